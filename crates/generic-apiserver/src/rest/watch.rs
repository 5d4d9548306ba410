//! WATCH: a stream of `{"type": ..., "object": ...}` lines served from the watch cache.
//!
//! Without a resourceVersion (or with "0") the stream starts with ADDED events for the
//! current objects; with one, it replays the cache's history after it, or sends a 410
//! Expired ERROR event when that history is gone. Objects moving in or out of a selector
//! become ADDED / DELETED, as upstream's cacher does. Bookmarks are sent on request.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::StatusCode;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use krust_api::status::ApiError;
use krust_store::{Revision, Store};
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::Caller;
use super::read::{Filter, list_prefix};
use super::{Call, parse_rv};
use crate::response::{self, Output, Response};
use crate::rest::Kind;
use crate::watch_cache::{CacheEvent, CachedObject, EventType, ResourceCache};

/// How often an idle watch with `allowWatchBookmarks` gets a BOOKMARK. Upstream sends
/// them about once a minute; bookmarks are one small line per watcher, and sending them
/// more often lets a resuming client skip more history, so krust sends them every 10 s.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(10);

pub async fn watch(call: &Call<'_>) -> Result<Response, ApiError> {
    let filter = Filter::from_call(call)?;
    let cache = call.resource_cache()?;
    let prefix = list_prefix(call);
    let namespace = call.namespace().map(str::to_string);
    let bookmarks = call.query.flag("allowWatchBookmarks");
    let send_initial = call.query.get("sendInitialEvents").map(|v| v == "true");
    let timeout = call
        .query
        .int("timeoutSeconds")?
        .filter(|t| *t > 0)
        .map(|t| Duration::from_secs(t as u64))
        .unwrap_or(Duration::from_secs(30 * 60));
    let rv = call.query.get("resourceVersion").filter(|v| !v.is_empty());

    // Where the stream starts: an initial snapshot, or history after a revision.
    let (initial, start) = match (rv, send_initial) {
        (_, Some(true)) | (None, _) | (Some("0"), _) => {
            if rv.is_none() || send_initial == Some(true) {
                call.consistent().await?;
            }
            let (objs, rev) = cache.list(&prefix);
            (Some(objs), rev)
        }
        (Some(rv), _) => (None, parse_rv(rv)?),
    };

    let (tx, rx) = frames();
    let watcher = Watcher {
        kind: call.kind,
        output: call.output,
        filter,
        namespace,
        cache,
        bookmarks,
        first_table: std::sync::atomic::AtomicBool::new(true),
        converter: (call.kind.strategy.converter().is_some()
            && !matches!(call.output, Output::Metadata(_)))
        .then(|| call.scope.caller()),
    };
    let global = call.scope.cache.clone();
    let store = call.scope.store.clone();
    let metrics = call.scope.metrics.clone();
    let output = call.output;
    let request = (call.kind.info.plural, call.namespace().map(str::to_string));
    tokio::spawn(async move {
        let errors = tx.clone();
        let run = watcher.run(
            tx,
            initial,
            start,
            send_initial == Some(true),
            global,
            store,
        );
        let describe = || match &request {
            (plural, Some(ns)) => format!("WATCH {plural} in namespace {ns}"),
            (plural, None) => format!("WATCH {plural}"),
        };
        let caught = crate::recover::catch(&metrics, describe, async {
            let _ = tokio::time::timeout(timeout, run).await;
        })
        .await;
        if caught.is_none() {
            // The client learns why its watch ended, as from any watch error.
            let status = crate::recover::error().to_status();
            let _ = errors.send(output.event("ERROR", &status)).await;
        }
    });
    let body = BodyExt::boxed(StreamBody::new(tokio_stream_from(rx)));
    let mut resp = http::Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(output.stream_type()),
    );
    Ok(resp)
}

/// How many bytes of serialized events a watch may hold that its client has not taken
/// yet. A client that stops reading holds this much (and its socket's buffers), not
/// every event that follows: its watcher waits, and the cache's ring of events is
/// shared. Upstream's cacheWatcher bounds its buffer the same way, by count.
const BUFFERED_BYTES: usize = 1 << 20;

