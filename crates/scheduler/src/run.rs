//! The scheduler as a component: it watches Nodes, Pods, Namespaces and the storage
//! objects (claims, volumes, classes), keeps the
//! [`Cache`], feeds unscheduled pods of its profiles through the [`SchedulingQueue`],
//! runs one [`Framework`] cycle per pod, and writes the result back through the
//! apiserver:
//! - a fit: the pod is assumed on the node at once (the next cycle sees the room taken)
//!   and `pods/binding` is written in the background; then a `Scheduled` event;
//! - no fit: a `FailedScheduling` event with the FitError message and the
//!   `PodScheduled=False` condition (reason `Unschedulable`); if preemption found
//!   victims, each gets a `DisruptionTarget` condition and is deleted, and the pod's
//!   `status.nominatedNodeName` names the node; the pod waits as unschedulable until a
//!   cluster event (a node added or changed, a pod deleted or finished) moves it back;
//! - a failed binding: the assumption is forgotten and the pod retried after backoff.
//!
//! Pods whose `spec.schedulerName` names no profile are left alone.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Binding, Namespace, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::serde_json::{Value, json};
use krust_api::sync::Unpoisoned;
use krust_client::cache::Watched;
use krust_client::informer::{EventHandler, Informer};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::Semaphore;

use crate::cache::{Cache, occupies};
use crate::config::{ConfigError, SchedulerConfiguration};
use crate::events::{REPORTING_CONTROLLER, Recorder};
use crate::framework::{Framework, PodInfo, PostFilterResult, ScheduleError, Status, Storage};
use crate::metrics::{Metrics, Outcome};
use crate::plugins::volume_binding::{VolumeChoice, volume_choices};
use crate::queue::{QueuedPod, SchedulingQueue, pod_key};

/// How long a pod waits for the claims it binds on its node (upstream's
/// `bindTimeoutSeconds`), and how often it looks.
const VOLUME_BIND_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
enum VolumeBindError {
    #[error(transparent)]
    Write(#[from] kube::Error),
    #[error("timed out waiting for the condition")]
    Timeout,
}

/// Bindings in flight at once.
const MAX_BINDINGS_IN_FLIGHT: usize = 64;
/// How often bound but unconfirmed assumptions are checked for expiry.
const EXPIRY_PERIOD: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("scheduler configuration: {0}")]
    Config(#[from] ConfigError),
}

struct Scheduler {
    client: Client,
    frameworks: Vec<Framework>,
    queue: Arc<SchedulingQueue>,
    cache: Mutex<Cache>,
    events: Recorder,
    bindings: Arc<Semaphore>,
    /// Told of every change to the storage objects (a binding waits for its claims).
    storage_changed: tokio::sync::watch::Sender<()>,
    metrics: Arc<Metrics>,
}

/// Runs the scheduler until the future is dropped. `instance` names this process in
/// its events; `metrics` counts its attempts and shows its queue.
pub async fn run(
    client: Client,
    config: SchedulerConfiguration,
    instance: String,
    metrics: Arc<Metrics>,
) -> Result<(), Error> {
    let frameworks = config.build_frameworks()?;
    let (events, sender) = Recorder::new(client.clone(), instance);
    let scheduler = Arc::new(Scheduler {
        client,
        frameworks,
        queue: SchedulingQueue::new(),
        cache: Mutex::new(Cache::default()),
        events,
        bindings: Arc::new(Semaphore::new(MAX_BINDINGS_IN_FLIGHT)),
        storage_changed: tokio::sync::watch::Sender::new(()),
        metrics,
    });
    scheduler.metrics.watch(&scheduler.queue);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(sender);
    let nodes = informer::<Node>(&scheduler);
    let pods = informer::<Pod>(&scheduler);
    let namespaces = informer::<Namespace>(&scheduler);
    let claims = informer::<PersistentVolumeClaim>(&scheduler);
    let volumes = informer::<PersistentVolume>(&scheduler);
    let classes = informer::<StorageClass>(&scheduler);
    let drivers = informer::<CSIDriver>(&scheduler);
    let capacities = informer::<CSIStorageCapacity>(&scheduler);
    let synced = (
        nodes.cache(),
        pods.cache(),
        namespaces.cache(),
        claims.cache(),
        volumes.cache(),
        classes.cache(),
        (drivers.cache(), capacities.cache()),
    );
    tasks.spawn(nodes.run());
    tasks.spawn(pods.run());
    tasks.spawn(namespaces.run());
    tasks.spawn(claims.run());
    tasks.spawn(volumes.run());
    tasks.spawn(classes.run());
    tasks.spawn(drivers.run());
    tasks.spawn(capacities.run());
    futures::join!(
        synced.0.wait_until_ready(),
        synced.1.wait_until_ready(),
        synced.2.wait_until_ready(),
        synced.3.wait_until_ready(),
        synced.4.wait_until_ready(),
        synced.5.wait_until_ready(),
        synced.6.0.wait_until_ready(),
        synced.6.1.wait_until_ready()
    );
    tracing::info!(
        nodes = scheduler.cache.locked().node_count(),
        queued = scheduler.queue.len(),
        profiles = ?scheduler.frameworks.iter().map(Framework::profile_name).collect::<Vec<_>>(),
        "scheduler caches synced; scheduling"
    );
    let expiry = scheduler.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(EXPIRY_PERIOD);
        loop {
            tick.tick().await;
            expiry.cache.locked().expire(tokio::time::Instant::now());
        }
    });
    tasks.spawn(scheduler.schedule_loop());
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// An informer of every `K` (managedFields dropped) whose events go to the scheduler.
fn informer<K>(scheduler: &Arc<Scheduler>) -> Arc<Informer<K>>
where
    K: Watched,
    Scheduler: EventHandler<K>,
{
    let informer = Informer::new(
        Api::all(scheduler.client.clone()),
        watcher::Config::default(),
    );
    informer.add_handler(scheduler.clone());
    informer
}

