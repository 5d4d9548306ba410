//! `GarbageCollector`: deletes objects whose owners are gone, and carries out the
//! foreground and orphan propagation policies, as upstream's garbage collector does.
//!
//! It watches the metadata of every kind the apiserver serves that can be listed,
//! watched and deleted (events excepted) and keeps the owner → dependent [`graph`].
//! Graph changes queue two kinds of work, by UID:
//! - *attempt to delete*: an object whose owners may be gone. Its owner references are
//!   sorted into solid (the owner exists), dangling (gone, or the name now belongs to
//!   another UID) and waiting (the owner is being deleted in the foreground). With a solid
//!   owner left, dangling and waiting references are removed; otherwise the object is
//!   deleted — in the foreground if an owner waits for it and it has dependents itself,
//!   else with the policy its own finalizers ask for. An object deleting its dependents
//!   loses its `foregroundDeletion` finalizer once no dependent with
//!   `blockOwnerDeletion` is left.
//! - *attempt to orphan*: an object with the `orphan` finalizer: its dependents' references
//!   to it are removed, then the finalizer.
//!
//! "Gone" is never concluded from a cache: an owner missing from the graph is looked up
//! live, and every decision starts from a live read of the object itself. Work starts
//! only once every watch has listed, so orphaning never misses a dependent that the
//! graph had not seen yet.

pub mod graph;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::serde_json::json;
use krust_api::sync::Unpoisoned;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams,
    Preconditions, PropagationPolicy,
};
use kube::discovery::{Discovery, Scope, verbs};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::oneshot;

use crate::Error;
use crate::owner::release_patch;
use graph::{Deletion, FOREGROUND, Graph, Identity, ORPHAN, Uid, Work};
use krust_client::is_status;
use krust_client::queue::WorkQueue;

/// Resources the collector leaves alone, as upstream does: events come and go in bulk
/// and never own anything.
const IGNORED: &[(&str, &str)] = &[("", "events"), ("events.k8s.io", "events")];

/// How many confirmed-gone UIDs to remember before starting afresh (a UID is never
/// reused, so a remembered verdict never goes stale; the bound only caps memory).
const ABSENT_MEMORY: usize = 50_000;

/// How long to wait before asking for discovery again after it failed.
const DISCOVERY_RETRY: Duration = Duration::from_secs(2);

/// The kinds the apiserver serves: how to reach each, by `apiVersion` and kind.
struct Resources {
    by_kind: HashMap<(String, String), (ApiResource, bool)>,
    watched: Vec<ApiResource>,
}

impl Resources {
    async fn discover(client: &Client) -> Result<Self, kube::Error> {
        let discovery = Discovery::new(client.clone()).run().await?;
        let mut by_kind = HashMap::new();
        let mut watched = Vec::new();
        for group in discovery.groups() {
            for version in group.versions() {
                for (ar, caps) in group.versioned_resources(version) {
                    by_kind.insert(
                        (ar.api_version.clone(), ar.kind.clone()),
                        (ar, caps.scope == Scope::Namespaced),
                    );
                }
            }
            for (ar, caps) in group.recommended_resources() {
                let ignored = IGNORED.contains(&(ar.group.as_str(), ar.plural.as_str()));
                if !ignored
                    && caps.supports_operation(verbs::LIST)
                    && caps.supports_operation(verbs::WATCH)
                    && caps.supports_operation(verbs::DELETE)
                {
                    watched.push(ar);
                }
            }
        }
        Ok(Resources { by_kind, watched })
    }
}

/// Where an owner reference points, as far as the collector can tell.
#[derive(Debug, PartialEq, Eq)]
enum OwnerState {
    Absent,
    Present(Deletion),
}

pub struct GarbageCollector {
    client: Client,
    /// What discovery last said: kinds come and go with CustomResourceDefinitions.
    resources: Mutex<Resources>,
    /// The running metadata watch of each watched kind, by `apiVersion` and plural.
    watches: Mutex<HashMap<(String, String), tokio::task::AbortHandle>>,
    graph: Mutex<Graph>,
    deletes: Arc<WorkQueue>,
    orphans: Arc<WorkQueue>,
    absent: Mutex<HashSet<Uid>>,
}

