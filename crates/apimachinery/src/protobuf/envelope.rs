//! The request body around the object: the `k8s\0` magic and the `runtime.Unknown`
//! envelope naming the object's apiVersion and kind.

use serde_json::{Map, Value};

use super::descriptor::message_for_kind;
use super::error::{Located, ProtobufError, WireError};
use super::message::decode_message;
use super::wellknown::utf8;
use super::wire::fields;

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
