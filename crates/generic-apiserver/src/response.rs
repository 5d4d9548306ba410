//! Response encoding: content negotiation (JSON, server-side Table, PartialObjectMetadata),
//! objects and lists from cached bytes, and metav1.Status errors.

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use krust_api::status::ApiError;
use serde_json::{Value, json};

use crate::rest::Kind;
use crate::table::{self, IncludeObject};

pub type Body = BoxBody<Bytes, std::convert::Infallible>;
pub type Response = http::Response<Body>;

/// A backend's body passed on as it arrives (container logs, an aggregated apiserver's
/// watch); one that fails midway simply ends, and the client sees the stream close.
pub fn streamed(body: hyper::body::Incoming) -> Body {
    use futures::StreamExt;
    let frames = body
        .into_data_stream()
        .take_while(|chunk| futures::future::ready(chunk.is_ok()))
        .map(|chunk| Ok(hyper::body::Frame::data(chunk.unwrap_or_default())));
    BodyExt::boxed(http_body_util::StreamBody::new(frames))
}

/// The protobuf media type, upstream's `runtime.ContentTypeProtobuf`.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// The representation a client asked for with its Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    /// The kind's own protobuf message (built-in kinds only).
    Protobuf,
    Table(IncludeObject),
    /// meta.k8s.io/v1 PartialObjectMetadata(List), in JSON or protobuf.
    Metadata(Media),
}

/// The wire form of an answer that has both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Media {
    Json,
    Protobuf,
}

impl Media {
    /// The form of a Status error to a resource request. Upstream negotiates errors as it
    /// does answers, without the `as=` views, so a client that puts protobuf first gets
    /// its error in protobuf too.
    pub fn for_errors(accept: Option<&str>) -> Media {
        entries(accept.unwrap_or_default())
            .find(|(wire, params)| wire.is_some() && params.iter().all(|(k, _)| *k != "as"))
            .and_then(|(wire, _)| wire)
            .unwrap_or(Media::Json)
    }
}

/// The entries of an Accept header in order: the wire form of each media type (none
/// for types krust never serves) and its parameters.
fn entries(accept: &str) -> impl Iterator<Item = (Option<Media>, Vec<(&str, &str)>)> {
    accept.split(',').map(|media| {
        let mut parts = media.split(';').map(str::trim);
        let wire = match parts.next().unwrap_or_default() {
            "application/json" | "application/*" | "*/*" | "application/yaml" => Some(Media::Json),
            PROTOBUF => Some(Media::Protobuf),
            _ => None,
        };
        (wire, parts.filter_map(|p| p.split_once('=')).collect())
    })
}

impl Output {
    /// Picks the first acceptable media type of the Accept header, as upstream's
    /// negotiation does. `protobuf` says whether the kind has a protobuf form (custom
    /// resources do not); its metadata-only view always has one.
    pub fn negotiate(
        accept: Option<&str>,
        include: Option<&str>,
        protobuf: bool,
    ) -> Result<Output, ApiError> {
        let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
            return Ok(Output::Json);
        };
        for (wire, params) in entries(accept) {
            let param = |k: &str| params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
            let Some(wire) = wire else {
                continue;
            };
            match (param("as"), param("g"), wire) {
                (None, _, Media::Json) => return Ok(Output::Json),
                (None, _, Media::Protobuf) if protobuf => return Ok(Output::Protobuf),
                // Tables have no protobuf form.
                (Some("Table"), Some("meta.k8s.io"), Media::Json) => {
                    let include = match include {
                        Some("None") => IncludeObject::None,
                        Some("Object") => IncludeObject::Object,
                        _ => IncludeObject::Metadata,
                    };
                    return Ok(Output::Table(include));
                }
                (
                    Some("PartialObjectMetadata" | "PartialObjectMetadataList"),
                    Some("meta.k8s.io"),
                    wire,
                ) => {
                    return Ok(Output::Metadata(wire));
                }
                _ => continue,
            }
        }
        let types = if protobuf {
            "application/json, application/yaml, application/vnd.kubernetes.protobuf"
        } else {
            "application/json, application/yaml"
        };
        Err(ApiError::not_acceptable(format!(
            "only the following media types are accepted: {types}"
        )))
    }

    /// The wire form answers go out in.
    pub fn media(self) -> Media {
        match self {
            Output::Protobuf | Output::Metadata(Media::Protobuf) => Media::Protobuf,
            _ => Media::Json,
        }
    }

    /// A whole answer: `value` (an object, a list, a Status) in this output's wire form.
    pub fn encode(self, code: StatusCode, value: &Value) -> Response {
        in_media(code, value, self.media())
    }

    /// One watch event in this output's stream: a JSON line, or a length-framed
    /// protobuf `WatchEvent`.
    pub fn event(self, ty: &str, object: &Value) -> Bytes {
        if self.media() == Media::Json {
            let mut line =
                serde_json::to_vec(&json!({"type": ty, "object": object})).unwrap_or_default();
            line.push(b'\n');
            return Bytes::from(line);
        }
        use krust_apimachinery::protobuf::{encode, watch_event};
        let (ty, encoded) = match encode(object) {
            Ok(bytes) => (ty, bytes),
            Err(e) => {
                tracing::error!(error = %e, "a watch event could not be encoded as protobuf");
                let status = ApiError::internal(e.to_string()).to_status();
                ("ERROR", encode(&status).unwrap_or_default())
            }
        };
        Bytes::from(watch_event(ty, &encoded))
    }

    /// The Content-Type of a watch stream.
    pub fn stream_type(self) -> &'static str {
        match self.media() {
            Media::Protobuf => "application/vnd.kubernetes.protobuf;stream=watch",
            Media::Json => "application/json",
        }
    }
}

