//! `StatefulSetController`: pods with stable names, hostnames and claims, created,
//! removed and updated in ordinal order, as upstream's statefulset controller.
//!
//! A pass: the update revision (the ControllerRevision of the current template, from
//! [`history`](crate::history)) and the current one (`status.currentRevision`); claim
//! the pods named `<set>-<ordinal>`; decide the next writes on the cache
//! ([`control::plan`]) and make them; write status. Pod names are fixed, so a write
//! repeated on a stale cache only meets AlreadyExists or NotFound: no expectations
//! are needed (upstream keeps none either).

mod control;
mod identity;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec};
use k8s_openapi::jiff::Timestamp;
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::deployment::rollout::scaled_value;
use crate::history::{self, REVISION_HASH};
use crate::owner::{key_of, parse_selector, split_key};
use crate::podcontrol::claim_pods;
use crate::podevents::OwnedPodEvents;
use crate::pods::{CachedPod, is_available, until_available};
pub use control::{Action, Strategy};
pub use identity::{POD_INDEX_LABEL, POD_NAME_LABEL, ordinal_of};

pub struct StatefulSetController {
    client: Client,
    sets: Cache<StatefulSet>,
    pods: Cache<CachedPod>,
    revisions: Cache<ControllerRevision>,
    claims: Cache<PersistentVolumeClaim>,
    queue: Arc<WorkQueue>,
    events: EventRecorder,
}

impl StatefulSetController {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let set_informer = informers.get::<StatefulSet>();
        let pod_informer = informers.get::<CachedPod>();
        let rev_informer = informers.get::<ControllerRevision>();
        let controller = Arc::new(StatefulSetController {
            client,
            sets: set_informer.cache(),
            pods: pod_informer.cache(),
            revisions: rev_informer.cache(),
            claims: informers.get::<PersistentVolumeClaim>().cache(),
            queue: WorkQueue::new("statefulset"),
            events,
        });
        set_informer.add_handler(Arc::new(SetEvents(controller.queue.clone())));
        pod_informer.add_handler(Arc::new(OwnedPodEvents {
            owners: controller.sets.clone(),
            queue: controller.queue.clone(),
            expectations: None,
            selector: |set| {
                let selector = set.spec.as_ref()?.selector.clone();
                parse_selector(set, selector).ok()
            },
        }));
        rev_informer.add_handler(Arc::new(history::RevisionEvents {
            kind: "StatefulSet",
            queue: controller.queue.clone(),
        }));
        controller
    }
}

