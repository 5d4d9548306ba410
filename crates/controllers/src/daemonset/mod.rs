//! `DaemonSetController`: one pod of each DaemonSet on every node that should run it,
//! as upstream's daemon controller.
//!
//! A pass (level-triggered, safe to repeat):
//! 1. history: the ControllerRevision of the current template (created, or brought
//!    forward after `kubectl rollout undo`); its hash labels the pods it made;
//! 2. claim pods, group them by the node they run on or are pinned to;
//! 3. if the expectations of the last pass are met: create a pod on every node that
//!    should run one and has none (pinned there by node affinity, bound by the
//!    scheduler), delete pods on nodes that must not keep them, failed pods (with a
//!    back-off per node: 1 s doubling to 15 minutes, as upstream's, so a pod the kubelet
//!    keeps rejecting is not replaced in a hot loop) and extra pods; with nothing of
//!    that to do, take the next step of a RollingUpdate
//!    ([`update`]); then drop revisions beyond `revisionHistoryLimit`;
//! 4. write status (desired, current, misscheduled, ready, available, updated,
//!    unavailable, observedGeneration, collisionCount).

mod placement;
mod update;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use krust_api::sync::Unpoisoned;
use krust_client::backoff::Backoff;
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::expectations::Expectations;
use crate::history::{self, REVISION_HASH};
use crate::owner::{key_of, parse_selector, split_key};
use crate::podcontrol::{PodControl, claim_pods};
use crate::podevents::OwnedPodEvents;
use crate::pods::{CachedPod, Phase, is_available, is_ready, until_available};
pub use placement::{Eligibility, Placement, TEMPLATE_GENERATION, pod_for_node};

/// Most pods created or deleted in one pass (upstream's `BurstReplicas` for daemons).
const BURST: usize = 250;

/// Upstream's `failedPodsBackoff`: 1 s, doubling to 15 minutes.
type FailedPodsBackoff = Backoff<1, 900>;

pub struct DaemonSetController {
    client: Client,
    daemonsets: Cache<DaemonSet>,
    nodes: Cache<Node>,
    pods: Cache<CachedPod>,
    revisions: Cache<ControllerRevision>,
    queue: Arc<WorkQueue>,
    expectations: Arc<Expectations>,
    events: EventRecorder,
    /// Replacing finished daemon pods, by `<daemonset key>/<node>`.
    failed_pods: Mutex<HashMap<String, FailedPodsBackoff>>,
}

/// A DaemonSet's pods on one node, oldest first; pods that finished and are being
/// deleted are left out (they no longer hold the node's place).
type NodePods<'a> = HashMap<&'a str, Vec<&'a CachedPod>>;

/// What a pass writes: pods to create (by node) and pods to delete.
#[derive(Default, Debug, PartialEq, Eq)]
struct Plan {
    create_on: Vec<String>,
    delete: Vec<(String, String)>,
    /// When a finished pod left in place for its back-off may go.
    retry_after: Option<Duration>,
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.create_on.is_empty() && self.delete.is_empty()
    }
    fn delete(&mut self, pod: &CachedPod) {
        self.delete
            .push((pod.metadata.name.to_string(), key_of(&pod.metadata)));
    }
}

impl DaemonSetController {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let ds_informer = informers.get::<DaemonSet>();
        let node_informer = informers.get::<Node>();
        let pod_informer = informers.get::<CachedPod>();
        let rev_informer = informers.get::<ControllerRevision>();
        let controller = Arc::new(DaemonSetController {
            client,
            daemonsets: ds_informer.cache(),
            nodes: node_informer.cache(),
            pods: pod_informer.cache(),
            revisions: rev_informer.cache(),
            queue: WorkQueue::new("daemonset"),
            expectations: Arc::default(),
            events,
            failed_pods: Mutex::default(),
        });
        ds_informer.add_handler(Arc::new(DaemonSetEvents(controller.clone())));
        node_informer.add_handler(Arc::new(NodeEvents(controller.clone())));
        pod_informer.add_handler(Arc::new(OwnedPodEvents {
            owners: controller.daemonsets.clone(),
            queue: controller.queue.clone(),
            expectations: Some(controller.expectations.clone()),
            selector: |ds| {
                let selector = ds.spec.as_ref()?.selector.clone();
                parse_selector(ds, selector).ok()
            },
        }));
        rev_informer.add_handler(Arc::new(history::RevisionEvents {
            kind: "DaemonSet",
            queue: controller.queue.clone(),
        }));
        controller
    }

    fn enqueue_all(&self) {
        for ds in self.daemonsets.state() {
            self.queue.add(key_of(&ds.metadata));
        }
    }
}