impl GarbageCollector {
    /// Discovers the served kinds (retrying until the apiserver answers), watches them,
    /// and once every watch has listed runs `workers` loops on each work queue
    /// (upstream's `--concurrent-gc-syncs`, 20). Never returns.
    pub async fn run(client: Client, workers: usize) {
        let resources = loop {
            match Resources::discover(&client).await {
                Ok(r) => break r,
                Err(err) => {
                    tracing::warn!(error = %err, "garbage collector: discovery failed; retrying");
                    tokio::time::sleep(DISCOVERY_RETRY).await;
                }
            }
        };
        let gc = Arc::new(GarbageCollector {
            client,
            resources: Mutex::new(Resources {
                by_kind: resources.by_kind,
                watched: Vec::new(),
            }),
            watches: Mutex::new(HashMap::new()),
            graph: Mutex::new(Graph::default()),
            deletes: WorkQueue::new("garbagecollector-delete"),
            orphans: WorkQueue::new("garbagecollector-orphan"),
            absent: Mutex::new(HashSet::new()),
        });
        let mut tasks = tokio::task::JoinSet::new();
        let kinds = resources.watched.len();
        let synced = gc.start_watches(resources.watched);
        futures::future::join_all(synced).await;
        tracing::info!(
            kinds,
            objects = gc.graph.locked().len(),
            "garbage collector synced"
        );
        tasks.spawn(gc.clone().follow_definitions());
        let this = gc.clone();
        tasks.spawn(gc.deletes.clone().run(workers, move |uid| {
            let this = this.clone();
            async move { this.attempt_to_delete(&uid).await }
        }));
        let this = gc.clone();
        tasks.spawn(gc.orphans.clone().run(workers, move |uid| {
            let this = this.clone();
            async move { this.attempt_to_orphan(&uid).await }
        }));
        while tasks.join_next().await.is_some() {}
    }

    /// Watches the kinds not watched yet; returns a receiver per new watch that fires
    /// once it has listed.
    fn start_watches(self: &Arc<Self>, kinds: Vec<ApiResource>) -> Vec<oneshot::Receiver<()>> {
        let mut watches = self.watches.locked();
        let mut synced = Vec::new();
        for ar in kinds {
            let key = (ar.api_version.clone(), ar.plural.clone());
            if watches.contains_key(&key) {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            let task = tokio::spawn(self.clone().watch(ar, tx));
            watches.insert(key, task.abort_handle());
            synced.push(rx);
        }
        synced
    }

    /// Discovers again whenever a CustomResourceDefinition changes, so that custom kinds
    /// are collected from when they are served, and their watches stop when they are
    /// not (upstream's collector resyncs its monitors from discovery the same way).
    async fn follow_definitions(self: Arc<Self>) {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let api: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(self.client.clone());
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            if matches!(event, Ok(Event::Init | Event::InitApply(_))) {
                continue;
            }
            match Resources::discover(&self.client).await {
                Ok(found) => self.resync(found),
                Err(err) => tracing::warn!(error = %err, "garbage collector: discovery failed"),
            }
        }
    }

    fn resync(self: &Arc<Self>, found: Resources) {
        let served: HashSet<(String, String)> = found
            .watched
            .iter()
            .map(|ar| (ar.api_version.clone(), ar.plural.clone()))
            .collect();
        self.watches.locked().retain(|key, task| {
            let keep = served.contains(key);
            if !keep {
                task.abort();
            }
            keep
        });
        self.resources.locked().by_kind = found.by_kind;
        // New kinds need not have listed before work goes on: nothing can own them yet.
        drop(self.start_watches(found.watched));
    }

