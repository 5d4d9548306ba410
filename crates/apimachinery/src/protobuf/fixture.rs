//! Test helpers: a small protobuf writer that builds message bytes field by field the
//! way gogo-protobuf lays them out, and a reader for the captured `testdata/*.hex`.

use serde_json::Value;

use super::wire::Writer;

pub(super) struct Enc(Writer);

impl Enc {
    pub(super) fn new() -> Self {
        Enc(Writer::default())
    }

    /// Bytes taken as they are, for messages the tests make up at random.
    pub(super) fn raw(bytes: &[u8]) -> Self {
        let mut writer = Writer::default();
        writer.extend(bytes);
        Enc(writer)
    }

    /// An `int32`, `int64` or `bool` field; negative numbers take ten bytes, as in Go.
    pub(super) fn int(mut self, number: u32, value: i64) -> Self {
        self.0.int(number, value);
        self
    }

    pub(super) fn bytes(mut self, number: u32, value: &[u8]) -> Self {
        self.0.bytes(number, value);
        self
    }

    pub(super) fn str(self, number: u32, value: &str) -> Self {
        self.bytes(number, value.as_bytes())
    }

    pub(super) fn msg(self, number: u32, message: Enc) -> Self {
        self.bytes(number, &message.done())
    }

    /// A `map<string, string>` entry.
    pub(super) fn entry(self, number: u32, key: &str, value: &str) -> Self {
        self.msg(number, Enc::new().str(1, key).str(2, value))
    }

    /// A map entry whose value is a message (a Quantity, say).
    pub(super) fn entry_msg(self, number: u32, key: &str, value: Enc) -> Self {
        self.msg(number, Enc::new().str(1, key).msg(2, value))
    }

    /// A packed `repeated` varint field.
    pub(super) fn packed(self, number: u32, values: &[i64]) -> Self {
        let mut payload = Writer::default();
        values.iter().for_each(|&v| payload.varint(v as u64));
        self.bytes(number, &payload.into_bytes())
    }

    pub(super) fn done(self) -> Vec<u8> {
        self.0.into_bytes()
    }
}

/// A request body: the `k8s\0` magic and a `runtime.Unknown` holding `raw`.
pub(super) fn body(api_version: &str, kind: &str, raw: Enc) -> Vec<u8> {
    let type_meta = Enc::new().str(1, api_version).str(2, kind);
    let unknown = Enc::new()
        .msg(1, type_meta)
        .msg(2, raw)
        .str(3, "")
        .str(4, "");
    [b"k8s\0".as_slice(), &unknown.done()].concat()
}

/// The JSON without the zero values that only mean "absent" (`null`, `""`, `0`, `false`,
/// `{}`, `[]`), as krust stores objects; its protobuf and its Go JSON do not change.
/// Fields named in `keep` are kept whatever they hold (a pointer set to an empty
/// struct, a map whose values may be null).
pub(super) fn sparse(value: Value, keep: &[&str]) -> Value {
    let zero = |v: &Value| match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
    };
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let v = if keep.contains(&k.as_str()) {
                        v
                    } else {
                        sparse(v, keep)
                    };
                    (k, v)
                })
                .filter(|(k, v)| keep.contains(&k.as_str()) || !zero(v))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| sparse(v, keep)).collect()),
        other => other,
    }
}

/// Bytes from a `testdata/*.hex` file: two hex digits a byte, separated by spaces.
pub(super) fn hex(text: &str) -> Vec<u8> {
    text.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("testdata holds hex bytes"))
        .collect()
}
