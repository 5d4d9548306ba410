//! A pod's status from what the runtime reports: phase, the conditions
//! (PodReadyToStartContainers, Initialized, ContainersReady, Ready, PodScheduled),
//! one container status per spec container (waiting / running / terminated, last
//! state, restart count, ready, started, image ID, container ID), IPs, start time and
//! QoS class.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::serde_json::{Value, json};
use krust_cri::api::ContainerState;

use super::spec::qos_class;

/// The newest instance of one container, as the runtime reports it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Instance {
    pub id: String,
    pub attempt: u32,
    pub state: i32,
    /// Nanoseconds since the epoch.
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub image_ref: String,
}

impl Instance {
    pub fn running(&self) -> bool {
        self.state == ContainerState::ContainerRunning as i32
    }

    pub fn exited(&self) -> bool {
        self.state == ContainerState::ContainerExited as i32
    }

    /// The `terminated` state object of an exited instance.
    pub fn terminated(&self) -> Value {
        let reason = if !self.reason.is_empty() {
            self.reason.clone()
        } else if self.exit_code == 0 {
            "Completed".into()
        } else {
            "Error".into()
        };
        let mut t = json!({
            "exitCode": self.exit_code, "reason": reason,
            "startedAt": time(self.started_at), "finishedAt": time(self.finished_at),
            "containerID": format!("containerd://{}", self.id),
        });
        if !self.message.is_empty() {
            t["message"] = json!(self.message);
        }
        t
    }
}

fn time(nanos: i64) -> Value {
    if nanos <= 0 {
        return Value::Null;
    }
    k8s_openapi::jiff::Timestamp::from_nanosecond(nanos as i128)
        .map(|t| json!(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
        .unwrap_or(Value::Null)
}

/// What the pod worker knows about the pod's runtime state.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub sandbox_ready: bool,
    pub pod_ip: Option<String>,
    pub host_ip: String,
    /// RFC 3339, when the kubelet first acted on the pod.
    pub start_time: String,
    /// Newest instance per container name.
    pub containers: HashMap<String, Instance>,
    /// Why a container is not running (ContainerCreating, ErrImagePull, ...).
    pub waiting: HashMap<String, (String, String)>,
    /// The previous instance's termination, per container name.
    pub last_terminated: HashMap<String, Value>,
    /// Probe verdicts of running containers: (started, ready); none means no probes
    /// have a say (a running container is then started and ready).
    pub probed: HashMap<String, (bool, bool)>,
    /// Every init container has completed (true for pods without any).
    pub initialized: bool,
    /// An init container failed under `restartPolicy: Never`: the pod has failed.
    pub init_failed: bool,
    /// Evicted by the kubelet, with this message: the pod has failed.
    pub evicted: Option<String>,
}

/// The pod's phase: Pending until every container has started once; Succeeded or
/// Failed when all have stopped for good under the restart policy; else Running.
fn phase(pod: &Pod, observed: &Observed) -> &'static str {
    if observed.init_failed || observed.evicted.is_some() {
        return "Failed";
    }
    if !observed.initialized {
        return "Pending";
    }
    let spec = pod.spec.as_ref();
    let names: Vec<&str> = spec
        .map(|s| s.containers.iter().map(|c| c.name.as_str()).collect())
        .unwrap_or_default();
    let instances: Vec<&Instance> = names
        .iter()
        .filter_map(|n| observed.containers.get(*n))
        .collect();
    if instances.len() < names.len() || !observed.sandbox_ready && instances.is_empty() {
        return "Pending";
    }
    let policy = spec
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let all_exited = instances.iter().all(|i| i.exited());
    if all_exited && policy != "Always" {
        let ok = instances.iter().all(|i| i.exit_code == 0);
        if ok {
            return "Succeeded";
        }
        if policy == "Never" {
            return "Failed";
        }
    }
    "Running"
}

