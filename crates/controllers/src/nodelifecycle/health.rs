//! Upstream's node health monitoring (`monitorNodeHealth`) and NoExecute tainting pass.
//! Every monitor period each Node's liveness is judged from what its kubelet writes —
//! the Ready condition's heartbeat and the node's Lease in `kube-node-lease` — timed by
//! when *this* controller saw them change, so clock skew between machines does not
//! matter. A node silent for the grace period gets its conditions set to `Unknown`
//! ("Kubelet stopped posting node status."), a `NodeNotReady` event, and its pods
//! marked not ready (so EndpointSlices drop them at once). Nodes not Ready get the
//! `unreachable` or `not-ready` NoExecute taint, at most `eviction_rate` nodes per
//! second per zone; the taint-eviction controller then evicts their pods once their
//! tolerations run out. As upstream, a zone where most nodes are down is tainted more
//! slowly (not at all in small clusters), and when every node of every zone is down
//! the fault is assumed to be the control plane's network: nothing is tainted and the
//! taints come off.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::serde_json::json;
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::SharedInformers;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::pods::{CachedPod, is_ready};

pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
const NO_EXECUTE: &str = "NoExecute";
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// The conditions a silent node's are all set Unknown, as upstream's.
const WATCHED_CONDITIONS: &[&str] = &["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];
/// Upstream's `--unhealthy-zone-threshold` and `--large-cluster-size-threshold`.
const UNHEALTHY_ZONE_THRESHOLD: f64 = 0.55;
const LARGE_CLUSTER_SIZE: usize = 50;
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Upstream's node lifecycle flags.
#[derive(Clone, Debug)]
pub struct MonitorConfig {
    /// `--node-monitor-period`: how often nodes are judged.
    pub period: Duration,
    /// `--node-monitor-grace-period`: how long a node may be silent before it is
    /// `Unknown`.
    pub grace_period: Duration,
    /// `--node-eviction-rate`: nodes tainted for eviction per second in a healthy zone.
    pub eviction_rate: f64,
    /// `--secondary-node-eviction-rate`: the same in an unhealthy zone of a large
    /// cluster.
    pub secondary_eviction_rate: f64,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            period: Duration::from_secs(5),
            grace_period: Duration::from_secs(40),
            eviction_rate: 0.1,
            secondary_eviction_rate: 0.01,
        }
    }
}

/// What was last seen of a node's kubelet, and when it last changed.
struct Observed {
    heartbeat: Option<Time>,
    lease_renewed: Option<String>,
    probe: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ZoneState {
    Normal,
    PartialDisruption,
    FullDisruption,
}

pub struct NodeHealthMonitor {
    client: Client,
    nodes: Cache<Node>,
    leases: Cache<Lease>,
    pods: Cache<CachedPod>,
    config: MonitorConfig,
    events: EventRecorder,
    seen: HashMap<String, Observed>,
    /// Per zone: when the next node may be tainted.
    next_taint: HashMap<String, Instant>,
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The Ready condition's status: True, False or Unknown (no condition yet: Unknown).
pub(crate) fn ready_status(node: &Node) -> &str {
    condition(node, "Ready").map_or("Unknown", |c| c.status.as_str())
}

fn zone(node: &Node) -> String {
    node.labels().get(ZONE_LABEL).cloned().unwrap_or_default()
}

/// Upstream's `ComputeZoneState`.
fn zone_state(ready: usize, not_ready: usize) -> ZoneState {
    if ready == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2
        && not_ready as f64 / (ready + not_ready) as f64 >= UNHEALTHY_ZONE_THRESHOLD
    {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// The NoExecute taint a node's readiness calls for.
fn wanted_taint(ready: &str) -> Option<&'static str> {
    match ready {
        "True" => None,
        "False" => Some(NOT_READY),
        _ => Some(UNREACHABLE),
    }
}

/// The node's taints with the readiness NoExecute taint set to `wanted`; `None` when
/// they already match.
fn with_readiness_taint(node: &Node, wanted: Option<&str>) -> Option<Vec<Taint>> {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours = |t: &Taint| t.effect == NO_EXECUTE && (t.key == UNREACHABLE || t.key == NOT_READY);
    let have: Vec<&str> = taints
        .iter()
        .filter(|t| ours(t))
        .map(|t| t.key.as_str())
        .collect();
    if have == wanted.into_iter().collect::<Vec<_>>() {
        return None;
    }
    let mut kept: Vec<Taint> = taints.into_iter().filter(|t| !ours(t)).collect();
    if let Some(key) = wanted {
        kept.push(Taint {
            key: key.into(),
            effect: NO_EXECUTE.into(),
            time_added: Some(Time(jiff::Timestamp::now())),
            value: None,
        });
    }
    Some(kept)
}

/// The node's conditions with every watched one `Unknown`; `None` when they already are.
fn unknown_conditions(node: &Node) -> Option<Vec<NodeCondition>> {
    let now = Time(jiff::Timestamp::now());
    let mut conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut changed = false;
    for type_ in WATCHED_CONDITIONS {
        match conditions.iter_mut().find(|c| c.type_ == *type_) {
            Some(c) if c.status == "Unknown" => {}
            Some(c) => {
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                c.last_transition_time = Some(now.clone());
                changed = true;
            }
            None => {
                conditions.push(NodeCondition {
                    type_: type_.to_string(),
                    status: "Unknown".into(),
                    reason: Some("NodeStatusNeverUpdated".into()),
                    message: Some("Kubelet never posted node status.".into()),
                    last_heartbeat_time: Some(now.clone()),
                    last_transition_time: Some(now.clone()),
                });
                changed = true;
            }
        }
    }
    changed.then_some(conditions)
}

impl NodeHealthMonitor {
    pub fn new(
        client: Client,
        informers: &SharedInformers,
        config: MonitorConfig,
        events: EventRecorder,
    ) -> NodeHealthMonitor {
        NodeHealthMonitor {
            client,
            nodes: informers.get::<Node>().cache(),
            leases: informers.get::<Lease>().cache(),
            pods: informers.get::<CachedPod>().cache(),
            config,
            events,
            seen: HashMap::new(),
            next_taint: HashMap::new(),
        }
    }

    /// Judges every node once per monitor period, until dropped.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(self.config.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.pass().await;
        }
    }

