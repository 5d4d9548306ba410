//! `NodeLifecycleController`'s taint-by-condition pass (upstream's
//! `TaintNodesByCondition`): a Node's conditions and `spec.unschedulable` become
//! NoSchedule taints — `not-ready`, `unreachable`, `memory-pressure`, `disk-pressure`,
//! `pid-pressure`, `network-unavailable`, `unschedulable` under `node.kubernetes.io/` —
//! so the scheduler keeps new pods off a node in trouble unless they tolerate it. The
//! kubelet only reports conditions: NodeRestriction forbids it to change its own taints.
//! Taints that are not ours are kept as they are. [`health`] is the controller's other
//! half: silent nodes become `Unknown` and nodes not Ready get NoExecute taints.

pub mod health;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::serde_json::{self, json};
use krust_client::cache::Cache;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::Error;

const NO_SCHEDULE: &str = "NoSchedule";

/// (condition type, status) → the taint key it puts on, as upstream's
/// `nodeConditionToTaintKeyStatusMap`.
const CONDITION_TAINTS: &[(&str, &str, &str)] = &[
    ("Ready", "False", "node.kubernetes.io/not-ready"),
    ("Ready", "Unknown", "node.kubernetes.io/unreachable"),
    (
        "MemoryPressure",
        "True",
        "node.kubernetes.io/memory-pressure",
    ),
    ("DiskPressure", "True", "node.kubernetes.io/disk-pressure"),
    (
        "NetworkUnavailable",
        "True",
        "node.kubernetes.io/network-unavailable",
    ),
    ("PIDPressure", "True", "node.kubernetes.io/pid-pressure"),
];
const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

pub struct NodeLifecycleController {
    client: Client,
    nodes: Cache<Node>,
    queue: Arc<WorkQueue>,
}

impl NodeLifecycleController {
    /// Registers the controller's handler on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let informer = informers.get::<Node>();
        let controller = Arc::new(NodeLifecycleController {
            client,
            nodes: informer.cache(),
            queue: WorkQueue::new("node-lifecycle"),
        });
        informer.add_handler(Arc::new(NodeEvents(controller.clone())));
        controller
    }
}

/// Whether a taint key is one this pass manages.
fn managed(key: &str) -> bool {
    key == UNSCHEDULABLE || CONDITION_TAINTS.iter().any(|(_, _, k)| *k == key)
}

/// The NoSchedule taint keys the node's state calls for, in upstream's order.
fn wanted(node: &Node) -> Vec<&'static str> {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let mut keys: Vec<&'static str> = CONDITION_TAINTS
        .iter()
        .filter(|(ty, status, _)| {
            conditions
                .iter()
                .any(|c| c.type_ == *ty && c.status == *status)
        })
        .map(|(_, _, key)| *key)
        .collect();
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        keys.push(UNSCHEDULABLE);
    }
    keys
}

/// The node's taints with the managed NoSchedule ones replaced by `keys`, or `None` when
/// they already match.
fn retainted(node: &Node, keys: &[&str]) -> Option<Vec<Taint>> {
    let current = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let is_ours = |t: &Taint| t.effect == NO_SCHEDULE && managed(&t.key);
    let mut have: Vec<&str> = current
        .iter()
        .filter(|t| is_ours(t))
        .map(|t| t.key.as_str())
        .collect();
    have.sort_unstable();
    let mut want = keys.to_vec();
    want.sort_unstable();
    if have == want {
        return None;
    }
    let mut taints: Vec<Taint> = current.into_iter().filter(|t| !is_ours(t)).collect();
    taints.extend(keys.iter().map(|key| Taint {
        key: key.to_string(),
        effect: NO_SCHEDULE.into(),
        ..Default::default()
    }));
    Some(taints)
}

impl Reconciler for NodeLifecycleController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, name: &str) -> Result<Option<Duration>, Error> {
        let Some(node) = self.nodes.get(None, name) else {
            return Ok(None);
        };
        let Some(taints) = retainted(&node, &wanted(&node)) else {
            return Ok(None);
        };
        let api: Api<Node> = Api::all(self.client.clone());
        // Conditioned on the version read, so a concurrent edit of the taints conflicts
        // and the pass runs again on the newer node.
        let taints = serde_json::to_value(&taints).unwrap_or_default();
        let patch = json!({"metadata": {"resourceVersion": node.resource_version()}, "spec": {"taints": taints}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::api("tainting node", name.to_string(), e))?;
        tracing::info!(node = name, taints = %taints, "node taints follow its conditions");
        Ok(None)
    }
}

struct NodeEvents(Arc<NodeLifecycleController>);

impl EventHandler<Node> for NodeEvents {
    fn on_apply(&self, old: Option<&Node>, new: &Arc<Node>) {
        let changed = old.is_none_or(|o| {
            wanted(o) != wanted(new)
                || o.spec.as_ref().map(|s| &s.taints) != new.spec.as_ref().map(|s| &s.taints)
        });
        if changed {
            self.0.queue.add(new.name_any());
        }
    }
    fn on_delete(&self, _obj: &Arc<Node>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};

    fn node(conditions: &[(&str, &str)], taints: &[(&str, &str)], unschedulable: bool) -> Node {
        Node {
            spec: Some(NodeSpec {
                unschedulable: unschedulable.then_some(true),
                taints: Some(
                    taints
                        .iter()
                        .map(|(k, e)| Taint {
                            key: k.to_string(),
                            effect: e.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| NodeCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn conditions_become_no_schedule_taints_and_other_taints_stay() {
        let n = node(
            &[
                ("Ready", "True"),
                ("DiskPressure", "True"),
                ("MemoryPressure", "False"),
            ],
            &[
                ("dedicated", "NoSchedule"),
                ("node.kubernetes.io/memory-pressure", "NoSchedule"),
            ],
            true,
        );
        assert_eq!(
            wanted(&n),
            [
                "node.kubernetes.io/disk-pressure",
                "node.kubernetes.io/unschedulable"
            ]
        );
        let taints = retainted(&n, &wanted(&n)).unwrap();
        let keys: Vec<&str> = taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "dedicated",
                "node.kubernetes.io/disk-pressure",
                "node.kubernetes.io/unschedulable"
            ]
        );
        let settled = node(
            &[("Ready", "Unknown")],
            &[
                ("node.kubernetes.io/unreachable", "NoSchedule"),
                ("node.kubernetes.io/unreachable", "NoExecute"),
            ],
            false,
        );
        assert!(retainted(&settled, &wanted(&settled)).is_none());
        assert!(
            wanted(&node(&[], &[], false)).is_empty(),
            "no conditions, no taints"
        );
    }
}
