//! Pods bound to simulated nodes: started (Running and Ready, with an IP and container
//! statuses, after the configured delay) and finished when deleted (removed at once,
//! as a kubelet does once its containers have stopped). A pod may also say when its
//! containers exit, as kwok's stages do: `sim.krust.io/exit-after: 1s` (and
//! `sim.krust.io/exit-code: 3`, 0 by default) end it Succeeded or Failed under
//! restartPolicy Never, restart the containers after a failure under OnFailure (until
//! they exit 0), and are ignored under Always.
//!
//! One informer of all pods feeds a channel drained by `concurrency` workers. A pod is
//! started once per UID; a pod that is already Running and Ready (e.g. after the
//! simulator restarted) is left as it is.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::serde_json::{Value, json};
use krust_api::sync::Unpoisoned;
use krust_client::informer::{EventHandler, Informer};
use krust_client::supervise::restart_on_panic;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use crate::Config;
use crate::nodes::Fleet;

/// How often a pod whose node has no pod range yet is tried again, and how many times
/// before it starts without an IP. The wait holds no worker: a fleet larger than the
/// cluster CIDR has ranges for (256 nodes with the default /16 and /24s) must not slow
/// the pods of the nodes that have one.
const NO_RANGE_RETRY: Duration = Duration::from_millis(100);
const NO_RANGE_TRIES: u32 = 50;
/// Attempts at one write in a row; after them the action is queued again after
/// `REQUEUE_PAUSE`, for as long as the apiserver fails (a deleted pod gets no later event
/// that would try again, and `kubectl delete` waits until it is gone).
const WRITE_TRIES: u32 = 5;
const REQUEUE_PAUSE: Duration = Duration::from_secs(2);

/// After how long a simulated pod's containers exit.
pub const EXIT_AFTER: &str = "sim.krust.io/exit-after";
/// With which code they exit (0 when absent).
pub const EXIT_CODE: &str = "sim.krust.io/exit-code";

#[derive(Clone)]
enum Action {
    /// Start the pod; the number says how often its node had no pod range yet.
    Start(Arc<Pod>, u32),
    /// The containers exit, for the `n`th time.
    Exit(Arc<Pod>, i32),
    Finish(Arc<Pod>),
}

/// When and how a pod's containers exit, if its annotations say so and its restart
/// policy lets them.
fn exit_plan(pod: &Pod) -> Option<(Duration, i32)> {
    let after: k8s_openapi::jiff::SignedDuration =
        pod.annotations().get(EXIT_AFTER)?.parse().ok()?;
    let code = pod
        .annotations()
        .get(EXIT_CODE)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
    (policy != Some("Always") && policy.is_some()).then_some((after.unsigned_abs(), code))
}

/// Sends `action` after `delay`.
fn later(tx: &mpsc::UnboundedSender<Action>, delay: Duration, action: Action) {
    if delay.is_zero() {
        let _ = tx.send(action);
        return;
    }
    let tx = tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let _ = tx.send(action);
    });
}

/// UIDs of pods with a start or finish in progress or done.
#[derive(Default)]
struct Seen {
    started: HashSet<String>,
    finishing: HashSet<String>,
}

/// Watches pods and runs those bound to the fleet's nodes, telling `usage` about them.
/// Never returns.
pub async fn run(
    client: Client,
    config: Arc<Config>,
    fleet: Arc<Fleet>,
    usage: Arc<crate::usage::Usage>,
) {
    let (tx, rx) = mpsc::unbounded_channel::<Action>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..config.concurrency.max(1) {
        let rx = rx.clone();
        let tx = tx.clone();
        let client = client.clone();
        let fleet = fleet.clone();
        let seen = seen.clone();
        let work = move || {
            let (rx, client, fleet, seen, tx) = (
                rx.clone(),
                client.clone(),
                fleet.clone(),
                seen.clone(),
                tx.clone(),
            );
            async move {
                loop {
                    let Some(action) = rx.lock().await.recv().await else {
                        return;
                    };
                    act(&client, &fleet, &seen, &tx, action).await;
                }
            }
        };
        workers.spawn(restart_on_panic("simulated pod worker", work));
    }
    let pods = Informer::<Pod>::new(Api::all(client), watcher::Config::default());
    pods.add_handler(Arc::new(PodEvents {
        config,
        fleet,
        seen,
        tx,
    }));
    pods.add_handler(usage);
    pods.run().await
}

