//! `TaintEvictionController` (upstream's taint manager): a pod on a node with NoExecute
//! taints is evicted — a `DisruptionTarget` condition (reason `DeletionByTaintManager`),
//! a `TaintManagerEviction` event, then deletion — at once when it does not tolerate one
//! of them, else when the shortest `tolerationSeconds` of the tolerations it uses has
//! passed since the controller first saw it tainted (never, when one of them has none).
//! A taint removed in time cancels the eviction. Together with the NoExecute taints of
//! the node lifecycle controller, this is how pods leave a dead node: the default
//! tolerations that admission adds give them 300 s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::serde_json::json;
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use krust_client::selector::tolerates;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::owner::{key_of, split_key};
use crate::pods::CachedPod;

const NO_EXECUTE: &str = "NoExecute";

pub struct TaintEvictionController {
    client: Client,
    pods: Cache<CachedPod>,
    nodes: Cache<Node>,
    events: EventRecorder,
    queue: Arc<WorkQueue>,
    /// When each pod (key) was first seen on a tainted node: its countdown's start.
    tainted_since: Mutex<HashMap<String, Instant>>,
}

impl TaintEvictionController {
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let pods = informers.get::<CachedPod>();
        let nodes = informers.get::<Node>();
        let controller = Arc::new(TaintEvictionController {
            client,
            pods: pods.cache(),
            nodes: nodes.cache(),
            events,
            queue: WorkQueue::new("taint-eviction"),
            tainted_since: Mutex::default(),
        });
        pods.add_handler(Arc::new(PodEvents(controller.clone())));
        nodes.add_handler(Arc::new(NodeEvents(controller.clone())));
        controller
    }
}

fn no_execute_taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .filter(|t| t.effect == NO_EXECUTE)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// What to do with a pod under `taints`: `None` leaves it (no taint, or tolerated
/// forever); `Some(ZERO)` evicts now; else evicts after that long.
fn eviction_delay(taints: &[Taint], tolerations: &[Toleration]) -> Option<Duration> {
    if taints.is_empty() {
        return None;
    }
    let mut shortest: Option<i64> = None;
    for taint in taints {
        let used: Vec<&Toleration> = tolerations.iter().filter(|t| tolerates(t, taint)).collect();
        if used.is_empty() {
            return Some(Duration::ZERO);
        }
        // Upstream takes the minimum over every toleration in use; one without
        // tolerationSeconds tolerates forever only if all are so.
        for seconds in used.iter().filter_map(|t| t.toleration_seconds) {
            shortest = Some(shortest.map_or(seconds, |s| s.min(seconds)));
        }
    }
    shortest.map(|s| Duration::from_secs(s.max(0) as u64))
}

impl Reconciler for TaintEvictionController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (namespace, name) = split_key(key);
        let pod = self.pods.get(Some(namespace), name);
        let taints = pod
            .as_ref()
            .filter(|p| !p.metadata.terminating)
            .and_then(|p| self.nodes.get(None, p.spec.node_name.as_deref()?))
            .map(|node| no_execute_taints(&node))
            .unwrap_or_default();
        let tolerations = pod
            .as_ref()
            .map(|p| p.spec.no_execute_tolerations.clone())
            .unwrap_or_default();
        let Some(delay) = eviction_delay(&taints, &tolerations) else {
            self.tainted_since.lock().expect("lock").remove(key);
            return Ok(None);
        };
        let since = *self
            .tainted_since
            .lock()
            .expect("lock")
            .entry(key.to_string())
            .or_insert_with(Instant::now);
        let due = since + delay;
        let now = Instant::now();
        if due > now {
            return Ok(Some(due - now));
        }
        let pod = pod.expect("a pod with taints exists");
        self.evict(&pod).await?;
        self.tainted_since.lock().expect("lock").remove(key);
        Ok(None)
    }
}

