//! krust's storage side, through the Container Storage Interface (CSI v1):
//! - [`v1`]: the CSI services' messages, clients and servers (the subset in
//!   `proto/csi.proto`, wire-compatible with every CSI driver);
//! - [`Driver`]: the clients of one driver's unix socket, found as the kubelet finds
//!   registered drivers (`<plugins dir>/<driver name>/csi.sock`);
//! - [`local`]: krust's built-in driver, one directory per volume on the node;
//! - [`provisioner`]: volumes for claims, through a node's driver (upstream's
//!   external-provisioner, one per node);
//! - [`mount`]: bind mounts, as drivers and the kubelet make them.

pub mod local;
pub mod mount;
pub mod provisioner;

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// The generated CSI v1 types, clients and servers.
#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

use v1::controller_client::ControllerClient;
use v1::identity_client::IdentityClient;
use v1::node_client::NodeClient;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to CSI driver socket {socket}: {source}")]
    Connect {
        socket: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("serving CSI on {socket}: {source}")]
    Serve {
        socket: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where the socket of driver `name` is under `plugins_dir`.
pub fn socket_path(plugins_dir: &Path, name: &str) -> PathBuf {
    plugins_dir.join(name).join("csi.sock")
}

/// The clients of one CSI driver; cheap to clone (they share the connection).
#[derive(Clone, Debug)]
pub struct Driver {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
}

impl Driver {
    /// Connects to the driver listening on the unix socket `socket`.
    pub async fn connect(socket: &Path) -> Result<Driver, Error> {
        let dial = socket.to_path_buf();
        let channel =
            Endpoint::try_from("http://[::]:0")
                .expect("static URI")
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = dial.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .map_err(|source| Error::Connect {
                    socket: socket.display().to_string(),
                    source,
                })?;
        Ok(Driver {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
        })
    }
}
