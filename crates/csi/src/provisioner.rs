//! The provisioner of a node's CSI driver: upstream's external-provisioner in its
//! node-deployment mode (one per node, each serving the claims the scheduler placed on
//! its node), talking CSI to the driver on this node.
//!
//! - A claim that names this driver (`volume.kubernetes.io/storage-provisioner`, set
//!   by the PersistentVolume controller) and this node (`selected-node`, set by the
//!   scheduler) and is not bound gets a volume: CreateVolume, then a PersistentVolume
//!   `pvc-<claim uid>` pre-bound to the claim, with the class's reclaim policy, the
//!   CSI source and node affinity from the volume's topology. The controller binds them.
//! - A Released volume this driver provisioned here, with reclaim policy Delete: its
//!   storage is removed (DeleteVolume), then the PersistentVolume.
//!
//! It also registers the driver (a CSIDriver object) and the `local-path` StorageClass,
//! default and WaitForFirstConsumer, as k3s does, and publishes the node's free storage
//! ([`crate::capacity`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::serde_json::json;
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, Informer};
use krust_client::is_status;
use krust_client::queue::{PassError, Reconciler, WorkQueue};
use krust_client::volume::{PROVISIONED_BY, SELECTED_NODE, STORAGE_PROVISIONER};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use crate::capacity::{ClassChanges, Publisher};
use crate::v1::volume_capability::access_mode::Mode;
use crate::v1::{
    CapacityRange, CreateVolumeRequest, DeleteVolumeRequest, Topology, TopologyRequirement,
};
use crate::{Driver, local};

/// The StorageClass of the built-in driver.
pub const LOCAL_CLASS: &str = "local-path";
const MANAGER: &str = "krust-local-storage";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {object}: {source}")]
    Api {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("{call} for {object}: {status}")]
    Csi {
        call: &'static str,
        object: String,
        status: tonic::Status,
    },
    #[error(transparent)]
    Connect(#[from] crate::Error),
}

impl PassError for Error {
    fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source, .. } if is_status(source, 409))
    }
}

/// The provisioner of `driver` (listening on `socket`) for node `node`.
pub struct Provisioner {
    client: Client,
    node: String,
    driver: &'static str,
    socket: PathBuf,
    claims: Cache<PersistentVolumeClaim>,
    volumes: Cache<PersistentVolume>,
    classes: Cache<StorageClass>,
    events: EventRecorder,
    queue: Arc<WorkQueue>,
}

/// Work-queue keys: claims and volumes share the queue.
fn claim_key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "pvc:{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.name_any()
    )
}

fn volume_key(pv: &PersistentVolume) -> String {
    format!("pv:{}", pv.name_any())
}

struct Events(Arc<Provisioner>);

impl EventHandler<PersistentVolumeClaim> for Events {
    fn on_apply(&self, _old: Option<&PersistentVolumeClaim>, claim: &Arc<PersistentVolumeClaim>) {
        self.0.queue.add(claim_key(claim));
    }
    fn on_delete(&self, _claim: &Arc<PersistentVolumeClaim>) {}
}

impl EventHandler<PersistentVolume> for Events {
    fn on_apply(&self, _old: Option<&PersistentVolume>, pv: &Arc<PersistentVolume>) {
        self.0.queue.add(volume_key(pv));
    }
    fn on_delete(&self, _pv: &Arc<PersistentVolume>) {}
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

impl Provisioner {
    /// Registers the driver and its class, then provisions and deletes volumes until
    /// the future is dropped.
    pub async fn run(client: Client, node: String, socket: PathBuf) -> Result<(), Error> {
        register(&client).await?;
        let claims = Informer::<PersistentVolumeClaim>::new(
            Api::all(client.clone()),
            watcher::Config::default(),
        );
        let volumes =
            Informer::<PersistentVolume>::new(Api::all(client.clone()), watcher::Config::default());
        let classes =
            Informer::<StorageClass>::new(Api::all(client.clone()), watcher::Config::default());
        let (events, sender) = EventRecorder::new(client.clone(), MANAGER);
        let provisioner = Arc::new(Provisioner {
            client,
            driver: local::NAME,
            events: events.on_host(&node),
            node,
            socket,
            claims: claims.cache(),
            volumes: volumes.cache(),
            classes: classes.cache(),
            queue: WorkQueue::new("local-storage-provisioner"),
        });
        claims.add_handler(Arc::new(Events(provisioner.clone())));
        volumes.add_handler(Arc::new(Events(provisioner.clone())));
        let class_changed = Arc::new(tokio::sync::Notify::new());
        classes.add_handler(Arc::new(ClassChanges(class_changed.clone())));
        let capacity = Publisher {
            client: provisioner.client.clone(),
            node: provisioner.node.clone(),
            driver: provisioner.driver,
            socket: provisioner.socket.clone(),
            classes: classes.cache(),
            changed: class_changed,
        };
        let caches = (claims.cache(), volumes.cache(), classes.cache());
        let informers = async {
            futures::join!(claims.run(), volumes.run(), classes.run());
        };
        let work = async {
            futures::join!(
                caches.0.wait_until_ready(),
                caches.1.wait_until_ready(),
                caches.2.wait_until_ready()
            );
            futures::join!(
                krust_client::queue::run(provisioner.clone(), 2),
                capacity.run()
            );
        };
        futures::join!(informers, work, sender);
        Ok(())
    }