/// The sending side of a watch's stream of lines, bounded by [`BUFFERED_BYTES`].
#[derive(Clone)]
struct Frames {
    tx: mpsc::Sender<(Bytes, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
}

/// Frames and the stream that takes them (each frame's budget is given back as the
/// HTTP layer takes it).
fn frames() -> (Frames, mpsc::Receiver<(Bytes, OwnedSemaphorePermit)>) {
    let (tx, rx) = mpsc::channel(256);
    let budget = Arc::new(Semaphore::new(BUFFERED_BYTES));
    (Frames { tx, budget }, rx)
}

/// The client went away.
struct Closed;

impl Frames {
    async fn send(&self, frame: Bytes) -> Result<(), Closed> {
        // A frame larger than the whole budget waits for all of it.
        let cost = u32::try_from(frame.len().clamp(1, BUFFERED_BYTES)).unwrap_or(u32::MAX);
        let permit = tokio::select! {
            permit = self.budget.clone().acquire_many_owned(cost) => permit.map_err(|_| Closed)?,
            _ = self.tx.closed() => return Err(Closed),
        };
        self.tx.send((frame, permit)).await.map_err(|_| Closed)
    }

    async fn closed(&self) {
        self.tx.closed().await
    }
}

fn tokio_stream_from(
    rx: mpsc::Receiver<(Bytes, OwnedSemaphorePermit)>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, std::convert::Infallible>> {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|(frame, _permit)| (Ok(Frame::data(frame)), rx))
    })
}

struct Watcher {
    kind: &'static Kind,
    output: Output,
    filter: Filter,
    namespace: Option<String>,
    cache: Arc<ResourceCache>,
    bookmarks: bool,
    first_table: std::sync::atomic::AtomicBool,
    /// How objects reach the definition's conversion webhook, for custom resources
    /// that convert by one.
    converter: Option<Caller>,
}

impl Watcher {
    async fn run(
        self,
        tx: Frames,
        initial: Option<Vec<Arc<CachedObject>>>,
        mut cursor: Revision,
        initial_end_bookmark: bool,
        global: Arc<crate::watch_cache::WatchCache>,
        store: Arc<dyn Store>,
    ) {
        let mut changes = self.cache.subscribe();
        if let Some(objs) = initial {
            for o in objs.iter().filter(|o| self.in_scope(o)) {
                let frame = self.frame(EventType::Added, o).await;
                if !send(&tx, self.output, frame).await {
                    return;
                }
            }
            if initial_end_bookmark {
                let frame = self.bookmark(cursor, true);
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
        }
        let mut ticker = tokio::time::interval(BOOKMARK_INTERVAL);
        ticker.tick().await;
        loop {
            let events = match self.cache.events_after(cursor) {
                Ok(events) => events,
                Err(too_old) => match self.replay_from_store(&store, &tx, cursor).await {
                    Replay::CaughtUp(at) => {
                        cursor = at;
                        continue;
                    }
                    Replay::ClientGone => return,
                    Replay::Gone => {
                        let err = ApiError::gone(too_old.to_string());
                        let frame = self.output.event("ERROR", &err.to_status());
                        let _ = tx.send(frame).await;
                        return;
                    }
                },
            };
            for ev in &events {
                cursor = ev.revision();
                if let Some(frame) = self.event_frame(ev).await.transpose()
                    && !send(&tx, self.output, frame).await
                {
                    return;
                }
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = ticker.tick(), if self.bookmarks => {
                    let rev = global.revision().max(cursor);
                    if tx.send(self.bookmark(rev, false)).await.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
            }
        }
    }

    /// Serves history the cache has already dropped from the store's own history (kept
    /// until compaction), until the cache's ring reaches back far enough to take over.
    async fn replay_from_store(
        &self,
        store: &Arc<dyn Store>,
        tx: &Frames,
        cursor: Revision,
    ) -> Replay {
        let Ok(mut events) = store.watch(self.cache.prefix(), cursor + 1).await else {
            return Replay::Gone;
        };
        while let Some(event) = events.next().await {
            let Ok(event) = event else {
                return Replay::Gone;
            };
            let rev = event.revision();
            if let Some(ev) = CacheEvent::from_store(&self.cache, &event)
                && let Some(frame) = self.event_frame(&ev).await.transpose()
                && !send(tx, self.output, frame).await
            {
                return Replay::ClientGone;
            }
            if self.cache.events_after(rev).is_ok() {
                return Replay::CaughtUp(rev);
            }
        }
        Replay::Gone
    }

    fn in_scope(&self, o: &CachedObject) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == o.namespace) && self.filter.matches(o)
    }

