//! `DisruptionController`: the status of every PodDisruptionBudget, as upstream's
//! disruption controller — how many of the pods it selects are healthy
//! (`currentHealthy`), how many must stay so (`desiredHealthy`, from `minAvailable` or
//! `maxUnavailable`, percentages against the replicas of the pods' controllers), and so
//! how many may be disrupted now (`disruptionsAllowed`), which the apiserver's eviction
//! checks and takes. Pods an eviction recorded in `disruptedPods` do not count as
//! healthy until they are gone, or for two minutes if they never go.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::ReplicationController;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, PostParams};
use kube::core::{Selector, SelectorExt};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::deployment::rollout::scaled_value;
use crate::owner::{controller_of, key_of, split_key};
use crate::pods::{CachedPod, is_ready};

/// How long an eviction's pod may take to go before it counts again (upstream's
/// `DeletionTimeout`).
const DELETION_TIMEOUT: SignedDuration = SignedDuration::from_secs(120);

pub struct DisruptionController {
    client: Client,
    budgets: Cache<PodDisruptionBudget>,
    pods: Cache<CachedPod>,
    replicasets: Cache<ReplicaSet>,
    deployments: Cache<Deployment>,
    statefulsets: Cache<StatefulSet>,
    replication_controllers: Cache<ReplicationController>,
    queue: Arc<WorkQueue>,
    events: EventRecorder,
}

impl DisruptionController {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let pdb_informer = informers.get::<PodDisruptionBudget>();
        let pod_informer = informers.get::<CachedPod>();
        let controller = Arc::new(DisruptionController {
            client,
            budgets: pdb_informer.cache(),
            pods: pod_informer.cache(),
            replicasets: informers.get::<ReplicaSet>().cache(),
            deployments: informers.get::<Deployment>().cache(),
            statefulsets: informers.get::<StatefulSet>().cache(),
            replication_controllers: informers.get::<ReplicationController>().cache(),
            queue: WorkQueue::new("disruption"),
            events,
        });
        pdb_informer.add_handler(Arc::new(BudgetEvents(controller.queue.clone())));
        pod_informer.add_handler(Arc::new(PodEvents(controller.clone())));
        // A scale change moves percentages and maxUnavailable.
        informers
            .get::<Deployment>()
            .add_handler(Arc::new(ScaleEvents(controller.clone())));
        informers
            .get::<StatefulSet>()
            .add_handler(Arc::new(ScaleEvents(controller.clone())));
        informers
            .get::<ReplicaSet>()
            .add_handler(Arc::new(ScaleEvents(controller.clone())));
        informers
            .get::<ReplicationController>()
            .add_handler(Arc::new(ScaleEvents(controller.clone())));
        controller
    }

    fn enqueue_namespace(&self, namespace: Option<&str>) {
        for pdb in self
            .budgets
            .state_filter(|b| b.metadata.namespace.as_deref() == namespace)
        {
            self.queue.add(key_of(&pdb.metadata));
        }
    }

    /// The replicas the pods' controllers want, each controller once (a ReplicaSet of a
    /// Deployment counts as the Deployment). Unmanaged pods are left out, as upstream.
    fn expected_scale(&self, ns: &str, pods: &[Arc<CachedPod>]) -> Result<(i32, usize), String> {
        let mut seen: HashMap<String, i32> = HashMap::new();
        let mut unmanaged = 0;
        for pod in pods {
            let Some(owner) = controller_of(&pod.metadata) else {
                unmanaged += 1;
                continue;
            };
            let found = match owner.kind.as_str() {
                "ReplicaSet" => self.replicasets.get(Some(ns), &owner.name).map(|rs| {
                    let deployment = controller_of(&rs.metadata)
                        .filter(|d| d.kind == "Deployment")
                        .and_then(|d| self.deployments.get(Some(ns), &d.name));
                    match deployment {
                        Some(d) => (
                            d.uid().unwrap_or_default(),
                            d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                        ),
                        None => (
                            rs.uid().unwrap_or_default(),
                            rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                        ),
                    }
                }),
                "StatefulSet" => self.statefulsets.get(Some(ns), &owner.name).map(|s| {
                    (
                        s.uid().unwrap_or_default(),
                        s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                    )
                }),
                "ReplicationController" => self
                    .replication_controllers
                    .get(Some(ns), &owner.name)
                    .map(|rc| {
                        (
                            rc.uid().unwrap_or_default(),
                            rc.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                        )
                    }),
                _ => None,
            };
            let Some((uid, replicas)) = found else {
                return Err(format!(
                    "found no controllers for pod {:?}",
                    pod.metadata.name
                ));
            };
            seen.insert(uid, replicas);
        }
        Ok((seen.values().sum(), unmanaged))
    }
}

