//! One worker per pod: a level-triggered loop that brings the runtime in line with the
//! pod — a sandbox, each container running (restarted under the restart policy with
//! back-off 10 s doubling to 5 min, reset after 10 min of running) — and reports the
//! status when it changes. A pass runs when the pod changes and after each relist of
//! the runtime ([`super::pleg`]; containerd 1.6 has no CRI events), which is how exits
//! are noticed; it reads the shared snapshot and asks the runtime only about what
//! changed. A pod being deleted has its
//! containers stopped within its grace period, its sandbox removed, and is then
//! deleted for good.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::serde_json::{Value, json};
use krust_cri::Runtime;
use krust_cri::api::{
    ContainerFilter, ContainerState, CreateContainerRequest, ImageSpec, ImageStatusRequest,
    ListContainersRequest, ListPodSandboxRequest, PodSandboxFilter, PodSandboxState,
    PodSandboxStatusRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopPodSandboxRequest,
};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use super::env::{self, ConfigError, Sources};
use super::pleg::Relisted;
use super::probe::Prober;
use super::status::{Instance, Observed, api_shows, pod_status, same};
use super::tokens::Tokens;
use super::{lifecycle, security, spec, volumes};
use crate::Config;
use crate::csi::Drivers;
use crate::eviction::Evictions;
use krust_client::events::{EventRecorder, EventType};

mod images;
mod teardown;

/// The longest a worker waits between passes (relists normally wake it sooner).
pub const RESYNC: Duration = Duration::from_secs(1);
/// A container that ran this long starts its back-off afresh.
const BACKOFF_RESET: Duration = Duration::from_secs(600);
/// How often the same volume failure is reported again (upstream's volume manager
/// retries with a growing back-off; the event count grows with each report).
const FAILED_MOUNT_REPEAT: Duration = Duration::from_secs(30);
/// How often the same sandbox failure is reported again, though the worker tries every
/// pass: upstream's pod worker retries a failed sync after its 10 s back-off.
const FAILED_SANDBOX_REPEAT: Duration = Duration::from_secs(10);
/// A failure retried every pass but reported as an event only when it changes, or
/// again once `every` has passed since it was.
struct Repeats {
    every: Duration,
    last: Option<(String, Instant)>,
}

impl Repeats {
    fn every(every: Duration) -> Self {
        Repeats { every, last: None }
    }

    /// Whether `message` is to be reported now (and is then taken as reported).
    fn due(&mut self, message: &str) -> bool {
        let repeat = self
            .last
            .as_ref()
            .is_some_and(|(m, at)| m == message && at.elapsed() < self.every);
        if !repeat {
            self.last = Some((message.to_string(), Instant::now()));
        }
        !repeat
    }
}

/// How often configMap, secret and downwardAPI volumes are brought up to date.
const VOLUME_REFRESH: Duration = Duration::from_secs(10);

/// The restart (or image pull) back-off of one container: 10 s, doubling to 5 minutes.
type Backoff = krust_client::backoff::Backoff<10, 300>;

pub struct Worker {
    client: Client,
    runtime: Runtime,
    config: Arc<Config>,
    sandbox: Option<String>,
    /// The attempt number of the next sandbox made (after those that died).
    next_attempt: u32,
    observed: Observed,
    restarts: HashMap<String, Backoff>,
    pulls: HashMap<String, Backoff>,
    reported: Option<Value>,
    /// Host paths of the pod's volumes, once they exist, and when they were written.
    volumes: Option<(HashMap<String, PathBuf>, Instant)>,
    prober: Prober,
    events: EventRecorder,
    /// The waiting reason last announced with an event, per container (so a state
    /// that lasts is reported once, not on every pass).
    announced: HashMap<String, String>,
    /// Pods the eviction manager has chosen.
    evictions: Evictions,
    /// The pod's service-account tokens (projected volumes).
    tokens: Tokens,
    /// The runtime's latest relist.
    relist: Relisted,
    /// When this worker last changed the runtime (a relist taken earlier does not show
    /// it yet).
    changed_at: Instant,
    /// What the runtime said about each container instance, by ID, while its state
    /// stays the same.
    known: HashMap<String, Instance>,
    /// The FailedMount and FailedCreatePodSandBox events last reported.
    failed_mount: Repeats,
    failed_sandbox: Repeats,
    /// The CSI drivers registered on the node.
    csi: Drivers,
    /// Turns to pull images, shared by the node's pod workers.
    pull_slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Pulls started while the sandbox was made.
    prefetched: images::Prefetched,
    /// When this worker first saw the pod, until the pod's start is measured.
    first_seen: Option<Instant>,
}

