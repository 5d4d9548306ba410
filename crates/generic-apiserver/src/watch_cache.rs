//! The watch cache: every stored object held in memory, fed by ONE store watch, so that
//! lists, gets and any number of watchers are served without touching the store.
//!
//! Each resource's objects live in a [`ResourceCache`]: the current objects (already
//! serialised with their `resourceVersion`, so a GET is a memcpy) plus a bounded ring of
//! recent events. Watchers keep a cursor into the ring and wake on a revision channel;
//! a watcher that falls behind the ring's start gets 410 Gone instead of slowing writers,
//! as upstream's cacher does.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use futures::StreamExt;
use krust_api::sync::UnpoisonedRw;
use krust_store::{Event, KeyValue, RangeRequest, Revision, Store, StoreError};
use serde_json::Value;
use tokio::sync::watch;

/// The most events each resource keeps for watch resume.
const HISTORY_CAPACITY: usize = 20_000;
/// Events younger than this stay in the ring; older ones leave once it holds more than
/// [`HISTORY_MIN`]. Upstream sizes its watch cache to cover 75 s of events; a watch
/// resuming from further back is served from the store's history here (until
/// compaction), so the ring need not hold hours of a busy resource's writes — with
/// 20,000 events of every kind kept, a steady churn grew the apiserver's memory for
/// hours before the rings were full (the soak in docs/benchmarks.md).
const HISTORY_WINDOW: std::time::Duration = std::time::Duration::from_secs(150);
const HISTORY_MIN: usize = 100;

/// One object as the cache holds it.
#[derive(Debug)]
pub struct CachedObject {
    pub namespace: String,
    pub name: String,
    pub revision: Revision,
    /// The object as JSON with `metadata.resourceVersion` set.
    pub json: Bytes,
    pub labels: BTreeMap<String, String>,
    /// Values of the kind's selectable fields (see `rest::strategy::Strategy::fields`).
    pub fields: Vec<(&'static str, String)>,
}

impl CachedObject {
    pub fn field(&self, name: &str) -> Option<String> {
        match name {
            "metadata.name" => Some(self.name.clone()),
            "metadata.namespace" => Some(self.namespace.clone()),
            _ => self
                .fields
                .iter()
                .find(|(f, _)| *f == name)
                .map(|(_, v)| v.clone()),
        }
    }

    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// A change to one object. For a delete, `object` is the last state with the delete's
/// revision as its resourceVersion.
#[derive(Debug)]
pub struct CacheEvent {
    pub kind: EventType,
    pub object: Arc<CachedObject>,
    pub prev: Option<Arc<CachedObject>>,
    /// The JSON watch frame, encoded once and shared by every watcher that sees the
    /// event as it is.
    frame: std::sync::OnceLock<Bytes>,
}

impl CacheEvent {
    pub fn new(
        kind: EventType,
        object: Arc<CachedObject>,
        prev: Option<Arc<CachedObject>>,
    ) -> Self {
        CacheEvent {
            kind,
            object,
            prev,
            frame: Default::default(),
        }
    }

    /// The cache event a store event of this resource means, for watchers replaying
    /// history the cache no longer holds.
    pub fn from_store(cache: &ResourceCache, event: &Event) -> Option<CacheEvent> {
        match event {
            Event::Put { kv, prev } => {
                let object = Arc::new(cache.decode_stored(kv)?);
                let prev = prev
                    .as_ref()
                    .and_then(|p| cache.decode_stored(p))
                    .map(Arc::new);
                let kind = if prev.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                Some(CacheEvent::new(kind, object, prev))
            }
            Event::Delete { prev, revision } => {
                let object = Arc::new(cache.cached(prev, *revision)?);
                let before = cache.decode_stored(prev).map(Arc::new);
                Some(CacheEvent::new(EventType::Deleted, object, before))
            }
        }
    }

    pub fn revision(&self) -> Revision {
        self.object.revision
    }

