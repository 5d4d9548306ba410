//! `DeploymentController`: turns each Deployment into ReplicaSets, one per pod template,
//! and moves pods from the old ones to the new one as the strategy allows, as upstream's
//! deployment controller does.
//!
//! A pass (level-triggered, safe to repeat at any point):
//! 1. claim ReplicaSets (adopt matching orphans, release those that stopped matching);
//! 2. find the new ReplicaSet — the one whose template equals the Deployment's, ignoring
//!    `pod-template-hash` — and sync revisions (`deployment.kubernetes.io/revision` is
//!    one more than the highest old revision; a reused old ReplicaSet, as after
//!    `kubectl rollout undo`, gets the next revision and keeps its history);
//! 3. take one step: paused or resized → only scale (in proportion, mid-rollout);
//!    `Recreate` → old to 0, wait for their pods to go, then the new one to `replicas`;
//!    `RollingUpdate` → [`rollout`] arithmetic;
//! 4. when complete, delete old ReplicaSets beyond `revisionHistoryLimit`;
//! 5. write status and conditions ([`status`]).
//!
//! Each step writes with the cached resourceVersion: a decision made on a stale cache
//! fails with a conflict and is taken again on fresh data.

pub mod rollout;
pub mod status;
pub mod template_hash;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use krust_client::cache::Cache;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{Selector, SelectorExt};
use kube::{Client, ResourceExt};

use self::rollout::Counts;
use self::template_hash::{POD_TEMPLATE_HASH, compute_hash, equal_ignore_hash};
use crate::Error;
use crate::owner::{adopt_patch, controller_of, controller_ref, key_of, release_patch, split_key};
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};

pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";

/// Deployment annotations that are not copied to its ReplicaSets.
const NOT_COPIED: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    REVISION_HISTORY,
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
];

pub struct DeploymentController {
    client: Client,
    deployments: Cache<Deployment>,
    replicasets: Cache<ReplicaSet>,
    queue: Arc<WorkQueue>,
    events: EventRecorder,
}

impl DeploymentController {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let d_informer = informers.get::<Deployment>();
        let rs_informer = informers.get::<ReplicaSet>();
        let controller = Arc::new(DeploymentController {
            client,
            deployments: d_informer.cache(),
            replicasets: rs_informer.cache(),
            queue: WorkQueue::new("deployment"),
            events,
        });
        d_informer.add_handler(Arc::new(DeploymentEvents(controller.queue.clone())));
        rs_informer.add_handler(Arc::new(ReplicaSetEvents(controller.clone())));
        controller
    }

    fn owner_of(&self, rs: &ReplicaSet) -> Option<Arc<Deployment>> {
        let r = controller_of(&rs.metadata).filter(|r| r.kind == "Deployment")?;
        let d = self
            .deployments
            .get(rs.metadata.namespace.as_deref(), &r.name)?;
        (d.uid().as_deref() == Some(r.uid.as_str())).then_some(d)
    }

    fn matching(&self, rs: &ReplicaSet) -> Vec<Arc<Deployment>> {
        let ns = rs.namespace();
        self.deployments.state_filter(|d| {
            d.namespace() == ns
                && selector_of(d).is_ok_and(|s| !s.selects_all() && s.matches(rs.labels()))
        })
    }
}

impl Reconciler for DeploymentController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let Some(d) = self.deployments.get(Some(ns), name) else {
            return Ok(None);
        };
        let selector = selector_of(&d)?;
        if selector.selects_all() {
            self.events.record(
                &*d,
                EventType::Warning,
                "SelectingAll",
                "This deployment is selecting all pods. A non-empty selector is required.".into(),
            );
            return Ok(None);
        }
        let rss = self.claim_replica_sets(&d, &selector).await?;
        let mut pass = Pass::new(self, (*d).clone(), rss)?;
        if d.metadata.deletion_timestamp.is_some() {
            let new = pass.find_new();
            return pass.sync_status(new, false).await;
        }
        if pass.paused() || pass.is_scaling_event() {
            return pass.sync_scale().await;
        }
        if pass.strategy() == "Recreate" {
            pass.rollout_recreate().await
        } else {
            pass.rollout_rolling().await
        }
    }
}

