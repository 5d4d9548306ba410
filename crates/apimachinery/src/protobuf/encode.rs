//! Encoding one message from the JSON object Go's encoding/json would read into the Go
//! struct, byte for byte as upstream's gogo-generated marshalers write that struct:
//! fields in number order; every field that is not a pointer written, zero or not (an
//! absent JSON key is the Go zero value); pointers only when set; map entries sorted by
//! key; inline structs read from the parent object; the apimachinery types with a custom
//! JSON form by their own marshalers.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

use super::descriptor::{Field, Kind, Message, Obj, Presence, Shape};
use super::error::{Located, WireError};
use super::wire::Writer;

/// The bytes of `message` for the JSON object `object`; keys the message does not know
/// are left out, as protobuf cannot carry them.
pub(super) fn encode_message(
    message: &'static Message,
    object: &Map<String, Value>,
) -> Result<Vec<u8>, Located> {
    let mut out = Writer::default();
    for field in message.fields {
        write_field(&mut out, field, object).map_err(|e| e.within(field.name))?;
    }
    Ok(out.into_bytes())
}

fn write_field(
    out: &mut Writer,
    field: &Field,
    parent: &Map<String, Value>,
) -> Result<(), Located> {
    if field.name.is_empty() {
        // An inline struct: its JSON fields are the parent's own.
        let Kind::Obj(Obj::Msg(inline)) = field.kind else {
            return Err(WireError::NotEncodable("an inline field that is not a struct").into());
        };
        out.bytes(field.number, &encode_message(inline, parent)?);
        return Ok(());
    }
    // `null` decodes to the Go zero value (a nil pointer, slice or map) as absence does.
    let value = parent.get(field.name).filter(|v| !v.is_null());
    match field.shape {
        Shape::One => match (field.presence, value) {
            (Presence::Ptr | Presence::PtrNull, None) => {}
            _ => one(out, field.number, field.kind, value)?,
        },
        Shape::List => {
            for item in array(value)? {
                one(
                    out,
                    field.number,
                    field.kind,
                    Some(item).filter(|v| !v.is_null()),
                )?;
            }
        }
        Shape::Map => {
            let mut entries: Vec<(&String, &Value)> = object(value)?.iter().collect();
            // Go's marshalers sort the keys (a Go map has no order).
            entries.sort_unstable_by_key(|(key, _)| key.as_str());
            for (key, item) in entries {
                let mut entry = Writer::default();
                entry.bytes(1, key.as_bytes());
                one(
                    &mut entry,
                    2,
                    field.kind,
                    Some(item).filter(|v| !v.is_null()),
                )?;
                out.bytes(field.number, &entry.into_bytes());
            }
        }
    }
    Ok(())
}

/// One value of `kind` as field `number`; `None` is the Go zero value.
fn one(out: &mut Writer, number: u32, kind: Kind, value: Option<&Value>) -> Result<(), Located> {
    match kind {
        Kind::Str => out.bytes(number, string(value)?.as_bytes()),
        Kind::Bool => out.int(number, i64::from(boolean(value)?)),
        // Go keeps an int32 field in 32 bits and writes it sign-extended.
        Kind::I32 => out.int(number, i64::from(integer(value)? as i32)),
        Kind::I64 => out.int(number, integer(value)?),
        // A nil []byte is not written; an empty one is.
        Kind::Bytes => {
            if let Some(value) = value {
                let bytes = STANDARD
                    .decode(string(Some(value))?)
                    .map_err(|_| WireError::NotEncodable("bytes that are not base64"))?;
                out.bytes(number, &bytes);
            }
        }
        Kind::Obj(obj) => out.bytes(number, &object_bytes(obj, value)?),
    }
    Ok(())
}

/// The bytes of a message-encoded value.
fn object_bytes(obj: Obj, value: Option<&Value>) -> Result<Vec<u8>, Located> {
    let mut out = Writer::default();
    match obj {
        Obj::Msg(message) => return encode_message(message, object(value)?),
        // `{string = 1}`: Quantity's marshaler writes its canonical string, "0" when zero.
        Obj::Quantity => {
            let text = match value {
                None => "0".to_string(),
                Some(Value::Number(n)) => n.to_string(),
                Some(v) => string(Some(v))?.to_string(),
            };
            out.bytes(1, text.as_bytes());
        }
        // `{type = 1, intVal = 2, strVal = 3}`, all three always.
        Obj::IntOrString => {
            let (kind, int, text) = match value {
                Some(Value::String(s)) => (1, 0, s.as_str()),
                other => (0, integer(other)? as i32, ""),
            };
            out.int(1, kind);
            out.int(2, i64::from(int));
            out.bytes(3, text.as_bytes());
        }
        // `{seconds = 1, nanos = 2}`; the zero time marshals to nothing.
        Obj::Time | Obj::MicroTime => {
            if let Some((seconds, nanos)) = timestamp(value)? {
                out.int(1, seconds);
                out.int(2, i64::from(nanos));
            }
        }
        // `{raw = 1}`: the JSON text, not written when nil.
        Obj::FieldsV1 | Obj::RawExtension => {
            if let Some(value) = value {
                let raw = serde_json::to_vec(value)
                    .map_err(|_| WireError::NotEncodable("embedded JSON"))?;
                out.bytes(1, &raw);
            }
        }
        Obj::StringList => {
            for item in array(value)? {
                out.bytes(1, string(Some(item))?.as_bytes());
            }
        }
    }
    Ok(out.into_bytes())
}

/// Unix seconds and nanoseconds of an RFC 3339 time, or `None` for Go's zero time
/// (year 1), which `metav1.Time` marshals to no bytes.
fn timestamp(value: Option<&Value>) -> Result<Option<(i64, i32)>, Located> {
    const GO_ZERO: i64 = -62_135_596_800; // 0001-01-01T00:00:00Z
    let Some(value) = value else {
        return Ok(None);
    };
    let time: jiff::Timestamp = string(Some(value))?
        .parse()
        .map_err(|_| WireError::NotEncodable("a time that is not RFC 3339"))?;
    let (seconds, nanos) = (time.as_second(), time.subsec_nanosecond());
    Ok((seconds != GO_ZERO || nanos != 0).then_some((seconds, nanos)))
}

fn string(value: Option<&Value>) -> Result<&str, Located> {
    match value {
        None => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(WireError::NotEncodable("a string field holding another JSON type").into()),
    }
}

fn boolean(value: Option<&Value>) -> Result<bool, Located> {
    match value {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(WireError::NotEncodable("a boolean field holding another JSON type").into()),
    }
}

/// An integer; Go's decoder also takes a float with no fraction.
fn integer(value: Option<&Value>) -> Result<i64, Located> {
    let Some(value) = value else {
        return Ok(0);
    };
    value
        .as_i64()
        .or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0)
                .map(|f| f as i64)
        })
        .ok_or_else(|| {
            WireError::NotEncodable("an integer field holding another JSON value").into()
        })
}

fn array(value: Option<&Value>) -> Result<&[Value], Located> {
    match value {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(WireError::NotEncodable("a list field holding another JSON type").into()),
    }
}

fn object(value: Option<&Value>) -> Result<&Map<String, Value>, Located> {
    static EMPTY: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);
    match value {
        None => Ok(&EMPTY),
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(WireError::NotEncodable("an object field holding another JSON type").into()),
    }
}