    pub fn json_frame(&self) -> &Bytes {
        self.frame
            .get_or_init(|| crate::rest::frame_bytes(self.kind.as_str(), &self.object.json))
    }
}

/// Extracts the selectable fields of a kind's objects (its strategy).
pub type Indexer = &'static dyn crate::rest::strategy::Strategy;

struct State {
    objects: BTreeMap<String, Arc<CachedObject>>,
    /// Recent events, oldest first, each with when it was added.
    history: VecDeque<(std::time::Instant, Arc<CacheEvent>)>,
    /// Watches resuming from a revision at or after this one can be served from `history`.
    history_start: Revision,
}

impl State {
    /// Drops the events the ring no longer keeps before one is added at `now`: beyond
    /// its capacity, and those older than the window once it holds more than the minimum.
    fn make_room(&mut self, now: std::time::Instant) {
        while self.history.len() >= HISTORY_CAPACITY
            || (self.history.len() > HISTORY_MIN
                && self
                    .history
                    .front()
                    .is_some_and(|(added, _)| now.duration_since(*added) > HISTORY_WINDOW))
        {
            let Some((_, oldest)) = self.history.pop_front() else {
                break;
            };
            self.history_start = oldest.revision();
        }
    }
}

/// The cache of one storage prefix.
pub struct ResourceCache {
    prefix: String,
    indexer: Indexer,
    state: RwLock<State>,
    /// The revision of this resource's last event; set while the state lock is held.
    revision: watch::Sender<Revision>,
    /// The store revision all caches have caught up with.
    global: watch::Receiver<Revision>,
}

/// Why a watch cannot be served from the cache.
#[derive(Debug, thiserror::Error)]
#[error("too old resource version: {requested} ({oldest})")]
pub struct TooOld {
    pub requested: Revision,
    pub oldest: Revision,
}

impl ResourceCache {
    fn new(prefix: String, indexer: Indexer, global: watch::Receiver<Revision>) -> Self {
        let start = *global.borrow();
        ResourceCache {
            global,
            prefix,
            indexer,
            state: RwLock::new(State {
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_start: start,
            }),
            revision: watch::Sender::new(start),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The object under `key`, if present.
    pub fn get(&self, key: &str) -> Option<Arc<CachedObject>> {
        self.read().objects.get(key).cloned()
    }

    /// All objects whose key starts with `prefix`, in key order, with the revision of the
    /// snapshot.
    pub fn list(&self, prefix: &str) -> (Vec<Arc<CachedObject>>, Revision) {
        let state = self.read();
        let items = state
            .objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, o)| o.clone())
            .collect();
        // Under the state lock every event of this resource up to the global revision has
        // been applied (the feeder applies before it publishes), and none after our own
        // revision: the larger of the two is exactly this snapshot's revision.
        let rev = (*self.global.borrow()).max(*self.revision.borrow());
        (items, rev)
    }

    /// Events with revision greater than `after`, or an error when the ring no longer
    /// reaches back that far.
    pub fn events_after(&self, after: Revision) -> Result<Vec<Arc<CacheEvent>>, TooOld> {
        let state = self.read();
        if after < state.history_start {
            return Err(TooOld {
                requested: after,
                oldest: state.history_start,
            });
        }
        let start = state
            .history
            .partition_point(|(_, e)| e.revision() <= after);
        Ok(state
            .history
            .range(start..)
            .map(|(_, e)| e.clone())
            .collect())
    }

    /// A receiver that changes whenever this resource gets a new event.
    pub fn subscribe(&self) -> watch::Receiver<Revision> {
        self.revision.subscribe()
    }

    pub fn revision(&self) -> Revision {
        *self.revision.borrow()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read_locked()
    }

    /// Decodes an object read from the store (for paged lists served by the store).
    pub fn decode_stored(&self, kv: &KeyValue) -> Option<CachedObject> {
        self.cached(kv, kv.mod_revision)
    }

    fn cached(&self, kv: &KeyValue, revision: Revision) -> Option<CachedObject> {
        let mut value: Value = match serde_json::from_slice(&kv.value) {
            Ok(v) => v,
            Err(err) => {
                tracing::error!(key = %kv.key, %err, "undecodable object in store");
                return None;
            }
        };
        let fields = self.indexer.fields(&value);
        let meta = value.get_mut("metadata")?.as_object_mut()?;
        meta.insert(
            "resourceVersion".into(),
            Value::String(revision.to_string()),
        );
        let name = meta.get("name")?.as_str()?.to_string();
        let namespace = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let labels = meta
            .get("labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        // Served as kube-apiserver writes it: in Go's field order.
        krust_apimachinery::protobuf::go_order(&mut value);
        let json = Bytes::from(serde_json::to_vec(&value).ok()?);
        Some(CachedObject {
            namespace,
            name,
            revision,
            json,
            labels,
            fields,
        })
    }

    fn apply(&self, event: &Event) {
        let rev = event.revision();
        let mut state = self.state.write_locked();
        let cache_event = match event {
            Event::Put { kv, .. } => {
                let Some(obj) = self.cached(kv, rev) else {
                    return;
                };
                let obj = Arc::new(obj);
                let prev = state.objects.insert(kv.key.clone(), obj.clone());
                CacheEvent {
                    kind: if prev.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    object: obj,
                    prev,
                    frame: Default::default(),
                }
            }
            Event::Delete { prev, .. } => {
                let old = state.objects.remove(&prev.key);
                let Some(obj) = self.cached(prev, rev) else {
                    return;
                };
                CacheEvent::new(EventType::Deleted, Arc::new(obj), old)
            }
        };
        let now = std::time::Instant::now();
        state.make_room(now);
        state.history.push_back((now, Arc::new(cache_event)));
        self.revision.send_replace(rev);
    }

    fn load(&self, kv: &KeyValue) {
        if let Some(obj) = self.cached(kv, kv.mod_revision) {
            let mut state = self.state.write_locked();
            state.objects.insert(kv.key.clone(), Arc::new(obj));
        }
    }
}

/// Kinds that stored objects add while the apiserver runs (CustomResourceDefinitions
/// add custom resources): the watch cache shows it each such definition as it is
/// stored, before the definition's own event reaches watchers, and keeps a cache for
/// every storage prefix it names — so a new kind's first object always finds its cache.
pub trait DynamicKinds: Send + Sync {
    /// Where the definitions are stored (a prefix ending in `/`).
    fn definitions(&self) -> &'static str;

