//! `ReplicaSetController`: keeps the number of active pods of each ReplicaSet at
//! `spec.replicas`, as upstream's replicaset controller does. One controller, two kinds:
//! a ReplicationController is managed the same way through a ReplicaSet view of it
//! ([`Replicated`]), as upstream's replication manager wraps the ReplicaSet controller.
//!
//! A pass (level-triggered, safe to repeat at any point):
//! 1. claim pods: adopt matching orphans, release owned pods that stopped matching;
//! 2. if the expectations of the last pass are met, create or delete the difference:
//!    creations in slow-start batches (1, 2, 4, ...) so a failing create costs one
//!    request, not hundreds; deletions in [`deletion_order`]; at most 500 per pass;
//! 3. write status (replicas, fullyLabeledReplicas, readyReplicas, availableReplicas,
//!    observedGeneration) from the cache, leaving out pods it has just deleted.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::apps::v1::{
    ReplicaSet, ReplicaSetCondition, ReplicaSetSpec, ReplicaSetStatus,
};
use k8s_openapi::api::core::v1::{
    Pod, PodTemplateSpec, ReplicationController, ReplicationControllerStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use krust_client::cache::{Cache, Watched};
use kube::api::{Api, PostParams};
use kube::core::{Selector, SelectorExt};
use kube::{Client, Resource, ResourceExt};

use crate::Error;
use crate::expectations::Expectations;
use crate::owner::{controller_of, controller_ref, key_of, split_key};
use crate::podcontrol::{PodControl, claim_pods};
use crate::podevents::OwnedPodEvents;
use crate::pods::{
    CachedPod, Candidate, deletion_order, is_active, is_available, is_ready, until_available,
};
use krust_client::events::EventRecorder;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::queue::{Reconciler, WorkQueue};

/// Most pods created or deleted in one pass (upstream's `BurstReplicas`).
pub const BURST_REPLICAS: usize = 500;

/// The kinds the controller manages: ReplicaSet and ReplicationController.
pub trait Replicated:
    Watched + Resource<Scope = k8s_openapi::NamespaceResourceScope> + serde::Serialize
{
    /// The work queue's name (upstream's controller name).
    const QUEUE: &'static str;
    /// The object as a ReplicaSet: the fields the controller reads.
    fn as_replicaset(&self) -> Cow<'_, ReplicaSet>;
    /// The object with `status` in place of its own.
    fn with_status(&self, status: ReplicaSetStatus) -> Self;
}

impl Replicated for ReplicaSet {
    const QUEUE: &'static str = "replicaset";
    fn as_replicaset(&self) -> Cow<'_, ReplicaSet> {
        Cow::Borrowed(self)
    }
    fn with_status(&self, status: ReplicaSetStatus) -> Self {
        ReplicaSet {
            status: Some(status),
            ..self.clone()
        }
    }
}

impl Replicated for ReplicationController {
    const QUEUE: &'static str = "replicationmanager";
    /// Upstream's conversion: the selector map becomes `matchLabels`.
    fn as_replicaset(&self) -> Cow<'_, ReplicaSet> {
        let spec = self.spec.clone().unwrap_or_default();
        let status = self.status.as_ref().map(same_shape);
        Cow::Owned(ReplicaSet {
            metadata: self.metadata.clone(),
            spec: Some(ReplicaSetSpec {
                replicas: spec.replicas,
                min_ready_seconds: spec.min_ready_seconds,
                selector: LabelSelector {
                    match_labels: spec.selector,
                    match_expressions: None,
                },
                template: spec.template,
            }),
            status,
        })
    }
    fn with_status(&self, status: ReplicaSetStatus) -> Self {
        let status: ReplicationControllerStatus = same_shape(&status);
        ReplicationController {
            status: Some(status),
            ..self.clone()
        }
    }
}

/// A ReplicaSet's status as a ReplicationController's or back: the same fields under the
/// same names (a ReplicaSet's `terminatingReplicas` has no counterpart and is dropped).
fn same_shape<A: serde::Serialize, B: serde::de::DeserializeOwned + Default>(a: &A) -> B {
    serde_json::to_value(a)
        .and_then(serde_json::from_value)
        .unwrap_or_default()
}

pub struct ReplicaSetController<K: Replicated = ReplicaSet> {
    client: Client,
    replicasets: Cache<K>,
    pods: Cache<CachedPod>,
    queue: Arc<WorkQueue>,
    expectations: Arc<Expectations>,
    events: EventRecorder,
}