    async fn pass(&mut self) {
        let now = Instant::now();
        let nodes = self.nodes.state();
        self.seen
            .retain(|name, _| nodes.iter().any(|n| n.name_any() == *name));
        let mut readiness: Vec<(std::sync::Arc<Node>, String)> = Vec::new();
        for node in nodes {
            let name = node.name_any();
            let heartbeat = condition(&node, "Ready").and_then(|c| c.last_heartbeat_time.clone());
            let lease_renewed = self.leases.get(Some(LEASE_NAMESPACE), &name).and_then(|l| {
                l.spec
                    .as_ref()?
                    .renew_time
                    .as_ref()
                    .map(|t| t.0.to_string())
            });
            let seen = self.seen.entry(name.clone()).or_insert(Observed {
                heartbeat: heartbeat.clone(),
                lease_renewed: lease_renewed.clone(),
                probe: now,
            });
            if seen.heartbeat != heartbeat || seen.lease_renewed != lease_renewed {
                seen.heartbeat = heartbeat;
                seen.lease_renewed = lease_renewed;
                seen.probe = now;
            }
            let mut ready = ready_status(&node).to_string();
            if now.duration_since(seen.probe) > self.config.grace_period
                && let Some(conditions) = unknown_conditions(&node)
                && self.mark_unknown(&node, conditions).await
            {
                if ready == "True" {
                    self.events.record(
                        &*node,
                        EventType::Normal,
                        "NodeNotReady",
                        format!("Node {name} status is now: NodeNotReady"),
                    );
                }
                ready = "Unknown".into();
            }
            readiness.push((node, ready));
        }
        let not_ready: HashSet<String> = readiness
            .iter()
            .filter(|(_, ready)| ready != "True")
            .map(|(node, _)| node.name_any())
            .collect();
        if !not_ready.is_empty() {
            self.mark_pods_not_ready(&not_ready).await;
        }
        self.taint_pass(&readiness, now).await;
    }

