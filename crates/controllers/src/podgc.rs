//! `PodGcController`, upstream's pod garbage collector. Every 20 s it
//! - deletes the oldest finished pods (Succeeded or Failed; evicted ones first) beyond
//!   `--terminated-pod-gc-threshold` (12,500; 0 keeps them all);
//! - force-deletes terminating pods on a node that is not Ready and carries the
//!   `node.kubernetes.io/out-of-service` taint (non-graceful node shutdown);
//! - force-deletes the pods bound to a node that no longer exists — once the node has
//!   been missing from the cache for 40 s and a read confirms it — marked Failed with a
//!   `DisruptionTarget` condition (`DeletionByPodGC`), so a Job's pod failure policy can
//!   tell them from failures;
//! - force-deletes terminating pods that were never scheduled (no kubelet will).
//!
//! Pods still running are marked Failed before they go, as upstream does: no kubelet is
//! left to do it for an orphan.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::serde_json::json;
use krust_client::cache::Cache;
use krust_client::informer::SharedInformers;
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use crate::Error;
use crate::owner::key_of;
use crate::pods::{CachedPod, Phase};

/// Upstream's `gcCheckPeriod`.
const PERIOD: Duration = Duration::from_secs(20);
/// Upstream's `quarantineTime`: how long a node may be missing from the cache before it
/// is looked up, in case the cache is merely behind.
const QUARANTINE: Duration = Duration::from_secs(40);
/// kube-controller-manager's `--terminated-pod-gc-threshold` default.
pub const TERMINATED_POD_GC_THRESHOLD: usize = 12_500;
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";
/// The queue's only key: one pass over every pod.
const PASS: &str = "gc";

pub struct PodGcController {
    client: Client,
    pods: Cache<CachedPod>,
    nodes: Cache<Node>,
    queue: Arc<WorkQueue>,
    /// Finished pods kept at most (0: no limit).
    terminated_threshold: usize,
    /// Nodes that pods are bound to but the cache lacks: since when.
    missing_since: Mutex<HashMap<String, Instant>>,
}

impl PodGcController {
    pub fn new(
        client: Client,
        informers: &SharedInformers,
        terminated_threshold: usize,
    ) -> Arc<Self> {
        let controller = Arc::new(PodGcController {
            client,
            pods: informers.get::<CachedPod>().cache(),
            nodes: informers.get::<Node>().cache(),
            queue: WorkQueue::new("pod-garbage-collector"),
            terminated_threshold,
            missing_since: Mutex::default(),
        });
        controller.queue.add(PASS);
        controller
    }
}

/// Upstream's `isPodTerminated`: a pod without a phase counts as finished too.
fn is_terminated(pod: &CachedPod) -> bool {
    !matches!(
        pod.status.phase,
        Some(Phase::Pending | Phase::Running | Phase::Unknown)
    )
}

fn node_of(pod: &CachedPod) -> Option<&str> {
    pod.spec.node_name.as_deref().filter(|n| !n.is_empty())
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The finished pods to delete so that `threshold` remain: evicted ones first, then the
/// oldest, names breaking ties (upstream's `byEvictionAndCreationTimestamp`).
fn excess_terminated(pods: &[Arc<CachedPod>], threshold: usize) -> Vec<Arc<CachedPod>> {
    let mut finished: Vec<Arc<CachedPod>> =
        pods.iter().filter(|p| is_terminated(p)).cloned().collect();
    let Some(excess) = finished.len().checked_sub(threshold).filter(|n| *n > 0) else {
        return Vec::new();
    };
    let evicted = |p: &CachedPod| {
        p.status.phase == Some(Phase::Failed) && p.status.reason.as_deref() == Some("Evicted")
    };
    finished.sort_by(|a, b| {
        evicted(b)
            .cmp(&evicted(a))
            .then_with(|| {
                let created = |p: &CachedPod| p.metadata.creation_timestamp;
                created(a).cmp(&created(b))
            })
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    finished.truncate(excess);
    finished
}

impl Reconciler for PodGcController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, _key: &str) -> Result<Option<Duration>, Error> {
        let pods = self.pods.state();
        let mut doomed: Vec<(Arc<CachedPod>, Option<PodCondition>)> = Vec::new();
        if self.terminated_threshold > 0 {
            doomed.extend(
                excess_terminated(&pods, self.terminated_threshold)
                    .into_iter()
                    .map(|p| (p, None)),
            );
        }
        doomed.extend(
            pods.iter()
                .filter(|p| p.metadata.terminating)
                .filter(|p| {
                    node_of(p)
                        .and_then(|n| self.nodes.get(None, n))
                        .is_some_and(|n| !is_ready(&n) && has_out_of_service_taint(&n))
                })
                .map(|p| (p.clone(), None)),
        );
        let gone = self.deleted_nodes(&pods).await;
        doomed.extend(
            pods.iter()
                .filter(|p| node_of(p).is_some_and(|n| gone.contains(n)))
                .map(|p| {
                    let condition = PodCondition {
                        type_: "DisruptionTarget".into(),
                        status: "True".into(),
                        reason: Some("DeletionByPodGC".into()),
                        message: Some("PodGC: node no longer exists".into()),
                        last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                        ..Default::default()
                    };
                    (p.clone(), Some(condition))
                }),
        );
        doomed.extend(
            pods.iter()
                .filter(|p| p.metadata.terminating && node_of(p).is_none())
                .map(|p| (p.clone(), None)),
        );
        let mut seen = BTreeSet::new();
        for (pod, condition) in doomed {
            if seen.insert(key_of(&pod.metadata)) {
                self.fail_and_delete(&pod, condition).await?;
            }
        }
        Ok(Some(PERIOD))
    }
}

fn has_out_of_service_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE))
}

