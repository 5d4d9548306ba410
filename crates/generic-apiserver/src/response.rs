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

/// The representation a client asked for with its Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    Table(IncludeObject),
    /// meta.k8s.io/v1 PartialObjectMetadata(List).
    Metadata,
}

impl Output {
    /// Picks the first acceptable media type of the Accept header, as upstream's
    /// negotiation does; protobuf-only clients get 406.
    pub fn negotiate(accept: Option<&str>, include: Option<&str>) -> Result<Output, ApiError> {
        let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
            return Ok(Output::Json);
        };
        for media in accept.split(',') {
            let mut parts = media.split(';').map(str::trim);
            let ty = parts.next().unwrap_or_default();
            let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
            let param = |k: &str| params.iter().find(|(pk, _)| *pk == k).map(|(_, v)| *v);
            if !matches!(
                ty,
                "application/json" | "application/*" | "*/*" | "application/yaml"
            ) {
                continue;
            }
            match (param("as"), param("g")) {
                (None, _) => return Ok(Output::Json),
                (Some("Table"), Some("meta.k8s.io")) => {
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
                ) => {
                    return Ok(Output::Metadata);
                }
                _ => continue,
            }
        }
        Err(ApiError::not_acceptable(
            "only the following media types are accepted: application/json, application/yaml",
        ))
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
    let code = StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json(code, &err.to_status());
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
        Output::Table(include) => {
            let obj: Value =
                serde_json::from_slice(&served_bytes(kind, stored)).unwrap_or(Value::Null);
            let rv = obj["metadata"]["resourceVersion"].clone();
            json(
                code,
                &table_of(kind, &[obj], include, json!({"resourceVersion": rv})),
            )
        }
        Output::Metadata => {
            let obj: Value = serde_json::from_slice(stored).unwrap_or(Value::Null);
            json(code, &partial_metadata(&obj))
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
        Output::Metadata => {
            let objs: Vec<Value> = items
                .iter()
                .map(|b| partial_metadata(&serde_json::from_slice(b).unwrap_or(Value::Null)))
                .collect();
            json(
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
            Output::negotiate(Some(kubectl_get), None).unwrap(),
            Output::Table(IncludeObject::Metadata)
        );
        assert_eq!(
            Output::negotiate(Some("application/json, */*"), None).unwrap(),
            Output::Json
        );
        assert_eq!(Output::negotiate(None, None).unwrap(), Output::Json);
        assert!(wants_pretty(None, Some("curl/7.88.1")));
        assert!(!wants_pretty(Some("pretty=false"), Some("curl/7.88.1")));
        assert!(wants_pretty(
            Some("limit=1&pretty=1"),
            Some("kubectl/v1.33.1")
        ));
        assert!(!wants_pretty(None, Some("kubectl/v1.33.1 (linux/amd64)")));
        assert_eq!(
            Output::negotiate(Some("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"), None).unwrap(),
            Output::Metadata
        );
        assert_eq!(
            Output::negotiate(Some("application/vnd.kubernetes.protobuf"), None)
                .unwrap_err()
                .code,
            406
        );
    }
}
