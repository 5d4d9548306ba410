//! What simulated containers use, so that `kubectl top` and the HorizontalPodAutoscaler
//! have figures on simulated nodes. Each container of a running pod uses what the
//! pod's annotations `sim.krust.io/usage-cpu` and `sim.krust.io/usage-memory` say (as
//! kwok's `kwok.x-k8s.io/usage-*`), 1m and 1Mi when they say nothing; annotating a
//! running pod changes its usage from then on, as a change of load would. A node uses
//! what its pods use.
//!
//! CPU is a cumulative counter, as the kubelet reads it from cgroups: the rate a scraper
//! computes between two readings is the configured usage, and a node's counter keeps
//! what its ended containers used, so it never goes back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use krust_api::resource_metrics::{ContainerKey, Sample, now_millis};
use krust_api::sync::Unpoisoned;
use krust_client::informer::EventHandler;
use kube::ResourceExt;

use crate::nodes::Fleet;

/// The CPU each container of the pod uses (a quantity: `250m`, `1.5`).
pub const USAGE_CPU: &str = "sim.krust.io/usage-cpu";
/// The memory each container of the pod uses (a quantity: `64Mi`).
pub const USAGE_MEMORY: &str = "sim.krust.io/usage-memory";
/// kwok's defaults: 1m and 1Mi.
const DEFAULT_NANO_CORES: u64 = 1_000_000;
const DEFAULT_MEMORY_BYTES: u64 = 1 << 20;

/// One run of a container (a restart is a new run).
#[derive(Debug, PartialEq)]
struct Run {
    container: String,
    started_millis: i64,
    nano_cores: u64,
    memory_bytes: u64,
    /// CPU seconds used up to `since_millis`, at the earlier rates.
    used: f64,
    since_millis: i64,
}

impl Run {
    fn cpu_seconds(&self, now_millis: i64) -> f64 {
        let elapsed = (now_millis - self.since_millis).max(0) as f64 / 1000.0;
        self.used + self.nano_cores as f64 / 1e9 * elapsed
    }
}

#[derive(Default)]
struct NodePods {
    /// CPU seconds of the runs that ended.
    ended: f64,
    /// (namespace, pod) → its containers' runs.
    pods: HashMap<(String, String), Vec<Run>>,
}

impl NodePods {
    fn end(&mut self, runs: impl IntoIterator<Item = Run>, now: i64) {
        self.ended += runs.into_iter().map(|r| r.cpu_seconds(now)).sum::<f64>();
    }
}

/// The usage of every running pod on the fleet's nodes, fed by the pod informer.
pub struct Usage {
    fleet: Arc<Fleet>,
    nodes: Mutex<HashMap<String, NodePods>>,
}

impl Usage {
    pub fn new(fleet: Arc<Fleet>) -> Usage {
        Usage {
            fleet,
            nodes: Mutex::new(HashMap::new()),
        }
    }

    /// What `node` and its containers have used, read at `now_millis`.
    pub fn sample(&self, node: &str, now_millis: i64) -> (Sample, BTreeMap<ContainerKey, Sample>) {
        let nodes = self.nodes.locked();
        let mut total = Sample {
            cpu_seconds: 0.0,
            memory_bytes: 0,
            millis: now_millis,
            started: None,
        };
        let mut containers = BTreeMap::new();
        let Some(pods) = nodes.get(node) else {
            return (total, containers);
        };
        total.cpu_seconds = pods.ended;
        for ((namespace, pod), runs) in &pods.pods {
            for run in runs {
                let sample = Sample {
                    cpu_seconds: run.cpu_seconds(now_millis),
                    memory_bytes: run.memory_bytes,
                    millis: now_millis,
                    started: Some(run.started_millis as f64 / 1000.0),
                };
                total.cpu_seconds += sample.cpu_seconds;
                total.memory_bytes = total.memory_bytes.saturating_add(sample.memory_bytes);
                let key = (namespace.clone(), pod.clone(), run.container.clone());
                containers.insert(key, sample);
            }
        }
        (total, containers)
    }

    /// Takes in a pod's current state at `now`.
    fn update(&self, pod: &Pod, now: i64) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            return;
        };
        if !self.fleet.contains(node) {
            return;
        }
        let running = running_containers(pod);
        if running.is_empty() {
            return self.remove(pod, now);
        }
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let mut nodes = self.nodes.locked();
        let (nano_cores, memory_bytes) = configured(pod);
        let pods = nodes.entry(node.to_string()).or_default();
        let before = pods.pods.remove(&key).unwrap_or_default();
        let (mut kept, mut ended) = (Vec::new(), Vec::new());
        for run in before {
            match running.iter().find(|(c, _)| *c == run.container) {
                Some((_, started)) if *started == run.started_millis => kept.push(run),
                _ => ended.push(run),
            }
        }
        pods.end(ended, now);
        let runs = running
            .into_iter()
            .map(|(container, started_millis)| {
                match kept.iter().position(|r| r.container == container) {
                    // The same run: what it used so far stays, the rate may change.
                    Some(i) => {
                        let run = kept.swap_remove(i);
                        Run {
                            used: run.cpu_seconds(now),
                            since_millis: now.max(run.since_millis),
                            nano_cores,
                            memory_bytes,
                            ..run
                        }
                    }
                    None => Run {
                        container,
                        started_millis,
                        nano_cores,
                        memory_bytes,
                        used: 0.0,
                        since_millis: started_millis,
                    },
                }
            })
            .collect();
        pods.pods.insert(key, runs);
    }

    fn remove(&self, pod: &Pod, now: i64) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            return;
        };
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        if let Some(pods) = self.nodes.locked().get_mut(node)
            && let Some(runs) = pods.pods.remove(&key)
        {
            pods.end(runs, now);
        }
    }
}