/// Nodes go to the cache; any node event may make room for a waiting pod.
impl EventHandler<Node> for Scheduler {
    fn on_apply(&self, _old: Option<&Node>, new: &Arc<Node>) {
        self.cache.locked().upsert_node(new.clone());
        self.queue.move_all_to_active_or_backoff();
    }
    fn on_delete(&self, node: &Arc<Node>) {
        self.cache.locked().remove_node(&node.name_any());
    }
}

impl EventHandler<Pod> for Scheduler {
    fn on_apply(&self, _old: Option<&Pod>, new: &Arc<Pod>) {
        self.on_pod(new.clone());
    }
    fn on_delete(&self, pod: &Arc<Pod>) {
        self.on_pod_deleted(pod);
    }
}

/// Namespace labels, for affinity terms with a namespaceSelector.
impl EventHandler<Namespace> for Scheduler {
    fn on_apply(&self, _old: Option<&Namespace>, ns: &Arc<Namespace>) {
        let labels = ns.labels().clone();
        self.cache
            .locked()
            .snapshot_mut()
            .set_namespace_labels(&ns.name_any(), labels);
    }
    fn on_delete(&self, ns: &Arc<Namespace>) {
        self.cache
            .locked()
            .snapshot_mut()
            .remove_namespace(&ns.name_any());
    }
}

/// Claims, volumes, classes, CSI drivers and capacities go to the snapshot's storage; a
/// change may let a pod waiting for its claim go on.
impl EventHandler<PersistentVolumeClaim> for Scheduler {
    fn on_apply(&self, _old: Option<&PersistentVolumeClaim>, claim: &Arc<PersistentVolumeClaim>) {
        let key = (claim.namespace().unwrap_or_default(), claim.name_any());
        self.change_storage(|s| s.claims.insert(key, claim.clone()));
    }
    fn on_delete(&self, claim: &Arc<PersistentVolumeClaim>) {
        let key = (claim.namespace().unwrap_or_default(), claim.name_any());
        self.change_storage(|s| s.claims.remove(&key));
    }
}

impl EventHandler<PersistentVolume> for Scheduler {
    fn on_apply(&self, _old: Option<&PersistentVolume>, pv: &Arc<PersistentVolume>) {
        self.change_storage(|s| s.volumes.insert(pv.name_any(), pv.clone()));
    }
    fn on_delete(&self, pv: &Arc<PersistentVolume>) {
        self.change_storage(|s| s.volumes.remove(&pv.name_any()));
    }
}

impl EventHandler<StorageClass> for Scheduler {
    fn on_apply(&self, _old: Option<&StorageClass>, class: &Arc<StorageClass>) {
        self.change_storage(|s| s.classes.insert(class.name_any(), class.clone()));
    }
    fn on_delete(&self, class: &Arc<StorageClass>) {
        self.change_storage(|s| s.classes.remove(&class.name_any()));
    }
}

