//! The plugin watcher: registers the CSI drivers whose registration sockets appear in
//! `<agent>/plugins_registry` and deregisters those whose sockets go, as upstream's
//! kubelet does. Registering a driver: GetInfo on its registration socket (type
//! `CSIPlugin`, a 1.x CSI version), NodeGetInfo on its CSI socket, the driver added to
//! the node's CSINode (node ID, topology keys, volume limit) and to the Node's
//! `csi.volume.kubernetes.io/nodeid` annotation, and the driver told the outcome.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use krust_csi::registration::{CSI_PLUGIN, info, notify};
use krust_csi::v1::NodeGetInfoRequest;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

use super::{Drivers, Registered};

/// How often the registry directory is read (upstream watches it with inotify; a
/// driver's start takes seconds, so a poll costs nothing a user notices).
const POLL: Duration = Duration::from_millis(500);
/// How long before a socket that failed to register is tried again.
const RETRY: Duration = Duration::from_secs(2);
/// How long a driver may take to answer one call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The Node annotation listing each driver's node ID (upstream's).
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

pub struct Watcher {
    pub client: Client,
    pub node: String,
    pub node_uid: Option<String>,
    pub drivers: Drivers,
    pub dir: PathBuf,
}

/// What the watcher knows of one registration socket.
enum Seen {
    Registered(String),
    Failed(Instant),
}

