//! Decoding one message into the JSON object Go's encoding/json would write for the
//! decoded Go struct: fields by the descriptor table, in Go struct order, zero values
//! dropped or kept by the field's [`Presence`], inline structs merged into the parent.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

use super::descriptor::{Field, Kind, Message, Obj, Presence, Shape};
use super::error::Located;
use super::wellknown;
use super::wire::{Reader, WireValue, fields};

/// What has been read for one field so far.
enum Slot<'a> {
    Absent,
    /// A scalar: the last occurrence wins.
    Scalar(Value),
    /// Every occurrence of a message field, merged when decoded.
    Chunks(Obj, Vec<&'a [u8]>),
    List(Vec<Value>),
    /// Sorted by key, as encoding/json writes maps; a repeated key keeps its last value.
    Map(BTreeMap<String, Value>),
}

/// The JSON object for `message`, whose bytes arrived in `chunks`.
pub(super) fn decode_message(
    message: &'static Message,
    chunks: &[&[u8]],
) -> Result<Map<String, Value>, Located> {
    let mut slots: Vec<Slot> = message.fields.iter().map(|_| Slot::Absent).collect();
    for wire_field in fields(chunks) {
        let (number, value) = wire_field?;
        // Unknown fields are skipped, as in every protobuf reader.
        let Some((index, field)) = message.field(number) else {
            continue;
        };
        read_field(field, number, value, &mut slots[index]).map_err(|e| e.within(field.name))?;
    }

    let mut entries = Vec::new();
    for (field, slot) in message.fields.iter().zip(slots) {
        let value = finish(field, slot).map_err(|e| e.within(field.name))?;
        match value {
            None => {}
            Some(Value::Object(inner)) if field.name.is_empty() => {
                entries.extend(inner.into_iter().map(|(k, v)| (field.order, k, v)));
            }
            Some(value) => entries.push((field.order, field.name.to_string(), value)),
        }
    }
    // Stable, so an inline struct's fields keep their own order.
    entries.sort_by_key(|&(order, _, _)| order);
    Ok(entries.into_iter().map(|(_, k, v)| (k, v)).collect())
}

/// Adds one occurrence of `field` on the wire to its slot.
fn read_field<'a>(
    field: &Field,
    number: u64,
    value: WireValue<'a>,
    slot: &mut Slot<'a>,
) -> Result<(), Located> {
    match (field.shape, field.kind) {
        (Shape::One, Kind::Obj(obj)) => {
            let chunk = value.bytes(number)?;
            match slot {
                Slot::Chunks(_, chunks) => chunks.push(chunk),
                _ => *slot = Slot::Chunks(obj, vec![chunk]),
            }
        }
        (Shape::One, kind) => *slot = Slot::Scalar(single(kind, number, value)?),
        (Shape::List, kind) => {
            let mut new = Vec::new();
            match value {
                // Packed: a run of varints in one length-delimited field.
                WireValue::Len(packed) if matches!(kind, Kind::Bool | Kind::I32 | Kind::I64) => {
                    let mut reader = Reader::new(packed);
                    while !reader.is_empty() {
                        new.push(single(kind, number, WireValue::Varint(reader.varint()?))?);
                    }
                }
                item => new.push(single(kind, number, item)?),
            }
            match slot {
                Slot::List(items) => items.append(&mut new),
                _ => *slot = Slot::List(new),
            }
        }
        (Shape::Map, kind) => {
            let (key, item) = map_entry(kind, value.bytes(number)?)?;
            match slot {
                Slot::Map(entries) => {
                    entries.insert(key, item);
                }
                _ => *slot = Slot::Map(BTreeMap::from([(key, item)])),
            }
        }
    }
    Ok(())
}

