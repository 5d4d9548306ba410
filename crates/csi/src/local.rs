//! krust's built-in CSI driver, `local.csi.krust.io`: node-local volumes, one directory
//! per volume under the node's storage root (k3s's local-path, through CSI). Every
//! node runs one; a volume lives on the node that created it, which its topology
//! (`topology.local.csi.krust.io/node`) says, so that its pods are scheduled there.
//!
//! - Controller: CreateVolume makes the directory (the volume ID is the requested
//!   name), DeleteVolume removes it; both are idempotent, as CSI requires. GetCapacity
//!   answers what the root's filesystem has free.
//! - Node: NodePublishVolume bind-mounts the directory on the target path (read-only if
//!   asked; a volume made by hand for a PersistentVolume is created on first use),
//!   NodeUnpublishVolume unmounts it. No staging.
//! - Ephemeral inline volumes (`csi:` in a pod): published into a directory of their
//!   own under `<root>/.ephemeral`, removed when unpublished.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tonic::{Request, Response, Status};

use crate::v1::controller_server::{Controller, ControllerServer};
use crate::v1::identity_server::{Identity, IdentityServer};
use crate::v1::node_server::{Node, NodeServer};
use crate::v1::*;
use crate::{Error, mount};

/// The driver's name (and its StorageClasses' provisioner).
pub const NAME: &str = "local.csi.krust.io";
/// The topology key naming the node a volume lives on (the node ID is the node name,
/// which is what the kubelet puts in this label).
pub const TOPOLOGY_KEY: &str = "kubernetes.io/hostname";
/// The volume context key that marks an inline (ephemeral) volume, as upstream's kubelet
/// sets it.
pub const EPHEMERAL_CONTEXT: &str = "csi.storage.k8s.io/ephemeral";
/// Where inline volumes live under the root (volume IDs may not start with a dot).
const EPHEMERAL_DIR: &str = ".ephemeral";

/// The driver of one node.
#[derive(Clone, Debug)]
pub struct LocalDriver {
    node_id: String,
    root: PathBuf,
}

impl LocalDriver {
    /// The driver of node `node_id`, keeping volumes under `root`.
    pub fn new(node_id: impl Into<String>, root: impl Into<PathBuf>) -> Self {
        LocalDriver {
            node_id: node_id.into(),
            root: root.into(),
        }
    }

    fn topology(&self) -> Topology {
        Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), self.node_id.clone())]),
        }
    }

    /// The directory of a volume; IDs that could leave the root are refused.
    fn dir(&self, volume_id: &str) -> Result<PathBuf, Status> {
        let valid = !volume_id.is_empty()
            && !volume_id.starts_with('.')
            && !volume_id.contains('/')
            && !volume_id.contains('\0');
        if !valid {
            return Err(Status::invalid_argument(format!(
                "invalid volume ID {volume_id:?}"
            )));
        }
        Ok(self.root.join(volume_id))
    }

    /// The directory of an inline volume.
    fn ephemeral_dir(&self, volume_id: &str) -> Result<PathBuf, Status> {
        let dir = self.dir(volume_id)?;
        Ok(self
            .root
            .join(EPHEMERAL_DIR)
            .join(dir.file_name().unwrap_or_default()))
    }

    /// Serves the Identity, Controller and Node services on the unix socket `socket`
    /// (replacing a stale one) until the future is dropped.
    pub async fn serve(self, socket: &Path) -> Result<(), Error> {
        let failed = |source| Error::Serve {
            socket: socket.display().to_string(),
            source,
        };
        tokio::fs::create_dir_all(&self.root)
            .await
            .map_err(failed)?;
        let incoming = crate::listen(socket).await.map_err(failed)?;
        tracing::info!(driver = NAME, socket = %socket.display(), root = %self.root.display(), "CSI driver serving");
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(self.clone()))
            .add_service(ControllerServer::new(self.clone()))
            .add_service(NodeServer::new(self))
            .serve_with_incoming(incoming)
            .await
            .map_err(|e| failed(std::io::Error::other(e)))
    }
}

fn internal(what: &str, e: std::io::Error) -> Status {
    Status::internal(format!("{what}: {e}"))
}