/// Starts pods bound to the fleet's nodes, and finishes them when they are deleted.
struct PodEvents {
    config: Arc<Config>,
    fleet: Arc<Fleet>,
    seen: Arc<Mutex<Seen>>,
    tx: mpsc::UnboundedSender<Action>,
}

impl EventHandler<Pod> for PodEvents {
    fn on_apply(&self, _old: Option<&Pod>, pod: &Arc<Pod>) {
        on_pod(&self.config, &self.fleet, &self.seen, &self.tx, pod.clone());
    }
    fn on_delete(&self, pod: &Arc<Pod>) {
        let uid = pod.uid().unwrap_or_default();
        let mut seen = self.seen.locked();
        seen.started.remove(&uid);
        seen.finishing.remove(&uid);
    }
}

fn on_pod(
    config: &Config,
    fleet: &Fleet,
    seen: &Mutex<Seen>,
    tx: &mpsc::UnboundedSender<Action>,
    pod: Arc<Pod>,
) {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if !node.is_some_and(|n| fleet.contains(n)) {
        return;
    }
    let uid = pod.uid().unwrap_or_default();
    let mut seen = seen.locked();
    if pod.metadata.deletion_timestamp.is_some() {
        if seen.finishing.insert(uid) {
            let _ = tx.send(Action::Finish(pod));
        }
    } else if !is_running_and_ready(&pod) && !is_finished(&pod) && seen.started.insert(uid) {
        later(tx, config.pod_ready_delay, Action::Start(pod, 0));
    }
}

fn is_finished(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

fn is_running_and_ready(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

async fn act(
    client: &Client,
    fleet: &Fleet,
    seen: &Mutex<Seen>,
    tx: &mpsc::UnboundedSender<Action>,
    action: Action,
) {
    let again = action.clone();
    let (pod, result) = match action {
        Action::Start(pod, tries) => {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or_default();
            let addresses = fleet.next_pod_ip(node);
            if addresses.is_none() && tries < NO_RANGE_TRIES {
                later(tx, NO_RANGE_RETRY, Action::Start(pod, tries + 1));
                return;
            }
            static WARNED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            if addresses.is_none() && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(%node, "a node has no pod range (is the cluster CIDR large enough for every node?): its pods start without an IP");
            }
            let result = start(client, &pod, addresses).await;
            // The containers' time counts from their start: an exit written before the
            // start (a node waiting for its pod range) would be overwritten by it, and
            // the pod would run for ever.
            if let (Ok(()), Some((after, _))) = (&result, exit_plan(&pod)) {
                later(tx, after, Action::Exit(pod.clone(), 1));
            }
            (pod, result)
        }
        Action::Exit(pod, n) => {
            let Some((after, code)) = exit_plan(&pod) else {
                return;
            };
            // A pod being deleted has had its containers stopped.
            if seen
                .locked()
                .finishing
                .contains(&pod.uid().unwrap_or_default())
            {
                return;
            }
            let restarts = code != 0
                && pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("OnFailure");
            if restarts {
                later(tx, after, Action::Exit(pod.clone(), n + 1));
            }
            if let Err(err) = exit(client, &pod, code, n, restarts).await {
                tracing::debug!(pod = %pod.name_any(), error = %err, "simulated exit not written");
            }
            return;
        }
        Action::Finish(pod) => {
            let result = finish(client, &pod).await;
            (pod, result)
        }
    };
    match result {
        Err(err) if transient(&err) => {
            tracing::warn!(pod = %pod.name_any(), error = %err, "simulated pod update failed; trying again");
            later(tx, REQUEUE_PAUSE, again);
        }
        // Forget it, so that the pod's next event tries again.
        Err(err) => forget(seen, &pod, &err),
        Ok(()) => {}
    }
}

fn forget(seen: &Mutex<Seen>, pod: &Pod, err: &kube::Error) {
    let uid = pod.uid().unwrap_or_default();
    let mut seen = seen.locked();
    seen.started.remove(&uid);
    seen.finishing.remove(&uid);
    drop(seen);
    tracing::warn!(pod = %pod.name_any(), error = %err, "simulated pod update failed");
}

/// Whether the same write may succeed later: the apiserver was busy or unreachable, as
/// opposed to an answer that will not change (not found, conflict, invalid).
fn transient(err: &kube::Error) -> bool {
    !matches!(err, kube::Error::Api(s) if s.code < 500 && s.code != 429)
}

/// Writes the pod Running and Ready with its (pod IP, node IP), if its node has a range.
async fn start(
    client: &Client,
    pod: &Pod,
    addresses: Option<(std::net::Ipv4Addr, std::net::Ipv4Addr)>,
) -> Result<(), kube::Error> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let (pod_ip, host_ip) = match addresses {
        Some((_, host_ip)) if host_network => (Some(host_ip), Some(host_ip)),
        Some((pod_ip, host_ip)) => (Some(pod_ip), Some(host_ip)),
        None => (None, None),
    };
    let status = running_status(
        pod,
        pod_ip.map(|i| i.to_string()),
        host_ip.map(|i| i.to_string()),
    );
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let (name, params, patch) = (
        pod.name_any(),
        PatchParams::default(),
        Patch::Merge(&status),
    );
    retry(|| api.patch_status(&name, &params, &patch)).await
}