    /// A definition was stored: the storage prefix and field indexer of the objects
    /// of the kinds it serves now, if it serves any.
    fn observe(&self, definition: &Value) -> Option<(String, Indexer)>;

    /// The definition `name` was deleted.
    fn forget(&self, name: &str);
}

/// All resource caches plus the store watch that feeds them.
pub struct WatchCache {
    /// One cache per storage prefix: the built-in kinds' from the start, a custom
    /// resource's from the event that establishes its definition (so its first object
    /// always finds its cache).
    caches: RwLock<Vec<Arc<ResourceCache>>>,
    /// What adds kinds, kept in step with its definitions' events.
    dynamic: Arc<dyn DynamicKinds>,
    /// The store revision the caches have caught up with.
    revision: watch::Sender<Revision>,
}

impl WatchCache {
    /// Loads every prefix from the store and starts following it. `prefixes` pairs each
    /// storage prefix (ending in `/`) with its field indexer; `dynamic` adds more.
    pub async fn start(
        store: Arc<dyn Store>,
        prefixes: Vec<(String, Indexer)>,
        dynamic: Arc<dyn DynamicKinds>,
    ) -> Result<Arc<Self>, StoreError> {
        let mut revision = 0;
        let mut kvs = Vec::new();
        let mut start_after = None;
        loop {
            let page = store
                .range(RangeRequest {
                    prefix: "/registry/".into(),
                    start_after: start_after.take(),
                    limit: 10_000,
                    revision,
                })
                .await?;
            revision = page.revision;
            start_after = page.kvs.last().map(|kv| kv.key.clone());
            kvs.extend(page.kvs);
            if !page.more {
                break;
            }
        }
        let global = watch::Sender::new(revision);
        let caches: Vec<Arc<ResourceCache>> = prefixes
            .into_iter()
            .map(|(p, idx)| Arc::new(ResourceCache::new(p, idx, global.subscribe())))
            .collect();
        let this = Arc::new(WatchCache {
            caches: RwLock::new(caches),
            dynamic,
            revision: global,
        });
        // Definitions first, so that their objects have caches to load into.
        let definitions = this.dynamic.definitions();
        for kv in kvs.iter().filter(|kv| kv.key.starts_with(definitions)) {
            this.observe_definition(kv);
        }
        for kv in &kvs {
            if let Some(c) = this.cache_for_key(&kv.key) {
                c.load(kv);
            }
        }
        let events = store.watch("/registry/", revision + 1).await?;
        tokio::spawn(this.clone().feed(store, events));
        Ok(this)
    }