impl Reconciler for DisruptionController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let Some(pdb) = self.budgets.get(Some(ns), name) else {
            return Ok(None);
        };
        let spec = pdb.spec.clone().unwrap_or_default();
        // policy/v1: an empty selector selects every pod of the namespace, none selects
        // nothing.
        let selector: Option<Selector> = match spec.selector.clone() {
            None => None,
            Some(s) => Some(crate::owner::parse_selector(&*pdb, s)?),
        };
        let pods = self.pods.state_filter(|p| {
            &*p.metadata.namespace == ns && selector.as_ref().is_some_and(|s| s.matches(p.labels()))
        });
        let now = Timestamp::now();
        let old = pdb.status.clone().unwrap_or_default();
        let (status, requeue) = match self.desired_healthy(&pdb, ns, &pods) {
            Ok(counts) => {
                let (status, requeue) = calculate_status(&pdb, &old, &pods, counts, now);
                (status, requeue)
            }
            Err(reason) => {
                self.events.record(
                    &*pdb,
                    EventType::Warning,
                    "CalculateExpectedPodCountFailed",
                    format!("Failed to calculate the number of expected pods: {reason}"),
                );
                (failed_status(&pdb, &old, &reason, now), None)
            }
        };
        if pdb.status.as_ref() != Some(&status) {
            let mut updated = (*pdb).clone();
            updated.status = Some(status);
            Api::<PodDisruptionBudget>::namespaced(self.client.clone(), ns)
                .replace_status(name, &PostParams::default(), &updated)
                .await
                .map_err(|e| Error::api("updating status of poddisruptionbudget", key, e))?;
        }
        Ok(requeue)
    }
}

impl DisruptionController {
    /// (expectedPods, desiredHealthy).
    fn desired_healthy(
        &self,
        pdb: &PodDisruptionBudget,
        ns: &str,
        pods: &[Arc<CachedPod>],
    ) -> Result<(i32, i32), String> {
        let spec = pdb.spec.clone().unwrap_or_default();
        let scaled = |expected: i32, value: &IntOrString| scaled_value(value, expected, true);
        if let Some(max) = &spec.max_unavailable {
            let (expected, unmanaged) = self.expected_scale(ns, pods)?;
            self.warn_unmanaged(pdb, unmanaged);
            return Ok((expected, (expected - scaled(expected, max)?).max(0)));
        }
        match &spec.min_available {
            Some(IntOrString::Int(n)) => Ok((pods.len() as i32, *n)),
            Some(pct) => {
                let (expected, unmanaged) = self.expected_scale(ns, pods)?;
                self.warn_unmanaged(pdb, unmanaged);
                Ok((expected, scaled(expected, pct)?))
            }
            None => Ok((pods.len() as i32, 0)),
        }
    }

    fn warn_unmanaged(&self, pdb: &PodDisruptionBudget, unmanaged: usize) {
        if unmanaged > 0 {
            let selector = pdb
                .spec
                .as_ref()
                .and_then(|s| s.selector.clone())
                .and_then(|s| Selector::try_from(s).ok())
                .map(|s| s.to_string())
                .unwrap_or_default();
            self.events.record(
                pdb,
                EventType::Warning,
                "UnmanagedPods",
                format!("Pods selected by this PodDisruptionBudget (selector: {selector}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value."),
            );
        }
    }
}

fn condition(
    pdb: &PodDisruptionBudget,
    old: &PodDisruptionBudgetStatus,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Condition {
    let previous = old
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionAllowed");
    let since = previous
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: "DisruptionAllowed".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: pdb.metadata.generation,
        last_transition_time: since,
    }
}

/// The status for the selected pods: healthy are Ready pods not being deleted and not
/// just evicted. Returns when to look again (a recorded eviction expiring).
fn calculate_status(
    pdb: &PodDisruptionBudget,
    old: &PodDisruptionBudgetStatus,
    pods: &[Arc<CachedPod>],
    (expected, desired): (i32, i32),
    now: Timestamp,
) -> (PodDisruptionBudgetStatus, Option<Duration>) {
    // Evictions whose pod is still there and not yet being deleted, for a while.
    let mut disrupted: BTreeMap<String, Time> = BTreeMap::new();
    let mut requeue: Option<Duration> = None;
    for (name, at) in old.disrupted_pods.iter().flatten() {
        let expires = at.0 + DELETION_TIMEOUT;
        let pending = pods
            .iter()
            .any(|p| &*p.metadata.name == name && !p.metadata.terminating);
        if pending && expires > now {
            disrupted.insert(name.clone(), at.clone());
            let wait = expires.duration_since(now).unsigned_abs();
            requeue = Some(requeue.map_or(wait, |r| r.min(wait)));
        }
    }
    let healthy = pods
        .iter()
        .filter(|p| {
            !p.metadata.terminating && is_ready(p) && !disrupted.contains_key(&*p.metadata.name)
        })
        .count() as i32;
    let allowed = (healthy - desired).max(0);
    let allowed_condition = if allowed > 0 {
        condition(pdb, old, "True", "SufficientPods", "", now)
    } else {
        condition(pdb, old, "False", "InsufficientPods", "", now)
    };
    let status = PodDisruptionBudgetStatus {
        observed_generation: pdb.metadata.generation,
        current_healthy: healthy,
        desired_healthy: desired,
        expected_pods: expected,
        disruptions_allowed: allowed,
        disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
        conditions: Some(vec![allowed_condition]),
    };
    (status, requeue)
}