impl TaintEvictionController {
    /// Upstream's `addConditionAndDeletePod`.
    async fn evict(&self, pod: &CachedPod) -> Result<(), Error> {
        let (namespace, name) = (&*pod.metadata.namespace, &*pod.metadata.name);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        // A strategic merge patch: the condition replaces any of its type, the others stay.
        let condition = k8s_openapi::api::core::v1::PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("DeletionByTaintManager".into()),
            message: Some("Taint manager: deleting due to NoExecute taint".into()),
            last_transition_time: Some(Time(jiff::Timestamp::now())),
            ..Default::default()
        };
        let patch = json!({"status": {"conditions": [condition]}});
        let key = key_of(&pod.metadata);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => return Ok(()),
            Err(e) => return Err(Error::api("marking the pod for eviction", key, e)),
        }
        self.events.record(
            &pod.reference(),
            EventType::Normal,
            "TaintManagerEviction",
            format!("Marking for deletion Pod {key}"),
        );
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(pod.metadata.uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(pod = key, "evicted from a node tainted NoExecute");
                Ok(())
            }
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
            Err(e) => Err(Error::api("evicting pod", key, e)),
        }
    }
}

struct PodEvents(Arc<TaintEvictionController>);

impl EventHandler<CachedPod> for PodEvents {
    fn on_apply(&self, old: Option<&CachedPod>, new: &Arc<CachedPod>) {
        let changed = old.is_none_or(|o| {
            o.spec.node_name != new.spec.node_name
                || o.spec.no_execute_tolerations != new.spec.no_execute_tolerations
        });
        if changed && new.spec.node_name.is_some() {
            self.0.queue.add(key_of(&new.metadata));
        }
    }
    fn on_delete(&self, pod: &Arc<CachedPod>) {
        self.0
            .tainted_since
            .lock()
            .expect("lock")
            .remove(&key_of(&pod.metadata));
    }
}

struct NodeEvents(Arc<TaintEvictionController>);

impl EventHandler<Node> for NodeEvents {
    fn on_apply(&self, old: Option<&Node>, new: &Arc<Node>) {
        let taints = no_execute_taints(new);
        if old.is_some_and(|o| no_execute_taints(o) == taints) {
            return;
        }
        let name = new.name_any();
        for pod in self
            .0
            .pods
            .state_filter(|p| p.spec.node_name.as_deref() == Some(name.as_str()))
        {
            self.0.queue.add(key_of(&pod.metadata));
        }
    }
    fn on_delete(&self, _node: &Arc<Node>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: NO_EXECUTE.into(),
            ..Default::default()
        }
    }

    fn toleration(key: &str, seconds: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(NO_EXECUTE.into()),
            toleration_seconds: seconds,
            ..Default::default()
        }
    }

    #[test]
    fn tolerations_decide_when_a_pod_leaves_a_tainted_node() {
        let unreachable = taint("node.kubernetes.io/unreachable");
        assert_eq!(eviction_delay(&[], &[]), None, "no taint");
        assert_eq!(
            eviction_delay(std::slice::from_ref(&unreachable), &[]),
            Some(Duration::ZERO),
            "not tolerated"
        );
        let default = toleration("node.kubernetes.io/unreachable", Some(300));
        assert_eq!(
            eviction_delay(
                std::slice::from_ref(&unreachable),
                std::slice::from_ref(&default)
            ),
            Some(Duration::from_secs(300))
        );
        let forever = toleration("node.kubernetes.io/unreachable", None);
        assert_eq!(
            eviction_delay(
                std::slice::from_ref(&unreachable),
                std::slice::from_ref(&forever)
            ),
            None
        );
        let short = toleration("", Some(10));
        let any = Toleration { key: None, ..short };
        assert_eq!(
            eviction_delay(std::slice::from_ref(&unreachable), &[default, any]),
            Some(Duration::from_secs(10)),
            "the shortest in use"
        );
        let other = taint("example.com/maintenance");
        assert_eq!(
            eviction_delay(&[unreachable, other], &[forever]),
            Some(Duration::ZERO),
            "one untolerated taint is enough"
        );
    }
}