#[tonic::async_trait]
impl Identity for LocalDriver {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::service::Type;
        let service = |t: Type| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t as i32 },
            )),
        };
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(Type::ControllerService),
                service(Type::VolumeAccessibilityConstraints),
            ],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Controller for LocalDriver {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume capabilities missing"));
        }
        let block = req
            .volume_capabilities
            .iter()
            .any(|c| matches!(c.access_type, Some(volume_capability::AccessType::Block(_))));
        if block {
            return Err(Status::invalid_argument(
                "block volumes are not supported: this driver serves directories",
            ));
        }
        // A volume can only live here: a requirement naming only other nodes fails.
        if let Some(requirement) = &req.accessibility_requirements {
            let here = self.topology();
            if !requirement.requisite.is_empty() && !requirement.requisite.contains(&here) {
                return Err(Status::resource_exhausted(format!(
                    "node {} is not among the requisite topologies",
                    self.node_id
                )));
            }
        }
        let dir = self.dir(&req.name)?;
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| internal("creating the volume directory", e))?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(Volume {
                capacity_bytes: req.capacity_range.map_or(0, |r| r.required_bytes),
                volume_id: req.name,
                volume_context: HashMap::new(),
                accessible_topology: vec![self.topology()],
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let dir = self.dir(&request.into_inner().volume_id)?;
        match tokio::fs::remove_dir_all(&dir).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(internal("removing the volume directory", e)),
        }
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: [Type::CreateDeleteVolume, Type::GetCapacity]
                .into_iter()
                .map(|t| ControllerServiceCapability {
                    r#type: Some(controller_service_capability::Type::Rpc(
                        controller_service_capability::Rpc { r#type: t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let req = request.into_inner();
        // Only this node's segment has capacity here.
        let elsewhere = req
            .accessible_topology
            .is_some_and(|t| t.segments.get(TOPOLOGY_KEY) != Some(&self.node_id));
        let available = if elsewhere {
            0
        } else {
            tokio::fs::create_dir_all(&self.root)
                .await
                .map_err(|e| internal("creating the storage root", e))?;
            mount::available_bytes(&self.root)
                .map_err(|e| internal("measuring the storage root", e))?
        };
        Ok(Response::new(GetCapacityResponse {
            available_capacity: i64::try_from(available).unwrap_or(i64::MAX),
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl Node for LocalDriver {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target path missing"));
        }
        let ephemeral = req
            .volume_context
            .get(EPHEMERAL_CONTEXT)
            .is_some_and(|v| v == "true");
        let source = if ephemeral {
            self.ephemeral_dir(&req.volume_id)?
        } else {
            self.dir(&req.volume_id)?
        };
        let target = PathBuf::from(&req.target_path);
        for dir in [&source, &target] {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| internal("creating a directory", e))?;
        }
        mount::bind(&source, &target, req.readonly)
            .map_err(|e| internal("bind-mounting the volume", e))?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target path missing"));
        }
        let target = PathBuf::from(&req.target_path);
        mount::unmount(&target).map_err(|e| internal("unmounting the volume", e))?;
        match tokio::fs::remove_dir(&target).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(internal("removing the target path", e)),
        }
        // An inline volume lives only as long as its pod's publication.
        match tokio::fs::remove_dir_all(self.ephemeral_dir(&req.volume_id)?).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(internal("removing the inline volume", e)),
        }
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_stage_volume(
        &self,
        _: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented("this driver does not stage volumes"))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("this driver does not stage volumes"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(self.topology()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Driver;

    #[tokio::test]
    async fn volumes_are_created_published_unpublished_and_deleted_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("plugins").join(NAME).join("csi.sock");
        let root = dir.path().join("storage");
        let server = LocalDriver::new("node-a", &root);
        let serving = tokio::spawn({
            let socket = socket.clone();
            async move { server.serve(&socket).await }
        });
        let mut driver = loop {
            match Driver::connect(&socket).await {
                Ok(d) => break d,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        let info = driver
            .identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, NAME);
        let node = driver
            .node
            .node_get_info(NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(node.node_id, "node-a");

        let mount_capability = VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume::default(),
            )),
            access_mode: None,
        };
        let created = driver
            .controller
            .create_volume(CreateVolumeRequest {
                name: "pvc-1".into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![mount_capability.clone()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(created.volume_id, "pvc-1");
        assert_eq!(
            created.accessible_topology[0].segments[TOPOLOGY_KEY],
            "node-a"
        );
        assert!(root.join("pvc-1").is_dir());

        // Another node's requirement, an escaping ID: refused.
        let elsewhere = driver
            .controller
            .create_volume(CreateVolumeRequest {
                name: "pvc-2".into(),
                volume_capabilities: vec![mount_capability.clone()],
                accessibility_requirements: Some(TopologyRequirement {
                    requisite: vec![Topology {
                        segments: HashMap::from([(TOPOLOGY_KEY.into(), "node-b".into())]),
                    }],
                    preferred: vec![],
                }),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(elsewhere.code(), tonic::Code::ResourceExhausted);
        let escape = driver
            .controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: "..".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(escape.code(), tonic::Code::InvalidArgument);

        // Published: the target shows the volume's files; unpublished: it is gone.
        std::fs::write(root.join("pvc-1").join("file"), "data").unwrap();
        let target = dir.path().join("pod").join("mount");
        let publish = NodePublishVolumeRequest {
            volume_id: "pvc-1".into(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_capability),
            ..Default::default()
        };
        driver
            .node
            .node_publish_volume(publish.clone())
            .await
            .unwrap();
        driver.node.node_publish_volume(publish).await.unwrap();
        assert!(mount::is_mounted(&target));
        assert_eq!(
            std::fs::read_to_string(target.join("file")).unwrap(),
            "data"
        );
        let unpublish = NodeUnpublishVolumeRequest {
            volume_id: "pvc-1".into(),
            target_path: target.display().to_string(),
        };
        driver
            .node
            .node_unpublish_volume(unpublish.clone())
            .await
            .unwrap();
        driver.node.node_unpublish_volume(unpublish).await.unwrap();
        assert!(!mount::is_mounted(&target) && !target.exists());

        // Deleted twice: the second finds nothing and succeeds.
        for _ in 0..2 {
            driver
                .controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: "pvc-1".into(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        assert!(!root.join("pvc-1").exists());
        serving.abort();
    }
}
