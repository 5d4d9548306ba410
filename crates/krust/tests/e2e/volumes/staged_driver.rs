//! A third-party CSI driver for the tests, `staged.csi.example.com`, in the test process:
//! it stages (a bind mount of `<root>/<volume>` on the staging path) and publishes from
//! the staged path, as block-device drivers do, records every Node call, and fails to
//! stage the volume `broken`. Like a block driver it needs attaching: it stages only
//! with the publish context its attacher returned (`device`, which the test, as the
//! external attacher, writes into the VolumeAttachment). It registers through the
//! kubelet's plugin registry as node-driver-registrar would.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use krust_csi::mount;
use krust_csi::registration::Registrar;
use krust_csi::v1::identity_server::{Identity, IdentityServer};
use krust_csi::v1::node_server::{Node, NodeServer};
use krust_csi::v1::*;
use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

pub const NAME: &str = "staged.csi.example.com";
/// The volume limit the driver reports (CSINode's allocatable count).
pub const MAX_VOLUMES: i64 = 7;
/// The device its attacher reports.
pub const DEVICE: &str = "/dev/staged0";

#[derive(Clone)]
pub struct StagedDriver {
    pub root: PathBuf,
    pub calls: Arc<Mutex<Vec<String>>>,
}

impl StagedDriver {
    fn record(&self, call: &str, volume: &str) {
        self.calls.lock().unwrap().push(format!("{call} {volume}"));
    }

    /// Serves the driver on `socket` and its registration socket in `registry` until
    /// the runtime drops the task.
    pub async fn serve(self, socket: PathBuf, registry: &Path) {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let listener = UnixListener::bind(&socket).unwrap();
        let incoming = futures::stream::unfold(listener, |l| async move {
            Some((l.accept().await.map(|(s, _)| s), l))
        });
        let registrar = Registrar {
            driver: NAME.into(),
            endpoint: socket,
        };
        let registration = krust_csi::registration::socket_path(registry, NAME);
        let serving = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(self.clone()))
            .add_service(NodeServer::new(self))
            .serve_with_incoming(incoming);
        let (served, registered) = futures::join!(serving, registrar.serve(&registration));
        served.unwrap();
        registered.unwrap();
    }
}

fn internal(e: std::io::Error) -> Status {
    Status::internal(e.to_string())
}

#[tonic::async_trait]
impl Identity for StagedDriver {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: NAME.into(),
            vendor_version: "0.0.1".into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for StagedDriver {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        self.record("stage", &req.volume_id);
        if req.publish_context.get("device").map(String::as_str) != Some(DEVICE) {
            return Err(Status::failed_precondition("the volume is not attached"));
        }
        if req.volume_id == "broken" {
            return Err(Status::internal("disk on fire"));
        }
        let source = self.root.join(&req.volume_id);
        std::fs::create_dir_all(&source).map_err(internal)?;
        mount::bind(&source, Path::new(&req.staging_target_path), false).map_err(internal)?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        self.record("unstage", &req.volume_id);
        mount::unmount(Path::new(&req.staging_target_path)).map_err(internal)?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        self.record("publish", &req.volume_id);
        if req.staging_target_path.is_empty() {
            return Err(Status::failed_precondition("the volume was not staged"));
        }
        let target = Path::new(&req.target_path);
        std::fs::create_dir_all(target).map_err(internal)?;
        mount::bind(Path::new(&req.staging_target_path), target, req.readonly).map_err(internal)?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        self.record("unpublish", &req.volume_id);
        mount::unmount(Path::new(&req.target_path)).map_err(internal)?;
        let _ = std::fs::remove_dir(&req.target_path);
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::{Rpc, Type, rpc};
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc {
                    r#type: rpc::Type::StageUnstageVolume as i32,
                })),
            }],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: "staged-node-1".into(),
            max_volumes_per_node: MAX_VOLUMES,
            accessible_topology: None,
        }))
    }
}