/// What every pod worker of the node shares.
#[derive(Clone)]
pub struct Shared {
    pub client: Client,
    pub runtime: Runtime,
    pub config: Arc<Config>,
    pub events: EventRecorder,
    /// Pods the eviction manager has chosen.
    pub evictions: Evictions,
    /// The runtime's latest relist.
    pub relist: Relisted,
    /// The CSI drivers registered on the node.
    pub csi: Drivers,
    /// Turns to pull images (`None`: no limit).
    pub pull_slots: Option<Arc<tokio::sync::Semaphore>>,
}

/// Whether the API shows the pod Succeeded or Failed.
fn terminal(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The outcome of one pass.
enum Pass {
    Continue,
    /// The pod is gone from the node and from the apiserver.
    Finished,
}

impl Worker {
    pub fn new(shared: Shared) -> Self {
        let Shared {
            client,
            runtime,
            config,
            events,
            evictions,
            relist,
            csi,
            pull_slots,
        } = shared;
        let observed = Observed {
            host_ip: config.node_ip.to_string(),
            start_time: k8s_openapi::jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string(),
            ..Observed::default()
        };
        Worker {
            client,
            runtime,
            config,
            sandbox: None,
            next_attempt: 0,
            observed,
            restarts: HashMap::new(),
            pulls: HashMap::new(),
            reported: None,
            volumes: None,
            prober: Prober::default(),
            events,
            announced: HashMap::new(),
            evictions,
            tokens: Tokens::default(),
            relist,
            changed_at: Instant::now(),
            known: HashMap::new(),
            failed_mount: Repeats::every(FAILED_MOUNT_REPEAT),
            failed_sandbox: Repeats::every(FAILED_SANDBOX_REPEAT),
            csi,
            pull_slots,
            prefetched: images::Prefetched::new(),
            first_seen: Some(Instant::now()),
        }
    }

    /// Stops and removes the sandbox `sandbox` of pod `uid`, which the API no longer has
    /// (deleted while this kubelet was not running), and the pod's directory: a
    /// restarted kubelet never hears of such a pod, so nothing else would.
    pub async fn reap(shared: Shared, uid: &str, sandbox: String) {
        let mut worker = Worker::new(shared);
        worker.sandbox = Some(sandbox);
        worker.tear_down(None, 0).await;
        let dir = spec::pod_dir_of(&worker.config, uid);
        worker.remove_pod_dir(&dir).await;
    }

    /// Runs until the pod is finished; `pods` carries the latest version of the pod
    /// (`None` once it is gone from the apiserver).
    pub async fn run(mut self, mut pods: watch::Receiver<Option<Arc<Pod>>>) {
        loop {
            let pod = pods.borrow_and_update().clone();
            let pass = match pod {
                Some(pod) => self.sync(&pod).await,
                None => {
                    self.tear_down(None, 0).await;
                    Pass::Finished
                }
            };
            if matches!(pass, Pass::Finished) {
                return;
            }
            let relisted = async {
                if self.relist.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = pods.changed() => {}
                _ = relisted => {}
                _ = tokio::time::sleep(RESYNC) => {}
            }
        }
    }

    async fn sync(&mut self, pod: &Pod) -> Pass {
        if pod.metadata.deletion_timestamp.is_some() {
            let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30);
            self.tear_down(Some(pod), grace).await;
            return if self.delete_for_good(pod).await {
                Pass::Finished
            } else {
                Pass::Continue
            };
        }
        if let Some(message) = self.evictions.message(&pod.uid().unwrap_or_default()) {
            if self.observed.evicted.is_none() {
                // Hard eviction: no grace period; the pod stays, Failed.
                self.tear_down(Some(pod), 0).await;
                for instance in self.observed.containers.values_mut() {
                    if instance.running() {
                        instance.state = ContainerState::ContainerExited as i32;
                        instance.exit_code = 137;
                    }
                }
                self.observed.waiting.clear();
                self.observed.evicted = Some(message);
            }
            self.report(pod).await;
            return Pass::Continue;
        }
        if self.sandbox.is_none() && terminal(pod) {
            // Finished before this worker began (a restarted kubelet, a sandbox gone):
            // a pod that Succeeded or Failed never runs again, and its status stays.
            return Pass::Continue;
        }
        if self.sandbox.is_none() {
            // Images come while the sandbox is made.
            self.prefetch(pod).await;
        }
        if let Err(err) = self.ensure_sandbox(pod).await {
            tracing::warn!(pod = %pod.name_any(), error = %err, "creating the pod sandbox failed");
            let message = format!("Failed to create pod sandbox: {}", err.message());
            if self.failed_sandbox.due(&message) {
                self.event(pod, EventType::Warning, "FailedCreatePodSandBox", message);
            }
            for c in &pod
                .spec
                .as_ref()
                .map(|s| s.containers.clone())
                .unwrap_or_default()
            {
                self.observed
                    .waiting
                    .insert(c.name.clone(), ("ContainerCreating".into(), String::new()));
            }
        } else if self.sync_volumes(pod).await {
            self.sync_containers(pod).await;
        }
        self.report(pod).await;
        Pass::Continue
    }

    /// Makes the pod's volumes exist (and content volumes current every
    /// [`VOLUME_REFRESH`]); false while they cannot be set up.
    async fn sync_volumes(&mut self, pod: &Pod) -> bool {
        let due = match &self.volumes {
            None => true,
            Some((_, at)) => volumes::has_content(pod) && at.elapsed() >= VOLUME_REFRESH,
        };
        if !due {
            return true;
        }
        let sources = Sources {
            client: &self.client,
            namespace: pod.namespace().unwrap_or_default(),
            tokens: &self.tokens,
            node: &self.config.node_name,
            csi: &self.csi,
            csi_plugins: self.config.csi_plugins_dir(),
        };
        let pod_ip = self.observed.pod_ip.clone().unwrap_or_default();
        let dir = spec::pod_dir(&self.config, pod);
        let addresses = (pod_ip.as_str(), self.observed.host_ip.as_str());
        let first = self.volumes.is_none();
        match volumes::prepare(&sources, &dir, pod, addresses, first).await {
            Ok(paths) => {
                self.volumes = Some((paths, Instant::now()));
                true
            }
            Err(ConfigError(message)) => {
                tracing::warn!(pod = %pod.name_any(), %message, "volumes not ready");
                if self.failed_mount.due(&message) {
                    self.event(pod, EventType::Warning, "FailedMount", message.clone());
                }
                if self.volumes.is_some() {
                    // Already running: keep the last content, try again later.
                    return true;
                }
                for c in pod.spec.iter().flat_map(|s| &s.containers) {
                    self.observed.waiting.insert(
                        c.name.clone(),
                        ("ContainerCreating".into(), message.clone()),
                    );
                }
                false
            }
        }
    }

    /// The CRI runtime handler of the pod's RuntimeClass; empty (the runtime's default)
    /// for a pod without one. Read from the API when a sandbox is made: one request per
    /// sandbox of such a pod (upstream's kubelet keeps an informer of RuntimeClasses).
    async fn runtime_handler(&self, pod: &Pod) -> Result<String, tonic::Status> {
        let Some(name) = pod
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref())
        else {
            return Ok(String::new());
        };
        match Api::<RuntimeClass>::all(self.client.clone())
            .get(name)
            .await
        {
            Ok(class) => Ok(class.handler),
            Err(kube::Error::Api(status)) if status.code == 404 => Err(tonic::Status::not_found(
                format!("runtimeclass.node.k8s.io {name:?} not found"),
            )),
            Err(e) => Err(tonic::Status::unavailable(format!(
                "failed to lookup RuntimeClass {name}: {e}"
            ))),
        }
    }

    /// Finds this pod's ready sandbox (after a kubelet restart) or runs a new one.
    async fn ensure_sandbox(&mut self, pod: &Pod) -> Result<(), tonic::Status> {
        let uid = pod.uid().unwrap_or_default();
        let mut rt = self.runtime.runtime.clone();
        if self.sandbox.is_none() {
            let listed = rt
                .list_pod_sandbox(ListPodSandboxRequest {
                    filter: Some(PodSandboxFilter {
                        label_selector: HashMap::from([(spec::POD_UID.to_string(), uid.clone())]),
                        ..PodSandboxFilter::default()
                    }),
                })
                .await?
                .into_inner()
                .items;
            self.sandbox = listed
                .iter()
                .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
                .max_by_key(|s| s.created_at)
                .map(|s| s.id.clone());
            if self.sandbox.is_none() {
                // Sandboxes of earlier attempts that died (their pause exited, or
                // containerd or the kubelet died while making them): stopped and removed,
                // so their network goes, and the next attempt is numbered after them, as
                // upstream's kubelet does — containerd keeps a dead sandbox's name
                // reserved, and a new one under it would fail for ever.
                self.next_attempt = listed
                    .iter()
                    .filter_map(|s| s.metadata.as_ref().map(|m| m.attempt + 1))
                    .max()
                    .unwrap_or(0);
                for dead in listed {
                    let _ = rt
                        .stop_pod_sandbox(StopPodSandboxRequest {
                            pod_sandbox_id: dead.id.clone(),
                        })
                        .await;
                    let _ = rt
                        .remove_pod_sandbox(RemovePodSandboxRequest {
                            pod_sandbox_id: dead.id,
                        })
                        .await;
                }
            }
        }
        let id = match &self.sandbox {
            Some(id) => id.clone(),
            None => {
                self.changed_at = Instant::now();
                let config = spec::sandbox_config(&self.config, pod, self.next_attempt);
                let runtime_handler = self.runtime_handler(pod).await?;
                let id = rt
                    .run_pod_sandbox(RunPodSandboxRequest {
                        config: Some(config),
                        runtime_handler,
                    })
                    .await?
                    .into_inner()
                    .pod_sandbox_id;
                tracing::info!(pod = %pod.name_any(), sandbox = %id, "sandbox started");
                self.sandbox = Some(id.clone());
                id
            }
        };
        // A recent relist answers for a sandbox whose address is known already.
        let snapshot = self.relist.borrow().clone();
        if snapshot.taken > self.changed_at && self.observed.pod_ip.is_some() {
            let ready = snapshot
                .sandboxes
                .get(&id)
                .is_some_and(|s| s.state == PodSandboxState::SandboxReady as i32);
            self.observed.sandbox_ready = ready;
            if !ready {
                // Gone or stopped underneath us: start over with a new one next pass.
                self.sandbox = None;
            }
            return Ok(());
        }
        let status = rt
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id,
                verbose: false,
            })
            .await?
            .into_inner()
            .status;
        let ready = status
            .as_ref()
            .is_some_and(|s| s.state == PodSandboxState::SandboxReady as i32);
        self.observed.sandbox_ready = ready;
        self.observed.pod_ip = if spec::host_network(pod) {
            Some(self.config.node_ip.to_string())
        } else {
            status
                .and_then(|s| s.network)
                .map(|n| n.ip)
                .filter(|ip| !ip.is_empty())
        };
        if !ready {
            // Gone or stopped underneath us: start over with a new one next pass.
            self.sandbox = None;
        }
        Ok(())
    }

    /// The newest instance of each container in the sandbox, with the termination
    /// message of those that exited: from the latest relist unless this worker changed
    /// the runtime since, with the details asked only for instances not seen before in
    /// their current state.
    async fn instances(&mut self, pod: &Pod) -> Result<HashMap<String, Instance>, tonic::Status> {
        let Some(sandbox) = self.sandbox.clone() else {
            return Ok(HashMap::new());
        };
        let mut rt = self.runtime.runtime.clone();
        let snapshot = self.relist.borrow().clone();
        let listed =
            if snapshot.taken > self.changed_at && snapshot.sandboxes.contains_key(&sandbox) {
                snapshot
                    .containers
                    .get(&sandbox)
                    .cloned()
                    .unwrap_or_default()
            } else {
                rt.list_containers(ListContainersRequest {
                    filter: Some(ContainerFilter {
                        pod_sandbox_id: sandbox.clone(),
                        ..ContainerFilter::default()
                    }),
                })
                .await?
                .into_inner()
                .containers
            };
        self.known
            .retain(|id, _| listed.iter().any(|c| &c.id == id));
        let mut newest: HashMap<String, Instance> = HashMap::new();
        for c in listed {
            let Some(meta) = c.metadata else { continue };
            if newest
                .get(&meta.name)
                .is_some_and(|i| i.attempt >= meta.attempt)
            {
                continue;
            }
            if let Some(known) = self.known.get(&c.id).filter(|k| k.state == c.state) {
                newest.insert(meta.name, known.clone());
                continue;
            }
            let status = rt
                .container_status(krust_cri::api::ContainerStatusRequest {
                    container_id: c.id.clone(),
                    verbose: false,
                })
                .await?
                .into_inner()
                .status
                .unwrap_or_default();
            let exited = status.state == ContainerState::ContainerExited as i32;
            let message = match spec_container(pod, &meta.name).filter(|_| exited) {
                Some(container) => Some(lifecycle::message(
                    &lifecycle::message_file(&self.config, pod, &meta.name, meta.attempt),
                    std::path::Path::new(&status.log_path),
                    &container,
                    status.exit_code,
                ))
                .filter(|m| !m.is_empty())
                .unwrap_or(status.message),
                None => status.message,
            };
            let instance = Instance {
                id: c.id.clone(),
                attempt: meta.attempt,
                state: status.state,
                started_at: status.started_at,
                finished_at: status.finished_at,
                exit_code: status.exit_code,
                reason: status.reason,
                message,
                image_ref: status.image_ref,
            };
            self.known.insert(c.id, instance.clone());
            newest.insert(meta.name, instance);
        }
        Ok(newest)
    }

    async fn sync_containers(&mut self, pod: &Pod) {
        let instances = match self.instances(pod).await {
            Ok(i) => i,
            Err(err) => {
                tracing::warn!(pod = %pod.name_any(), error = %err, "listing containers failed");
                return;
            }
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let policy = spec.restart_policy.as_deref().unwrap_or("Always");
        let now = Instant::now();
        // Init containers run one at a time, in order, each to success; they are
        // restarted on failure unless the pod never restarts anything.
        let init_policy = if policy == "Never" {
            "Never"
        } else {
            "OnFailure"
        };
        self.observed.initialized = true;
        self.observed.init_failed = false;
        for init in spec.init_containers.iter().flatten() {
            let instance = instances.get(&init.name);
            let succeeded = instance.is_some_and(|i| i.exited() && i.exit_code == 0);
            if succeeded {
                if let Some(i) = instance {
                    self.observed
                        .containers
                        .insert(init.name.clone(), i.clone());
                }
                self.observed.waiting.remove(&init.name);
                continue;
            }
            self.observed.initialized = false;
            if init_policy == "Never" && instance.is_some_and(Instance::exited) {
                self.observed.init_failed = true;
            }
            self.sync_container(pod, init, &instances, init_policy, now)
                .await;
            break;
        }
        // Ephemeral containers start as soon as they are added, init or not, and are
        // never restarted.
        for container in spec::ephemeral_containers(pod) {
            self.sync_container(pod, &container, &instances, "Never", now)
                .await;
        }
        if !self.observed.initialized {
            if let Ok(fresh) = self.instances(pod).await {
                self.observed.containers.extend(fresh);
            }
            return;
        }
        for container in &spec.containers {
            self.sync_container(pod, container, &instances, policy, now)
                .await;
        }
        // Report the instances started just now on the next pass.
        if let Ok(fresh) = self.instances(pod).await {
            self.observed.containers.extend(fresh);
        }
    }

    /// Brings one container in line: started if it never ran, probed while running,
    /// restarted after an exit as `policy` says (with back-off).
    async fn sync_container(
        &mut self,
        pod: &Pod,
        container: &Container,
        instances: &HashMap<String, Instance>,
        policy: &str,
        now: Instant,
    ) {
        let name = container.name.clone();
        let current = instances.get(&name).cloned();
        let next_attempt = match &current {
            None => Some(0),
            Some(i) if i.running() => {
                let started =
                    std::time::UNIX_EPOCH + Duration::from_nanos(i.started_at.max(0) as u64);
                let running_for = std::time::SystemTime::now()
                    .duration_since(started)
                    .unwrap_or_default();
                // Ran long enough: the next crash starts the back-off afresh.
                if running_for > BACKOFF_RESET {
                    self.restarts.remove(&name);
                }
                let started = now.checked_sub(running_for).unwrap_or(now);
                self.probe(pod, container, i, started).await;
                None
            }
            Some(i) if i.exited() => {
                let restart = match policy {
                    "Never" => false,
                    "OnFailure" => i.exit_code != 0,
                    _ => true,
                };
                restart.then_some(i.attempt + 1)
            }
            // Created but never started (its start was lost: the runtime died during
            // it), or in an unknown state: upstream's kubelet always runs a new
            // instance, whatever the restart policy, stopping an unknown one first so
            // that two never run. A created one stays until its sandbox goes.
            Some(i) => {
                if i.state == ContainerState::ContainerUnknown as i32 {
                    self.stop(Some(pod), &name, &i.id, grace_period(pod)).await;
                }
                Some(i.attempt + 1)
            }
        };
        if let Some(current) = &current {
            self.observed
                .containers
                .insert(name.clone(), current.clone());
        }
        let Some(attempt) = next_attempt else {
            self.observed.waiting.remove(&name);
            return;
        };
        let previous = current.as_ref().filter(|i| i.exited());
        if let Some(previous) = previous {
            let backoff = self.restarts.entry(name.clone()).or_default();
            if let Some(left) = backoff.waiting(now) {
                self.observed.waiting.insert(
                    name.clone(),
                    (
                        "CrashLoopBackOff".into(),
                        format!(
                            "back-off {} restarting failed container={name} pod={}_{}({})",
                            fmt_secs(backoff.delay().unwrap_or(left)),
                            pod.name_any(),
                            pod.namespace().unwrap_or_default(),
                            pod.uid().unwrap_or_default()
                        ),
                    ),
                );
                let message = format!(
                    "Back-off restarting failed container {name} in pod {}_{}({})",
                    pod.name_any(),
                    pod.namespace().unwrap_or_default(),
                    pod.uid().unwrap_or_default()
                );
                self.announce(pod, &name, "CrashLoopBackOff", &message);
                return;
            }
            self.observed
                .last_terminated
                .insert(name.clone(), previous.terminated());
        }
        let started = self.start_container(pod, container, attempt).await;
        self.changed_at = Instant::now();
        if let Err((reason, message)) = &started {
            self.announce(pod, &name, reason, message);
        } else {
            self.announced.remove(&name);
        }
        let ran = match &started {
            Ok(()) => true,
            Err((reason, _)) => reason == POST_START_HOOK_ERROR,
        };
        if ran && previous.is_some() {
            // The next exit waits: 10 s, then doubling.
            self.restarts.entry(name.clone()).or_default().fail(now);
        }
        match started {
            Ok(()) => {
                self.observed.waiting.remove(&name);
            }
            Err(waiting) => {
                self.observed.waiting.insert(name.clone(), waiting);
            }
        }
    }

    /// Runs the container's due probes; a failed liveness or startup probe stops the
    /// container (it is then restarted under the restart policy).
    async fn probe(
        &mut self,
        pod: &Pod,
        container: &Container,
        instance: &Instance,
        started: Instant,
    ) {
        let has_probes = container.startup_probe.is_some()
            || container.liveness_probe.is_some()
            || container.readiness_probe.is_some();
        if !has_probes {
            self.observed.probed.remove(&container.name);
            return;
        }
        let ip = self.observed.pod_ip.clone().unwrap_or_default();
        let verdict = self
            .prober
            .check(&self.runtime, &instance.id, container, &ip, started)
            .await;
        for message in &verdict.unhealthy {
            self.event(pod, EventType::Warning, "Unhealthy", message.clone());
        }
        self.observed
            .probed
            .insert(container.name.clone(), (verdict.started, verdict.ready));
        if let Some(message) = verdict.kill {
            self.event(pod, EventType::Normal, "Killing", message);
            let grace = grace_period(pod);
            self.stop(Some(pod), &container.name, &instance.id, grace)
                .await;
            self.changed_at = Instant::now();
        }
    }

    fn event(&self, pod: &Pod, kind: EventType, reason: &str, message: String) {
        self.events.record(pod, kind, reason, message);
    }

    /// Reports a container's waiting state with upstream's events, once per state.
    fn announce(&mut self, pod: &Pod, container: &str, reason: &str, message: &str) {
        if self.announced.get(container).map(String::as_str) == Some(reason) {
            return;
        }
        self.announced
            .insert(container.to_string(), reason.to_string());
        match reason {
            "CrashLoopBackOff" => {
                self.event(pod, EventType::Warning, "BackOff", message.to_string())
            }
            "ImagePullBackOff" => {
                self.event(pod, EventType::Normal, "BackOff", message.to_string());
                self.event(
                    pod,
                    EventType::Warning,
                    "Failed",
                    format!("Error: {reason}"),
                );
            }
            "ErrImageNeverPull" => self.event(pod, EventType::Warning, reason, message.to_string()),
            // The pull's own `Failed to pull image` event came with each attempt.
            "ErrImagePull" => self.event(
                pod,
                EventType::Warning,
                "Failed",
                format!("Error: {reason}"),
            ),
            _ => self.event(
                pod,
                EventType::Warning,
                "Failed",
                format!("Error: {message}"),
            ),
        }
    }

    /// Makes sure the image is there (as its pull policy says), then creates and starts
    /// one container; on failure returns the waiting reason and message.
    async fn start_container(
        &mut self,
        pod: &Pod,
        container: &Container,
        attempt: u32,
    ) -> Result<(), (String, String)> {
        self.ensure_image(pod, container).await?;
        if security::non_root_required(pod, container) {
            let image = self
                .runtime
                .images
                .clone()
                .image_status(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: container.image.clone().unwrap_or_default(),
                        ..ImageSpec::default()
                    }),
                    verbose: false,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().image);
            let uid = image.as_ref().and_then(|i| i.uid.as_ref()).map(|u| u.value);
            let user = image.map(|i| i.username).unwrap_or_default();
            security::verify_non_root(pod, container, uid, &user)
                .map_err(|m| ("CreateContainerConfigError".to_string(), m))?;
        }
        let sandbox = self.sandbox.clone().unwrap_or_default();
        let ip = self.observed.pod_ip.clone().unwrap_or_default();
        let hosts = spec::write_hosts(&self.config, pod, &ip)
            .map_err(|e| ("CreateContainerError".to_string(), e.to_string()))?;
        let sources = Sources {
            client: &self.client,
            namespace: pod.namespace().unwrap_or_default(),
            tokens: &self.tokens,
            node: &self.config.node_name,
            csi: &self.csi,
            csi_plugins: self.config.csi_plugins_dir(),
        };
        let env = env::environment(&sources, pod, container, &ip, &self.observed.host_ip)
            .await
            .map_err(|ConfigError(m)| ("CreateContainerConfigError".to_string(), m))?;
        let paths = self
            .volumes
            .as_ref()
            .map(|(p, _)| p.clone())
            .unwrap_or_default();
        let mut mounts = volumes::mounts(pod, container.volume_mounts.as_ref(), &paths);
        let message = lifecycle::message_file(&self.config, pod, &container.name, attempt);
        mounts.push(
            lifecycle::message_mount(&message, container)
                .map_err(|e| ("CreateContainerError".to_string(), e.to_string()))?,
        );
        let mut config = spec::container_config(pod, container, attempt, env, mounts, &hosts);
        if let Some(target) = spec::ephemeral_target(pod, &container.name) {
            match self
                .observed
                .containers
                .get(&target)
                .filter(|i| i.running())
            {
                Some(instance) => spec::share_processes_with(&mut config, pod, &instance.id),
                None => {
                    return Err((
                        "CreateContainerConfigError".to_string(),
                        format!("target container {target:?} is not running"),
                    ));
                }
            }
        }
        let mut rt = self.runtime.runtime.clone();
        let created = rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox,
                config: Some(config),
                sandbox_config: Some(spec::sandbox_config(&self.config, pod, 0)),
            })
            .await
            .map_err(|e| ("CreateContainerError".to_string(), e.message().to_string()))?
            .into_inner()
            .container_id;
        rt.start_container(StartContainerRequest {
            container_id: created.clone(),
        })
        .await
        .map_err(|e| ("RunContainerError".to_string(), e.message().to_string()))?;
        tracing::info!(pod = %pod.name_any(), container = %container.name, attempt, "container started");
        self.event(
            pod,
            EventType::Normal,
            "Created",
            format!("Created container: {}", container.name),
        );
        self.event(
            pod,
            EventType::Normal,
            "Started",
            format!("Started container {}", container.name),
        );
        let post_start = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref());
        if let Some(hook) = post_start {
            let hooked = lifecycle::run(
                &self.runtime,
                &created,
                container,
                hook,
                &ip,
                lifecycle::POST_START_TIMEOUT,
            )
            .await;
            if let Err(message) = hooked {
                // Upstream leaves the handler's output out of the event (secrets).
                self.event(
                    pod,
                    EventType::Warning,
                    "FailedPostStartHook",
                    "PostStartHook failed".into(),
                );
                let grace = grace_period(pod);
                self.stop(None, &container.name, &created, grace).await;
                return Err((POST_START_HOOK_ERROR.into(), message));
            }
        }
        Ok(())
    }

    /// Writes the status if it says something new.
    async fn report(&mut self, pod: &Pod) {
        let status = pod_status(pod, &self.observed);
        if status["phase"] == "Running"
            && let Some(first_seen) = self.first_seen.take()
        {
            // A pod already Running before this worker (a restarted kubelet) did not
            // start now.
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase != Some("Running") {
                crate::metrics::POD_START.observe(first_seen.elapsed().as_secs_f64());
            }
        }
        if self.reported.as_ref().is_some_and(|r| same(r, &status)) && api_shows(pod, &status) {
            return;
        }
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        match api
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
        {
            Ok(_) => self.reported = Some(status),
            Err(err) => {
                tracing::warn!(pod = %pod.name_any(), error = %err, "reporting pod status failed")
            }
        }
    }
}

/// The waiting reason of a container whose postStart hook failed.
const POST_START_HOOK_ERROR: &str = "PostStartHookError";

/// The pod's `terminationGracePeriodSeconds` (upstream's default: 30).
fn grace_period(pod: &Pod) -> i64 {
    (pod.spec.as_ref())
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30)
}

/// The spec of a pod's (init or ephemeral) container by name.
fn spec_container(pod: &Pod, name: &str) -> Option<Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .cloned()
        .or_else(|| {
            spec::ephemeral_containers(pod)
                .into_iter()
                .find(|c| c.name == name)
        })
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 && s.is_multiple_of(60) {
        format!("{}m0s", s / 60)
    } else if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_from_ten_seconds_to_five_minutes() {
        let mut b = Backoff::default();
        let now = Instant::now();
        let delays: Vec<u64> = (0..7).map(|_| b.fail(now).as_secs()).collect();
        assert_eq!(delays, vec![10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(fmt_secs(Duration::from_secs(20)), "20s");
        assert_eq!(fmt_secs(Duration::from_secs(300)), "5m0s");
    }
}
