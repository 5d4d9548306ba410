//! The attach/detach controller, for CSI volumes as upstream's: a CSI PersistentVolume
//! used by a pod on a node is attached to that node — a VolumeAttachment
//! `csi-<sha256(volume handle + driver + node)>` that the driver's external attacher
//! acts on — when the driver needs attaching (its CSIDriver's `attachRequired`, or no
//! CSIDriver at all: upstream's default). The kubelet waits for `status.attached`
//! before staging the volume. The attachment is deleted once no pod on the node uses
//! the volume. An attacher's `attachError` becomes a `FailedAttachVolume` event on the
//! pods waiting for it, in upstream's words.
//!
//! Only pods with claims matter; they are indexed by node, so that pods without
//! volumes cost nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{
    CSIDriver, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use krust_client::volume::attachment_name;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::pods::CachedPod;

/// Pods with claims, by node: `(namespace, name)` keys.
type ByNode = HashMap<String, HashSet<(String, String)>>;

pub struct AttachDetachController {
    client: Client,
    pods: Cache<CachedPod>,
    claims: Cache<PersistentVolumeClaim>,
    volumes: Cache<PersistentVolume>,
    drivers: Cache<CSIDriver>,
    attachments: Cache<VolumeAttachment>,
    by_node: Mutex<ByNode>,
    events: EventRecorder,
    queue: Arc<WorkQueue>,
}

