//! `Informer<K>`: one list+watch of a kind (kube-runtime's `watcher`, which resumes and
//! re-lists with backoff), one [`Store`](crate::cache::Store) fed from it, and the event handlers of
//! every controller that watches the kind. `SharedInformers` hands out one informer per
//! kind, so the ReplicaSet and Deployment controllers share a single ReplicaSet cache
//! and watch, like client-go's shared informer factory.
//!
//! Handlers are called after the store has been updated and see the previous version of
//! an object, so they can tell what changed (a pod's labels, its controller). A re-list
//! (after a watch expired) is applied atomically, and objects that vanished during the
//! gap are reported as deleted, so controllers stay level-triggered across watch breaks.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::cache::{Cached, Store, Table, Watched, Writer};

/// What a controller does when an object of a watched kind changes. Handlers must be
/// quick (they run on the informer's task): enqueue keys, note expectations.
pub trait EventHandler<K>: Send + Sync {
    /// `old` is the cached version before this change, `None` for a new object.
    fn on_apply(&self, old: Option<&K>, new: &K);
    fn on_delete(&self, obj: &K);
}

/// One kind's watch, cache and handlers.
pub struct Informer<K: Cached> {
    api: Api<K::Wire>,
    store: Store<K>,
    writer: Mutex<Option<Writer<K>>>,
    handlers: Mutex<Vec<Arc<dyn EventHandler<K>>>>,
}

impl<K: Cached> Informer<K> {
    fn new(api: Api<K::Wire>) -> Arc<Self> {
        let (store, writer) = Writer::new();
        Arc::new(Informer {
            api,
            store,
            writer: Mutex::new(Some(writer)),
            handlers: Mutex::new(Vec::new()),
        })
    }

    /// The cache. Reads never go to the apiserver.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Registers a handler; call before the informers start.
    pub fn add_handler(&self, handler: Arc<dyn EventHandler<K>>) {
        self.handlers.lock().expect("handlers").push(handler);
    }

    async fn run(self: Arc<Self>) {
        let Some(writer) = self.writer.lock().expect("writer").take() else {
            return;
        };
        let handlers: Vec<_> = self.handlers.lock().expect("handlers").clone();
        let mut stream = watcher(self.api.clone()).default_backoff().boxed();
        // A re-list fills a fresh table, swapped in whole once the list is complete.
        let mut relisted = Table::new();
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(err) => {
                    tracing::warn!(kind = %<K::Wire as kube::Resource>::kind(&()), error = %err, "watch failed; retrying");
                    continue;
                }
            };
            match event {
                Event::Apply(obj) => {
                    let obj = Arc::new(K::from_wire(obj));
                    let old = writer.apply(obj.clone());
                    handlers
                        .iter()
                        .for_each(|h| h.on_apply(old.as_deref(), &obj));
                }
                Event::Delete(obj) => {
                    let obj = K::from_wire(obj);
                    writer.delete(&obj);
                    handlers.iter().for_each(|h| h.on_delete(&obj));
                }
                Event::Init => relisted = Table::new(),
                Event::InitApply(obj) => {
                    relisted.insert(Arc::new(K::from_wire(obj)));
                }
                Event::InitDone => {
                    let fresh: Vec<Arc<K>> = relisted.iter().cloned().collect();
                    let mut before = writer.replace(std::mem::take(&mut relisted));
                    for obj in fresh {
                        let old = before.remove(obj.namespace(), obj.name());
                        handlers
                            .iter()
                            .for_each(|h| h.on_apply(old.as_deref(), &obj));
                    }
                    for gone in before.into_values() {
                        handlers.iter().for_each(|h| h.on_delete(&gone));
                    }
                }
            }
        }
    }
}

/// The list+watch of a kind, without managedFields: no controller reads them, and they
/// are often the larger part of an object (kube-controller-manager drops them too).
/// Pods, by far the most numerous, are cached as [`CachedPod`](crate::pods::CachedPod)s.
fn watcher<K: Watched>(api: Api<K>) -> impl futures::Stream<Item = watcher::Result<Event<K>>> {
    watcher::watcher(api, watcher::Config::default()).modify(|obj| {
        obj.meta_mut().managed_fields = None;
    })
}

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One informer per kind, created on first use and started together.
pub struct SharedInformers {
    client: Client,
    informers: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    pending: Mutex<Vec<(Task, Task)>>,
}

impl SharedInformers {
    pub fn new(client: Client) -> Self {
        SharedInformers {
            client,
            informers: Mutex::new(HashMap::new()),
            pending: Mutex::new(Vec::new()),
        }
    }

    /// The informer of kind `K` across all namespaces.
    pub fn get<K: Cached>(&self) -> Arc<Informer<K>> {
        let mut informers = self.informers.lock().expect("informers");
        if let Some(existing) = informers.get(&TypeId::of::<K>()) {
            return existing
                .clone()
                .downcast::<Informer<K>>()
                .expect("informer type");
        }
        let informer = Informer::<K>::new(Api::all(self.client.clone()));
        informers.insert(TypeId::of::<K>(), informer.clone());
        let store = informer.store();
        let synced: Task = Box::pin(async move { store.wait_until_ready().await });
        self.pending
            .lock()
            .expect("pending")
            .push((Box::pin(informer.clone().run()), synced));
        informer
    }

    /// Starts every informer created so far on `tasks` and waits until all caches hold a
    /// complete list.
    pub async fn start(&self, tasks: &mut tokio::task::JoinSet<()>) {
        let pending: Vec<_> = std::mem::take(&mut *self.pending.lock().expect("pending"));
        let mut synced = Vec::new();
        for (run, ready) in pending {
            tasks.spawn(run);
            synced.push(ready);
        }
        futures::future::join_all(synced).await;
    }
}