impl<K: Replicated> ReplicaSetController<K> {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let rs_informer = informers.get::<K>();
        let pod_informer = informers.get::<CachedPod>();
        let controller = Arc::new(ReplicaSetController {
            client,
            replicasets: rs_informer.cache(),
            pods: pod_informer.cache(),
            queue: WorkQueue::new(K::QUEUE),
            expectations: Arc::default(),
            events,
        });
        rs_informer.add_handler(Arc::new(ReplicaSetEvents(controller.clone())));
        pod_informer.add_handler(Arc::new(OwnedPodEvents {
            owners: controller.replicasets.clone(),
            queue: controller.queue.clone(),
            expectations: Some(controller.expectations.clone()),
            selector: |rs| selector_of(&rs.as_replicaset()).ok(),
        }));
        controller
    }

    fn replicaset(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.replicasets.get(Some(namespace), name)
    }
}

impl<K: Replicated> Reconciler for ReplicaSetController<K> {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        // Before the pods are read (see `Expectations::satisfied`).
        let satisfied = self.expectations.satisfied(key);
        let Some(object) = self.replicaset(ns, name) else {
            self.expectations.forget(key);
            return Ok(None);
        };
        let rs = object.as_replicaset();
        let selector = selector_of(&rs)?;
        let pods = self.claim_pods(&*object, &selector).await?;
        let mut manage_err = None;
        if satisfied
            && rs.metadata.deletion_timestamp.is_none()
            && let Err(err) = self.manage_replicas(key, &*object, &rs, &pods).await
        {
            manage_err = Some(err);
        }
        let pending = self.expectations.pending_deletions(key);
        let counted: Vec<&CachedPod> = pods
            .iter()
            .filter(|p| !pending.contains(&key_of(&p.metadata)))
            .map(|p| &**p)
            .collect();
        let now = Timestamp::now();
        let status = calculate_status(&rs, &counted, manage_err.as_ref(), now);
        if rs.status.as_ref() != Some(&status) {
            Api::<K>::namespaced(self.client.clone(), ns)
                .replace_status(name, &PostParams::default(), &object.with_status(status))
                .await
                .map_err(|e| Error::api("updating status", key, e))?;
        }
        if let Some(err) = manage_err {
            return Err(err);
        }
        // Look again when a ready pod becomes available.
        let min_ready = rs
            .spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .unwrap_or(0);
        Ok(counted
            .iter()
            .filter_map(|p| until_available(p, min_ready, now))
            .min())
    }
}

impl<K: Replicated> ReplicaSetController<K> {
    /// The pods of every ReplicaSet with the same controller as `rs` (the ReplicaSets of
    /// one Deployment), each once; none for a ReplicaSet without a controller. Scale-down
    /// ranks a pod by how many of these share its node, as upstream.
    fn related_pods(&self, rs: &ReplicaSet) -> Vec<Arc<CachedPod>> {
        let Some(owner) = controller_of(&rs.metadata) else {
            return Vec::new();
        };
        let ns = rs.metadata.namespace.as_deref();
        let family = self.replicasets.state_filter(|other| {
            other.meta().namespace.as_deref() == ns
                && controller_of(other.meta()).is_some_and(|r| r.uid == owner.uid)
        });
        let selectors: Vec<Selector> = family
            .iter()
            .filter_map(|r| selector_of(&r.as_replicaset()).ok())
            .collect();
        self.pods.state_filter(|pod| {
            Some(&*pod.metadata.namespace) == ns
                && selectors
                    .iter()
                    .any(|s| !s.selects_all() && s.matches(pod.labels()))
        })
    }

    /// The active pods this ReplicaSet controls after adopting and releasing.
    async fn claim_pods(&self, rs: &K, selector: &Selector) -> Result<Vec<Arc<CachedPod>>, Error> {
        let ns = rs.namespace();
        let candidates = self
            .pods
            .state_filter(|p| Some(&*p.metadata.namespace) == ns.as_deref() && is_active(p));
        claim_pods(&self.client, rs, selector, candidates).await
    }

    /// Creates or deletes pods of `object` (read through its view `rs`).
    async fn manage_replicas(
        &self,
        key: &str,
        object: &K,
        rs: &ReplicaSet,
        pods: &[Arc<CachedPod>],
    ) -> Result<(), Error> {
        let want = rs
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(1)
            .max(0) as usize;
        let control = PodControl {
            client: &self.client,
            expectations: &self.expectations,
            events: &self.events,
            key,
            owner: object,
        };
        if pods.len() < want {
            let count = (want - pods.len()).min(BURST_REPLICAS);
            tracing::debug!(replicaset = key, count, "creating pods");
            let template = pod_from_template(object, rs);
            control.create(count, |_| template.clone()).await?;
        } else if pods.len() > want {
            let count = (pods.len() - want).min(BURST_REPLICAS);
            let related = self.related_pods(rs);
            let mut on_node: HashMap<&str, usize> = HashMap::new();
            for pod in related.iter().filter(|p| is_active(p)) {
                *on_node.entry(pod.node()).or_default() += 1;
            }
            let mut ranked: Vec<Candidate> = pods
                .iter()
                .map(|pod| Candidate {
                    pod,
                    colocated: on_node.get(pod.node()).copied().unwrap_or(0),
                })
                .collect();
            let now = Timestamp::now();
            ranked.sort_by(|a, b| deletion_order(a, b, now));
            let doomed: Vec<(&str, String)> = ranked[..count]
                .iter()
                .map(|c| (&*c.pod.metadata.name, key_of(&c.pod.metadata)))
                .collect();
            tracing::debug!(replicaset = key, count, "deleting pods");
            control.delete(&doomed).await?;
        }
        Ok(())
    }
}