    /// The frame for one cache event as this watcher sees it, or none if it does not
    /// concern the watcher's namespace and selectors.
    async fn event_frame(&self, ev: &CacheEvent) -> Result<Option<Bytes>, ApiError> {
        let now = self.in_scope(&ev.object);
        let before = ev.prev.as_ref().is_some_and(|p| self.in_scope(p));
        let ty = match (ev.kind, before, now) {
            (EventType::Deleted, _, true) => EventType::Deleted,
            (EventType::Deleted, true, false) => EventType::Deleted,
            (EventType::Deleted, false, false) => return Ok(None),
            (_, false, true) => EventType::Added,
            (EventType::Modified, true, true) => EventType::Modified,
            (EventType::Added, true, true) => EventType::Modified,
            (_, true, false) => EventType::Deleted,
            (_, false, false) => return Ok(None),
        };
        // The cache's frame holds the stored object: right only for the storage version.
        if ty == ev.kind && self.output == Output::Json && !self.kind.converts {
            return Ok(Some(ev.json_frame().clone()));
        }
        self.frame(ty, &ev.object).await.map(Some)
    }

    /// The stored object in the served version, where a conversion webhook must do it.
    async fn converted(&self, o: &CachedObject) -> Result<Bytes, ApiError> {
        match &self.converter {
            Some(caller) => {
                let items = vec![o.json.clone()];
                let mut converted = super::served_bytes(caller, self.kind, items).await?;
                Ok(converted.pop().unwrap_or_default())
            }
            None => Ok(o.json.clone()),
        }
    }

    async fn frame(&self, ty: EventType, o: &CachedObject) -> Result<Bytes, ApiError> {
        let object: Value = match self.output {
            Output::Json => {
                let bytes = response::served_bytes(self.kind, &self.converted(o).await?);
                return Ok(frame_bytes(ty.as_str(), &bytes));
            }
            Output::Protobuf => serde_json::from_slice(&response::served_bytes(
                self.kind,
                &self.converted(o).await?,
            ))
            .unwrap_or(Value::Null),
            Output::Metadata(_) => response::partial_metadata(&o.value()),
            Output::Table(include) => {
                let obj: Value = serde_json::from_slice(&response::served_bytes(
                    self.kind,
                    &self.converted(o).await?,
                ))
                .unwrap_or(Value::Null);
                let mut t = response::table_of(
                    self.kind,
                    &[obj],
                    include,
                    json!({"resourceVersion": o.revision.to_string()}),
                );
                // Column definitions go out once, with the first event.
                if !self
                    .first_table
                    .swap(false, std::sync::atomic::Ordering::Relaxed)
                {
                    t["columnDefinitions"] = json!([]);
                }
                t
            }
        };
        Ok(self.output.event(ty.as_str(), &object))
    }

    fn bookmark(&self, rev: Revision, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rev.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let api_version = self.kind.info.api_version();
        let object =
            json!({"kind": self.kind.info.kind, "apiVersion": api_version, "metadata": meta});
        self.output.event("BOOKMARK", &object)
    }
}

/// Sends an event's frame, or the error that ends the watch (a conversion that failed,
/// as upstream's watch ends on an object it cannot decode). Whether the watch goes on.
async fn send(tx: &Frames, output: Output, frame: Result<Bytes, ApiError>) -> bool {
    match frame {
        Ok(frame) => tx.send(frame).await.is_ok(),
        Err(err) => {
            let _ = tx.send(output.event("ERROR", &err.to_status())).await;
            false
        }
    }
}

/// How a replay from the store ended.
enum Replay {
    /// Everything after this revision is in the cache's ring again.
    CaughtUp(Revision),
    /// The store no longer has the history either (compacted).
    Gone,
    ClientGone,
}

/// `{"type":"<ty>","object":<json>}\n` without re-encoding the object.
pub fn frame_bytes(ty: &str, object: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(object.len() + 32);
    b.extend_from_slice(b"{\"type\":\"");
    b.extend_from_slice(ty.as_bytes());
    b.extend_from_slice(b"\",\"object\":");
    b.extend_from_slice(object);
    b.extend_from_slice(b"}\n");
    Bytes::from(b)
}