impl EventHandler<Pod> for Usage {
    fn on_apply(&self, _old: Option<&Pod>, pod: &Arc<Pod>) {
        self.update(pod, now_millis());
    }
    fn on_delete(&self, pod: &Arc<Pod>) {
        self.remove(pod, now_millis());
    }
}

/// The containers of a Running pod that run, with when they started (milliseconds);
/// none for a pod being deleted or not running.
fn running_containers(pod: &Pod) -> Vec<(String, i64)> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    if pod.metadata.deletion_timestamp.is_some() || status.phase.as_deref() != Some("Running") {
        return Vec::new();
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| {
            let started = c.state.as_ref()?.running.as_ref()?.started_at.as_ref();
            let millis = started.map_or_else(now_millis, |t| t.0.as_millisecond());
            Some((c.name.clone(), millis))
        })
        .collect()
}

/// (nano-cores, bytes) each container of `pod` uses.
fn configured(pod: &Pod) -> (u64, u64) {
    let read = |key: &str, scale: i32, default: u64| {
        let Some(text) = pod.annotations().get(key) else {
            return default;
        };
        match krust_api::quantity::scaled_value(text, scale) {
            Ok(v) => v.max(0) as u64,
            Err(err) => {
                tracing::debug!(pod = %pod.name_any(), %err, "{key} ignored");
                default
            }
        }
    };
    (
        read(USAGE_CPU, 9, DEFAULT_NANO_CORES),
        read(USAGE_MEMORY, 0, DEFAULT_MEMORY_BYTES),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::json;

    fn pod(annotations: &[(&str, &str)], started: &str, phase: &str) -> Pod {
        let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
        k8s_openapi::serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "annotations": annotations},
            "spec": {"nodeName": "sim-node-0", "containers": [{"name": "app"}]},
            "status": {"phase": phase, "containerStatuses": [{"name": "app", "image": "i",
                "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": started}}}]},
        }))
        .unwrap()
    }

    const T0: &str = "2026-01-01T00:00:00Z";
    const T0_MILLIS: i64 = 1_767_225_600_000;

    #[tokio::test]
    async fn a_container_uses_what_its_pod_says_and_the_node_keeps_what_ended_ones_used() {
        let usage = Usage::new(Fleet::for_tests(&["sim-node-0"]));
        let cpu = |usage: &Usage, at: i64| usage.sample("sim-node-0", at);
        let busy = pod(
            &[(USAGE_CPU, "500m"), (USAGE_MEMORY, "64Mi")],
            T0,
            "Running",
        );
        usage.update(&busy, T0_MILLIS + 1_000);
        let (node, containers) = cpu(&usage, T0_MILLIS + 20_000);
        let app = containers[&("ns".into(), "web".into(), "app".into())];
        // Half a core for 20 s since the start.
        assert_eq!(app.cpu_seconds, 10.0);
        assert_eq!(app.memory_bytes, 64 << 20);
        assert_eq!(app.started, Some(T0_MILLIS as f64 / 1000.0));
        assert_eq!((node.cpu_seconds, node.memory_bytes), (10.0, 64 << 20));

        // More load from 20 s on: what was used stays, the rate changes.
        let busier = pod(&[(USAGE_CPU, "2")], T0, "Running");
        usage.update(&busier, T0_MILLIS + 20_000);
        let (node, containers) = cpu(&usage, T0_MILLIS + 30_000);
        assert_eq!(containers.values().next().unwrap().cpu_seconds, 30.0);
        assert_eq!(node.memory_bytes, DEFAULT_MEMORY_BYTES);

        // A restart is a new run; the node's counter does not go back.
        let restarted = pod(&[(USAGE_CPU, "2")], "2026-01-01T00:00:30Z", "Running");
        usage.update(&restarted, T0_MILLIS + 30_000);
        let (node, containers) = cpu(&usage, T0_MILLIS + 31_000);
        assert_eq!(containers.values().next().unwrap().cpu_seconds, 2.0);
        assert_eq!(node.cpu_seconds, 32.0);

        // Finished: gone from the node's containers, counted in its total.
        usage.update(&pod(&[], T0, "Succeeded"), T0_MILLIS + 32_000);
        let (node, containers) = cpu(&usage, T0_MILLIS + 40_000);
        assert!(containers.is_empty());
        assert_eq!((node.cpu_seconds, node.memory_bytes), (34.0, 0));
    }

    #[tokio::test]
    async fn defaults_are_kwoks_and_other_nodes_pods_are_not_ours() {
        let usage = Usage::new(Fleet::for_tests(&["sim-node-0"]));
        let idle = pod(&[(USAGE_CPU, "lots")], T0, "Running");
        assert_eq!(
            configured(&idle),
            (DEFAULT_NANO_CORES, DEFAULT_MEMORY_BYTES)
        );
        let mut elsewhere = idle.clone();
        elsewhere.spec.as_mut().unwrap().node_name = Some("real-node".into());
        usage.update(&elsewhere, T0_MILLIS);
        assert!(usage.nodes.locked().is_empty());
        usage.update(&idle, T0_MILLIS);
        usage.remove(&idle, T0_MILLIS + 1000);
        let (node, containers) = usage.sample("sim-node-0", T0_MILLIS + 5000);
        assert!(containers.is_empty());
        assert_eq!(node.cpu_seconds, 0.001);
    }
}