/// Runs `count` calls of `f` in batches of 1, 2, 4, ... (each batch concurrently),
/// stopping after the first batch with a failure. Returns the successes and the first
/// error: a quota or validation error then costs one request instead of hundreds.
pub async fn slow_start_batch<T, E, F, Fut>(count: usize, f: F) -> (Vec<T>, Option<E>)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut done = Vec::with_capacity(count);
    let mut batch = 1.min(count);
    let mut started = 0;
    while batch > 0 {
        let results = join_all((started..started + batch).map(&f)).await;
        started += batch;
        let mut first_err = None;
        for r in results {
            match r {
                Ok(v) => done.push(v),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if first_err.is_some() {
            return (done, first_err);
        }
        batch = (batch * 2).min(count - started);
    }
    (done, None)
}

pub fn selector_of(rs: &ReplicaSet) -> Result<Selector, Error> {
    let selector = rs
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .unwrap_or_default();
    crate::owner::parse_selector(rs, selector)
}

/// The pod a ReplicaSet (or ReplicationController, `rs` its view) creates: its template,
/// `generateName: <name>-` (the apiserver adds five random characters) and a controller
/// reference.
pub fn pod_from_template<K: Replicated>(owner: &K, rs: &ReplicaSet) -> Pod {
    let template: PodTemplateSpec = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", rs.name_any())),
            namespace: rs.namespace(),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![controller_ref(owner)]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// The status a ReplicaSet should show for the active pods it controls.
pub fn calculate_status(
    rs: &ReplicaSet,
    pods: &[&CachedPod],
    manage_err: Option<&Error>,
    now: Timestamp,
) -> ReplicaSetStatus {
    let template_labels: BTreeMap<String, String> = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let min_ready = rs
        .spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0);
    let count = |f: &dyn Fn(&CachedPod) -> bool| pods.iter().filter(|p| f(p)).count() as i32;
    let old = rs.status.clone().unwrap_or_default();
    let mut conditions: Vec<ReplicaSetCondition> = old
        .conditions
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != "ReplicaFailure")
        .collect();
    if let Some(err) = manage_err {
        // A standing failure is kept as first written, as upstream does: each failed
        // create names another pod, and a message rewritten every pass would be a status
        // change, whose event brings the ReplicaSet straight back past its backoff.
        let previous = (old.conditions.iter().flatten())
            .find(|c| c.type_ == "ReplicaFailure")
            .cloned();
        conditions.push(previous.unwrap_or_else(|| ReplicaSetCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: Some("FailedCreate".into()),
            message: Some(err.to_string()),
            last_transition_time: Some(Time(now)),
        }));
    }
    ReplicaSetStatus {
        replicas: pods.len() as i32,
        fully_labeled_replicas: Some(count(&|p| {
            template_labels
                .iter()
                .all(|(k, v)| p.labels().get(k) == Some(v))
        })),
        ready_replicas: Some(count(&|p| is_ready(p))),
        available_replicas: Some(count(&|p| is_available(p, min_ready, now))),
        observed_generation: rs.metadata.generation,
        conditions: (!conditions.is_empty()).then_some(conditions),
        ..old
    }
}

struct ReplicaSetEvents<K: Replicated>(Arc<ReplicaSetController<K>>);