impl Reconciler for StatefulSetController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let Some(set) = self.sets.get(Some(ns), name) else {
            return Ok(None);
        };
        let spec = set.spec.clone().unwrap_or_default();
        let selector = parse_selector(&*set, spec.selector.clone())?;
        let revisions = history::claim(&self.client, &self.revisions, &*set, &selector).await?;
        let old_status = set.status.clone().unwrap_or_default();
        let mut collisions = old_status.collision_count.unwrap_or(0);
        let update = history::current(
            &self.client,
            &*set,
            &revisions,
            &spec.template,
            &mut collisions,
        )
        .await?;
        let current = old_status
            .current_revision
            .as_deref()
            .and_then(|c| {
                revisions
                    .iter()
                    .find(|r| r.metadata.name.as_deref() == Some(c))
            })
            .map(|r| (**r).clone())
            .unwrap_or_else(|| update.clone());
        let candidates = self.pods.state_filter(|p| {
            &*p.metadata.namespace == ns && ordinal_of(name, &p.metadata.name).is_some()
        });
        let pods = claim_pods(&self.client, &*set, &selector, candidates).await?;
        let by_ordinal: BTreeMap<i32, &CachedPod> = pods
            .iter()
            .filter_map(|p| Some((ordinal_of(name, &p.metadata.name)?, &**p)))
            .collect();
        let replicas = spec.replicas.unwrap_or(1);
        let min_ready = spec.min_ready_seconds.unwrap_or(0);
        let now = Timestamp::now();

        let mut result = Ok(());
        if set.metadata.deletion_timestamp.is_none() {
            let inputs = control::Inputs {
                start: identity::start_ordinal(&set),
                replicas,
                pods: &by_ordinal,
                update_revision: &update.name_any(),
                ordered: spec.pod_management_policy.as_deref() != Some("Parallel"),
                strategy: strategy(&set, replicas)?,
                min_ready,
                now,
            };
            let actions = control::plan(&inputs);
            result = self.act(&set, &actions, &current, &update).await;
            let live: HashSet<&str> = pods
                .iter()
                .filter_map(|p| p.labels().get(REVISION_HASH).map(String::as_str))
                .chain([current.metadata.name.as_deref().unwrap_or_default()])
                .collect();
            let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
            history::truncate(&self.client, &revisions, &update.name_any(), &live, limit).await?;
        }

        let status = calculate_status(&set, &by_ordinal, &current, &update, collisions, now);
        if set.status.as_ref() != Some(&status) {
            let mut updated = (*set).clone();
            updated.status = Some(status);
            Api::<StatefulSet>::namespaced(self.client.clone(), ns)
                .replace_status(name, &PostParams::default(), &updated)
                .await
                .map_err(|e| Error::api("updating status of statefulset", key, e))?;
        }
        result?;
        Ok(by_ordinal
            .values()
            .filter_map(|p| until_available(p, min_ready, now))
            .min())
    }
}

