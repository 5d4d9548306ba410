//! The storage protection controllers: a deleted claim keeps its
//! `kubernetes.io/pvc-protection` finalizer while a pod that is not finished uses it
//! (upstream's pvc-protection controller), and a deleted volume keeps
//! `kubernetes.io/pv-protection` while it is Bound (pv-protection). Admission adds both
//! finalizers on create; these controllers add them to objects that predate that and
//! remove them when the object is no longer in use.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use krust_client::cache::Cache;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{PV_PROTECTION, PVC_PROTECTION};
use crate::Error;
use crate::owner::{key_of, split_key};
use crate::pods::{CachedPod, Phase};

pub struct PvcProtectionController {
    client: Client,
    claims: Cache<PersistentVolumeClaim>,
    pods: Cache<CachedPod>,
    queue: Arc<WorkQueue>,
}

impl PvcProtectionController {
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let claims = informers.get::<PersistentVolumeClaim>();
        let pods = informers.get::<CachedPod>();
        let controller = Arc::new(PvcProtectionController {
            client,
            claims: claims.cache(),
            pods: pods.cache(),
            queue: WorkQueue::new("pvc-protection"),
        });
        claims.add_handler(Arc::new(QueueAll(controller.queue.clone())));
        pods.add_handler(Arc::new(PodEvents(controller.clone())));
        controller
    }
}

/// Queues every object of a kind by its key.
struct QueueAll(Arc<WorkQueue>);

impl<K: Resource> EventHandler<K> for QueueAll {
    fn on_apply(&self, _old: Option<&K>, obj: &Arc<K>) {
        self.0.add(key_of(obj.meta()));
    }
    fn on_delete(&self, _obj: &Arc<K>) {}
}

/// A pod that finished or went away may have been the last user of a deleted claim.
struct PodEvents(Arc<PvcProtectionController>);

impl PodEvents {
    fn queue_claims(&self, pod: &CachedPod) {
        for claim in pod.claim_names() {
            self.0
                .queue
                .add(format!("{}/{claim}", pod.metadata.namespace));
        }
    }
}

impl EventHandler<CachedPod> for PodEvents {
    fn on_apply(&self, _old: Option<&CachedPod>, pod: &Arc<CachedPod>) {
        if finished(pod) || pod.metadata.terminating {
            self.queue_claims(pod);
        }
    }
    fn on_delete(&self, pod: &Arc<CachedPod>) {
        self.queue_claims(pod);
    }
}

fn finished(pod: &CachedPod) -> bool {
    matches!(pod.status.phase, Some(Phase::Succeeded | Phase::Failed))
}

fn has_finalizer(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    f: &str,
) -> bool {
    meta.finalizers.iter().flatten().any(|x| x == f)
}

/// Adds or removes `finalizer` with an update (the protection roles allow `update`).
async fn set_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    present: bool,
) -> Result<(), Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let mut updated = obj.clone();
    let list = updated.meta_mut().finalizers.get_or_insert_with(Vec::new);
    if present {
        list.push(finalizer.to_string());
    } else {
        list.retain(|f| f != finalizer);
    }
    match api
        .replace(&obj.name_any(), &PostParams::default(), &updated)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(e) => Err(Error::api("updating the finalizers of", obj.name_any(), e)),
    }
}

impl PvcProtectionController {
    /// Whether a pod that has not finished uses the claim. The cache may not have a pod
    /// created a moment ago, so a claim the cache finds unused is checked with a live
    /// list before it goes (as upstream does).
    async fn in_use(&self, ns: &str, name: &str) -> Result<bool, Error> {
        let uses = |pod: &CachedPod| !finished(pod) && pod.claim_names().any(|c| c == name);
        if !self
            .pods
            .state_filter(|p| &*p.metadata.namespace == ns && uses(p))
            .is_empty()
        {
            return Ok(true);
        }
        let pods = Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::api("listing the pods of namespace", ns, e))?;
        Ok(pods.items.iter().any(|pod| {
            let done = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Succeeded" || p == "Failed");
            !done
                && krust_client::volume::pod_claims(pod)
                    .iter()
                    .any(|c| c == name)
        }))
    }
}

impl Reconciler for PvcProtectionController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let Some(claim) = self.claims.get(Some(ns), name) else {
            return Ok(None);
        };
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns);
        let protected = has_finalizer(&claim.metadata, PVC_PROTECTION);
        match claim.metadata.deletion_timestamp {
            None if !protected => set_finalizer(&api, &*claim, PVC_PROTECTION, true).await?,
            Some(_) if protected && !self.in_use(ns, name).await? => {
                set_finalizer(&api, &*claim, PVC_PROTECTION, false).await?;
                tracing::info!(
                    claim = key,
                    "claim no longer in use; its protection removed"
                );
            }
            _ => {}
        }
        Ok(None)
    }
}

pub struct PvProtectionController {
    client: Client,
    volumes: Cache<PersistentVolume>,
    queue: Arc<WorkQueue>,
}

impl PvProtectionController {
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let volumes = informers.get::<PersistentVolume>();
        let controller = Arc::new(PvProtectionController {
            client,
            volumes: volumes.cache(),
            queue: WorkQueue::new("pv-protection"),
        });
        volumes.add_handler(Arc::new(QueueAll(controller.queue.clone())));
        controller
    }
}

impl Reconciler for PvProtectionController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (_, name) = split_key(key);
        let Some(pv) = self.volumes.get(None, name) else {
            return Ok(None);
        };
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let protected = has_finalizer(&pv.metadata, PV_PROTECTION);
        let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        match pv.metadata.deletion_timestamp {
            None if !protected => set_finalizer(&api, &*pv, PV_PROTECTION, true).await?,
            Some(_) if protected && !bound => {
                set_finalizer(&api, &*pv, PV_PROTECTION, false).await?;
            }
            _ => {}
        }
        Ok(None)
    }
}