/// One container's status, and whether it is ready. A completed init container is
/// ready; an app container is ready while running and passing its probes.
fn container_status(c: &Container, observed: &Observed, init: bool) -> (Value, bool) {
    let image = c.image.clone().unwrap_or_default();
    let instance = observed.containers.get(&c.name);
    let running = instance.is_some_and(Instance::running);
    let completed = init && instance.is_some_and(|i| i.exited() && i.exit_code == 0);
    let (started, ready) = match observed.probed.get(&c.name) {
        Some((started, ready)) => (running && *started, running && *ready),
        None => (running, running || completed),
    };
    let state = match (instance, observed.waiting.get(&c.name)) {
        (_, Some((reason, message))) if !running => {
            let mut w = json!({"reason": reason});
            if !message.is_empty() {
                w["message"] = json!(message);
            }
            json!({"waiting": w})
        }
        (Some(i), _) if i.running() => json!({"running": {"startedAt": time(i.started_at)}}),
        (Some(i), _) if i.exited() => json!({"terminated": i.terminated()}),
        _ if !init && !observed.initialized => json!({"waiting": {"reason": "PodInitializing"}}),
        _ => json!({"waiting": {"reason": "ContainerCreating"}}),
    };
    let mut status = json!({
        "name": c.name, "image": image, "ready": ready, "started": started,
        "restartCount": instance.map_or(0, |i| i.attempt),
        "state": state,
        "imageID": instance.map(|i| i.image_ref.clone()).unwrap_or_default(),
    });
    if let Some(i) = instance {
        status["containerID"] = json!(format!("containerd://{}", i.id));
    }
    status["lastState"] = match observed.last_terminated.get(&c.name) {
        Some(t) => json!({"terminated": t}),
        None => json!({}),
    };
    (status, ready)
}

/// The pod's status object.
pub fn pod_status(pod: &Pod, observed: &Observed) -> Value {
    let spec = pod.spec.clone().unwrap_or_default();
    let statuses: Vec<(Value, bool)> = spec
        .containers
        .iter()
        .map(|c| container_status(c, observed, false))
        .collect();
    let all_ready = !statuses.is_empty() && statuses.iter().all(|(_, ready)| *ready);
    let statuses: Vec<Value> = statuses.into_iter().map(|(s, _)| s).collect();
    let init_statuses: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_status(c, observed, true).0)
        .collect();
    let phase = phase(pod, observed);
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let condition = |t: &str, ok: bool, reason: Option<&str>| {
        let mut c = json!({"type": t, "status": if ok { "True" } else { "False" },
            "lastProbeTime": Value::Null, "lastTransitionTime": now});
        if let Some(r) = reason.filter(|_| !ok) {
            c["reason"] = json!(r);
        }
        c
    };
    let done = matches!(phase, "Succeeded" | "Failed");
    let ready = all_ready && !done;
    let mut status = json!({
        "phase": phase,
        "conditions": [
            condition("PodReadyToStartContainers", observed.sandbox_ready, None),
            condition("Initialized", observed.initialized, Some("ContainersNotInitialized")),
            condition("ContainersReady", ready, Some(if done { "PodCompleted" } else { "ContainersNotReady" })),
            condition("Ready", ready, Some(if done { "PodCompleted" } else { "ContainersNotReady" })),
            condition("PodScheduled", true, None),
        ],
        "hostIP": observed.host_ip,
        "hostIPs": [{"ip": observed.host_ip}],
        "startTime": observed.start_time,
        "containerStatuses": statuses,
        "qosClass": qos_class(pod),
    });
    if !init_statuses.is_empty() {
        status["initContainerStatuses"] = json!(init_statuses);
    }
    // Never ready: an ephemeral container serves no traffic.
    let ephemeral_statuses: Vec<Value> = crate::pods::spec::ephemeral_containers(pod)
        .iter()
        .map(|c| {
            let (mut s, _) = container_status(c, observed, true);
            s["ready"] = json!(false);
            s
        })
        .collect();
    if !ephemeral_statuses.is_empty() {
        status["ephemeralContainerStatuses"] = json!(ephemeral_statuses);
    }
    if let Some(ip) = observed.pod_ip.as_ref().filter(|ip| !ip.is_empty()) {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    if let Some(message) = &observed.evicted {
        status["reason"] = json!("Evicted");
        status["message"] = json!(message);
        let mut disruption = condition("DisruptionTarget", true, None);
        disruption["reason"] = json!("TerminationByKubelet");
        disruption["message"] = json!(message);
        status["conditions"]
            .as_array_mut()
            .expect("conditions")
            .push(disruption);
    }
    keep_others_conditions(&mut status, pod);
    status
}

/// The condition types only the kubelet writes (upstream's `PodConditionByKubelet`).
const KUBELET_CONDITIONS: [&str; 5] = [
    "PodScheduled",
    "Ready",
    "Initialized",
    "ContainersReady",
    "PodReadyToStartContainers",
];

/// Conditions that others set — a readiness gate's, a DisruptionTarget from an
/// eviction — stay as the API has them, unless the kubelet sets that type itself; the
/// status is written with a merge patch, which replaces the whole list (upstream's
/// status manager merges them the same way).
fn keep_others_conditions(status: &mut Value, pod: &Pod) {
    let Some(api) = pod.status.as_ref().and_then(|s| s.conditions.as_ref()) else {
        return;
    };
    let conditions = status["conditions"].as_array_mut().expect("conditions");
    for c in api {
        let ours = KUBELET_CONDITIONS.contains(&c.type_.as_str())
            || conditions.iter().any(|o| o["type"] == c.type_.as_str());
        if !ours && let Ok(c) = k8s_openapi::serde_json::to_value(c) {
            conditions.push(c);
        }
    }
}