impl StatefulSetController {
    /// Makes the planned writes, all at once (a plan under OrderedReady holds one).
    async fn act(
        &self,
        set: &StatefulSet,
        actions: &[Action],
        current: &ControllerRevision,
        update: &ControllerRevision,
    ) -> Result<(), Error> {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &set.namespace().unwrap_or_default());
        let set_name = set.name_any();
        let update_template = set
            .spec
            .as_ref()
            .map(|s| s.template.clone())
            .unwrap_or_default();
        let current_template: PodTemplateSpec =
            history::template_of(current).unwrap_or_else(|| update_template.clone());
        let results = join_all(actions.iter().map(|action| {
            let api = api.clone();
            let (update_template, current_template) = (&update_template, &current_template);
            let set_name = &set_name;
            async move {
                match *action {
                    Action::Create { ordinal, update: up } => {
                        let (template, revision) = if up {
                            (update_template, update)
                        } else {
                            (current_template, current)
                        };
                        let pod = identity::new_pod(set, template, &revision.name_any(), ordinal);
                        let pod_name = identity::pod_name(set_name, ordinal);
                        self.create_claims(set, ordinal).await?;
                        match api.create(&PostParams::default(), &pod).await {
                            Ok(_) => {
                                self.event(set, "SuccessfulCreate", format!("create Pod {pod_name} in StatefulSet {set_name} successful"));
                                Ok(())
                            }
                            Err(e) if is_status(&e, 409) => Ok(()),
                            Err(e) => {
                                self.warn(set, "FailedCreate", format!("create Pod {pod_name} in StatefulSet {set_name} failed error: {e}"));
                                Err(Error::api("creating pod", pod_name, e))
                            }
                        }
                    }
                    Action::Delete { ordinal } => {
                        let pod_name = identity::pod_name(set_name, ordinal);
                        match api.delete(&pod_name, &DeleteParams::default()).await {
                            Ok(_) => {
                                self.event(set, "SuccessfulDelete", format!("delete Pod {pod_name} in StatefulSet {set_name} successful"));
                                if condemned(set, ordinal) {
                                    self.delete_scaled_claims(set, ordinal).await?;
                                }
                                Ok(())
                            }
                            Err(e) if is_status(&e, 404) => Ok(()),
                            Err(e) => {
                                self.warn(set, "FailedDelete", format!("delete Pod {pod_name} in StatefulSet {set_name} failed error: {e}"));
                                Err(Error::api("deleting pod", pod_name, e))
                            }
                        }
                    }
                }
            }
        }))
        .await;
        results.into_iter().collect()
    }

    /// Creates the pod's claims that do not exist yet. A claim still being deleted (its
    /// pod of a previous life just went) holds the pod back until it is gone.
    async fn create_claims(&self, set: &StatefulSet, ordinal: i32) -> Result<(), Error> {
        let ns = set.namespace().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let (set_name, pod_name) = (set.name_any(), identity::pod_name(&set.name_any(), ordinal));
        for claim in identity::new_claims(set, ordinal) {
            let name = claim.name_any();
            match self.claims.get(Some(&ns), &name) {
                Some(existing) if existing.metadata.deletion_timestamp.is_some() => {
                    return Err(Error::InvalidSpec {
                        object: format!("statefulset {ns}/{set_name}"),
                        reason: format!("pvc {name} is being deleted"),
                    });
                }
                Some(_) => continue,
                None => {}
            }
            match api.create(&PostParams::default(), &claim).await {
                Ok(_) => self.event(
                    set,
                    "SuccessfulCreate",
                    format!("create Claim {name} Pod {pod_name} in StatefulSet {set_name} success"),
                ),
                Err(e) if is_status(&e, 409) => {}
                Err(e) => {
                    self.warn(set, "FailedCreate", format!("create Claim {name} for Pod {pod_name} in StatefulSet {set_name} failed error: {e}"));
                    return Err(Error::api("creating claim", name, e));
                }
            }
        }
        Ok(())
    }

    /// `whenScaled: Delete`: the claims of a pod scaled away go with it.
    async fn delete_scaled_claims(&self, set: &StatefulSet, ordinal: i32) -> Result<(), Error> {
        if !identity::claims_deleted_when(set).1 {
            return Ok(());
        }
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &set.namespace().unwrap_or_default());
        for claim in identity::new_claims(set, ordinal) {
            let name = claim.name_any();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => self.event(
                    set,
                    "SuccessfulDelete",
                    format!(
                        "delete Claim {name} Pod {} in StatefulSet {} success",
                        identity::pod_name(&set.name_any(), ordinal),
                        set.name_any()
                    ),
                ),
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(Error::api("deleting claim", name, e)),
            }
        }
        Ok(())
    }

    fn event(&self, set: &StatefulSet, reason: &str, message: String) {
        self.events.record(set, EventType::Normal, reason, message);
    }

    fn warn(&self, set: &StatefulSet, reason: &str, message: String) {
        self.events.record(set, EventType::Warning, reason, message);
    }
}

/// Whether `ordinal` is outside the set's ordinals (its pod is scaled away, not replaced).
fn condemned(set: &StatefulSet, ordinal: i32) -> bool {
    let start = identity::start_ordinal(set);
    let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    ordinal < start || ordinal >= start + replicas
}

/// The update strategy with its partition and maxUnavailable resolved.
fn strategy(set: &StatefulSet, replicas: i32) -> Result<Strategy, Error> {
    let update = set.spec.as_ref().and_then(|s| s.update_strategy.as_ref());
    if update.and_then(|u| u.type_.as_deref()) == Some("OnDelete") {
        return Ok(Strategy::OnDelete);
    }
    let rolling = update.and_then(|u| u.rolling_update.as_ref());
    let max_unavailable = match rolling.and_then(|r| r.max_unavailable.as_ref()) {
        None => 1,
        Some(v) => scaled_value(v, replicas, false).map_err(|reason| Error::InvalidSpec {
            object: format!("statefulset {}", key_of(&set.metadata)),
            reason,
        })?,
    };
    Ok(Strategy::RollingUpdate {
        partition: rolling.and_then(|r| r.partition).unwrap_or(0).max(0),
        max_unavailable: max_unavailable.max(1) as usize,
    })
}

