//! krust's storage side, through the Container Storage Interface (CSI v1):
//! - [`v1`]: the CSI services' messages, clients and servers (the subset in
//!   `proto/csi.proto`, wire-compatible with every CSI driver);
//! - [`Driver`]: the clients of one driver's unix socket;
//! - [`registration`]: how a driver announces its socket to the kubelet (upstream's
//!   plugin-registration service, both sides);
//! - [`local`]: krust's built-in driver, one directory per volume on the node;
//! - [`provisioner`]: volumes for claims, through a node's driver (upstream's
//!   external-provisioner, one per node), and [`capacity`]: the node's free storage
//!   for the scheduler;
//! - [`mount`]: bind mounts, as drivers and the kubelet make them.

pub mod capacity;
pub mod local;
pub mod mount;
pub mod provisioner;
pub mod registration;

use std::path::{Path, PathBuf};

use futures::Stream;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
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
    #[error("connecting to socket {socket}: {source}")]
    Connect {
        socket: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("serving on {socket}: {source}")]
    Serve {
        socket: String,
        #[source]
        source: std::io::Error,
    },
}

/// The capability of a volume mounted as a filesystem (`fs_type` empty: the driver's
/// default), as the provisioner, the capacity publisher and the kubelet ask for it.
pub fn mount_capability(
    fs_type: &str,
    mode: v1::volume_capability::access_mode::Mode,
) -> v1::VolumeCapability {
    use v1::volume_capability::{AccessMode, AccessType, MountVolume};
    v1::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_string(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// Where the socket of driver `name` is under `plugins_dir` (upstream's layout:
/// `<kubelet>/plugins/<driver>/csi.sock`).
pub fn socket_path(plugins_dir: &Path, name: &str) -> PathBuf {
    plugins_dir.join(name).join("csi.sock")
}

/// Listens on the unix socket `socket` (its directory made, a stale socket replaced);
/// the connections, for a tonic server.
async fn listen(
    socket: &Path,
) -> std::io::Result<impl Stream<Item = std::io::Result<UnixStream>> + use<>> {
    if let Some(dir) = socket.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let _ = tokio::fs::remove_file(socket).await;
    let listener = UnixListener::bind(socket)?;
    Ok(futures::stream::unfold(listener, |listener| async move {
        let conn = listener.accept().await.map(|(stream, _)| stream);
        Some((conn, listener))
    }))
}

/// A gRPC channel over the unix socket `socket`.
async fn unix_channel(socket: &Path) -> Result<Channel, Error> {
    let dial = socket.to_path_buf();
    Endpoint::try_from("http://[::]:0")
        .expect("static URI")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = dial.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|source| Error::Connect {
            socket: socket.display().to_string(),
            source,
        })
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
        let channel = unix_channel(socket).await?;
        Ok(Driver {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
        })
    }
}