    /// Applies the store's events to the caches. A broken watch (an etcd member went
    /// away) is re-established from the next revision, so nothing is missed or repeated;
    /// only history lost to compaction makes the cache untrustworthy.
    async fn feed(self: Arc<Self>, store: Arc<dyn Store>, mut events: krust_store::WatchStream) {
        let mut backoff = std::time::Duration::from_millis(50);
        loop {
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        self.dispatch(&event);
                        backoff = std::time::Duration::from_millis(50);
                    }
                    // The store shut down: so are we.
                    Err(StoreError::Closed) => return,
                    Err(err) => {
                        tracing::warn!(%err, "store watch feeding the watch cache broke; resuming");
                        break;
                    }
                }
            }
            loop {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(2));
                match store.watch("/registry/", self.revision() + 1).await {
                    Ok(stream) => {
                        events = stream;
                        break;
                    }
                    Err(err @ StoreError::Compacted { .. }) => {
                        // Events we never saw are gone: failing loudly beats serving stale
                        // data forever. A supervisor restarts the server, which relists.
                        tracing::error!(%err, "the watch cache fell behind compaction");
                        std::process::exit(1);
                    }
                    Err(StoreError::Closed) => return,
                    Err(err) => tracing::warn!(%err, "re-establishing the store watch"),
                }
            }
        }
    }

    fn dispatch(&self, event: &Event) {
        let rev = event.revision();
        // A definition's kinds are served before watchers of definitions hear of it, so
        // whoever waits for Established finds the kind served.
        let definitions = self.dynamic.definitions();
        if event.key().starts_with(definitions) {
            match event {
                Event::Put { kv, .. } => self.observe_definition(kv),
                Event::Delete { prev, .. } => self.dynamic.forget(&prev.key[definitions.len()..]),
            }
        }
        if let Some(c) = self.cache_for_key(event.key()) {
            c.apply(event);
        }
        self.revision.send_replace(rev);
    }

    /// Serves the kinds of a stored definition, with a cache for their objects.
    fn observe_definition(&self, kv: &KeyValue) {
        let Ok(definition) = serde_json::from_slice::<Value>(&kv.value) else {
            return;
        };
        let Some((prefix, indexer)) = self.dynamic.observe(&definition) else {
            return;
        };
        let mut caches = self.caches.write_locked();
        if !caches.iter().any(|c| c.prefix() == prefix) {
            let global = self.revision.subscribe();
            caches.push(Arc::new(ResourceCache::new(prefix, indexer, global)));
        }
    }

    fn cache_for_key(&self, key: &str) -> Option<Arc<ResourceCache>> {
        self.caches
            .read_locked()
            .iter()
            .find(|c| key.starts_with(c.prefix()))
            .cloned()
    }

    /// The cache that holds keys under `prefix`.
    pub fn cache(&self, prefix: &str) -> Option<Arc<ResourceCache>> {
        self.caches
            .read_locked()
            .iter()
            .find(|c| c.prefix() == prefix)
            .cloned()
    }

    /// The cached object `name` (in `namespace`) of a core/v1 resource (`pods`,
    /// `serviceaccounts`, ...), as admission and connect requests look them up.
    pub fn core_object(&self, plural: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.object(
            krust_api::registry::find("", "v1", plural)?,
            namespace,
            name,
        )
    }

    /// The cached object `name` (in `namespace`) of any built-in resource.
    pub fn object(
        &self,
        info: &krust_api::registry::ResourceInfo,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        self.cache(&info.storage_prefix())?
            .get(&info.storage_key(namespace, name))
            .map(|obj| obj.value())
    }

    pub fn revision(&self) -> Revision {
        *self.revision.borrow()
    }

    /// Waits until the caches reflect every write up to `rev`.
    pub async fn wait_for(&self, rev: Revision) {
        if *self.revision.borrow() >= rev {
            return;
        }
        let mut rx = self.revision.subscribe();
        // The sender lives as long as self, so this only ends when the revision is reached.
        let _ = rx.wait_for(|r| *r >= rev).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn event(revision: Revision) -> Arc<CacheEvent> {
        let object = CachedObject {
            namespace: "default".into(),
            name: format!("o{revision}"),
            revision,
            json: Bytes::from_static(b"{}"),
            labels: BTreeMap::new(),
            fields: Vec::new(),
        };
        Arc::new(CacheEvent::new(EventType::Added, Arc::new(object), None))
    }

    #[test]
    fn the_ring_keeps_a_window_of_events_not_hours_of_them() {
        let start = Instant::now();
        let mut state = State {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_start: 0,
        };
        // 300 events a second apart: at the end, the last 150 s are kept.
        for revision in 1..=300 {
            let now = start + Duration::from_secs(revision as u64);
            state.make_room(now);
            state.history.push_back((now, event(revision)));
        }
        let kept = state.history.len();
        assert!((150..=152).contains(&kept), "{kept} kept");
        let oldest = state.history.front().unwrap().1.revision();
        assert_eq!(
            state.history_start,
            oldest - 1,
            "resumable from the last one dropped"
        );
        // A quiet resource keeps at least the minimum however old.
        state.make_room(start + Duration::from_secs(10_000));
        assert_eq!(state.history.len(), HISTORY_MIN);
    }
}
