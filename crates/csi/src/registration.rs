//! Plugin registration, both sides of upstream's `pluginregistration/v1`:
//! - [`Registrar`]: what node-driver-registrar does for a driver — answers the
//!   kubelet's GetInfo on `<plugins_registry>/<driver>-reg.sock` with the driver's name
//!   and CSI socket, and logs what the kubelet made of it;
//! - [`info`] and [`notify`]: the kubelet's calls on such a socket.

use std::path::{Path, PathBuf};

use tonic::{Request, Response, Status};

use crate::Error;

/// The generated pluginregistration types, clients and servers.
#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("pluginregistration");
}

use v1::registration_client::RegistrationClient;
use v1::registration_server::{Registration, RegistrationServer};
use v1::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};

/// The plugin type of CSI drivers.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// The CSI versions krust's kubelet speaks (upstream's kubelet accepts 1.x).
pub const CSI_VERSIONS: &[&str] = &["1.0.0"];

/// Where a driver's registration socket goes in the kubelet's registry directory.
pub fn socket_path(registry_dir: &Path, driver: &str) -> PathBuf {
    registry_dir.join(format!("{driver}-reg.sock"))
}

/// Announces one CSI driver to the kubelet.
#[derive(Clone, Debug)]
pub struct Registrar {
    pub driver: String,
    /// The driver's CSI socket.
    pub endpoint: PathBuf,
}

impl Registrar {
    /// Serves the registration socket `socket` (replacing a stale one) until dropped.
    pub async fn serve(self, socket: &Path) -> Result<(), Error> {
        let failed = |source| Error::Serve {
            socket: socket.display().to_string(),
            source,
        };
        let incoming = crate::listen(socket).await.map_err(failed)?;
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(self))
            .serve_with_incoming(incoming)
            .await
            .map_err(|e| failed(std::io::Error::other(e)))
    }
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: CSI_PLUGIN.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: CSI_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = self.driver, "registered with the kubelet");
        } else {
            tracing::error!(
                driver = self.driver,
                error = status.error,
                "the kubelet refused the driver"
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// GetInfo on a registration socket.
pub async fn info(socket: &Path) -> Result<PluginInfo, String> {
    let channel = crate::unix_channel(socket)
        .await
        .map_err(|e| e.to_string())?;
    RegistrationClient::new(channel)
        .get_info(InfoRequest {})
        .await
        .map(Response::into_inner)
        .map_err(|s| format!("GetInfo: {}", s.message()))
}

/// Tells a plugin whether the kubelet took it (`error`: why not).
pub async fn notify(socket: &Path, error: Option<String>) -> Result<(), String> {
    let channel = crate::unix_channel(socket)
        .await
        .map_err(|e| e.to_string())?;
    RegistrationClient::new(channel)
        .notify_registration_status(RegistrationStatus {
            plugin_registered: error.is_none(),
            error: error.unwrap_or_default(),
        })
        .await
        .map(|_| ())
        .map_err(|s| format!("NotifyRegistrationStatus: {}", s.message()))
}