impl EventHandler<CSIDriver> for Scheduler {
    fn on_apply(&self, _old: Option<&CSIDriver>, driver: &Arc<CSIDriver>) {
        self.change_storage(|s| s.drivers.insert(driver.name_any(), driver.clone()));
    }
    fn on_delete(&self, driver: &Arc<CSIDriver>) {
        self.change_storage(|s| s.drivers.remove(&driver.name_any()));
    }
}

impl EventHandler<CSIStorageCapacity> for Scheduler {
    fn on_apply(&self, _old: Option<&CSIStorageCapacity>, c: &Arc<CSIStorageCapacity>) {
        let key = (c.namespace().unwrap_or_default(), c.name_any());
        self.change_storage(|s| s.capacities.insert(key, c.clone()));
    }
    fn on_delete(&self, c: &Arc<CSIStorageCapacity>) {
        let key = (c.namespace().unwrap_or_default(), c.name_any());
        self.change_storage(|s| s.capacities.remove(&key));
    }
}

impl Scheduler {
    fn change_storage<T>(&self, change: impl FnOnce(&mut Storage) -> T) {
        change(self.cache.locked().snapshot_mut().storage_mut());
        self.storage_changed.send_replace(());
        self.queue.move_all_to_active_or_backoff();
    }

    fn framework_for(&self, pod: &Pod) -> Option<&Framework> {
        let name = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .unwrap_or(crate::config::DEFAULT_SCHEDULER_NAME);
        self.frameworks.iter().find(|f| f.profile_name() == name)
    }

    /// A pod added or changed: bound pods go to the cache, pods waiting for this
    /// scheduler to the queue.
    fn on_pod(&self, pod: Arc<Pod>) {
        let key = pod_key(&pod);
        let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        if bound {
            self.queue.delete(&key);
            let freed = !occupies(&pod);
            self.cache.locked().upsert_pod(pod);
            if freed {
                self.queue.move_all_to_active_or_backoff();
            }
        } else if pod.metadata.deletion_timestamp.is_none()
            && occupies(&pod)
            && self.framework_for(&pod).is_some()
        {
            self.queue.add(pod);
        } else {
            self.queue.delete(&key);
        }
    }