/// The status of a pod whose containers all run: Ready, with every condition a kubelet
/// sets, init containers Completed.
pub fn running_status(pod: &Pod, pod_ip: Option<String>, host_ip: Option<String>) -> Value {
    let now = Timestamp::now().to_string();
    let spec = pod.spec.clone().unwrap_or_default();
    let uid = pod.uid().unwrap_or_default();
    let container_id = |name: &str| format!("sim://{uid}/{name}");
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": format!("sim://{}", c.image.as_deref().unwrap_or_default()),
                "containerID": container_id(&c.name), "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": now}}})
        })
        .collect();
    let inits: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": format!("sim://{}", c.image.as_deref().unwrap_or_default()),
                "containerID": container_id(&c.name), "ready": true, "started": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}})
        })
        .collect();
    let condition = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let mut status = json!({
        "phase": "Running",
        "conditions": [
            condition("PodReadyToStartContainers"),
            condition("Initialized"),
            condition("Ready"),
            condition("ContainersReady"),
            condition("PodScheduled"),
        ],
        "startTime": now,
        "containerStatuses": containers,
    });
    if !inits.is_empty() {
        status["initContainerStatuses"] = json!(inits);
    }
    if let Some(ip) = pod_ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    if let Some(ip) = host_ip {
        status["hostIP"] = json!(ip);
        status["hostIPs"] = json!([{"ip": ip}]);
    }
    json!({ "status": status })
}

/// The containers' `n`th exit with `code`: the pod ends Succeeded or Failed, or (when
/// they restart) stays Running, not ready until the restart, with `n` restarts counted.
async fn exit(
    client: &Client,
    pod: &Pod,
    code: i32,
    n: i32,
    restarts: bool,
) -> Result<(), kube::Error> {
    let patch = exited_status(pod, code, n, restarts);
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    retry(|| api.patch_status(&name, &params, &patch)).await
}

/// The status after the containers' `n`th exit (see [`exit`]).
pub fn exited_status(pod: &Pod, code: i32, n: i32, restarts: bool) -> Value {
    let now = Timestamp::now().to_string();
    let uid = pod.uid().unwrap_or_default();
    let reason = if code == 0 { "Completed" } else { "Error" };
    let terminated = json!({"terminated": {"exitCode": code, "reason": reason,
        "startedAt": now, "finishedAt": now}});
    let spec = pod.spec.clone().unwrap_or_default();
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            let mut status = json!({"name": c.name, "image": c.image,
                "imageID": format!("sim://{}", c.image.as_deref().unwrap_or_default()),
                "containerID": format!("sim://{uid}/{}", c.name), "ready": restarts,
                "started": restarts, "restartCount": if restarts { n } else { n - 1 }});
            if restarts {
                status["state"] = json!({"running": {"startedAt": now}});
                status["lastState"] = terminated.clone();
            } else {
                status["state"] = terminated.clone();
            }
            status
        })
        .collect();
    if restarts {
        return json!({"status": {"containerStatuses": containers}});
    }
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    let condition = |t: &str, status: &str| {
        json!({"type": t, "status": status, "lastTransitionTime": now,
            "reason": if status == "False" { "PodCompleted" } else { "" }})
    };
    json!({"status": {"phase": phase, "containerStatuses": containers, "conditions": [
        condition("PodReadyToStartContainers", "False"),
        condition("Initialized", "True"),
        condition("Ready", "False"),
        condition("ContainersReady", "False"),
        condition("PodScheduled", "True"),
    ]}})
}