/// One `map<string, kind>` entry: `{key = 1, value = 2}`, either of which may be left out.
fn map_entry(kind: Kind, entry: &[u8]) -> Result<(String, Value), Located> {
    let (mut key, mut value) = (String::new(), None);
    for wire_field in fields(&[entry]) {
        match wire_field? {
            (1, v) => key = wellknown::utf8(v.bytes(1)?),
            (2, v) => value = Some(v),
            _ => {}
        }
    }
    let value = match (value, kind) {
        (Some(v), kind) => single(kind, 2, v)?,
        // Go starts from an empty []byte here, not a nil one.
        (None, Kind::Bytes) => Value::String(String::new()),
        (None, kind) => zero(kind)?,
    };
    Ok((key, value))
}

/// The JSON Go writes for a field its struct leaves at the zero value, or `None` where
/// encoding/json leaves the field out.
pub(super) fn absent(field: &Field) -> Option<Value> {
    match (field.presence, field.shape) {
        (Presence::Ptr | Presence::Omit, _) => None,
        (Presence::PtrNull, _) => Some(Value::Null),
        // A nil slice or map.
        (Presence::Keep, Shape::List | Shape::Map) => Some(Value::Null),
        // Decoding no bytes cannot fail.
        (Presence::Keep, Shape::One) => zero(field.kind).ok(),
    }
}

/// The JSON for a field that was on the wire or not, or `None` to leave it out.
fn finish(field: &Field, slot: Slot) -> Result<Option<Value>, Located> {
    let value = match slot {
        Slot::Absent => return Ok(absent(field)),
        Slot::Scalar(value) => value,
        Slot::Chunks(obj, chunks) => of_chunks(obj, &chunks)?,
        Slot::List(items) => Value::Array(items),
        Slot::Map(entries) => Value::Object(entries.into_iter().collect()),
    };
    let omitted = field.presence == Presence::Omit && is_empty(&value);
    Ok((!omitted).then_some(value))
}

/// The JSON for one value on the wire.
fn single(kind: Kind, number: u64, value: WireValue) -> Result<Value, Located> {
    Ok(match kind {
        Kind::Str => Value::String(wellknown::utf8(value.bytes(number)?)),
        Kind::Bytes => Value::String(STANDARD.encode(value.bytes(number)?)),
        Kind::Bool => Value::Bool(value.varint(number)? != 0),
        // Go truncates a varint to the field's width.
        Kind::I32 => Value::from(value.varint(number)? as i32),
        Kind::I64 => Value::from(value.varint(number)? as i64),
        Kind::Obj(obj) => of_chunks(obj, &[value.bytes(number)?])?,
    })
}

/// The JSON for a message-encoded value from its bytes; no bytes is the Go zero value.
fn of_chunks(obj: Obj, chunks: &[&[u8]]) -> Result<Value, Located> {
    Ok(match obj {
        Obj::Msg(message) => Value::Object(decode_message(message, chunks)?),
        Obj::Quantity => wellknown::quantity(chunks)?,
        Obj::IntOrString => wellknown::int_or_string(chunks)?,
        Obj::Time => wellknown::time(chunks)?,
        Obj::MicroTime => wellknown::micro_time(chunks)?,
        Obj::FieldsV1 => wellknown::fields_v1(chunks)?,
        Obj::RawExtension => wellknown::raw_extension(chunks)?,
        Obj::StringList => wellknown::string_list(chunks)?,
    })
}

/// The JSON of a kind's Go zero value (a nil []byte is `null`).
fn zero(kind: Kind) -> Result<Value, Located> {
    Ok(match kind {
        Kind::Str => Value::String(String::new()),
        Kind::Bool => Value::Bool(false),
        Kind::I32 | Kind::I64 => Value::from(0),
        Kind::Bytes => Value::Null,
        Kind::Obj(obj) => of_chunks(obj, &[])?,
    })
}

/// What `omitempty` drops: false, 0, "", and empty lists and maps. Only scalars, lists
/// and maps are ever [`Presence::Omit`]: encoding/json never omits a struct.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_i64() == Some(0),
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(entries) => entries.is_empty(),
        Value::Null => true,
    }
}