impl DeploymentController {
    /// The ReplicaSets this Deployment controls, after adopting and releasing.
    async fn claim_replica_sets(
        &self,
        d: &Deployment,
        selector: &Selector,
    ) -> Result<Vec<ReplicaSet>, Error> {
        let ns = d.namespace().unwrap_or_default();
        let uid = d.uid().unwrap_or_default();
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        let mut claimed = Vec::new();
        for rs in self
            .replicasets
            .state_filter(|rs| rs.namespace().as_deref() == Some(&ns))
        {
            let matches = selector.matches(rs.labels());
            match controller_of(&rs.metadata) {
                Some(r) if r.uid == uid => {
                    if matches {
                        claimed.push((*rs).clone());
                    } else if rs.metadata.deletion_timestamp.is_none() {
                        let patch = release_patch(&rs.metadata, &[&uid]);
                        match api
                            .patch(
                                &rs.name_any(),
                                &PatchParams::default(),
                                &Patch::Merge(&patch),
                            )
                            .await
                        {
                            Ok(_) => {
                                tracing::info!(replicaset = %key_of(&rs.metadata), deployment = %d.name_any(), "released replicaset")
                            }
                            Err(e) if is_status(&e, 404) => {}
                            Err(e) => {
                                return Err(Error::api(
                                    "releasing replicaset",
                                    key_of(&rs.metadata),
                                    e,
                                ));
                            }
                        }
                    }
                }
                None if matches
                    && d.metadata.deletion_timestamp.is_none()
                    && rs.metadata.deletion_timestamp.is_none() =>
                {
                    let patch = adopt_patch(&rs.metadata, d);
                    match api
                        .patch(
                            &rs.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                    {
                        Ok(adopted) => claimed.push(adopted),
                        Err(e) if is_status(&e, 404) => {}
                        Err(e) => {
                            return Err(Error::api("adopting replicaset", key_of(&rs.metadata), e));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(claimed)
    }
}

/// One reconcile pass over one Deployment: its ReplicaSets (oldest first), updated in
/// place as this pass writes them.
struct Pass<'a> {
    c: &'a DeploymentController,
    d: Deployment,
    key: String,
    rss: Vec<ReplicaSet>,
    replicas: i32,
    max_surge: i32,
    max_unavailable: i32,
}

fn spec_of(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

fn counts(rs: &ReplicaSet) -> Counts {
    let status = rs.status.clone().unwrap_or_default();
    Counts {
        spec: spec_of(rs),
        pods: status.replicas,
        available: status.available_replicas.unwrap_or(0),
    }
}

fn revision_of(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

impl<'a> Pass<'a> {
    fn new(
        c: &'a DeploymentController,
        d: Deployment,
        mut rss: Vec<ReplicaSet>,
    ) -> Result<Self, Error> {
        rss.sort_by(|a, b| {
            let t = |rs: &ReplicaSet| rs.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b))
                .then_with(|| a.name_any().cmp(&b.name_any()))
        });
        let spec = d.spec.clone().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1);
        let key = key_of(&d.metadata);
        let (max_surge, max_unavailable) =
            if spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate") {
                (0, 0)
            } else {
                let ru = spec
                    .strategy
                    .as_ref()
                    .and_then(|s| s.rolling_update.as_ref());
                rollout::resolve_fenceposts(
                    ru.and_then(|r| r.max_surge.as_ref()),
                    ru.and_then(|r| r.max_unavailable.as_ref()),
                    replicas,
                )
                .map_err(|reason| Error::InvalidSpec {
                    object: format!("deployment {key}"),
                    reason,
                })?
            };
        Ok(Pass {
            c,
            d,
            key,
            rss,
            replicas,
            max_surge,
            max_unavailable,
        })
    }

    fn paused(&self) -> bool {
        self.d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false)
    }

    fn strategy(&self) -> &str {
        self.d
            .spec
            .as_ref()
            .and_then(|s| s.strategy.as_ref())
            .and_then(|s| s.type_.as_deref())
            .unwrap_or("RollingUpdate")
    }

    fn template(&self) -> k8s_openapi::api::core::v1::PodTemplateSpec {
        self.d
            .spec
            .as_ref()
            .map(|s| s.template.clone())
            .unwrap_or_default()
    }

    /// Index of the ReplicaSet of the current template (the oldest, if several).
    fn find_new(&self) -> Option<usize> {
        let template = self.template();
        self.rss.iter().position(|rs| {
            rs.spec
                .as_ref()
                .and_then(|s| s.template.as_ref())
                .is_some_and(|t| equal_ignore_hash(t, &template))
        })
    }

    fn old_indices(&self, new: Option<usize>) -> Vec<usize> {
        (0..self.rss.len()).filter(|i| Some(*i) != new).collect()
    }

    fn rs_api(&self) -> Api<ReplicaSet> {
        Api::namespaced(
            self.c.client.clone(),
            &self.d.namespace().unwrap_or_default(),
        )
    }

    /// Finds (or, with `create`, creates) the new ReplicaSet and brings revisions up to
    /// date. Returns its index and whether it was created in this pass.
    async fn new_replica_set(&mut self, create: bool) -> Result<(Option<usize>, bool), Error> {
        let new = self.find_new();
        let max_old = self
            .old_indices(new)
            .into_iter()
            .map(|i| revision_of(&self.rss[i]))
            .max()
            .unwrap_or(0);
        let revision = max_old + 1;
        let mut created = false;
        let new = match new {
            Some(i) => {
                let mut rs = self.rss[i].clone();
                let mut changed = self.set_new_rs_annotations(&mut rs, revision);
                let min_ready = self.d.spec.as_ref().and_then(|s| s.min_ready_seconds);
                let spec = rs.spec.get_or_insert_with(Default::default);
                if spec.min_ready_seconds.unwrap_or(0) != min_ready.unwrap_or(0) {
                    spec.min_ready_seconds = min_ready;
                    changed = true;
                }
                if changed {
                    self.rss[i] = self
                        .rs_api()
                        .replace(&rs.name_any(), &PostParams::default(), &rs)
                        .await
                        .map_err(|e| Error::api("updating replicaset", key_of(&rs.metadata), e))?;
                }
                Some(i)
            }
            None if create => {
                let i = self.create_new(revision).await?;
                created = true;
                Some(i)
            }
            None => None,
        };
        if let Some(i) = new {
            let rev = self.rss[i]
                .annotations()
                .get(REVISION)
                .cloned()
                .unwrap_or_default();
            if self.d.annotations().get(REVISION) != Some(&rev) {
                let mut d = self.d.clone();
                d.annotations_mut().insert(REVISION.into(), rev);
                self.d = Api::<Deployment>::namespaced(
                    self.c.client.clone(),
                    &d.namespace().unwrap_or_default(),
                )
                .replace(&d.name_any(), &PostParams::default(), &d)
                .await
                .map_err(|e| Error::api("updating deployment", self.key.clone(), e))?;
            }
        }
        Ok((new, created))
    }

    /// Upstream's `SetNewReplicaSetAnnotations`: copies the Deployment's annotations and
    /// raises the revision, remembering the one it replaces. True if anything changed.
    fn set_new_rs_annotations(&self, rs: &mut ReplicaSet, revision: i64) -> bool {
        let before = rs.annotations().clone();
        let annotations = rs.annotations_mut();
        for (k, v) in self.d.annotations() {
            if !NOT_COPIED.contains(&k.as_str()) {
                annotations.insert(k.clone(), v.clone());
            }
        }
        let old = annotations.get(REVISION).cloned();
        let old_num: i64 = old.as_deref().and_then(|r| r.parse().ok()).unwrap_or(0);
        if old_num < revision {
            annotations.insert(REVISION.into(), revision.to_string());
            if let Some(old) = old.filter(|o| !o.is_empty()) {
                let history = match annotations.get(REVISION_HISTORY) {
                    Some(h) if !h.is_empty() => format!("{h},{old}"),
                    _ => old,
                };
                annotations.insert(REVISION_HISTORY.into(), history);
            }
        }
        *annotations != before
    }

    fn replica_annotations(&self) -> [(String, String); 2] {
        [
            (DESIRED_REPLICAS.into(), self.replicas.to_string()),
            (
                MAX_REPLICAS.into(),
                (self.replicas + self.max_surge).to_string(),
            ),
        ]
    }

    async fn create_new(&mut self, revision: i64) -> Result<usize, Error> {
        let d = &self.d;
        let collision_count = d.status.as_ref().and_then(|s| s.collision_count);
        let mut template = self.template();
        let hash = compute_hash(&template, collision_count);
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let mut selector = d
            .spec
            .as_ref()
            .map(|s| s.selector.clone())
            .unwrap_or_default();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let labels = template.metadata.as_ref().and_then(|m| m.labels.clone());
        // Created at its first step's size; the counts of the other ReplicaSets decide it.
        let all: Vec<Counts> = self.rss.iter().map(counts).collect();
        let replicas = if self.strategy() == "Recreate" {
            self.replicas
        } else {
            rollout::new_rs_replicas(self.replicas, self.max_surge, &all, Counts::default())
        };
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(format!("{}-{hash}", d.name_any())),
                namespace: d.namespace(),
                labels,
                owner_references: Some(vec![controller_ref(d)]),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                min_ready_seconds: d.spec.as_ref().and_then(|s| s.min_ready_seconds),
                selector,
                template: Some(template.clone()),
            }),
            status: None,
        };
        self.set_new_rs_annotations(&mut rs, revision);
        rs.annotations_mut().extend(self.replica_annotations());
        let created = match self.rs_api().create(&PostParams::default(), &rs).await {
            Ok(created) => created,
            Err(e) if is_status(&e, 409) => {
                // Our own from a pass whose result the cache has not shown yet, or a
                // hash collision with a ReplicaSet of another template.
                let existing = self
                    .rs_api()
                    .get(&rs.name_any())
                    .await
                    .map_err(|e| Error::api("reading replicaset", rs.name_any(), e))?;
                let ours = controller_of(&existing.metadata)
                    .is_some_and(|r| Some(&r.uid) == d.uid().as_ref());
                let same = existing
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.as_ref())
                    .is_some_and(|t| equal_ignore_hash(t, &template));
                if !(ours && same) {
                    let mut d = self.d.clone();
                    let status = d.status.get_or_insert_with(Default::default);
                    status.collision_count = Some(collision_count.unwrap_or(0) + 1);
                    Api::<Deployment>::namespaced(
                        self.c.client.clone(),
                        &d.namespace().unwrap_or_default(),
                    )
                    .replace_status(&d.name_any(), &PostParams::default(), &d)
                    .await
                    .map_err(|e| {
                        Error::api("updating status of deployment", self.key.clone(), e)
                    })?;
                }
                return Err(Error::api("creating replicaset", key_of(&rs.metadata), e));
            }
            Err(e) => return Err(Error::api("creating replicaset", key_of(&rs.metadata), e)),
        };
        tracing::info!(deployment = %self.key, replicaset = %created.name_any(), replicas, "created new replicaset");
        if replicas > 0 {
            self.c.events.record(
                &self.d,
                EventType::Normal,
                "ScalingReplicaSet",
                format!(
                    "Scaled up replica set {} from 0 to {replicas}",
                    created.name_any()
                ),
            );
        }
        self.rss.push(created);
        Ok(self.rss.len() - 1)
    }

    /// Sets a ReplicaSet's size (and the replica annotations). True if the size changed.
    async fn scale(&mut self, i: usize, to: i32) -> Result<bool, Error> {
        let from = spec_of(&self.rss[i]);
        let annotations = self.replica_annotations();
        let annotated = annotations
            .iter()
            .all(|(k, v)| self.rss[i].annotations().get(k) == Some(v));
        if from == to && annotated {
            return Ok(false);
        }
        let mut rs = self.rss[i].clone();
        rs.spec.get_or_insert_with(Default::default).replicas = Some(to);
        rs.annotations_mut().extend(annotations);
        self.rss[i] = self
            .rs_api()
            .replace(&rs.name_any(), &PostParams::default(), &rs)
            .await
            .map_err(|e| Error::api("scaling replicaset", key_of(&rs.metadata), e))?;
        if from != to {
            let direction = if to > from { "up" } else { "down" };
            tracing::info!(deployment = %self.key, replicaset = %rs.name_any(), from, to, "scaled replicaset");
            self.c.events.record(
                &self.d,
                EventType::Normal,
                "ScalingReplicaSet",
                format!(
                    "Scaled {direction} replica set {} from {from} to {to}",
                    rs.name_any()
                ),
            );
        }
        Ok(from != to)
    }

    async fn rollout_rolling(&mut self) -> Result<Option<Duration>, Error> {
        let (new, created) = self.new_replica_set(true).await?;
        let n = new.expect("created when missing");
        let spec = spec_of(&self.rss[n]);
        let target = if spec > self.replicas {
            self.replicas
        } else {
            let all: Vec<Counts> = self.rss.iter().map(counts).collect();
            rollout::new_rs_replicas(self.replicas, self.max_surge, &all, counts(&self.rss[n]))
        };
        if self.scale(n, target).await? {
            return self.sync_status(new, created).await;
        }
        let old = self.old_indices(new);
        let old_counts: Vec<Counts> = old.iter().map(|i| counts(&self.rss[*i])).collect();
        let targets = rollout::old_rs_replicas(
            self.replicas,
            self.max_unavailable,
            Some(counts(&self.rss[n])),
            &old_counts,
        );
        let mut scaled = false;
        for (i, to) in old.into_iter().zip(targets) {
            scaled |= self.scale(i, to).await?;
        }
        if scaled {
            return self.sync_status(new, created).await;
        }
        self.finish(new, created).await
    }

    async fn rollout_recreate(&mut self) -> Result<Option<Duration>, Error> {
        let (new, _) = self.new_replica_set(false).await?;
        let mut scaled = false;
        for i in self.old_indices(new) {
            scaled |= self.scale(i, 0).await?;
        }
        if scaled {
            return self.sync_status(new, false).await;
        }
        // Old pods must be gone (as far as the ReplicaSet controller has reported) before
        // any new pod starts.
        let old_running = self.old_indices(new).into_iter().any(|i| {
            let rs = &self.rss[i];
            let st = rs.status.clone().unwrap_or_default();
            st.replicas > 0 || st.observed_generation < rs.metadata.generation
        });
        if old_running {
            return self.sync_status(new, false).await;
        }
        let (new, created) = match new {
            Some(_) => (new, false),
            None => self.new_replica_set(true).await?,
        };
        let n = new.expect("created when missing");
        if self.scale(n, self.replicas).await? {
            return self.sync_status(new, created).await;
        }
        self.finish(new, created).await
    }

    /// The Deployment was resized: some ReplicaSet with pods was sized for another
    /// `replicas` (its desired-replicas annotation says so).
    fn is_scaling_event(&self) -> bool {
        self.rss.iter().filter(|rs| spec_of(rs) > 0).any(|rs| {
            rs.annotations()
                .get(DESIRED_REPLICAS)
                .and_then(|d| d.parse::<i32>().ok())
                .is_some_and(|d| d != self.replicas)
        })
    }

    /// Resizing (or paused): apply the new `replicas` without taking a rollout step.
    async fn sync_scale(&mut self) -> Result<Option<Duration>, Error> {
        let (new, _) = self.new_replica_set(false).await?;
        self.scale_to_replicas(new).await?;
        if self.paused() {
            self.cleanup(new).await?;
        }
        self.sync_status(new, false).await
    }

    /// Upstream's `scale`: a lone active ReplicaSet (or the newest one) takes `replicas`;
    /// a saturated new ReplicaSet means the old ones go to 0; otherwise, in a rolling
    /// update, the change is shared in proportion ([`rollout::proportional_sizes`]).
    async fn scale_to_replicas(&mut self, new: Option<usize>) -> Result<(), Error> {
        let active: Vec<usize> = (0..self.rss.len())
            .filter(|i| spec_of(&self.rss[*i]) > 0)
            .collect();
        let lone = match active.as_slice() {
            [only] => Some(*only),
            [] => new.or(self.rss.len().checked_sub(1)),
            _ => None,
        };
        if let Some(i) = lone {
            self.scale(i, self.replicas).await?;
            return Ok(());
        }
        if let Some(n) = new {
            let rs = &self.rss[n];
            let saturated = spec_of(rs) == self.replicas
                && rs.annotations().get(DESIRED_REPLICAS) == Some(&self.replicas.to_string())
                && counts(rs).available == self.replicas;
            if saturated {
                for i in self.old_indices(new) {
                    if spec_of(&self.rss[i]) > 0 {
                        self.scale(i, 0).await?;
                    }
                }
                return Ok(());
            }
        }
        if self.strategy() == "Recreate" {
            return Ok(());
        }
        let sized: Vec<(i32, Option<i32>)> = active
            .iter()
            .map(|i| {
                let rs = &self.rss[*i];
                (
                    spec_of(rs),
                    rs.annotations()
                        .get(MAX_REPLICAS)
                        .and_then(|m| m.parse().ok()),
                )
            })
            .collect();
        let status_replicas = self.d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let sizes =
            rollout::proportional_sizes(self.replicas, self.max_surge, &sized, status_replicas);
        for (i, size) in active.into_iter().zip(sizes) {
            self.scale(i, size).await?;
        }
        Ok(())
    }

    /// The rollout step is done: clean up history once complete, then report.
    async fn finish(
        &mut self,
        new: Option<usize>,
        created: bool,
    ) -> Result<Option<Duration>, Error> {
        let complete = new.is_some_and(|n| {
            let c = counts(&self.rss[n]);
            c.spec == self.replicas
                && c.available == self.replicas
                && self
                    .old_indices(new)
                    .iter()
                    .all(|i| spec_of(&self.rss[*i]) == 0)
        });
        if complete {
            self.cleanup(new).await?;
        }
        self.sync_status(new, created).await
    }

    /// Deletes the oldest revisions of scaled-down ReplicaSets beyond
    /// `revisionHistoryLimit` (default 10).
    async fn cleanup(&mut self, new: Option<usize>) -> Result<(), Error> {
        let limit = self
            .d
            .spec
            .as_ref()
            .and_then(|s| s.revision_history_limit)
            .unwrap_or(10)
            .max(0) as usize;
        let mut cleanable: Vec<&ReplicaSet> = self
            .old_indices(new)
            .into_iter()
            .map(|i| &self.rss[i])
            .filter(|rs| {
                let st = rs.status.clone().unwrap_or_default();
                spec_of(rs) == 0
                    && st.replicas == 0
                    && st.observed_generation >= rs.metadata.generation
                    && rs.metadata.deletion_timestamp.is_none()
            })
            .collect();
        if cleanable.len() <= limit {
            return Ok(());
        }
        cleanable.sort_by_key(|rs| revision_of(rs));
        let doomed: Vec<String> = cleanable[..cleanable.len() - limit]
            .iter()
            .map(|rs| rs.name_any())
            .collect();
        for name in doomed {
            tracing::info!(deployment = %self.key, replicaset = %name, "deleting old replicaset beyond revisionHistoryLimit");
            match self.rs_api().delete(&name, &DeleteParams::default()).await {
                // Left in `self.rss` (indices into it stay valid): at size 0 with no
                // pods it counts for nothing in the status.
                Ok(_) => {}
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(Error::api("deleting replicaset", name, e)),
            }
        }
        Ok(())
    }

    async fn sync_status(
        &mut self,
        new: Option<usize>,
        created: bool,
    ) -> Result<Option<Duration>, Error> {
        let now = Timestamp::now();
        let new_status = status::calculate(
            &self.d,
            &status::Observed {
                all: &self.rss,
                new: new.map(|n| &self.rss[n]),
                created_new: created,
                max_unavailable: self.max_unavailable,
                now,
            },
        );
        // Check progress again when the deadline would pass.
        let requeue = match status::get_condition(&new_status, "Progressing") {
            Some(c)
                if !status::is_complete(&self.d, &new_status)
                    && c.status == "True"
                    && !self.paused() =>
            {
                c.last_update_time.as_ref().map(|t| {
                    let at = t.0 + status::progress_deadline(&self.d);
                    at.duration_since(now).unsigned_abs() + Duration::from_secs(1)
                })
            }
            _ => None,
        };
        if self.d.status.as_ref() != Some(&new_status) {
            let mut d = self.d.clone();
            d.status = Some(new_status);
            self.d = Api::<Deployment>::namespaced(
                self.c.client.clone(),
                &d.namespace().unwrap_or_default(),
            )
            .replace_status(&d.name_any(), &PostParams::default(), &d)
            .await
            .map_err(|e| Error::api("updating status of deployment", self.key.clone(), e))?;
        }
        Ok(requeue)
    }
}