impl AttachDetachController {
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let pods = informers.get::<CachedPod>();
        let claims = informers.get::<PersistentVolumeClaim>();
        let volumes = informers.get::<PersistentVolume>();
        let drivers = informers.get::<CSIDriver>();
        let attachments = informers.get::<VolumeAttachment>();
        let controller = Arc::new(AttachDetachController {
            client,
            pods: pods.cache(),
            claims: claims.cache(),
            volumes: volumes.cache(),
            drivers: drivers.cache(),
            attachments: attachments.cache(),
            by_node: Mutex::default(),
            events,
            queue: WorkQueue::new("attachdetach"),
        });
        pods.add_handler(Arc::new(PodEvents(controller.clone())));
        attachments.add_handler(Arc::new(AttachmentEvents(controller.queue.clone())));
        // A claim bound or its volume changed: the nodes of the pods using it care; a
        // driver changed: every node with claims.
        claims.add_handler(Arc::new(ClaimEvents(controller.clone())));
        volumes.add_handler(Arc::new(VolumeEvents(controller.clone())));
        drivers.add_handler(Arc::new(AllNodes(controller.clone())));
        controller
    }

    /// The node's pods with claims, `(namespace, name)`.
    fn pods_on(&self, node: &str) -> Vec<(String, String)> {
        self.by_node
            .lock()
            .unwrap()
            .get(node)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Queues the nodes whose pods use claim `namespace/name`.
    fn queue_nodes_using(&self, namespace: &str, claim: &str) {
        // A copy, so that the pod cache is not read under this lock.
        let by_node = self.by_node.lock().unwrap().clone();
        let nodes: Vec<String> = by_node
            .iter()
            .filter(|(_, pods)| {
                pods.iter().any(|(ns, name)| {
                    ns == namespace
                        && self
                            .pods
                            .get(Some(ns), name)
                            .is_some_and(|p| p.claim_names().any(|c| c == claim))
                })
            })
            .map(|(node, _)| node.clone())
            .collect();
        for node in nodes {
            self.queue.add(node);
        }
    }

    /// The attachments the node's pods need: attachment name → (volume, driver).
    fn desired(&self, node: &str) -> BTreeMap<String, (String, String)> {
        let mut desired = BTreeMap::new();
        for (ns, name) in self.pods_on(node) {
            let Some(pod) = self.pods.get(Some(&ns), &name) else {
                continue;
            };
            for claim in pod.claim_names() {
                let volume = self
                    .claims
                    .get(Some(&ns), &claim)
                    .and_then(|c| c.spec.as_ref()?.volume_name.clone())
                    .and_then(|v| self.volumes.get(None, &v));
                let Some(volume) = volume else { continue };
                let Some(csi) = volume.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
                    continue;
                };
                let attach = self
                    .drivers
                    .get(None, &csi.driver)
                    .is_none_or(|d| d.spec.attach_required != Some(false));
                if attach {
                    desired.insert(
                        attachment_name(&csi.volume_handle, &csi.driver, node),
                        (volume.name_any(), csi.driver.clone()),
                    );
                }
            }
        }
        desired
    }

    /// Upstream's FailedAttachVolume event on the node's pods that use the volume.
    fn report_attach_error(&self, node: &str, volume: &str, message: &str) {
        for (ns, name) in self.pods_on(node) {
            let Some(pod) = self.pods.get(Some(&ns), &name) else {
                continue;
            };
            let uses = pod.claim_names().any(|claim| {
                self.claims
                    .get(Some(&ns), &claim)
                    .and_then(|c| c.spec.as_ref()?.volume_name.clone())
                    .as_deref()
                    == Some(volume)
            });
            if uses {
                // The event names the pod; its metadata is all the recorder reads.
                let about = Pod {
                    metadata: ObjectMeta {
                        namespace: Some(ns.clone()),
                        name: Some(name.clone()),
                        uid: Some(pod.metadata.uid.to_string()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                self.events.record(
                    &about,
                    EventType::Warning,
                    "FailedAttachVolume",
                    format!("AttachVolume.Attach failed for volume \"{volume}\" : {message}"),
                );
            }
        }
    }
}

struct PodEvents(Arc<AttachDetachController>);

impl PodEvents {
    fn index(&self, pod: &CachedPod, present: bool) {
        let Some(node) = pod.spec.node_name.as_deref().map(String::from) else {
            return;
        };
        let key = (
            pod.metadata.namespace.to_string(),
            pod.metadata.name.to_string(),
        );
        let mut by_node = self.0.by_node.lock().unwrap();
        if present {
            by_node.entry(node.clone()).or_default().insert(key);
        } else if let Some(keys) = by_node.get_mut(&node) {
            keys.remove(&key);
            if keys.is_empty() {
                by_node.remove(&node);
            }
        }
        drop(by_node);
        self.0.queue.add(node);
    }
}

impl EventHandler<CachedPod> for PodEvents {
    fn on_apply(&self, old: Option<&CachedPod>, pod: &Arc<CachedPod>) {
        if let Some(old) = old.filter(|o| o.spec.node_name != pod.spec.node_name) {
            self.index(old, false);
        }
        if !pod.spec.claims.is_empty() {
            self.index(pod, true);
        }
    }
    fn on_delete(&self, pod: &Arc<CachedPod>) {
        if !pod.spec.claims.is_empty() {
            self.index(pod, false);
        }
    }
}

struct AttachmentEvents(Arc<WorkQueue>);

impl EventHandler<VolumeAttachment> for AttachmentEvents {
    fn on_apply(&self, _old: Option<&VolumeAttachment>, va: &Arc<VolumeAttachment>) {
        self.0.add(va.spec.node_name.clone());
    }
    fn on_delete(&self, va: &Arc<VolumeAttachment>) {
        self.0.add(va.spec.node_name.clone());
    }
}

struct ClaimEvents(Arc<AttachDetachController>);

impl EventHandler<PersistentVolumeClaim> for ClaimEvents {
    fn on_apply(&self, _old: Option<&PersistentVolumeClaim>, claim: &Arc<PersistentVolumeClaim>) {
        let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
        self.0.queue_nodes_using(ns, &claim.name_any());
    }
    fn on_delete(&self, claim: &Arc<PersistentVolumeClaim>) {
        self.on_apply(None, claim);
    }
}

struct VolumeEvents(Arc<AttachDetachController>);

impl EventHandler<PersistentVolume> for VolumeEvents {
    fn on_apply(&self, _old: Option<&PersistentVolume>, pv: &Arc<PersistentVolume>) {
        if let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
            self.0.queue_nodes_using(
                r.namespace.as_deref().unwrap_or_default(),
                r.name.as_deref().unwrap_or_default(),
            );
        }
    }
    fn on_delete(&self, pv: &Arc<PersistentVolume>) {
        self.on_apply(None, pv);
    }
}

struct AllNodes(Arc<AttachDetachController>);

impl<K> EventHandler<K> for AllNodes {
    fn on_apply(&self, _old: Option<&K>, _obj: &Arc<K>) {
        let nodes: Vec<String> = self.0.by_node.lock().unwrap().keys().cloned().collect();
        for node in nodes {
            self.0.queue.add(node);
        }
    }
    fn on_delete(&self, obj: &Arc<K>) {
        self.on_apply(None, obj);
    }
}

impl Reconciler for AttachDetachController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, node: &str) -> Result<Option<Duration>, Error> {
        let desired = self.desired(node);
        let api = Api::<VolumeAttachment>::all(self.client.clone());
        let current = self.attachments.state_filter(|va| {
            va.spec.node_name == node && va.spec.source.persistent_volume_name.is_some()
        });
        for va in &current {
            let name = va.name_any();
            if desired.contains_key(&name) || va.metadata.deletion_timestamp.is_some() {
                continue;
            }
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(
                    attachment = name,
                    node,
                    "volume no longer used on the node; detaching"
                ),
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(Error::api("deleting VolumeAttachment", name, e)),
            }
        }
        for (name, (volume, driver)) in desired {
            match current.iter().find(|va| va.name_any() == name) {
                Some(va) => {
                    let error = va
                        .status
                        .as_ref()
                        .and_then(|s| s.attach_error.as_ref())
                        .and_then(|e| e.message.clone());
                    if let Some(message) = error {
                        self.report_attach_error(node, &volume, &message);
                    }
                }
                None => {
                    let va = VolumeAttachment {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            ..Default::default()
                        },
                        spec: VolumeAttachmentSpec {
                            attacher: driver,
                            node_name: node.to_string(),
                            source: VolumeAttachmentSource {
                                persistent_volume_name: Some(volume),
                                ..Default::default()
                            },
                        },
                        status: None,
                    };
                    match api.create(&PostParams::default(), &va).await {
                        Ok(_) => tracing::info!(attachment = name, node, "attaching a volume"),
                        Err(e) if is_status(&e, 409) => {}
                        Err(e) => return Err(Error::api("creating VolumeAttachment", name, e)),
                    }
                }
            }
        }
        Ok(None)
    }
}