pub fn full(code: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Response {
    let mut resp = http::Response::new(Full::new(body.into()).boxed());
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// `value` as JSON, ending in a newline as upstream's encoder writes it.
pub fn json(code: StatusCode, value: &Value) -> Response {
    let mut body = serde_json::to_vec(value).unwrap_or_default();
    body.push(b'\n');
    full(code, body, "application/json")
}

/// Whether a request gets its JSON indented, as upstream decides: `?pretty=` says so
/// (Go's boolean words), else command-line HTTP tools and browsers do.
pub fn wants_pretty(query: Option<&str>, user_agent: Option<&str>) -> bool {
    let asked = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter_map(|pair| pair.strip_prefix("pretty="))
        .find(|v| !v.is_empty());
    if let Some(value) = asked {
        return matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True");
    }
    let agent = user_agent.unwrap_or_default();
    ["curl", "Wget", "Mozilla/5.0"]
        .iter()
        .any(|tool| agent.starts_with(tool))
}

/// A whole JSON answer indented as upstream's pretty encoder writes it (two spaces, a
/// final newline); streamed answers (watches, logs) and other media types pass as they
/// are.
pub async fn indented(resp: Response) -> Response {
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    let whole = hyper::body::Body::size_hint(resp.body()).exact().is_some();
    if !json || !whole {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = match serde_json::from_slice::<Value>(&bytes) {
        Ok(value) => {
            let mut pretty = serde_json::to_vec_pretty(&value).unwrap_or_default();
            pretty.push(b'\n');
            parts.headers.remove(header::CONTENT_LENGTH);
            Bytes::from(pretty)
        }
        Err(_) => bytes,
    };
    http::Response::from_parts(parts, Full::new(body).boxed())
}

pub fn error(err: &ApiError) -> Response {
    error_in(err, Media::Json)
}

/// `value` as JSON or as protobuf. A value protobuf cannot carry (never a stored
/// object) is a 500, whose Status then goes out as JSON.
fn in_media(code: StatusCode, value: &Value, media: Media) -> Response {
    match media {
        Media::Json => json(code, value),
        Media::Protobuf => match krust_apimachinery::protobuf::encode(value) {
            Ok(bytes) => full(code, bytes, PROTOBUF),
            Err(e) => {
                tracing::error!(error = %e, "an answer could not be encoded as protobuf");
                error(&ApiError::internal(e.to_string()))
            }
        },
    }
}

/// An error as a Status in the given wire form.
pub fn error_in(err: &ApiError, media: Media) -> Response {
    let code = StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = in_media(code, &err.to_status(), media);
    if let Some(secs) = err.details.as_ref().and_then(|d| d.retry_after_seconds) {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// Converts a stored object to the version this kind serves (only shared-storage kinds
/// differ) and re-encodes it only when needed.
pub fn served_bytes(kind: &Kind, stored: &Bytes) -> Bytes {
    if kind.converts {
        let v: Value = serde_json::from_slice(stored).unwrap_or(Value::Null);
        Bytes::from(serde_json::to_vec(&kind.strategy.to_served(v)).unwrap_or_default())
    } else {
        stored.clone()
    }
}

/// One object in the requested representation.
pub fn object(kind: &Kind, output: Output, code: StatusCode, stored: &Bytes) -> Response {
    match output {
        Output::Json => full(code, served_bytes(kind, stored), "application/json"),
        Output::Protobuf => {
            let obj: Value =
                serde_json::from_slice(&served_bytes(kind, stored)).unwrap_or(Value::Null);
            output.encode(code, &obj)
        }
        Output::Table(include) => {
            let obj: Value =
                serde_json::from_slice(&served_bytes(kind, stored)).unwrap_or(Value::Null);
            let rv = obj["metadata"]["resourceVersion"].clone();
            json(
                code,
                &table_of(kind, &[obj], include, json!({"resourceVersion": rv})),
            )
        }
        Output::Metadata(_) => {
            let obj: Value = serde_json::from_slice(stored).unwrap_or(Value::Null);
            output.encode(code, &partial_metadata(&obj))
        }
    }
}

pub fn partial_metadata(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

pub fn table_of(kind: &Kind, objs: &[Value], include: IncludeObject, list_meta: Value) -> Value {
    let columns = kind.strategy.columns();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": table::definitions(columns),
        "rows": (objs.iter())
            .map(|o| table::row(columns, kind.strategy.printed_name(o), o, include))
            .collect::<Vec<_>>(),
    })
}

/// A list response: JSON lists are assembled from the cached bytes without re-encoding.
pub fn list(
    kind: &Kind,
    output: Output,
    items: &[Bytes],
    revision: i64,
    continue_token: Option<String>,
) -> Response {
    let mut meta = json!({"resourceVersion": revision.to_string()});
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
    }
    match output {
        Output::Json => {
            let head = json!({
                "kind": format!("{}List", kind.info.kind),
                "apiVersion": kind.info.api_version(),
                "metadata": meta,
            });
            let mut buf = BytesMut::with_capacity(
                items.iter().map(Bytes::len).sum::<usize>() + items.len() + 128,
            );
            let head = serde_json::to_vec(&head).unwrap_or_default();
            // `{...,"metadata":{...}` + `,"items":[` + items + `]}`
            buf.extend_from_slice(&head[..head.len() - 1]);
            buf.extend_from_slice(b",\"items\":[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    buf.extend_from_slice(b",");
                }
                buf.extend_from_slice(&served_bytes(kind, item));
            }
            buf.extend_from_slice(b"]}");
            full(StatusCode::OK, buf.freeze(), "application/json")
        }
        Output::Table(include) => {
            let objs: Vec<Value> = items
                .iter()
                .map(|b| serde_json::from_slice(&served_bytes(kind, b)).unwrap_or(Value::Null))
                .collect();
            json(StatusCode::OK, &table_of(kind, &objs, include, meta))
        }
        Output::Protobuf => {
            let objs: Vec<Value> = items
                .iter()
                .map(|b| serde_json::from_slice(&served_bytes(kind, b)).unwrap_or(Value::Null))
                .collect();
            output.encode(
                StatusCode::OK,
                &json!({"kind": format!("{}List", kind.info.kind), "apiVersion": kind.info.api_version(), "metadata": meta, "items": objs}),
            )
        }
        Output::Metadata(_) => {
            let objs: Vec<Value> = items
                .iter()
                .map(|b| partial_metadata(&serde_json::from_slice(b).unwrap_or(Value::Null)))
                .collect();
            output.encode(
                StatusCode::OK,
                &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": objs}),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_accept_order() {
        let kubectl_get = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            Output::negotiate(Some(kubectl_get), None, true).unwrap(),
            Output::Table(IncludeObject::Metadata)
        );
        assert_eq!(
            Output::negotiate(Some("application/json, */*"), None, true).unwrap(),
            Output::Json
        );
        assert_eq!(Output::negotiate(None, None, true).unwrap(), Output::Json);
        assert!(wants_pretty(None, Some("curl/7.88.1")));
        assert!(!wants_pretty(Some("pretty=false"), Some("curl/7.88.1")));
        assert!(wants_pretty(
            Some("limit=1&pretty=1"),
            Some("kubectl/v1.33.1")
        ));
        assert!(!wants_pretty(None, Some("kubectl/v1.33.1 (linux/amd64)")));
        assert_eq!(
            Output::negotiate(Some("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"), None, false).unwrap(),
            Output::Metadata(Media::Protobuf)
        );
        // client-go configured for protobuf: built-in kinds get it, custom ones JSON.
        let client_go = "application/vnd.kubernetes.protobuf, application/json";
        assert_eq!(
            Output::negotiate(Some(client_go), None, true).unwrap(),
            Output::Protobuf
        );
        assert_eq!(
            Output::negotiate(Some(client_go), None, false).unwrap(),
            Output::Json
        );
        let refused = Output::negotiate(Some(PROTOBUF), None, false).unwrap_err();
        assert_eq!(refused.code, 406);
        assert_eq!(
            refused.message,
            "only the following media types are accepted: application/json, application/yaml"
        );
        // Tables are JSON only.
        let table = "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io";
        assert_eq!(
            Output::negotiate(Some(table), None, true).unwrap_err().code,
            406
        );
    }
}