impl<K: Replicated> EventHandler<K> for ReplicaSetEvents<K> {
    fn on_apply(&self, _old: Option<&K>, new: &Arc<K>) {
        self.0.queue.add(key_of(new.meta()));
    }
    fn on_delete(&self, obj: &Arc<K>) {
        self.0.expectations.forget(&key_of(obj.meta()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use krust_api::sync::Unpoisoned;
    use std::sync::Mutex;

    #[tokio::test]
    async fn creations_go_in_batches_of_1_2_4_and_stop_at_the_first_failing_batch() {
        let calls = Mutex::new(Vec::new());
        let (done, err) = slow_start_batch(10, |i| {
            calls.locked().push(i);
            async move { if i == 4 { Err("quota") } else { Ok(i) } }
        })
        .await;
        // Batches [0], [1, 2], [3, 4, 5, 6]: the third fails, the rest are never sent.
        assert_eq!(calls.locked().len(), 7);
        assert_eq!(done.len(), 6);
        assert_eq!(err, Some("quota"));
        let (done, err) = slow_start_batch(10, |i| async move { Ok::<_, ()>(i) }).await;
        assert_eq!((done.len(), err), (10, None));
    }

    #[test]
    fn pods_come_from_the_template_with_generate_name_and_a_controller_reference() {
        let rs: ReplicaSet = k8s_openapi::serde_json::from_value(k8s_openapi::serde_json::json!({
            "metadata": {"name": "web-abc", "namespace": "default", "uid": "u1"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}, "annotations": {"a": "b"}},
                                  "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
        }))
        .unwrap();
        let pod = pod_from_template(&rs, &rs);
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("web-abc-"));
        assert_eq!(pod.labels().get("app").map(String::as_str), Some("web"));
        assert_eq!(pod.annotations().get("a").map(String::as_str), Some("b"));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("ReplicaSet", "web-abc", "u1")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
    }

    #[test]
    fn a_replication_controller_is_seen_as_a_replicaset_and_gets_its_status_back() {
        let rc: ReplicationController =
            k8s_openapi::serde_json::from_value(k8s_openapi::serde_json::json!({
                "metadata": {"name": "legacy", "namespace": "default", "uid": "u2"},
                "spec": {"replicas": 2, "minReadySeconds": 3, "selector": {"app": "legacy"},
                         "template": {"metadata": {"labels": {"app": "legacy"}}}},
                "status": {"replicas": 1, "readyReplicas": 1,
                           "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate"}]}
            }))
            .unwrap();
        let rs = rc.as_replicaset();
        let spec = rs.spec.as_ref().unwrap();
        assert_eq!(
            spec.selector.match_labels,
            Some([("app".to_string(), "legacy".to_string())].into())
        );
        assert_eq!((spec.replicas, spec.min_ready_seconds), (Some(2), Some(3)));
        let status = rs.status.clone().unwrap();
        assert_eq!((status.replicas, status.ready_replicas), (1, Some(1)));
        assert_eq!(
            status.conditions.unwrap()[0].reason.as_deref(),
            Some("FailedCreate")
        );
        let pod = pod_from_template(&rc, &rs);
        assert_eq!(
            pod.metadata.owner_references.unwrap()[0].kind,
            "ReplicationController"
        );
        let back = rc.with_status(ReplicaSetStatus {
            replicas: 2,
            available_replicas: Some(2),
            terminating_replicas: Some(0),
            ..Default::default()
        });
        let status = back.status.unwrap();
        assert_eq!((status.replicas, status.available_replicas), (2, Some(2)));
    }

    #[test]
    fn status_counts_labelled_ready_and_available_pods() {
        use crate::pods::tests::{pod, ts};
        let mut rs = ReplicaSet::default();
        rs.metadata.generation = Some(4);
        rs.spec = Some(k8s_openapi::api::apps::v1::ReplicaSetSpec {
            min_ready_seconds: Some(10),
            ..Default::default()
        });
        let a = pod("a", 0, None, "Running", Some(0));
        let b = pod("b", 0, None, "Running", Some(8));
        let c = pod("c", 0, None, "Pending", None);
        let status = calculate_status(&rs, &[&a, &b, &c], None, ts(12));
        assert_eq!(status.replicas, 3);
        assert_eq!(status.fully_labeled_replicas, Some(3));
        assert_eq!(status.ready_replicas, Some(2));
        assert_eq!(
            status.available_replicas,
            Some(1),
            "b is ready for 4 s of 10"
        );
        assert_eq!(status.observed_generation, Some(4));
    }

    #[test]
    fn a_standing_failure_is_kept_as_first_written_and_cleared_on_success() {
        use crate::pods::tests::ts;
        let refused = |pod: &str| Error::InvalidSpec {
            object: format!("pod {pod}"),
            reason: "exceeded quota".into(),
        };
        let mut rs = ReplicaSet::default();
        let first = calculate_status(&rs, &[], Some(&refused("web-1")), ts(1));
        rs.status = Some(first.clone());
        let again = calculate_status(&rs, &[], Some(&refused("web-2")), ts(9));
        assert_eq!(
            again.conditions, first.conditions,
            "no status change to wake on"
        );
        let message = first.conditions.as_ref().unwrap()[0]
            .message
            .clone()
            .unwrap();
        assert!(message.contains("web-1"), "{message}");
        rs.status = Some(again);
        assert_eq!(calculate_status(&rs, &[], None, ts(10)).conditions, None);
    }
}
