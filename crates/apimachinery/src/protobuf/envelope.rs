//! The body around the object: the `k8s\0` magic and the `runtime.Unknown` envelope
//! naming the object's apiVersion and kind; and the frame of a watch event.

use serde_json::{Map, Value};

use super::descriptor::message_for_kind;
use super::encode::encode_message;
use super::error::{Located, ProtobufError, WireError};
use super::message::decode_message;
use super::wellknown::utf8;
use super::wire::{Writer, fields};

const MAGIC: &[u8] = b"k8s\0";

/// The `application/vnd.kubernetes.protobuf` content type.
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Decodes a Kubernetes protobuf request body into the object's JSON form, as the
/// Kubernetes JSON API writes it, with `kind` and `apiVersion` set.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or(ProtobufError::MissingMagic)?;
    let unknown = Unknown::parse(envelope).map_err(|e| e.at("runtime.Unknown"))?;
    if !unknown.content_encoding.is_empty() {
        return Err(ProtobufError::ContentEncoding(unknown.content_encoding));
    }
    // Go clients leave contentType empty, which means protobuf.
    if !unknown.content_type.is_empty() && unknown.content_type != PROTOBUF {
        return Err(ProtobufError::ContentType(unknown.content_type));
    }
    let message = message_for_kind(&unknown.api_version, &unknown.kind).ok_or_else(|| {
        ProtobufError::UnknownKind {
            api_version: unknown.api_version.clone(),
            kind: unknown.kind.clone(),
        }
    })?;
    let fields = decode_message(message, &[unknown.raw]).map_err(|e| e.at(message.name))?;

    // TypeMeta comes first in every Go object, kind before apiVersion.
    let mut object = Map::with_capacity(fields.len() + 2);
    object.insert("kind".into(), Value::String(unknown.kind));
    object.insert("apiVersion".into(), Value::String(unknown.api_version));
    object.extend(fields);
    Ok(Value::Object(object))
}

/// Whether objects of this apiVersion and kind have a protobuf form.
pub fn supports(api_version: &str, kind: &str) -> bool {
    message_for_kind(api_version, kind).is_some()
}

/// Encodes an object's JSON form (with `kind` and `apiVersion`) as upstream's protobuf
/// serializer writes the same object: the magic, then a `runtime.Unknown` whose `raw`
/// is the object's message.
pub fn encode(object: &Value) -> Result<Vec<u8>, ProtobufError> {
    let (Some(api_version), Some(kind), Some(fields)) = (
        object["apiVersion"].as_str(),
        object["kind"].as_str(),
        object.as_object(),
    ) else {
        return Err(ProtobufError::UnknownKind {
            api_version: object["apiVersion"].to_string(),
            kind: object["kind"].to_string(),
        });
    };
    let message =
        message_for_kind(api_version, kind).ok_or_else(|| ProtobufError::UnknownKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })?;
    let raw = encode_message(message, fields).map_err(|e| e.encoding(message.name))?;
    let mut type_meta = Writer::default();
    type_meta.bytes(1, api_version.as_bytes());
    type_meta.bytes(2, kind.as_bytes());
    // Go writes the empty contentEncoding and contentType too.
    let mut unknown = Writer::default();
    unknown.bytes(1, &type_meta.into_bytes());
    unknown.bytes(2, &raw);
    unknown.bytes(3, b"");
    unknown.bytes(4, b"");
    Ok([MAGIC, &unknown.into_bytes()].concat())
}

/// One event of a protobuf watch stream: a `meta.v1.WatchEvent` `{type = 1, object = 2}`
/// whose object is a `runtime.RawExtension` holding `object` (a body from [`encode`]),
/// framed by its length as four big-endian bytes.
pub fn watch_event(event_type: &str, object: &[u8]) -> Vec<u8> {
    let mut raw = Writer::default();
    raw.bytes(1, object);
    let mut event = Writer::default();
    event.bytes(1, event_type.as_bytes());
    event.bytes(2, &raw.into_bytes());
    let event = event.into_bytes();
    let length = u32::try_from(event.len()).unwrap_or(u32::MAX);
    [length.to_be_bytes().as_slice(), &event].concat()
}

/// `runtime.Unknown`: `{typeMeta = 1 {apiVersion = 1, kind = 2}, raw = 2,
/// contentEncoding = 3, contentType = 4}`.
struct Unknown<'a> {
    api_version: String,
    kind: String,
    raw: &'a [u8],
    content_encoding: String,
    content_type: String,
}

impl<'a> Unknown<'a> {
    fn parse(envelope: &'a [u8]) -> Result<Self, Located> {
        let mut unknown = Unknown {
            api_version: String::new(),
            kind: String::new(),
            raw: &[],
            content_encoding: String::new(),
            content_type: String::new(),
        };
        for field in fields(&[envelope]) {
            match field? {
                (1, v) => {
                    let type_meta = v.bytes(1)?;
                    Self::parse_type_meta(type_meta, &mut unknown)
                        .map_err(|e| Located::from(e).within("typeMeta"))?;
                }
                (2, v) => unknown.raw = v.bytes(2)?,
                (3, v) => unknown.content_encoding = utf8(v.bytes(3)?),
                (4, v) => unknown.content_type = utf8(v.bytes(4)?),
                _ => {}
            }
        }
        Ok(unknown)
    }

    fn parse_type_meta(type_meta: &[u8], unknown: &mut Self) -> Result<(), WireError> {
        for field in fields(&[type_meta]) {
            match field? {
                (1, v) => unknown.api_version = utf8(v.bytes(1)?),
                (2, v) => unknown.kind = utf8(v.bytes(2)?),
                _ => {}
            }
        }
        Ok(())
    }
}