impl Reconciler for DaemonSetController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        // Before the pods are read (see `Expectations::satisfied`).
        let satisfied = self.expectations.satisfied(key);
        let Some(ds) = self.daemonsets.get(Some(ns), name) else {
            self.expectations.forget(key);
            return Ok(None);
        };
        let spec = ds.spec.clone().unwrap_or_default();
        let selector = parse_selector(&*ds, spec.selector.clone())?;
        if selector.selects_all() {
            self.events.record(
                &*ds,
                EventType::Warning,
                "SelectingAll",
                "This daemon set is selecting all pods. A non-empty selector is required.".into(),
            );
            return Ok(None);
        }
        let revisions = history::claim(&self.client, &self.revisions, &*ds, &selector).await?;
        let mut collisions = ds
            .status
            .as_ref()
            .and_then(|s| s.collision_count)
            .unwrap_or(0);
        let current = history::current(
            &self.client,
            &*ds,
            &revisions,
            &spec.template,
            &mut collisions,
        )
        .await?;
        let hash = current
            .labels()
            .get(REVISION_HASH)
            .cloned()
            .unwrap_or_default();
        let candidates = self.pods.state_filter(|p| &*p.metadata.namespace == ns);
        let pods = claim_pods(&self.client, &*ds, &selector, candidates).await?;
        let nodes = self.nodes.state();
        let eligibility = Eligibility::new(&ds);
        let placements: HashMap<&str, Placement> = nodes
            .iter()
            .map(|n| {
                (
                    n.metadata.name.as_deref().unwrap_or_default(),
                    eligibility.placement(n),
                )
            })
            .collect();
        let on_node = pods_by_node(&pods);
        let min_ready = spec.min_ready_seconds.unwrap_or(0);
        let now = Timestamp::now();

        let mut result = Ok(());
        let mut retry_after = None;
        if ds.metadata.deletion_timestamp.is_none() && satisfied {
            let rolling = spec
                .update_strategy
                .as_ref()
                .and_then(|s| s.type_.as_deref())
                .is_none_or(|t| t == "RollingUpdate");
            let surge = rolling && update::limits(&ds, &placements).is_ok_and(|l| l.max_surge > 0);
            let mut plan = self.manage(&ds, &placements, &on_node, &hash, surge, min_ready, now);
            retry_after = plan.retry_after;
            if plan.is_empty() && rolling {
                plan = update::rolling_update(&ds, &placements, &on_node, &hash, min_ready, now)?;
            }
            result = self.sync(key, &ds, &plan, &hash).await;
            let live: HashSet<&str> = pods
                .iter()
                .filter_map(|p| p.labels().get(REVISION_HASH).map(String::as_str))
                .collect();
            let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
            history::truncate(&self.client, &revisions, &current.name_any(), &live, limit).await?;
        }

        let status = calculate_status(&ds, &placements, &on_node, &hash, collisions, now);
        if ds.status.as_ref() != Some(&status) {
            let mut updated = (*ds).clone();
            updated.status = Some(status);
            Api::<DaemonSet>::namespaced(self.client.clone(), ns)
                .replace_status(name, &PostParams::default(), &updated)
                .await
                .map_err(|e| Error::api("updating status of daemonset", key, e))?;
        }
        result?;
        // Look again when a ready pod becomes available, or a back-off ends.
        Ok(on_node
            .values()
            .flatten()
            .filter_map(|p| until_available(p, min_ready, now))
            .chain(retry_after)
            .min())
    }
}

impl DaemonSetController {
    /// Pods to create and delete so that every node runs the one daemon pod it should
    /// (upstream's `podsShouldBeOnNode` over every node, plus unbound pods pinned to
    /// nodes that are gone: no scheduler or pod GC would ever remove those).
    #[allow(clippy::too_many_arguments)]
    fn manage(
        &self,
        ds: &DaemonSet,
        placements: &HashMap<&str, Placement>,
        on_node: &NodePods,
        hash: &str,
        surge: bool,
        min_ready: i32,
        now: Timestamp,
    ) -> Plan {
        let mut plan = Plan::default();
        for (&node, placement) in placements {
            let pods = on_node.get(node).map(Vec::as_slice).unwrap_or_default();
            if placement.should_run && pods.is_empty() {
                plan.create_on.push(node.to_string());
            } else if placement.may_stay {
                let mut running = Vec::new();
                for pod in pods.iter().filter(|p| !p.metadata.terminating) {
                    match pod.status.phase {
                        Some(Phase::Failed | Phase::Succeeded) => {
                            let backoff = format!("{}/{node}", key_of(&ds.metadata));
                            if let Some(wait) = self.back_off_failed_pod(backoff) {
                                plan.retry_after =
                                    Some(plan.retry_after.map_or(wait, |r| r.min(wait)));
                                continue;
                            }
                            let what = if pod.status.phase == Some(Phase::Failed) {
                                "failed"
                            } else {
                                "succeeded"
                            };
                            self.events.record(
                                ds,
                                EventType::Warning,
                                "FailedDaemonPod",
                                format!(
                                    "Found {what} daemon pod {} on node {node}, will try to kill it",
                                    key_of(&pod.metadata)
                                ),
                            );
                            plan.delete(pod);
                        }
                        _ => running.push(*pod),
                    }
                }
                extra_pods(&running, hash, surge, min_ready, now, &mut plan);
            } else {
                for pod in pods.iter().filter(|p| !p.metadata.terminating) {
                    plan.delete(pod);
                }
            }
        }
        for (node, pods) in on_node {
            if !placements.contains_key(node) {
                for pod in pods
                    .iter()
                    .filter(|p| p.node().is_empty() && !p.metadata.terminating)
                {
                    plan.delete(pod);
                }
            }
        }
        plan.create_on.sort();
        plan
    }