/// Two statuses that differ only in transition times say the same.
pub fn same(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        for c in v["conditions"].as_array_mut().into_iter().flatten() {
            c.as_object_mut().map(|m| m.remove("lastTransitionTime"));
        }
        v
    };
    strip(a) == strip(b)
}

/// Whether the API's copy of the pod shows each condition of `status` as `status` has
/// it: someone else (the node lifecycle controller marking the pods of a silent node
/// not ready) may have changed one since the kubelet reported, and the kubelet then
/// reports again, as upstream's status manager reconciles.
pub fn api_shows(pod: &Pod, status: &Value) -> bool {
    let api = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions_shown(
        api.into_iter()
            .flatten()
            .map(|c| (c.type_.as_str(), c.status.as_str())),
        &status["conditions"],
    )
}

/// Whether `api` (condition type and status pairs) has every condition of `ours` (a
/// JSON list of conditions) with the same status.
pub fn conditions_shown<'a>(
    api: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    ours: &Value,
) -> bool {
    ours.as_array().into_iter().flatten().all(|c| {
        api.clone()
            .any(|(type_, status)| c["type"] == type_ && c["status"] == status)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_others_own_are_kept_and_the_kubelets_are_its_own() {
        let mut p = pod("Never");
        p.status = Some(
            k8s_openapi::serde_json::from_value(json!({"conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
                {"type": "example.com/gate", "status": "True"},
                {"type": "Ready", "status": "True"}
            ]}))
            .unwrap(),
        );
        let mut status = json!({"conditions": [{"type": "Ready", "status": "False"}]});
        keep_others_conditions(&mut status, &p);
        let types: Vec<(&str, &str)> = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
            .collect();
        assert_eq!(
            types,
            [
                ("Ready", "False"),
                ("DisruptionTarget", "True"),
                ("example.com/gate", "True")
            ]
        );
    }

    fn pod(policy: &str) -> Pod {
        k8s_openapi::serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"restartPolicy": policy, "containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}]}
        }))
        .unwrap()
    }

    fn instance(state: ContainerState, exit: i32, attempt: u32) -> Instance {
        Instance {
            id: "id".into(),
            attempt,
            state: state as i32,
            exit_code: exit,
            ..Instance::default()
        }
    }

    #[test]
    fn phases_follow_containers_and_restart_policy() {
        let mut o = Observed {
            sandbox_ready: true,
            initialized: true,
            ..Observed::default()
        };
        assert_eq!(phase(&pod("Always"), &o), "Pending");
        o.containers
            .insert("a".into(), instance(ContainerState::ContainerRunning, 0, 0));
        assert_eq!(phase(&pod("Always"), &o), "Pending", "b has not started");
        o.containers
            .insert("b".into(), instance(ContainerState::ContainerExited, 0, 0));
        assert_eq!(phase(&pod("Always"), &o), "Running");
        o.containers
            .insert("a".into(), instance(ContainerState::ContainerExited, 0, 0));
        assert_eq!(phase(&pod("Never"), &o), "Succeeded");
        o.containers
            .insert("a".into(), instance(ContainerState::ContainerExited, 1, 0));
        assert_eq!(phase(&pod("Never"), &o), "Failed");
        assert_eq!(
            phase(&pod("OnFailure"), &o),
            "Running",
            "it will be restarted"
        );
    }

    #[test]
    fn the_status_reports_readiness_and_container_states() {
        let mut o = Observed {
            sandbox_ready: true,
            initialized: true,
            pod_ip: Some("10.42.0.5".into()),
            host_ip: "192.168.1.2".into(),
            ..Observed::default()
        };
        o.containers
            .insert("a".into(), instance(ContainerState::ContainerRunning, 0, 2));
        o.waiting.insert(
            "b".into(),
            ("CrashLoopBackOff".into(), "back-off 20s".into()),
        );
        let s = pod_status(&pod("Always"), &o);
        assert_eq!(s["podIP"], "10.42.0.5");
        assert_eq!(s["containerStatuses"][0]["restartCount"], 2);
        assert_eq!(s["containerStatuses"][0]["ready"], true);
        assert_eq!(
            s["containerStatuses"][1]["state"]["waiting"]["reason"],
            "CrashLoopBackOff"
        );
        let ready = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "False");
        assert_eq!(ready["reason"], "ContainersNotReady");
        assert_eq!(s["qosClass"], "BestEffort");
    }
}
