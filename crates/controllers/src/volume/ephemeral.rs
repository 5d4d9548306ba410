//! `EphemeralVolumeController`: a pod's generic ephemeral volume
//! (`ephemeral.volumeClaimTemplate`) gets its claim `<pod>-<volume>`, made from the
//! template and controlled by the pod, so that the claim goes with the pod (the garbage
//! collector) — upstream's ephemeral-volume controller. The cached pods only say which
//! volumes are ephemeral; the template is read from the pod itself when a claim is to
//! be made, which is once per volume.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use krust_client::volume::ephemeral_claim_name;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::owner::{key_of, split_key};
use crate::pods::{CachedPod, VolumeClaim};

pub struct EphemeralVolumeController {
    client: Client,
    pods: Cache<CachedPod>,
    claims: Cache<PersistentVolumeClaim>,
    events: EventRecorder,
    queue: Arc<WorkQueue>,
}

impl EphemeralVolumeController {
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let pods = informers.get::<CachedPod>();
        let claims = informers.get::<PersistentVolumeClaim>();
        let controller = Arc::new(EphemeralVolumeController {
            client,
            pods: pods.cache(),
            claims: claims.cache(),
            events,
            queue: WorkQueue::new("ephemeral-volume"),
        });
        pods.add_handler(Arc::new(PodEvents(controller.queue.clone())));
        controller
    }
}

fn has_ephemeral(pod: &CachedPod) -> bool {
    pod.spec
        .claims
        .iter()
        .any(|c| matches!(c, VolumeClaim::Ephemeral(_)))
}

struct PodEvents(Arc<WorkQueue>);

impl EventHandler<CachedPod> for PodEvents {
    fn on_apply(&self, _old: Option<&CachedPod>, pod: &Arc<CachedPod>) {
        if has_ephemeral(pod) && !pod.metadata.terminating {
            self.0.add(key_of(&pod.metadata));
        }
    }
    fn on_delete(&self, _pod: &Arc<CachedPod>) {}
}

impl Reconciler for EphemeralVolumeController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let Some(cached) = self.pods.get(Some(ns), name) else {
            return Ok(None);
        };
        if cached.metadata.terminating {
            return Ok(None);
        }
        let missing: Vec<&str> = cached
            .spec
            .claims
            .iter()
            .filter_map(|c| match c {
                VolumeClaim::Ephemeral(volume) => Some(&**volume),
                VolumeClaim::Named(_) => None,
            })
            .filter(|volume| {
                self.claims
                    .get(Some(ns), &ephemeral_claim_name(name, volume))
                    .is_none()
            })
            .collect();
        if missing.is_empty() {
            return Ok(None);
        }
        let pod = match Api::<Pod>::namespaced(self.client.clone(), ns)
            .get(name)
            .await
        {
            Ok(pod) => pod,
            Err(e) if is_status(&e, 404) => return Ok(None),
            Err(e) => return Err(Error::api("reading pod", key, e)),
        };
        if pod.metadata.uid.as_deref() != Some(&*cached.metadata.uid) {
            return Ok(None);
        }
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let Some(template) = volume
                .ephemeral
                .as_ref()
                .and_then(|e| e.volume_claim_template.as_ref())
            else {
                continue;
            };
            if !missing.contains(&volume.name.as_str()) {
                continue;
            }
            let claim_name = ephemeral_claim_name(name, &volume.name);
            let meta = template.metadata.clone().unwrap_or_default();
            let claim = PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(claim_name.clone()),
                    namespace: Some(ns.to_string()),
                    labels: meta.labels,
                    annotations: meta.annotations,
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Pod".into(),
                        name: name.to_string(),
                        uid: pod.uid().unwrap_or_default(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    }]),
                    ..Default::default()
                },
                spec: Some(template.spec.clone()),
                status: None,
            };
            match api.create(&PostParams::default(), &claim).await {
                Ok(_) => {}
                Err(e) if is_status(&e, 409) => {}
                Err(e) => {
                    self.events.record(
                        &pod,
                        EventType::Warning,
                        "FailedCreate",
                        format!("create PVC {claim_name}: {e}"),
                    );
                    return Err(Error::api("creating claim", claim_name, e));
                }
            }
        }
        Ok(None)
    }
}
