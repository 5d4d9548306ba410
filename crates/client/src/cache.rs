//! `Cache<K>`: an informer's cache of one kind, read by components and written only by
//! the informer.
//!
//! Objects are kept once, behind an `Arc`, in a table that hashes them by their own
//! namespace and name: nothing is copied into a separate key (kube-rs's reflector store
//! keys each object with copies of its name, namespace, resourceVersion and UID, which
//! for tens of thousands of pods is as much as the cached pods themselves).

use std::fmt::Debug;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, RwLock};

use hashbrown::HashTable;
use k8s_openapi::serde::de::DeserializeOwned;
use krust_api::sync::UnpoisonedRw;
use kube::Resource;
use tokio::sync::watch;

/// The kinds that travel on a watch as themselves.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}
impl<K> Watched for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// What an informer caches: the object a watch decodes ([`Cached::Wire`]), or a compact
/// form of it made once per event.
pub trait Cached: Debug + Send + Sync + 'static {
    type Wire: Watched;
    fn from_wire(wire: Self::Wire) -> Self;
    fn namespace(&self) -> Option<&str>;
    fn name(&self) -> &str;
}

impl<K: Watched> Cached for K {
    type Wire = K;

    fn from_wire(wire: K) -> K {
        wire
    }
    fn namespace(&self) -> Option<&str> {
        self.meta().namespace.as_deref()
    }
    fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }
}

/// The objects of one kind by namespace and name.
pub struct Table<K> {
    objects: HashTable<Arc<K>>,
    hasher: RandomState,
}

impl<K: Cached> Table<K> {
    pub fn new() -> Self {
        Table {
            objects: HashTable::new(),
            hasher: RandomState::new(),
        }
    }

    fn hash(&self, namespace: Option<&str>, name: &str) -> u64 {
        self.hasher.hash_one((namespace, name))
    }

    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<&Arc<K>> {
        let hash = self.hash(namespace, name);
        self.objects
            .find(hash, |o| o.namespace() == namespace && o.name() == name)
    }

    /// Stores `obj`, returning the version it replaces.
    pub fn insert(&mut self, obj: Arc<K>) -> Option<Arc<K>> {
        let hash = self.hash(obj.namespace(), obj.name());
        let hasher = &self.hasher;
        match self.objects.entry(
            hash,
            |o| o.namespace() == obj.namespace() && o.name() == obj.name(),
            |o| hasher.hash_one((o.namespace(), o.name())),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut e) => {
                Some(std::mem::replace(e.get_mut(), obj))
            }
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(obj);
                None
            }
        }
    }

    /// Removes the object with `obj`'s namespace and name, returning it.
    pub fn remove(&mut self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let hash = self.hash(namespace, name);
        self.objects
            .find_entry(hash, |o| o.namespace() == namespace && o.name() == name)
            .ok()
            .map(|e| e.remove().0)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<K>> {
        self.objects.iter()
    }

    pub fn into_values(self) -> impl Iterator<Item = Arc<K>> {
        self.objects.into_iter()
    }
}

impl<K: Cached> Default for Table<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// A read handle on an informer's cache; clones share it.
pub struct Cache<K> {
    table: Arc<RwLock<Table<K>>>,
    ready: watch::Receiver<bool>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Cache {
            table: self.table.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<K: Cached> Cache<K> {
    /// The cached object, `namespace` `None` for a cluster-scoped kind.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        self.table.read_locked().get(namespace, name).cloned()
    }

    /// Every cached object.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.state_filter(|_| true)
    }

    /// The cached objects for which `keep` holds.
    pub fn state_filter(&self, keep: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        let table = self.table.read_locked();
        table.iter().filter(|o| keep(o)).cloned().collect()
    }

    /// Whether the cache holds a complete list.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Resolves once the cache holds a complete list.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.clone();
        // The sender lives as long as the informer; if it is gone nothing will fill
        // the cache, and waiting on is what callers want anyway.
        if ready.wait_for(|r| *r).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The informer's side of a [`Cache`].
pub struct Writer<K> {
    table: Arc<RwLock<Table<K>>>,
    ready: watch::Sender<bool>,
}

impl<K: Cached> Writer<K> {
    pub fn new() -> (Cache<K>, Writer<K>) {
        let table = Arc::new(RwLock::new(Table::new()));
        let (ready, rx) = watch::channel(false);
        (
            Cache {
                table: table.clone(),
                ready: rx,
            },
            Writer { table, ready },
        )
    }

    /// Stores `obj`, returning the version it replaces.
    pub fn apply(&self, obj: Arc<K>) -> Option<Arc<K>> {
        self.table.write_locked().insert(obj)
    }

    /// Removes `obj`, returning the cached version.
    pub fn delete(&self, obj: &K) -> Option<Arc<K>> {
        self.table
            .write_locked()
            .remove(obj.namespace(), obj.name())
    }

    /// Replaces the whole cache with a fresh list (marking it ready), returning the
    /// previous contents.
    pub fn replace(&self, fresh: Table<K>) -> Table<K> {
        let old = std::mem::replace(&mut *self.table.write_locked(), fresh);
        self.ready.send_replace(true);
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn cm(ns: Option<&str>, name: &str, data: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: ns.map(Into::into),
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some([("k".to_string(), data.to_string())].into()),
            ..Default::default()
        })
    }

    fn data(cm: &ConfigMap) -> &str {
        &cm.data.as_ref().unwrap()["k"]
    }

    #[test]
    fn objects_are_found_by_namespace_and_name_and_replaced_in_place() {
        let mut t = Table::new();
        assert!(t.insert(cm(Some("a"), "x", "1")).is_none());
        assert!(t.insert(cm(Some("b"), "x", "2")).is_none());
        assert!(t.insert(cm(None, "x", "3")).is_none());
        assert_eq!(t.len(), 3);
        assert_eq!(data(t.get(Some("a"), "x").unwrap()), "1");
        assert_eq!(data(t.get(None, "x").unwrap()), "3");
        assert!(t.get(Some("c"), "x").is_none());
        let old = t.insert(cm(Some("a"), "x", "4")).unwrap();
        assert_eq!(data(&old), "1");
        assert_eq!(data(t.get(Some("a"), "x").unwrap()), "4");
        assert_eq!(t.len(), 3);
        assert_eq!(data(&t.remove(Some("b"), "x").unwrap()), "2");
        assert!(t.remove(Some("b"), "x").is_none());
        assert_eq!(t.len(), 2);
    }

    #[tokio::test]
    async fn a_cache_is_ready_once_a_list_replaced_it() {
        let (cache, writer) = Writer::<ConfigMap>::new();
        writer.apply(cm(Some("a"), "early", "1"));
        let waiting = tokio::spawn({
            let cache = cache.clone();
            async move { cache.wait_until_ready().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let mut fresh = Table::new();
        fresh.insert(cm(Some("a"), "listed", "2"));
        let old = writer.replace(fresh);
        assert_eq!(old.len(), 1);
        waiting.await.unwrap();
        assert!(cache.get(Some("a"), "early").is_none());
        assert_eq!(cache.state().len(), 1);
    }
}