pub fn selector_of(d: &Deployment) -> Result<Selector, Error> {
    let selector = d
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .unwrap_or_default();
    crate::owner::parse_selector(d, selector)
}

struct DeploymentEvents(Arc<WorkQueue>);

impl EventHandler<Deployment> for DeploymentEvents {
    fn on_apply(&self, _old: Option<&Deployment>, new: &Arc<Deployment>) {
        self.0.add(key_of(&new.metadata));
    }
    fn on_delete(&self, _obj: &Arc<Deployment>) {}
}

struct ReplicaSetEvents(Arc<DeploymentController>);

impl ReplicaSetEvents {
    fn enqueue(&self, rs: &ReplicaSet) {
        match self.0.owner_of(rs) {
            Some(d) => self.0.queue.add(key_of(&d.metadata)),
            None if controller_of(&rs.metadata).is_none() => {
                for d in self.0.matching(rs) {
                    self.0.queue.add(key_of(&d.metadata));
                }
            }
            None => {}
        }
    }
}

impl EventHandler<ReplicaSet> for ReplicaSetEvents {
    fn on_apply(&self, old: Option<&ReplicaSet>, new: &Arc<ReplicaSet>) {
        if let Some(old) = old {
            if old.resource_version() == new.resource_version() {
                return;
            }
            if controller_of(&old.metadata) != controller_of(&new.metadata)
                || old.labels() != new.labels()
            {
                self.enqueue(old);
            }
        }
        self.enqueue(new);
    }
    fn on_delete(&self, obj: &Arc<ReplicaSet>) {
        self.enqueue(obj);
    }
}