impl PodGcController {
    /// The nodes pods are bound to that have been missing from the cache for the
    /// quarantine and that a read confirms are gone.
    async fn deleted_nodes(&self, pods: &[Arc<CachedPod>]) -> BTreeSet<String> {
        let missing: BTreeSet<&str> = pods
            .iter()
            .filter_map(|p| node_of(p))
            .filter(|n| self.nodes.get(None, n).is_none())
            .collect();
        let now = Instant::now();
        let due: Vec<String> = {
            let mut since = self.missing_since.lock().expect("lock");
            since.retain(|n, _| missing.contains(n.as_str()));
            for n in &missing {
                since.entry(n.to_string()).or_insert(now);
            }
            since
                .iter()
                .filter(|(_, t)| now.duration_since(**t) >= QUARANTINE)
                .map(|(n, _)| n.clone())
                .collect()
        };
        let api: Api<Node> = Api::all(self.client.clone());
        let mut gone = BTreeSet::new();
        for name in due {
            match api.get(&name).await {
                Err(e) if is_status(&e, 404) => {
                    gone.insert(name);
                }
                Err(e) => tracing::warn!(node = %name, error = %e, "checking a missing node"),
                Ok(_) => {}
            }
        }
        gone
    }

    /// Upstream's `markFailedAndDeletePodWithCondition`: a pod not yet finished is marked
    /// Failed (with `condition`), then the pod is deleted without a grace period.
    async fn fail_and_delete(
        &self,
        pod: &CachedPod,
        condition: Option<PodCondition>,
    ) -> Result<(), Error> {
        let name = &*pod.metadata.name;
        let key = key_of(&pod.metadata);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.metadata.namespace);
        tracing::info!(pod = %key, "PodGC is force deleting Pod");
        if !is_terminated(pod) {
            // A strategic merge patch: the condition joins the others by type.
            let mut status = json!({"phase": "Failed"});
            if let Some(c) = condition {
                status["conditions"] = json!([c]);
            }
            let patch = json!({"status": status});
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) if is_status(&e, 404) || is_status(&e, 409) => return Ok(()),
                Err(e) => return Err(Error::api("marking the pod failed", key, e)),
            }
        }
        match api
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(Error::api("deleting the pod", key, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str, created: &str, reason: Option<&str>) -> Arc<CachedPod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
                "status": {"phase": phase, "reason": reason}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn the_oldest_finished_pods_beyond_the_threshold_go_evicted_first() {
        let pods = vec![
            pod("running", "Running", "2026-01-01T00:00:00Z", None),
            pod("old", "Succeeded", "2026-01-01T00:00:01Z", None),
            pod("b-same", "Failed", "2026-01-01T00:00:02Z", None),
            pod("a-same", "Succeeded", "2026-01-01T00:00:02Z", None),
            pod("evicted", "Failed", "2026-01-01T00:00:09Z", Some("Evicted")),
            pod("new", "Succeeded", "2026-01-01T00:00:05Z", None),
        ];
        let names = |threshold| -> Vec<String> {
            excess_terminated(&pods, threshold)
                .iter()
                .map(|p| p.metadata.name.to_string())
                .collect()
        };
        assert_eq!(names(5), Vec::<String>::new(), "five finished pods fit");
        assert_eq!(names(3), ["evicted", "old"]);
        assert_eq!(names(1), ["evicted", "old", "a-same", "b-same"]);
    }
}