    /// Writes the Unknown conditions (conditioned on the version read: a kubelet that
    /// just reported wins). Whether it was written.
    async fn mark_unknown(&self, node: &Node, conditions: Vec<NodeCondition>) -> bool {
        let name = node.name_any();
        let patch = json!({
            "metadata": {"resourceVersion": node.resource_version()},
            "status": {"conditions": conditions},
        });
        let api: Api<Node> = Api::all(self.client.clone());
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = name, grace = ?self.config.grace_period, "node stopped posting status: Unknown");
                true
            }
            Err(e) => {
                tracing::debug!(node = name, error = %e, "marking the node Unknown");
                false
            }
        }
    }

    /// Upstream's `MarkPodsNotReady`: the pods of nodes that are not Ready are not ready
    /// (one scan of the pod cache for all such nodes).
    async fn mark_pods_not_ready(&self, nodes: &HashSet<String>) {
        let pods = self.pods.state_filter(|p| {
            is_ready(p)
                && p.spec
                    .node_name
                    .as_ref()
                    .is_some_and(|n| nodes.contains(&**n))
        });
        for pod in pods {
            // A strategic merge patch: the Ready condition's other fields stay; the
            // resourceVersion makes it apply to the pod as cached, still Ready.
            let patch = json!({
                "metadata": {"resourceVersion": &*pod.metadata.resource_version},
                "status": {"conditions": [{
                    "type": "Ready",
                    "status": "False",
                    "lastTransitionTime": Time(jiff::Timestamp::now()),
                }]},
            });
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.metadata.namespace);
            let name = &*pod.metadata.name;
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
            {
                Ok(_) => self.events.record(
                    &pod.reference(),
                    EventType::Warning,
                    "NodeNotReady",
                    "Node is not ready".into(),
                ),
                Err(e) => {
                    tracing::debug!(pod = name, error = %e, "marking the pod not ready")
                }
            }
        }
    }

    /// Upstream's `doNoExecuteTaintingPass`, rate-limited per zone.
    async fn taint_pass(&mut self, readiness: &[(std::sync::Arc<Node>, String)], now: Instant) {
        let mut zones: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (node, ready) in readiness {
            let counts = zones.entry(zone(node)).or_default();
            if ready == "True" {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }
        let states: BTreeMap<&String, ZoneState> = zones
            .iter()
            .map(|(z, (ready, not_ready))| (z, zone_state(*ready, *not_ready)))
            .collect();
        let control_plane_cut_off =
            !states.is_empty() && states.values().all(|s| *s == ZoneState::FullDisruption);
        if control_plane_cut_off {
            tracing::warn!("no node is Ready: assuming the control plane is cut off; no evictions");
        }
        for (node, ready) in readiness {
            let zone = zone(node);
            let wanted = if control_plane_cut_off {
                None
            } else {
                wanted_taint(ready)
            };
            let Some(taints) = with_readiness_taint(node, wanted) else {
                continue;
            };
            if wanted.is_some() {
                let size = zones[&zone].0 + zones[&zone].1;
                let rate = match states[&zone] {
                    ZoneState::Normal | ZoneState::FullDisruption => self.config.eviction_rate,
                    ZoneState::PartialDisruption if size > LARGE_CLUSTER_SIZE => {
                        self.config.secondary_eviction_rate
                    }
                    ZoneState::PartialDisruption => 0.0,
                };
                if rate <= 0.0 || self.next_taint.get(&zone).is_some_and(|t| now < *t) {
                    continue;
                }
                self.next_taint
                    .insert(zone.clone(), now + Duration::from_secs_f64(1.0 / rate));
            }
            self.write_taints(node, &taints).await;
        }
    }

    async fn write_taints(&self, node: &Node, taints: &[Taint]) {
        let name = node.name_any();
        let patch = json!({
            "metadata": {"resourceVersion": node.resource_version()},
            "spec": {"taints": taints},
        });
        let api: Api<Node> = Api::all(self.client.clone());
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = name, taints = ?taints.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect::<Vec<_>>(), "readiness taints updated")
            }
            Err(e) => tracing::debug!(node = name, error = %e, "updating the readiness taints"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: Option<&str>, taints: &[(&str, &str)]) -> Node {
        let conditions: Vec<_> = ready
            .map(|s| json!({"type": "Ready", "status": s}))
            .into_iter()
            .collect();
        let taints: Vec<_> = taints
            .iter()
            .map(|(k, e)| json!({"key": k, "effect": e}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"taints": taints},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn readiness_chooses_the_no_execute_taint_and_keeps_others() {
        let n = node(
            Some("Unknown"),
            &[("dedicated", "NoSchedule"), (NOT_READY, NO_EXECUTE)],
        );
        let taints = with_readiness_taint(&n, wanted_taint(ready_status(&n))).unwrap();
        let keys: Vec<(&str, &str)> = taints
            .iter()
            .map(|t| (t.key.as_str(), t.effect.as_str()))
            .collect();
        assert_eq!(
            keys,
            [("dedicated", "NoSchedule"), (UNREACHABLE, NO_EXECUTE)]
        );
        assert!(taints[1].time_added.is_some());
        let settled = node(Some("False"), &[(NOT_READY, NO_EXECUTE)]);
        assert!(with_readiness_taint(&settled, wanted_taint("False")).is_none());
        let back = node(
            Some("True"),
            &[(UNREACHABLE, NO_EXECUTE), (UNREACHABLE, "NoSchedule")],
        );
        let taints = with_readiness_taint(&back, wanted_taint("True")).unwrap();
        assert_eq!(taints.len(), 1, "only the NoSchedule one stays");
        assert_eq!(ready_status(&node(None, &[])), "Unknown");
    }

    #[test]
    fn silent_nodes_get_every_watched_condition_unknown() {
        let n = node(Some("True"), &[]);
        let conditions = unknown_conditions(&n).unwrap();
        assert_eq!(conditions.len(), 4);
        let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "Unknown");
        assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));
        assert_eq!(
            ready.message.as_deref(),
            Some("Kubelet stopped posting node status.")
        );
        let missing = conditions
            .iter()
            .find(|c| c.type_ == "DiskPressure")
            .unwrap();
        assert_eq!(missing.reason.as_deref(), Some("NodeStatusNeverUpdated"));
        let mut done = n.clone();
        done.status.as_mut().unwrap().conditions = Some(conditions);
        assert!(unknown_conditions(&done).is_none());
    }

    #[test]
    fn zones_follow_upstreams_thresholds() {
        assert_eq!(zone_state(3, 0), ZoneState::Normal);
        assert_eq!(zone_state(2, 1), ZoneState::Normal);
        assert_eq!(
            zone_state(1, 2),
            ZoneState::Normal,
            "two down is never partial"
        );
        assert_eq!(zone_state(2, 3), ZoneState::PartialDisruption);
        assert_eq!(zone_state(0, 1), ZoneState::FullDisruption);
    }
}
