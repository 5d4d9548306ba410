//! A node driver's free storage, published for the scheduler as CSIStorageCapacity
//! objects — external-provisioner's capacity tracking in its node-deployment mode: one
//! object per StorageClass of the driver, for this node's topology segment, in
//! `kube-system`, labelled as upstream labels them, owned by the Node (so that they go
//! with it). GetCapacity is asked again every minute (upstream's poll interval) and
//! whenever a class changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use krust_client::cache::Cache;
use krust_client::informer::EventHandler;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;

use crate::Driver;
use crate::local::TOPOLOGY_KEY;
use crate::provisioner::class_parameters;
use crate::v1::volume_capability::access_mode::Mode;
use crate::v1::{GetCapacityRequest, Topology};

/// Where the objects live.
pub const NAMESPACE: &str = "kube-system";
/// How often capacity is asked for again.
const POLL: Duration = Duration::from_secs(60);
/// How soon a failed publication is tried again (the driver may still be starting).
const RETRY: Duration = Duration::from_secs(2);
const DRIVER_LABEL: &str = "csi.storage.k8s.io/drivername";
const MANAGED_BY_LABEL: &str = "csi.storage.k8s.io/managed-by";

/// Publishes one node's capacity for one driver.
pub struct Publisher {
    pub client: Client,
    pub node: String,
    pub driver: &'static str,
    pub socket: std::path::PathBuf,
    pub classes: Cache<StorageClass>,
    /// Poked when a class changes.
    pub changed: Arc<Notify>,
}

/// Pokes the publisher when a StorageClass changes.
pub struct ClassChanges(pub Arc<Notify>);

impl EventHandler<StorageClass> for ClassChanges {
    fn on_apply(&self, _old: Option<&StorageClass>, _class: &Arc<StorageClass>) {
        self.0.notify_one();
    }
    fn on_delete(&self, _class: &Arc<StorageClass>) {
        self.0.notify_one();
    }
}

impl Publisher {
    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (DRIVER_LABEL.to_string(), self.driver.to_string()),
            (
                MANAGED_BY_LABEL.to_string(),
                format!("external-provisioner-{}", self.node),
            ),
        ])
    }

    /// Publishes until dropped (the classes' cache must be synced).
    pub async fn run(self) {
        loop {
            let next = match self.publish().await {
                Ok(()) => POLL,
                Err(err) => {
                    tracing::warn!(driver = self.driver, error = %err, "publishing storage capacity failed");
                    RETRY
                }
            };
            let _ = tokio::time::timeout(next, self.changed.notified()).await;
        }
    }

    async fn publish(&self) -> Result<(), String> {
        let api = Api::<CSIStorageCapacity>::namespaced(self.client.clone(), NAMESPACE);
        let selector = self
            .labels()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let existing = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| format!("listing CSIStorageCapacities: {e}"))?
            .items;
        let classes = self.classes.state_filter(|c| c.provisioner == self.driver);
        for stale in existing.iter().filter(|c| {
            !classes
                .iter()
                .any(|class| class.name_any() == c.storage_class_name)
        }) {
            api.delete(&stale.name_any(), &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting CSIStorageCapacity {}: {e}", stale.name_any()))?;
        }
        if classes.is_empty() {
            return Ok(());
        }
        let mut driver = Driver::connect(&self.socket)
            .await
            .map_err(|e| e.to_string())?;
        let node_uid = Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await
            .map_err(|e| format!("getting Node {}: {e}", self.node))?
            .metadata
            .uid
            .unwrap_or_default();
        for class in classes {
            let answer = driver
                .controller
                .get_capacity(GetCapacityRequest {
                    volume_capabilities: vec![crate::mount_capability("", Mode::SingleNodeWriter)],
                    parameters: class_parameters(&class),
                    accessible_topology: Some(Topology {
                        segments: [(TOPOLOGY_KEY.to_string(), self.node.clone())].into(),
                    }),
                })
                .await
                .map_err(|s| format!("GetCapacity: {}", s.message()))?
                .into_inner();
            let capacity = Quantity(answer.available_capacity.to_string());
            let maximum = answer.maximum_volume_size.map(|m| Quantity(m.to_string()));
            let class_name = class.name_any();
            match existing.iter().find(|c| c.storage_class_name == class_name) {
                Some(current)
                    if current.capacity.as_ref() == Some(&capacity)
                        && current.maximum_volume_size == maximum => {}
                Some(current) => {
                    let mut updated = current.clone();
                    updated.capacity = Some(capacity);
                    updated.maximum_volume_size = maximum;
                    api.replace(&current.name_any(), &PostParams::default(), &updated)
                        .await
                        .map_err(|e| format!("updating CSIStorageCapacity: {e}"))?;
                }
                None => {
                    let object = CSIStorageCapacity {
                        metadata: ObjectMeta {
                            generate_name: Some("csisc-".into()),
                            namespace: Some(NAMESPACE.into()),
                            labels: Some(self.labels()),
                            owner_references: Some(vec![OwnerReference {
                                api_version: "v1".into(),
                                kind: "Node".into(),
                                name: self.node.clone(),
                                uid: node_uid.clone(),
                                ..Default::default()
                            }]),
                            ..Default::default()
                        },
                        storage_class_name: class_name,
                        node_topology: Some(LabelSelector {
                            match_labels: Some(
                                [(TOPOLOGY_KEY.to_string(), self.node.clone())].into(),
                            ),
                            ..Default::default()
                        }),
                        capacity: Some(capacity),
                        maximum_volume_size: maximum,
                    };
                    api.create(&PostParams::default(), &object)
                        .await
                        .map_err(|e| format!("creating CSIStorageCapacity: {e}"))?;
                }
            }
        }
        Ok(())
    }
}