impl Watcher {
    pub async fn run(self) {
        if let Err(err) = tokio::fs::create_dir_all(&self.dir).await {
            tracing::error!(dir = %self.dir.display(), error = %err, "no plugin registry directory");
            return;
        }
        let mut seen: HashMap<PathBuf, Seen> = HashMap::new();
        loop {
            let sockets = sockets(&self.dir);
            for socket in &sockets {
                let due = match seen.get(socket) {
                    None => true,
                    Some(Seen::Failed(at)) => at.elapsed() >= RETRY,
                    Some(Seen::Registered(_)) => false,
                };
                if due {
                    let outcome = match self.register(socket).await {
                        Ok(name) => Seen::Registered(name),
                        Err(err) => {
                            tracing::warn!(socket = %socket.display(), error = %err, "registering a plugin failed");
                            Seen::Failed(Instant::now())
                        }
                    };
                    seen.insert(socket.clone(), outcome);
                }
            }
            let gone: Vec<PathBuf> = seen
                .keys()
                .filter(|s| !sockets.contains(s))
                .cloned()
                .collect();
            for socket in gone {
                if let Some(Seen::Registered(name)) = seen.remove(&socket) {
                    self.drivers.remove(&name);
                    if let Err(err) = self.deregister(&name).await {
                        tracing::warn!(driver = name, error = %err, "deregistering a CSI driver failed");
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Registers the plugin behind one registration socket; its name.
    async fn register(&self, socket: &Path) -> Result<String, String> {
        let plugin = timeout(info(socket)).await?;
        let checked = check(&plugin.r#type, &plugin.name, &plugin.supported_versions);
        let endpoint = if plugin.endpoint.is_empty() {
            socket.to_path_buf()
        } else {
            PathBuf::from(&plugin.endpoint)
        };
        let outcome = match checked {
            Ok(()) => self.add(&plugin.name, endpoint).await,
            Err(err) => Err(err),
        };
        // The plugin hears the outcome either way (a refused one may log why).
        if let Err(err) = timeout(notify(socket, outcome.clone().err())).await {
            tracing::debug!(driver = plugin.name, error = %err, "the plugin did not take the registration status");
        }
        outcome.map(|()| plugin.name)
    }

    async fn add(&self, name: &str, endpoint: PathBuf) -> Result<(), String> {
        let mut driver = timeout(async {
            krust_csi::Driver::connect(&endpoint)
                .await
                .map_err(|e| e.to_string())
        })
        .await?;
        let info = timeout(async {
            driver
                .node
                .node_get_info(NodeGetInfoRequest {})
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| format!("NodeGetInfo: {}", s.message()))
        })
        .await?;
        if info.node_id.is_empty() {
            return Err(format!("driver {name} answered an empty node ID"));
        }
        let entry = CSINodeDriver {
            name: name.to_string(),
            node_id: info.node_id.clone(),
            topology_keys: info
                .accessible_topology
                .map(|t| t.segments.into_keys().collect()),
            allocatable: (info.max_volumes_per_node > 0).then(|| VolumeNodeResources {
                count: i32::try_from(info.max_volumes_per_node).ok(),
            }),
        };
        self.drivers.insert(
            name,
            Registered {
                endpoint,
                node_id: info.node_id,
            },
        );
        let written = async {
            self.update_csi_node(|drivers| {
                drivers.retain(|d| d.name != name);
                drivers.push(entry.clone());
            })
            .await?;
            self.annotate_node().await
        };
        if let Err(err) = written.await {
            self.drivers.remove(name);
            return Err(err);
        }
        tracing::info!(driver = name, node = self.node, "CSI driver registered");
        Ok(())
    }

    async fn deregister(&self, name: &str) -> Result<(), String> {
        self.update_csi_node(|drivers| drivers.retain(|d| d.name != name))
            .await?;
        self.annotate_node().await?;
        tracing::info!(driver = name, node = self.node, "CSI driver deregistered");
        Ok(())
    }

    /// Changes the drivers of the node's CSINode (made if missing, owned by the Node so
    /// that it goes with it), retrying on conflicts.
    async fn update_csi_node(
        &self,
        change: impl Fn(&mut Vec<CSINodeDriver>),
    ) -> Result<(), String> {
        let api = Api::<CSINode>::all(self.client.clone());
        let failed = |e: kube::Error| format!("writing CSINode {}: {e}", self.node);
        for _ in 0..5 {
            let result = match api.get_opt(&self.node).await.map_err(failed)? {
                Some(mut csi_node) => {
                    change(&mut csi_node.spec.drivers);
                    api.replace(&self.node, &PostParams::default(), &csi_node)
                        .await
                }
                None => {
                    let mut csi_node = CSINode {
                        metadata: ObjectMeta {
                            name: Some(self.node.clone()),
                            owner_references: Some(vec![OwnerReference {
                                api_version: "v1".into(),
                                kind: "Node".into(),
                                name: self.node.clone(),
                                uid: self.node_uid.clone().unwrap_or_default(),
                                ..Default::default()
                            }]),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    change(&mut csi_node.spec.drivers);
                    api.create(&PostParams::default(), &csi_node).await
                }
            };
            match result {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(failed(e)),
            }
        }
        Err(format!(
            "writing CSINode {}: conflicts persisted",
            self.node
        ))
    }

    async fn annotate_node(&self) -> Result<(), String> {
        let ids = self.drivers.node_ids();
        let value = (!ids.is_empty()).then(|| json!(ids).to_string());
        let patch = json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: value}}});
        Api::<Node>::all(self.client.clone())
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| format!("annotating Node {}: {e}", self.node))
    }
}

/// Whether the kubelet takes a plugin: a CSI driver with a name, speaking CSI 1.x.
fn check(type_: &str, name: &str, versions: &[String]) -> Result<(), String> {
    if type_ != CSI_PLUGIN {
        return Err(format!("plugin type {type_:?} is not supported"));
    }
    if name.is_empty() {
        return Err("the plugin has no name".into());
    }
    let speaks_v1 = versions
        .iter()
        .any(|v| v.trim_start_matches('v').split('.').next() == Some("1"));
    if !speaks_v1 {
        return Err(format!(
            "none of CSI driver {name}'s versions {versions:?} is supported (1.x is)"
        ));
    }
    Ok(())
}

/// The registration sockets in `dir`.
fn sockets(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.path())
        .collect()
}

async fn timeout<T>(call: impl Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| format!("no answer within {CALL_TIMEOUT:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_csi_drivers_of_version_one_are_taken() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(check("CSIPlugin", "a.example.com", &v(&["1.0.0"])).is_ok());
        assert!(check("CSIPlugin", "a.example.com", &v(&["0.3.0", "v1.2.0"])).is_ok());
        assert!(check("CSIPlugin", "a.example.com", &v(&["0.3.0"])).is_err());
        assert!(check("DevicePlugin", "a.example.com", &v(&["1.0.0"])).is_err());
        assert!(check("CSIPlugin", "", &v(&["1.0.0"])).is_err());
    }
}