/// Removes a deleted pod for good (its "containers" stopped at once). As a kubelet
/// does, a pod not yet finished ends Failed first: controllers that hold pods with
/// finalizers (Jobs) release them once they see a terminal phase.
async fn finish(client: &Client, pod: &Pod) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    if !is_finished(pod) && pod.finalizers().iter().any(|f| !f.is_empty()) {
        let patch = exited_status(pod, 137, 1, false);
        let (name, params, patch) = (pod.name_any(), PatchParams::default(), Patch::Merge(&patch));
        match retry(|| api.patch_status(&name, &params, &patch)).await {
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            other => other?,
        }
    }
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let name = pod.name_any();
    match retry(|| api.delete(&name, &params)).await {
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// A write, tried again after a short pause when the apiserver is busy or unreachable;
/// answers that will not change (not found, conflict, invalid) are returned at once.
async fn retry<T, F, Fut>(write: F) -> Result<(), kube::Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut pause = Duration::from_millis(50);
    for attempt in 1..=WRITE_TRIES {
        match write().await {
            Ok(_) => return Ok(()),
            Err(e) if !transient(&e) || attempt == WRITE_TRIES => return Err(e),
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod() -> Pod {
        let container = |name: &str| Container {
            name: name.into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("p".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container("app")],
                init_containers: Some(vec![container("setup")]),
                node_name: Some("sim-node-0".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_started_pod_is_running_and_ready_with_its_addresses() {
        let mut pod = pod();
        assert!(!is_running_and_ready(&pod));
        let patch = running_status(&pod, Some("10.42.0.5".into()), Some("127.100.0.1".into()));
        let status = &patch["status"];
        assert_eq!(status["podIP"], "10.42.0.5");
        assert_eq!(status["hostIPs"][0]["ip"], "127.100.0.1");
        assert_eq!(
            status["containerStatuses"][0]["containerID"],
            "sim://u1/app"
        );
        assert_eq!(status["containerStatuses"][0]["ready"], true);
        assert_eq!(
            status["initContainerStatuses"][0]["state"]["terminated"]["reason"],
            "Completed"
        );
        pod.status = Some(k8s_openapi::serde_json::from_value(status.clone()).unwrap());
        assert!(is_running_and_ready(&pod));
    }

    #[test]
    fn annotated_pods_exit_as_their_restart_policy_says() {
        let mut pod = pod();
        assert_eq!(exit_plan(&pod), None);
        pod.metadata.annotations = Some(
            [
                (EXIT_AFTER.to_string(), "1500ms".to_string()),
                (EXIT_CODE.to_string(), "3".to_string()),
            ]
            .into(),
        );
        pod.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        assert_eq!(exit_plan(&pod), Some((Duration::from_millis(1500), 3)));
        let failed = &exited_status(&pod, 3, 1, false)["status"];
        assert_eq!(failed["phase"], "Failed");
        assert_eq!(
            failed["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            3
        );
        assert_eq!(
            failed["containerStatuses"][0]["state"]["terminated"]["reason"],
            "Error"
        );
        assert_eq!(
            exited_status(&pod, 0, 1, false)["status"]["phase"],
            "Succeeded"
        );
        // OnFailure: the containers restart and the pod stays Running.
        let restarted = &exited_status(&pod, 3, 2, true)["status"];
        assert!(restarted.get("phase").is_none());
        assert_eq!(restarted["containerStatuses"][0]["restartCount"], 2);
        assert_eq!(
            restarted["containerStatuses"][0]["lastState"]["terminated"]["exitCode"],
            3
        );
        pod.spec.as_mut().unwrap().restart_policy = Some("Always".into());
        assert_eq!(exit_plan(&pod), None, "Always: they run on");
    }
}