/// Upstream's `updateStatus` and `completeRollingUpdate`: counts over the pods that
/// exist; once every pod is updated and ready under RollingUpdate, the update revision
/// becomes the current one.
fn calculate_status(
    set: &StatefulSet,
    pods: &BTreeMap<i32, &CachedPod>,
    current: &ControllerRevision,
    update: &ControllerRevision,
    collisions: i32,
    now: Timestamp,
) -> StatefulSetStatus {
    let min_ready = set
        .spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0);
    let (current_name, update_name) = (current.name_any(), update.name_any());
    let mut status = StatefulSetStatus {
        observed_generation: set.metadata.generation,
        collision_count: Some(collisions),
        current_revision: Some(current_name.clone()),
        update_revision: Some(update_name.clone()),
        conditions: set.status.as_ref().and_then(|s| s.conditions.clone()),
        ..Default::default()
    };
    let (mut ready, mut available, mut current_count, mut updated) = (0, 0, 0, 0);
    for pod in pods.values() {
        if pod.status.phase.is_some() {
            status.replicas += 1;
        }
        if control::running_and_ready(pod) {
            ready += 1;
            if is_available(pod, min_ready, now) {
                available += 1;
            }
        }
        if pod.status.phase.is_some() && !pod.metadata.terminating {
            let revision = pod.labels().get(REVISION_HASH);
            if revision == Some(&current_name) {
                current_count += 1;
            }
            if revision == Some(&update_name) {
                updated += 1;
            }
        }
    }
    status.ready_replicas = Some(ready);
    status.available_replicas = Some(available);
    status.current_replicas = Some(current_count);
    status.updated_replicas = Some(updated);
    let rolling = set
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    if rolling && updated == status.replicas && ready == status.replicas {
        status.current_replicas = Some(updated);
        status.current_revision = Some(update_name);
    }
    status
}

struct SetEvents(Arc<WorkQueue>);

impl EventHandler<StatefulSet> for SetEvents {
    fn on_apply(&self, _old: Option<&StatefulSet>, new: &Arc<StatefulSet>) {
        self.0.add(key_of(&new.metadata));
    }
    fn on_delete(&self, _obj: &Arc<StatefulSet>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::tests::{labelled, pod, ts};

    fn revision(name: &str) -> ControllerRevision {
        let mut r = ControllerRevision::default();
        r.metadata.name = Some(name.into());
        r
    }

    #[test]
    fn status_counts_revisions_and_completes_a_rolling_update() {
        let set = StatefulSet::default();
        let member = |name: &str, revision: &str| {
            labelled(
                pod(name, 0, Some("n"), "Running", Some(0)),
                &[(REVISION_HASH, revision)],
            )
        };
        let status_of = |pods: &[&CachedPod]| {
            let by_ordinal: BTreeMap<i32, &CachedPod> = pods
                .iter()
                .enumerate()
                .map(|(i, p)| (i as i32, *p))
                .collect();
            let (current, update) = (revision("web-1"), revision("web-2"));
            calculate_status(&set, &by_ordinal, &current, &update, 0, ts(5))
        };
        let (a, b) = (member("web-0", "web-2"), member("web-1", "web-1"));
        let status = status_of(&[&a, &b]);
        assert_eq!(status.replicas, 2);
        assert_eq!(status.ready_replicas, Some(2));
        assert_eq!(status.current_replicas, Some(1));
        assert_eq!(status.updated_replicas, Some(1));
        assert_eq!(status.current_revision.as_deref(), Some("web-1"));
        assert_eq!(status.update_revision.as_deref(), Some("web-2"));

        let b = member("web-1", "web-2");
        let status = status_of(&[&a, &b]);
        assert_eq!(
            status.current_revision.as_deref(),
            Some("web-2"),
            "rolled out"
        );
        assert_eq!(status.current_replicas, Some(2));
    }
}