    /// Whether replacing a finished pod on a node must wait (how long), else records
    /// the replacement in the node's back-off.
    fn back_off_failed_pod(&self, key: String) -> Option<Duration> {
        let now = Instant::now();
        let mut failed = self.failed_pods.locked();
        // Entries idle for twice the longest wait start over (upstream's `hasExpired`).
        failed.retain(|_, b| !b.expired(now));
        let backoff = failed.entry(key).or_default();
        if let Some(wait) = backoff.waiting(now) {
            return Some(wait);
        }
        backoff.fail(now);
        None
    }

    /// Carries out a plan: creations (at most [`BURST`], in slow-start batches), then
    /// deletions.
    async fn sync(&self, key: &str, ds: &DaemonSet, plan: &Plan, hash: &str) -> Result<(), Error> {
        let control = PodControl {
            client: &self.client,
            expectations: &self.expectations,
            events: &self.events,
            key,
            owner: ds,
        };
        let create = &plan.create_on[..plan.create_on.len().min(BURST)];
        let created = if create.is_empty() {
            Ok(())
        } else {
            control
                .create(create.len(), |n| pod_for_node(ds, &create[n], hash))
                .await
        };
        let doomed: Vec<(&str, String)> = plan
            .delete
            .iter()
            .take(BURST)
            .map(|(name, key)| (name.as_str(), key.clone()))
            .collect();
        let deleted = control.delete(&doomed).await;
        created.and(deleted)
    }
}

/// Of the pods running on one node, the ones to delete: all but the oldest; with
/// surge, the oldest old pod may stay beside the oldest new one until the new one is
/// available, if the old one is ready.
fn extra_pods(
    running: &[&CachedPod],
    hash: &str,
    surge: bool,
    min_ready: i32,
    now: Timestamp,
    plan: &mut Plan,
) {
    if !surge {
        for pod in running.iter().skip(1) {
            plan.delete(pod);
        }
        return;
    }
    let (mut newest, mut oldest) = (None, None);
    for pod in running {
        let slot = if is_updated(pod, hash) {
            &mut newest
        } else {
            &mut oldest
        };
        if slot.is_none() {
            *slot = Some(*pod);
        } else {
            plan.delete(pod);
        }
    }
    if let (Some(new), Some(old)) = (newest, oldest)
        && (!is_ready(old) || is_available(new, min_ready, now))
    {
        plan.delete(old);
    }
}

/// Made from the current revision.
fn is_updated(pod: &CachedPod, hash: &str) -> bool {
    pod.labels().get(REVISION_HASH).map(String::as_str) == Some(hash)
}

/// The pods by node, oldest first, without finished pods that are being deleted.
fn pods_by_node(pods: &[Arc<CachedPod>]) -> NodePods<'_> {
    let mut by_node: NodePods = HashMap::new();
    for pod in pods {
        if pod.metadata.terminating && pod.is_finished() {
            continue;
        }
        if let Some(node) = pod.target_node() {
            by_node.entry(node).or_default().push(pod);
        }
    }
    for pods in by_node.values_mut() {
        pods.sort_by(|a, b| {
            (a.metadata.creation_timestamp, &a.metadata.name)
                .cmp(&(b.metadata.creation_timestamp, &b.metadata.name))
        });
    }
    by_node
}