    async fn driver(&self) -> Result<Driver, Error> {
        Ok(Driver::connect(&self.socket).await?)
    }

    /// Whether this provisioner is to make a volume for the claim: one placed on this
    /// node whose provisioner is this driver — named on the claim by the
    /// PersistentVolume controller, or, before the controller has written that, its
    /// class's: the volume is made while the controller writes the name, one hop
    /// sooner (the volume's name is the claim's UID, so it is never made twice).
    fn wants(&self, claim: &PersistentVolumeClaim) -> bool {
        let provisioner = match annotation(&claim.metadata, STORAGE_PROVISIONER) {
            Some(named) => named == self.driver,
            None => self
                .classes
                .get(None, krust_client::volume::claim_class(claim))
                .is_some_and(|c| c.provisioner == self.driver),
        };
        claim.metadata.deletion_timestamp.is_none()
            && provisioner
            && annotation(&claim.metadata, SELECTED_NODE) == Some(self.node.as_str())
            && claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .is_none_or(str::is_empty)
    }

    async fn provision(&self, claim: &PersistentVolumeClaim) -> Result<(), Error> {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let name = format!("pvc-{uid}");
        if self.volumes.get(None, &name).is_some() {
            return Ok(());
        }
        let object = format!(
            "claim {}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.name_any()
        );
        let class_name = krust_client::volume::claim_class(claim);
        let Some(class) = self.classes.get(None, class_name) else {
            return Ok(());
        };
        self.events.record(
            claim,
            EventType::Normal,
            "Provisioning",
            format!("External provisioner is provisioning volume for {object}"),
        );
        let spec = claim.spec.clone().unwrap_or_default();
        let requested = krust_client::volume::requested(claim);
        let here = Topology {
            segments: [(local::TOPOLOGY_KEY.to_string(), self.node.clone())].into(),
        };
        let request = CreateVolumeRequest {
            name: name.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: requested,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![crate::mount_capability("", Mode::SingleNodeWriter)],
            parameters: class_parameters(&class),
            accessibility_requirements: Some(TopologyRequirement {
                requisite: vec![here.clone()],
                preferred: vec![here],
            }),
            ..Default::default()
        };
        let created = match self.driver().await?.controller.create_volume(request).await {
            Ok(response) => response.into_inner().volume.unwrap_or_default(),
            Err(status) => {
                self.events.record(
                    claim,
                    EventType::Warning,
                    "ProvisioningFailed",
                    format!(
                        "failed to provision volume with StorageClass \"{class_name}\": {}",
                        status.message()
                    ),
                );
                return Err(Error::Csi {
                    call: "CreateVolume",
                    object,
                    status,
                });
            }
        };
        // The volume's topology becomes its node affinity.
        let terms = created
            .accessible_topology
            .iter()
            .map(|t| NodeSelectorTerm {
                match_expressions: Some(
                    t.segments
                        .iter()
                        .map(|(k, v)| NodeSelectorRequirement {
                            key: k.clone(),
                            operator: "In".into(),
                            values: Some(vec![v.clone()]),
                        })
                        .collect(),
                ),
                match_fields: None,
            })
            .collect::<Vec<_>>();
        let storage = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .cloned()
            .unwrap_or_default();
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                annotations: Some(BTreeMap::from([(
                    PROVISIONED_BY.to_string(),
                    self.driver.to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: spec.access_modes.clone(),
                capacity: Some(BTreeMap::from([("storage".to_string(), storage)])),
                claim_ref: Some(krust_client::volume::claim_ref(claim)),
                csi: Some(CSIPersistentVolumeSource {
                    driver: self.driver.to_string(),
                    volume_handle: created.volume_id,
                    volume_attributes: (!created.volume_context.is_empty())
                        .then(|| created.volume_context.into_iter().collect()),
                    ..Default::default()
                }),
                node_affinity: (!terms.is_empty()).then_some(VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: terms,
                    }),
                }),
                persistent_volume_reclaim_policy: Some(
                    class
                        .reclaim_policy
                        .clone()
                        .unwrap_or_else(|| "Delete".into()),
                ),
                storage_class_name: Some(class_name.to_string()),
                volume_mode: spec.volume_mode.clone(),
                ..Default::default()
            }),
            status: None,
        };
        match Api::<PersistentVolume>::all(self.client.clone())
            .create(&PostParams::default(), &pv)
            .await
        {
            Ok(_) => {}
            Err(e) if is_status(&e, 409) => {}
            Err(source) => {
                return Err(Error::Api {
                    action: "creating volume",
                    object: name,
                    source,
                });
            }
        }
        self.events.record(
            claim,
            EventType::Normal,
            "ProvisioningSucceeded",
            format!("Successfully provisioned volume {name}"),
        );
        tracing::info!(%object, volume = %name, "provisioned");
        Ok(())
    }

    /// Whether a volume is one of ours on this node whose claim is gone and whose
    /// class asked for its deletion.
    fn reclaims(&self, pv: &PersistentVolume) -> bool {
        let spec = pv.spec.as_ref();
        let here = spec
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .is_some_and(|r| {
                r.node_selector_terms.iter().any(|t| {
                    t.match_expressions.iter().flatten().any(|e| {
                        e.key == local::TOPOLOGY_KEY
                            && e.values.as_ref().is_some_and(|v| v.contains(&self.node))
                    })
                })
            });
        here && pv.metadata.deletion_timestamp.is_none()
            && annotation(&pv.metadata, PROVISIONED_BY) == Some(self.driver)
            && pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
            && spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete")
    }

    async fn delete(&self, pv: &PersistentVolume) -> Result<(), Error> {
        let name = pv.name_any();
        let handle = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.clone())
            .unwrap_or_default();
        let request = DeleteVolumeRequest {
            volume_id: handle,
            ..Default::default()
        };
        if let Err(status) = self.driver().await?.controller.delete_volume(request).await {
            self.events.record(
                pv,
                EventType::Warning,
                "VolumeFailedDelete",
                status.message().to_string(),
            );
            return Err(Error::Csi {
                call: "DeleteVolume",
                object: format!("volume {name}"),
                status,
            });
        }
        match Api::<PersistentVolume>::all(self.client.clone())
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => {
                tracing::info!(volume = %name, "deleted");
                Ok(())
            }
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(source) => Err(Error::Api {
                action: "deleting volume",
                object: name,
                source,
            }),
        }
    }
}

