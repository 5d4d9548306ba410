//! Pods bound to simulated nodes: started (Running and Ready, with an IP and container
//! statuses, after the configured delay) and finished when deleted (removed at once,
//! as a kubelet does once its containers have stopped).
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
/// before it starts without an IP.
const NO_RANGE_RETRY: Duration = Duration::from_millis(100);
const NO_RANGE_TRIES: u32 = 50;
/// Attempts at one write before the pod is left for a later event.
const WRITE_TRIES: u32 = 5;

enum Action {
    Start(Arc<Pod>),
    Finish(Arc<Pod>),
}

/// UIDs of pods with a start or finish in progress or done.
#[derive(Default)]
struct Seen {
    started: HashSet<String>,
    finishing: HashSet<String>,
}

/// Watches pods and runs those bound to the fleet's nodes. Never returns.
pub async fn run(client: Client, config: Arc<Config>, fleet: Arc<Fleet>) {
    let (tx, rx) = mpsc::unbounded_channel::<Action>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..config.concurrency.max(1) {
        let rx = rx.clone();
        let client = client.clone();
        let fleet = fleet.clone();
        let seen = seen.clone();
        let work = move || {
            let (rx, client, fleet, seen) =
                (rx.clone(), client.clone(), fleet.clone(), seen.clone());
            async move {
                loop {
                    let Some(action) = rx.lock().await.recv().await else {
                        return;
                    };
                    act(&client, &fleet, &seen, action).await;
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
    } else if !is_running_and_ready(&pod) && seen.started.insert(uid) {
        if config.pod_ready_delay.is_zero() {
            let _ = tx.send(Action::Start(pod));
        } else {
            let tx = tx.clone();
            let delay = config.pod_ready_delay;
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = tx.send(Action::Start(pod));
            });
        }
    }
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

async fn act(client: &Client, fleet: &Fleet, seen: &Mutex<Seen>, action: Action) {
    let (pod, result) = match action {
        Action::Start(pod) => {
            let result = start(client, fleet, &pod).await;
            (pod, result)
        }
        Action::Finish(pod) => {
            let result = finish(client, &pod).await;
            (pod, result)
        }
    };
    if let Err(err) = result {
        // Forget it, so that the pod's next event tries again.
        let uid = pod.uid().unwrap_or_default();
        let mut seen = seen.locked();
        seen.started.remove(&uid);
        seen.finishing.remove(&uid);
        tracing::warn!(pod = %pod.name_any(), error = %err, "simulated pod update failed");
    }
}

async fn start(client: &Client, fleet: &Fleet, pod: &Pod) -> Result<(), kube::Error> {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let mut addresses = fleet.next_pod_ip(&node);
    for _ in 0..NO_RANGE_TRIES {
        if addresses.is_some() {
            break;
        }
        tokio::time::sleep(NO_RANGE_RETRY).await;
        addresses = fleet.next_pod_ip(&node);
    }
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

/// Removes a deleted pod for good (its "containers" stopped at once).
async fn finish(client: &Client, pod: &Pod) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
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
            Err(kube::Error::Api(s)) if s.code < 500 && s.code != 429 => {
                return Err(kube::Error::Api(s));
            }
            Err(e) if attempt == WRITE_TRIES => return Err(e),
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
        let patch = running_status(&pod, Some("10.42.0.5".into()), Some("10.200.0.1".into()));
        let status = &patch["status"];
        assert_eq!(status["podIP"], "10.42.0.5");
        assert_eq!(status["hostIPs"][0]["ip"], "10.200.0.1");
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
}