/// The status for the pods on the nodes (upstream's `updateDaemonSetStatus`: the
/// oldest pod of a node speaks for it).
fn calculate_status(
    ds: &DaemonSet,
    placements: &HashMap<&str, Placement>,
    on_node: &NodePods,
    hash: &str,
    collisions: i32,
    now: Timestamp,
) -> DaemonSetStatus {
    let min_ready = ds
        .spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0);
    let mut status = DaemonSetStatus {
        observed_generation: ds.metadata.generation,
        collision_count: (collisions > 0).then_some(collisions),
        conditions: ds.status.as_ref().and_then(|s| s.conditions.clone()),
        ..Default::default()
    };
    let (mut available, mut ready, mut updated) = (0, 0, 0);
    for (node, placement) in placements {
        let oldest = on_node.get(node).and_then(|pods| pods.first());
        match (placement.should_run, oldest) {
            (true, oldest) => {
                status.desired_number_scheduled += 1;
                let Some(pod) = oldest else { continue };
                status.current_number_scheduled += 1;
                if is_ready(pod) {
                    ready += 1;
                    if is_available(pod, min_ready, now) {
                        available += 1;
                    }
                }
                if is_updated(pod, hash) {
                    updated += 1;
                }
            }
            (false, Some(_)) => status.number_misscheduled += 1,
            (false, None) => {}
        }
    }
    status.number_ready = ready;
    status.number_available = Some(available);
    status.updated_number_scheduled = Some(updated);
    status.number_unavailable = Some(status.desired_number_scheduled - available);
    status
}

struct DaemonSetEvents(Arc<DaemonSetController>);

impl EventHandler<DaemonSet> for DaemonSetEvents {
    fn on_apply(&self, _old: Option<&DaemonSet>, new: &Arc<DaemonSet>) {
        self.0.queue.add(key_of(&new.metadata));
    }
    fn on_delete(&self, obj: &Arc<DaemonSet>) {
        self.0.expectations.forget(&key_of(&obj.metadata));
    }
}

/// A node that came, went or changed what decides placement (labels, taints) may need
/// daemon pods or lose them; heartbeats change nothing.
struct NodeEvents(Arc<DaemonSetController>);

impl EventHandler<Node> for NodeEvents {
    fn on_apply(&self, old: Option<&Node>, new: &Arc<Node>) {
        let taints = |n: &Node| n.spec.as_ref().and_then(|s| s.taints.clone());
        if old.is_none_or(|old| {
            old.metadata.labels != new.metadata.labels || taints(old) != taints(new)
        }) {
            self.0.enqueue_all();
        }
    }
    fn on_delete(&self, _node: &Arc<Node>) {
        self.0.enqueue_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::tests::{labelled, pod, ts};

    #[test]
    fn status_counts_nodes_by_their_oldest_pod() {
        let mut ds = DaemonSet::default();
        ds.metadata.generation = Some(2);
        let a = labelled(
            pod("a", 0, None, "Running", Some(0)),
            &[(REVISION_HASH, "h2")],
        );
        let b = pod("b", 1, None, "Pending", None);
        let c = pod("c", 0, None, "Running", Some(0));
        let placements: HashMap<&str, Placement> = [
            (
                "n1",
                Placement {
                    should_run: true,
                    may_stay: true,
                },
            ),
            (
                "n2",
                Placement {
                    should_run: true,
                    may_stay: true,
                },
            ),
            (
                "n3",
                Placement {
                    should_run: true,
                    may_stay: true,
                },
            ),
            (
                "n4",
                Placement {
                    should_run: false,
                    may_stay: true,
                },
            ),
        ]
        .into();
        let on_node: NodePods = [("n1", vec![&a]), ("n2", vec![&b]), ("n4", vec![&c])].into();
        let status = calculate_status(&ds, &placements, &on_node, "h2", 0, ts(10));
        assert_eq!(status.desired_number_scheduled, 3);
        assert_eq!(status.current_number_scheduled, 2);
        assert_eq!(status.number_misscheduled, 1);
        assert_eq!(status.number_ready, 1);
        assert_eq!(status.number_available, Some(1));
        assert_eq!(status.updated_number_scheduled, Some(1));
        assert_eq!(status.number_unavailable, Some(2));
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.collision_count, None);
    }

    #[test]
    fn one_pod_per_node_and_with_surge_an_old_ready_one_until_the_new_is_available() {
        let old = labelled(
            pod("old", 0, None, "Running", Some(0)),
            &[(REVISION_HASH, "h1")],
        );
        let mut new = labelled(
            pod("new", 5, None, "Running", None),
            &[(REVISION_HASH, "h2")],
        );
        let names = |plan: &Plan| {
            plan.delete
                .iter()
                .map(|(n, _)| n.clone())
                .collect::<Vec<_>>()
        };

        let mut plan = Plan::default();
        extra_pods(&[&old, &new], "h2", false, 0, ts(10), &mut plan);
        assert_eq!(names(&plan), ["new"], "without surge only the oldest stays");

        let mut plan = Plan::default();
        extra_pods(&[&old, &new], "h2", true, 0, ts(10), &mut plan);
        assert!(plan.delete.is_empty(), "the new pod is not ready yet");

        new.status.ready = crate::pods::Readiness::ReadySince(Some(ts(8)));
        let mut plan = Plan::default();
        extra_pods(&[&old, &new], "h2", true, 0, ts(10), &mut plan);
        assert_eq!(names(&plan), ["old"]);
    }
}