impl Reconciler for Provisioner {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        if let Some(name) = key.strip_prefix("pv:") {
            if let Some(pv) = self.volumes.get(None, name)
                && self.reclaims(&pv)
            {
                self.delete(&pv).await?;
            }
        } else if let Some((ns, name)) = key.strip_prefix("pvc:").and_then(|k| k.split_once('/'))
            && let Some(claim) = self.claims.get(Some(ns), name)
            && self.wants(&claim)
        {
            self.provision(&claim).await?;
        }
        Ok(None)
    }
}

/// A class's parameters, as CSI calls take them.
pub(crate) fn class_parameters(class: &StorageClass) -> std::collections::HashMap<String, String> {
    class
        .parameters
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

/// The CSIDriver object of the built-in driver, and its default StorageClass.
async fn register(client: &Client) -> Result<(), Error> {
    let apply = PatchParams::apply(MANAGER).force();
    let failed = |action, object: &str| {
        let object = object.to_string();
        move |source| Error::Api {
            action,
            object,
            source,
        }
    };
    // Pod information on mount tells the driver which publications are inline volumes;
    // fsGroupPolicy File: a directory's ownership can always be changed.
    let driver = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": local::NAME},
        "spec": {"attachRequired": false, "podInfoOnMount": true, "fsGroupPolicy": "File",
            "storageCapacity": true,
            "volumeLifecycleModes": ["Persistent", "Ephemeral"]},
    });
    let drivers = Api::<k8s_openapi::api::storage::v1::CSIDriver>::all(client.clone());
    match drivers
        .patch(local::NAME, &apply, &Patch::Apply(&driver))
        .await
    {
        Ok(_) => {}
        // An older krust's object differs in immutable fields: made again, as users
        // replace a driver's CSIDriver when they upgrade it.
        Err(e) if is_status(&e, 422) => {
            drivers
                .delete(local::NAME, &DeleteParams::default())
                .await
                .map_err(failed("replacing CSI driver", local::NAME))?;
            drivers
                .patch(local::NAME, &apply, &Patch::Apply(&driver))
                .await
                .map_err(failed("registering CSI driver", local::NAME))?;
        }
        Err(source) => return Err(failed("registering CSI driver", local::NAME)(source)),
    }
    // The class's fields are immutable: it is created once, and a user's own class of
    // the same name is left alone.
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(LOCAL_CLASS.into()),
            annotations: Some(BTreeMap::from([(
                "storageclass.kubernetes.io/is-default-class".to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        provisioner: local::NAME.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..Default::default()
    };
    match Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
    {
        Ok(_) => {}
        Err(e) if is_status(&e, 409) => {}
        Err(source) => return Err(failed("creating StorageClass", LOCAL_CLASS)(source)),
    }
    Ok(())
}