/// A budget whose expected count cannot be computed allows nothing.
fn failed_status(
    pdb: &PodDisruptionBudget,
    old: &PodDisruptionBudgetStatus,
    reason: &str,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    PodDisruptionBudgetStatus {
        observed_generation: pdb.metadata.generation,
        disruptions_allowed: 0,
        conditions: Some(vec![condition(
            pdb,
            old,
            "False",
            "SyncFailed",
            reason,
            now,
        )]),
        ..old.clone()
    }
}

struct BudgetEvents(Arc<WorkQueue>);

impl EventHandler<PodDisruptionBudget> for BudgetEvents {
    fn on_apply(&self, _old: Option<&PodDisruptionBudget>, new: &Arc<PodDisruptionBudget>) {
        self.0.add(key_of(&new.metadata));
    }
    fn on_delete(&self, _obj: &Arc<PodDisruptionBudget>) {}
}

/// A pod change concerns the budgets of its namespace that select it (before or after).
struct PodEvents(Arc<DisruptionController>);

impl PodEvents {
    fn enqueue_selecting(&self, pod: &CachedPod) {
        let ns = &*pod.metadata.namespace;
        for pdb in self.0.budgets.state_filter(|b| {
            b.metadata.namespace.as_deref() == Some(ns)
                && b.spec
                    .as_ref()
                    .and_then(|s| s.selector.clone())
                    .and_then(|s| Selector::try_from(s).ok())
                    .is_some_and(|s| s.matches(pod.labels()))
        }) {
            self.0.queue.add(key_of(&pdb.metadata));
        }
    }
}

impl EventHandler<CachedPod> for PodEvents {
    fn on_apply(&self, old: Option<&CachedPod>, new: &Arc<CachedPod>) {
        if let Some(old) = old
            && old.labels() != new.labels()
        {
            self.enqueue_selecting(old);
        }
        self.enqueue_selecting(new);
    }
    fn on_delete(&self, pod: &Arc<CachedPod>) {
        self.enqueue_selecting(pod);
    }
}

/// A workload's scale changed: the budgets of its namespace look again.
struct ScaleEvents(Arc<DisruptionController>);

impl<K: kube::Resource + Send + Sync> EventHandler<K> for ScaleEvents {
    fn on_apply(&self, _old: Option<&K>, new: &Arc<K>) {
        self.0.enqueue_namespace(new.meta().namespace.as_deref());
    }
    fn on_delete(&self, obj: &Arc<K>) {
        self.0.enqueue_namespace(obj.meta().namespace.as_deref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::tests::{pod, ts};

    #[test]
    fn healthy_pods_beyond_the_desired_ones_may_be_disrupted() {
        let mut pdb = PodDisruptionBudget::default();
        pdb.metadata.generation = Some(3);
        let pods: Vec<Arc<CachedPod>> = vec![
            Arc::new(pod("a", 0, Some("n"), "Running", Some(0))),
            Arc::new(pod("b", 0, Some("n"), "Running", Some(0))),
            Arc::new(pod("c", 0, Some("n"), "Running", Some(0))),
            Arc::new(pod("d", 0, Some("n"), "Pending", None)),
        ];
        let old = PodDisruptionBudgetStatus::default();
        let (status, requeue) = calculate_status(&pdb, &old, &pods, (4, 2), ts(10));
        assert_eq!(
            (
                status.current_healthy,
                status.desired_healthy,
                status.expected_pods
            ),
            (3, 2, 4)
        );
        assert_eq!(status.disruptions_allowed, 1);
        assert_eq!(status.observed_generation, Some(3));
        let c = &status.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "SufficientPods")
        );
        assert_eq!(requeue, None);

        // A pod just evicted does not count until it is gone (or two minutes pass).
        let old = PodDisruptionBudgetStatus {
            disrupted_pods: Some([("a".to_string(), Time(ts(0)))].into()),
            ..status
        };
        let (status, requeue) = calculate_status(&pdb, &old, &pods, (4, 2), ts(10));
        assert_eq!((status.current_healthy, status.disruptions_allowed), (2, 0));
        assert_eq!(status.conditions.unwrap()[0].reason, "InsufficientPods");
        assert_eq!(requeue, Some(Duration::from_secs(110)));
        let (status, _) = calculate_status(&pdb, &old, &pods, (4, 2), ts(200));
        assert_eq!(status.current_healthy, 3, "the eviction expired");
        assert_eq!(status.disrupted_pods, None);
    }
}