    fn on_pod_deleted(&self, pod: &Pod) {
        self.queue.delete(&pod_key(pod));
        if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
            self.cache.locked().remove_pod(pod);
            self.queue.move_all_to_active_or_backoff();
        } else {
            // A pending pod may have held room as a nominated preemptor.
            self.cache.locked().forget(pod);
        }
    }

    async fn schedule_loop(self: Arc<Self>) {
        loop {
            let queued = self.queue.pop().await;
            let started = Instant::now();
            let Some(framework) = self.framework_for(&queued.pod) else {
                self.queue.delete(&queued.key);
                continue;
            };
            let outcome = {
                let mut cache = self.cache.locked();
                // The room held for the pod by an earlier preemption is its own to take.
                cache.forget(&queued.pod);
                // A plugin that panics fails this cycle only: the pod is retried after
                // backoff and the scheduler goes on with the next one.
                let cycle = AssertUnwindSafe(|| {
                    framework.schedule_pod(cache.snapshot(), queued.pod.clone())
                });
                std::panic::catch_unwind(cycle).unwrap_or_else(|payload| {
                    let message = krust_api::panics::message(&*payload);
                    Err(ScheduleError::Internal(Status::error(format!(
                        "scheduling cycle panicked: {message}"
                    ))))
                })
            };
            match outcome {
                Ok(result) => {
                    self.cache
                        .locked()
                        .assume(result.pod_info.clone(), &result.suggested_host);
                    // Waiting for a permit here is the back-pressure that keeps the
                    // scheduler from running ahead of what the apiserver takes.
                    let permit = self
                        .bindings
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("semaphore");
                    let this = self.clone();
                    let profile = framework.profile_name().to_string();
                    tokio::spawn(async move {
                        let outcome = this.bind(queued, result.suggested_host).await;
                        this.metrics.attempt(&profile, outcome, started);
                        drop(permit);
                    });
                }
                Err(ScheduleError::Unschedulable {
                    fit_error,
                    preemption,
                }) => {
                    self.metrics
                        .attempt(framework.profile_name(), Outcome::Unschedulable, started);
                    self.unschedulable(&queued, fit_error.to_string(), preemption)
                }
                Err(ScheduleError::NoNodesAvailable) => {
                    self.metrics
                        .attempt(framework.profile_name(), Outcome::Unschedulable, started);
                    self.unschedulable(&queued, ScheduleError::NoNodesAvailable.to_string(), None)
                }
                Err(err @ ScheduleError::Internal(_)) => {
                    self.metrics
                        .attempt(framework.profile_name(), Outcome::Error, started);
                    tracing::warn!(pod = %queued.key, error = %err, "scheduling cycle failed");
                    self.events.pod(
                        &queued.pod,
                        true,
                        "FailedScheduling",
                        "Scheduling",
                        err.to_string(),
                    );
                    self.queue.retry(&queued);
                }
            }
        }
    }

    /// Binds the pod's volumes and then the pod to `node`; says how the attempt ended.
    async fn bind(&self, queued: QueuedPod, node: String) -> Outcome {
        let pod = &queued.pod;
        let choices = {
            let cache = self.cache.locked();
            let snapshot = cache.snapshot();
            snapshot
                .get(&node)
                .map(|info| volume_choices(snapshot.storage(), pod, info))
                .unwrap_or_default()
        };
        if let Err(err) = self.bind_volumes(choices, &node).await {
            self.cache.locked().forget(pod);
            self.events.pod(
                pod,
                true,
                "FailedScheduling",
                "Binding",
                format!("binding volumes: {err}"),
            );
            self.queue.retry(&queued);
            return Outcome::Error;
        }
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(pod.name_any()),
                namespace: pod.namespace(),
                uid: pod.uid(),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.clone()),
                ..ObjectReference::default()
            },
        };
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let result = api
            .create_subresource::<_, Value>(
                "binding",
                &pod.name_any(),
                &PostParams::default(),
                &binding,
            )
            .await;
        match result {
            Ok(_) => {
                self.cache.locked().finish_binding(pod);
                self.queue.done(&queued);
                self.events.pod(
                    pod,
                    false,
                    "Scheduled",
                    "Binding",
                    format!("Successfully assigned {} to {node}", queued.key),
                );
                Outcome::Scheduled
            }
            Err(err) => {
                self.cache.locked().forget(pod);
                self.queue.move_all_to_active_or_backoff();
                match &err {
                    // Gone, or bound by someone else: nothing left to do.
                    kube::Error::Api(s) if s.code == 404 || s.code == 409 => {
                        self.queue.done(&queued);
                    }
                    _ => {
                        self.events.pod(
                            pod,
                            true,
                            "FailedScheduling",
                            "Binding",
                            format!("Binding rejected: {err}"),
                        );
                        self.queue.retry(&queued);
                    }
                }
                Outcome::Error
            }
        }
    }

    /// Upstream's VolumeBinding PreBind: a chosen free volume gets the claim in its
    /// `claimRef` (the PersistentVolume controller completes the binding), a claim to
    /// provision gets the node in `volume.kubernetes.io/selected-node` (its provisioner
    /// creates the volume there); then the pod waits, up to [`VOLUME_BIND_TIMEOUT`], for
    /// every such claim to be bound, so that its kubelet finds them ready.
    async fn bind_volumes(
        &self,
        choices: Vec<VolumeChoice>,
        node: &str,
    ) -> Result<(), VolumeBindError> {
        use krust_client::volume::{BOUND_BY_CONTROLLER, SELECTED_NODE};
        let claims: Vec<(String, String)> = choices
            .iter()
            .map(|c| {
                let claim = match c {
                    VolumeChoice::Volume { claim, .. } | VolumeChoice::Provision(claim) => claim,
                };
                (claim.namespace().unwrap_or_default(), claim.name_any())
            })
            .collect();
        for choice in choices {
            match choice {
                VolumeChoice::Volume { volume, claim } => {
                    let mut updated = (*volume).clone();
                    updated.spec.get_or_insert_with(Default::default).claim_ref =
                        Some(krust_client::volume::claim_ref(&claim));
                    updated
                        .metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(BOUND_BY_CONTROLLER.into(), "yes".into());
                    Api::<PersistentVolume>::all(self.client.clone())
                        .replace(&volume.name_any(), &PostParams::default(), &updated)
                        .await?;
                }
                VolumeChoice::Provision(claim) => {
                    let mut updated = (*claim).clone();
                    updated
                        .metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(SELECTED_NODE.into(), node.into());
                    Api::<PersistentVolumeClaim>::namespaced(
                        self.client.clone(),
                        claim.metadata.namespace.as_deref().unwrap_or_default(),
                    )
                    .replace(&claim.name_any(), &PostParams::default(), &updated)
                    .await?;
                }
            }
        }
        let deadline = tokio::time::Instant::now() + VOLUME_BIND_TIMEOUT;
        // Subscribed before the first look, so that no change is missed between them.
        let mut changes = self.storage_changed.subscribe();
        loop {
            let bound = {
                let cache = self.cache.locked();
                let storage = cache.snapshot().storage();
                claims.iter().all(|key| {
                    storage.claims.get(key).is_some_and(|c| {
                        c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                    })
                })
            };
            if bound {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Err(VolumeBindError::Timeout),
            }
        }
    }

    /// No node fits: say why (event and PodScheduled condition), start preemption if
    /// it found victims, and park the pod until a cluster event.
    fn unschedulable(
        self: &Arc<Self>,
        queued: &QueuedPod,
        message: String,
        preemption: Option<PostFilterResult>,
    ) {
        self.events.pod(
            &queued.pod,
            true,
            "FailedScheduling",
            "Scheduling",
            message.clone(),
        );
        if let Some(p) = &preemption {
            self.cache.locked().nominate(
                Arc::new(PodInfo::new(queued.pod.clone())),
                &p.nominated_node_name,
            );
        }
        self.queue.unschedulable(queued);
        let this = self.clone();
        let pod = queued.pod.clone();
        tokio::spawn(async move {
            let nominated = preemption.as_ref().map(|p| p.nominated_node_name.clone());
            if let Err(err) =
                update_status(&this.client, &pod, &message, nominated.as_deref()).await
            {
                tracing::debug!(pod = ?pod.metadata.name, error = %err, "updating PodScheduled failed");
            }
            if let Some(p) = preemption {
                this.preempt(&pod, p).await;
            }
        });
    }

    /// Evicts the victims that make room for `pod` on the nominated node: each gets the
    /// `DisruptionTarget` condition, a `Preempted` event, and is deleted. A victim that
    /// is itself only nominated there (not bound) loses its nomination instead.
    async fn preempt(&self, pod: &Pod, result: PostFilterResult) {
        let node = &result.nominated_node_name;
        for victim in &result.victims {
            if victim.spec.as_ref().is_none_or(|s| s.node_name.is_none()) {
                self.cache.locked().forget(victim);
                continue;
            }
            let api: Api<Pod> =
                Api::namespaced(self.client.clone(), &victim.namespace().unwrap_or_default());
            let condition = json!({"status": {"conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                "message": format!("{REPORTING_CONTROLLER}: preempting to accommodate a higher priority pod"),
                "lastTransitionTime": Timestamp::now().to_string(),
            }]}});
            if let Err(err) = api
                .patch_status(
                    &victim.name_any(),
                    &PatchParams::default(),
                    &Patch::Strategic(&condition),
                )
                .await
            {
                tracing::debug!(victim = %victim.name_any(), error = %err, "marking preemption victim");
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: victim.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&victim.name_any(), &params).await {
                Ok(_) => self.events.pod(
                    victim,
                    false,
                    "Preempted",
                    "Preempting",
                    format!(
                        "Preempted by pod {} on node {node}",
                        pod.uid().unwrap_or_default()
                    ),
                ),
                Err(err) => {
                    tracing::warn!(victim = %victim.name_any(), error = %err, "deleting preemption victim");
                }
            }
        }
    }
}

/// Sets `PodScheduled=False` (reason Unschedulable) and the nominated node, unless the
/// pod already says so.
async fn update_status(
    client: &Client,
    pod: &Pod,
    message: &str,
    nominated: Option<&str>,
) -> Result<(), kube::Error> {
    let status = pod.status.as_ref();
    let current = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"));
    let same_condition = current.is_some_and(|c| {
        c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
            && c.message.as_deref() == Some(message)
    });
    let current_nominated = status.and_then(|s| s.nominated_node_name.as_deref());
    if same_condition && current_nominated == nominated {
        return Ok(());
    }
    let mut patch = json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": message, "lastProbeTime": Value::Null,
        "lastTransitionTime": Timestamp::now().to_string(),
    }]}});
    if nominated != current_nominated {
        patch["status"]["nominatedNodeName"] = json!(nominated);
    }
    // Only onto the version this cycle judged: had the pod been bound meanwhile (by
    // another scheduler, or by hand), an Unschedulable condition would be false.
    patch["metadata"] = json!({"resourceVersion": pod.metadata.resource_version});
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    api.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Strategic(&patch),
    )
    .await
    .map(|_| ())
}