    /// Feeds one kind's metadata watch into the graph. A re-list forgets the objects
    /// that vanished while the watch was down.
    async fn watch(self: Arc<Self>, ar: ApiResource, synced: oneshot::Sender<()>) {
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(self.client.clone(), &ar);
        let mut stream = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut synced = Some(synced);
        let mut relisted: HashSet<String> = HashSet::new();
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(err) => {
                    tracing::warn!(kind = %ar.kind, error = %err, "garbage collector: watch failed; retrying");
                    continue;
                }
            };
            match event {
                Event::Apply(obj) => self.observe(&ar, &obj.metadata),
                Event::Delete(obj) => self.forget(obj.metadata.uid.as_deref().unwrap_or_default()),
                Event::Init => relisted.clear(),
                Event::InitApply(obj) => {
                    relisted.extend(obj.metadata.uid.clone());
                    self.observe(&ar, &obj.metadata);
                }
                Event::InitDone => {
                    let known = self.graph.locked().observed_of(&ar.api_version, &ar.kind);
                    for uid in known.iter().filter(|u| !relisted.contains(*u)) {
                        self.forget(uid);
                    }
                    relisted = HashSet::new();
                    if let Some(tx) = synced.take() {
                        let _ = tx.send(());
                    }
                }
            }
        }
    }

    fn observe(&self, ar: &ApiResource, meta: &ObjectMeta) {
        let work = self.graph.locked().observe(&ar.api_version, &ar.kind, meta);
        self.enqueue(work);
    }

    fn forget(&self, uid: &str) {
        let work = self.graph.locked().forget(uid);
        self.enqueue(work);
    }

    fn enqueue(&self, work: Vec<Work>) {
        for w in work {
            match w {
                Work::AttemptToDelete(uid) => self.deletes.add(uid),
                Work::AttemptToOrphan(uid) => self.orphans.add(uid),
            }
        }
    }

    /// The API of an object's kind, in its namespace if the kind is namespaced.
    fn api(&self, identity: &Identity) -> Result<Api<DynamicObject>, Error> {
        let key = (identity.api_version.to_string(), identity.kind.to_string());
        let Some((ar, namespaced)) = self.resources.locked().by_kind.get(&key).cloned() else {
            return Err(Error::InvalidSpec {
                object: identity.to_string(),
                reason: "the apiserver serves no such kind".into(),
            });
        };
        Ok(match (&identity.namespace, namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        })
    }

    /// The object's current metadata, or `None` if it is gone (deleted, or its name now
    /// belongs to another UID).
    async fn live(&self, identity: &Identity) -> Result<Option<ObjectMeta>, Error> {
        if self.absent.locked().contains(&*identity.uid) {
            return Ok(None);
        }
        let found = self
            .api(identity)?
            .get_metadata_opt(&identity.name)
            .await
            .map_err(|e| Error::api("getting", identity.to_string(), e))?;
        match found {
            Some(obj) if obj.metadata.uid.as_deref() == Some(&*identity.uid) => {
                Ok(Some(obj.metadata))
            }
            _ => {
                let mut absent = self.absent.locked();
                if absent.len() >= ABSENT_MEMORY {
                    absent.clear();
                }
                absent.insert(identity.uid.clone());
                Ok(None)
            }
        }
    }

    /// An owner reference of an object in `namespace`: the graph answers for owners it
    /// has seen (their deletion will queue this object again); others are looked up.
    async fn owner_state(
        &self,
        namespace: Option<&str>,
        owner: &OwnerReference,
    ) -> Result<OwnerState, Error> {
        let seen = self
            .graph
            .locked()
            .node(&owner.uid)
            .filter(|n| n.observed)
            .map(|n| n.deletion);
        if let Some(deletion) = seen {
            return Ok(OwnerState::Present(deletion));
        }
        let identity = Identity {
            api_version: owner.api_version.as_str().into(),
            kind: owner.kind.as_str().into(),
            namespace: namespace.map(Into::into),
            name: owner.name.as_str().into(),
            uid: owner.uid.as_str().into(),
        };
        Ok(match self.live(&identity).await? {
            Some(meta) => OwnerState::Present(Deletion::of(&meta)),
            None => OwnerState::Absent,
        })
    }

    async fn attempt_to_delete(&self, uid: &str) -> Result<Option<Duration>, Error> {
        let node = self
            .graph
            .locked()
            .node(uid)
            .map(|n| (n.identity.clone(), n.observed));
        let Some((identity, observed)) = node else {
            return Ok(None);
        };
        let Some(latest) = self.live(&identity).await? else {
            // Gone: for a virtual node, its dependents now have a dangling reference.
            tracing::debug!(object = %identity, observed, "garbage collector: object is gone");
            self.forget(uid);
            return Ok(None);
        };
        if !observed {
            // It exists; its watch will report it.
            return Ok(None);
        }
        match Deletion::of(&latest) {
            Deletion::DeletingDependents => {
                return self.finish_foreground(&identity, &latest).await;
            }
            _ if latest.deletion_timestamp.is_some() => return Ok(None),
            _ => {}
        }
        let owners = latest.owner_references.clone().unwrap_or_default();
        if owners.is_empty() {
            return Ok(None);
        }
        let (mut solid, mut dangling, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
        for owner in &owners {
            match self
                .owner_state(identity.namespace.as_deref(), owner)
                .await?
            {
                OwnerState::Absent => dangling.push(owner.uid.as_str()),
                OwnerState::Present(Deletion::DeletingDependents) => {
                    waiting.push(owner.uid.as_str())
                }
                OwnerState::Present(_) => solid.push(owner.uid.as_str()),
            }
        }
        if !solid.is_empty() {
            if dangling.is_empty() && waiting.is_empty() {
                return Ok(None);
            }
            // Keep the object for its live owners; a foreground deletion must not wait
            // for it, and dangling references must not linger.
            let released: Vec<&str> = dangling.iter().chain(&waiting).copied().collect();
            tracing::info!(object = %identity, ?released, "garbage collector: removing owner references");
            let patch = release_patch(&latest, &released);
            self.merge_patch(&identity, &patch, "removing owner references of")
                .await?;
            return Ok(None);
        }
        let has_dependents = self
            .graph
            .locked()
            .node(uid)
            .is_some_and(|n| !n.dependents.is_empty());
        let has = |f: &str| latest.finalizers.iter().flatten().any(|x| x == f);
        let policy = if !waiting.is_empty() && has_dependents {
            PropagationPolicy::Foreground
        } else if has(ORPHAN) {
            PropagationPolicy::Orphan
        } else if has(FOREGROUND) {
            PropagationPolicy::Foreground
        } else {
            PropagationPolicy::Background
        };
        tracing::info!(object = %identity, ?policy, "garbage collector: deleting object whose owners are gone");
        self.delete(&identity, policy).await
    }

    /// An object deleting its dependents: done once none blocks it, else make sure each
    /// blocking dependent is on its way out.
    async fn finish_foreground(
        &self,
        identity: &Identity,
        latest: &ObjectMeta,
    ) -> Result<Option<Duration>, Error> {
        let (blocking, waiting_on) = {
            let graph = self.graph.locked();
            let blocking = graph.blocking_dependents(&identity.uid);
            // Dependents deleting their own dependents are on their way already.
            let waiting_on: Vec<String> = blocking
                .iter()
                .filter(|d| {
                    graph
                        .node(d)
                        .is_some_and(|n| n.deletion != Deletion::DeletingDependents)
                })
                .cloned()
                .collect();
            (blocking, waiting_on)
        };
        if blocking.is_empty() {
            return self.remove_finalizer(identity, latest, FOREGROUND).await;
        }
        for dep in waiting_on {
            self.deletes.add(dep);
        }
        Ok(None)
    }

    /// A merge patch; an object that is gone needs none.
    async fn merge_patch(
        &self,
        identity: &Identity,
        patch: &k8s_openapi::serde_json::Value,
        action: &'static str,
    ) -> Result<(), Error> {
        match self
            .api(identity)?
            .patch(
                &identity.name,
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(Error::api(action, identity.to_string(), e)),
        }
    }

    async fn delete(
        &self,
        identity: &Identity,
        policy: PropagationPolicy,
    ) -> Result<Option<Duration>, Error> {
        let params = DeleteParams {
            propagation_policy: Some(policy),
            preconditions: Some(Preconditions {
                uid: Some(identity.uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api(identity)?.delete(&identity.name, &params).await {
            Ok(_) => Ok(None),
            // Gone already, or the name belongs to a new object now.
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(None),
            Err(e) => Err(Error::api("deleting", identity.to_string(), e)),
        }
    }

    /// Removes `finalizer` (compare-and-swap on the resourceVersion read); the apiserver
    /// deletes the object when its last finalizer goes.
    async fn remove_finalizer(
        &self,
        identity: &Identity,
        latest: &ObjectMeta,
        finalizer: &str,
    ) -> Result<Option<Duration>, Error> {
        let rest: Vec<&String> = latest
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != finalizer)
            .collect();
        let patch =
            json!({"metadata": {"finalizers": rest, "resourceVersion": latest.resource_version}});
        tracing::info!(object = %identity, finalizer, "garbage collector: removing finalizer");
        self.merge_patch(identity, &patch, "removing finalizer of")
            .await?;
        Ok(None)
    }

    async fn attempt_to_orphan(&self, uid: &str) -> Result<Option<Duration>, Error> {
        let node = {
            let graph = self.graph.locked();
            graph.node(uid).map(|n| {
                let dependents: Vec<Identity> = n
                    .dependents
                    .iter()
                    .filter_map(|d| graph.node(d).map(|d| d.identity.clone()))
                    .collect();
                (n.identity.clone(), dependents)
            })
        };
        let Some((identity, dependents)) = node else {
            return Ok(None);
        };
        let Some(latest) = self.live(&identity).await? else {
            self.forget(uid);
            return Ok(None);
        };
        if Deletion::of(&latest) != Deletion::Orphaning {
            return Ok(None);
        }
        for dep in &dependents {
            let Some(meta) = self.live(dep).await? else {
                continue;
            };
            if !meta.owner_references.iter().flatten().any(|r| r.uid == uid) {
                continue;
            }
            let patch = release_patch(&meta, &[uid]);
            self.merge_patch(dep, &patch, "orphaning").await?;
        }
        tracing::info!(object = %identity, dependents = dependents.len(), "garbage collector: dependents orphaned");
        self.remove_finalizer(&identity, &latest, ORPHAN).await
    }
}
