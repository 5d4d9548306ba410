//! GET and LIST. Unpaged reads come from the watch cache; paged reads (`limit`/`continue`)
//! read the store at one revision so every page belongs to the same snapshot, as upstream
//! does with etcd.

use base64::Engine;
use bytes::Bytes;
use http::StatusCode;
use krust_api::selector::{FieldSelector, LabelSelector};
use krust_api::status::ApiError;
use krust_store::{RangeRequest, Revision};
use serde_json::{Value, json};

use super::{Call, parse_rv, store_error};
use crate::response::{self, Response};
use crate::watch_cache::CachedObject;

pub async fn get(call: &Call<'_>) -> Result<Response, ApiError> {
    if call.query.get("resourceVersion") != Some("0") {
        call.consistent().await?;
    }
    let name = call.name();
    let obj = call
        .resource_cache()?
        .get(&call.key(name))
        .ok_or_else(|| ApiError::not_found(call.target(name)))?;
    let json = call.served_bytes(vec![obj.json.clone()]).await?;
    Ok(response::object(
        call.kind,
        call.output,
        StatusCode::OK,
        &json[0],
    ))
}

/// Label and field selectors of a list or watch.
pub struct Filter {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn from_call(call: &Call<'_>) -> Result<Filter, ApiError> {
        let labels = LabelSelector::parse(call.query.get("labelSelector").unwrap_or_default())
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let fields = FieldSelector::parse(call.query.get("fieldSelector").unwrap_or_default())
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let supported = supported_fields(call);
        for r in &fields.0 {
            if !supported.contains(&r.field.as_str()) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {}",
                    r.field
                )));
            }
        }
        Ok(Filter { labels, fields })
    }

    pub fn matches(&self, obj: &CachedObject) -> bool {
        self.labels.matches(&obj.labels) && self.fields.matches(|f| obj.field(f))
    }
}

fn supported_fields(call: &Call<'_>) -> Vec<&'static str> {
    let mut f = vec!["metadata.name", "metadata.namespace"];
    let sample = call.kind.strategy.fields(&Value::Null);
    f.extend(sample.into_iter().map(|(k, _)| k));
    f
}

/// The storage prefix a list or watch covers: one namespace or all.
pub fn list_prefix(call: &Call<'_>) -> String {
    call.kind.info.storage_prefix_in(call.namespace())
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    /// Revision of the snapshot.
    rv: Revision,
    /// Last key returned.
    start: String,
}

pub async fn list(call: &Call<'_>) -> Result<Response, ApiError> {
    let filter = Filter::from_call(call)?;
    let limit = call.query.int("limit")?.unwrap_or(0).max(0) as usize;
    let token = call.query.get("continue").filter(|c| !c.is_empty());
    if limit > 0 || token.is_some() {
        return list_paged(call, &filter, limit, token).await;
    }
    match call.query.get("resourceVersion") {
        None | Some("") => {
            call.consistent().await?;
        }
        Some("0") => {}
        Some(rv) => {
            // NotOlderThan: wait for the cache to reach it.
            let rv = parse_rv(rv)?;
            let current = call
                .scope
                .store
                .current_revision()
                .await
                .map_err(store_error)?;
            if rv > current {
                return Err(ApiError::timeout(format!(
                    "Too large resource version: {rv}, current: {current}"
                )));
            }
            call.scope.cache.wait_for(rv).await;
        }
    }
    let (objs, revision) = call.resource_cache()?.list(&list_prefix(call));
    let items: Vec<Bytes> = objs
        .iter()
        .filter(|o| filter.matches(o))
        .map(|o| o.json.clone())
        .collect();
    let items = call.served_bytes(items).await?;
    Ok(response::list(
        call.kind,
        call.output,
        &items,
        revision,
        None,
    ))
}

async fn list_paged(
    call: &Call<'_>,
    filter: &Filter,
    limit: usize,
    token: Option<&str>,
) -> Result<Response, ApiError> {
    let prefix = list_prefix(call);
    let (mut revision, mut start_after) = match token {
        Some(t) => {
            let t = decode_token(t)?;
            (t.rv, Some(t.start))
        }
        None => (0, None),
    };
    let compacted = call
        .scope
        .store
        .compacted_revision()
        .await
        .map_err(store_error)?;
    if token.is_some() && revision <= compacted {
        return Err(ApiError::gone(
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
        ));
    }
    let mut items = Vec::new();
    // As upstream's etcd3 store: a page the selector thins out is followed by one twice
    // its size, up to 10,000, so a selective list costs a few round trips, not one per
    // `limit` objects read.
    let mut page_size = limit;
    let more = 'pages: loop {
        let page = call
            .scope
            .store
            .range(RangeRequest {
                prefix: prefix.clone(),
                start_after: start_after.clone(),
                limit: page_size,
                revision,
            })
            .await
            .map_err(store_error)?;
        revision = page.revision;
        let read = page.kvs.len();
        for (i, kv) in page.kvs.iter().enumerate() {
            start_after = Some(kv.key.clone());
            let Some(obj) = call.resource_cache()?.decode_stored(kv) else {
                continue;
            };
            if filter.matches(&obj) {
                items.push(obj.json);
            }
            if limit > 0 && items.len() >= limit {
                break 'pages page.more || i + 1 < read;
            }
        }
        if !page.more {
            break false;
        }
        page_size = (page_size * 2).min(MAX_PAGE);
    };
    let next = if more {
        start_after.map(|start| {
            encode_token(&ContinueToken {
                rv: revision,
                start,
            })
        })
    } else {
        None
    };
    let items = call.served_bytes(items).await?;
    Ok(response::list(
        call.kind,
        call.output,
        &items,
        revision,
        next,
    ))
}

/// The largest page a paged list reads from the store at once (upstream's `maxLimit`).
const MAX_PAGE: usize = 10_000;

fn encode_token(t: &ContinueToken) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(t).unwrap_or_default())
}

fn decode_token(s: &str) -> Result<ContinueToken, ApiError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| ApiError::bad_request(format!("continue key is not valid: {}", json!(s))))
}
