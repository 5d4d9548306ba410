//! `Runtime`: the CRI v1 RuntimeService and ImageService clients on one connection to
//! a unix socket (tonic needs a URI; the connector ignores it and dials the socket).

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{VersionRequest, VersionResponse};
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};

use crate::Error;
use crate::metrics::Instrumented;

/// Clients of one CRI endpoint; cheap to clone (they share the connection).
/// The image service, as [`Runtime`] holds it.
pub type ImageClient = ImageServiceClient<Instrumented>;

#[derive(Clone, Debug)]
pub struct Runtime {
    pub runtime: RuntimeServiceClient<Instrumented>,
    pub images: ImageClient,
}

impl Runtime {
    /// Connects to the CRI socket at `socket` (a path, or `unix://` + path).
    pub async fn connect(socket: &str) -> Result<Runtime, Error> {
        let path = PathBuf::from(socket.strip_prefix("unix://").unwrap_or(socket));
        let dial = path.clone();
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
                    socket: path.display().to_string(),
                    source,
                })?;
        // Images and pod specs can be large; upstream's kubelet allows 16 MiB messages.
        const MAX: usize = 16 << 20;
        let channel = Instrumented::new(channel);
        Ok(Runtime {
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX)
                .max_encoding_message_size(MAX),
            images: ImageServiceClient::new(channel)
                .max_decoding_message_size(MAX)
                .max_encoding_message_size(MAX),
        })
    }

    /// The runtime's name and version (e.g. `containerd` `1.6.20`).
    pub async fn version(&self) -> Result<VersionResponse, Error> {
        self.runtime
            .clone()
            .version(VersionRequest {
                version: "v1".into(),
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|e| Error::Call {
                call: "Version",
                source: Box::new(e),
            })
    }
}

/// Whether a CRI runtime answers on `socket`.
pub async fn answers(socket: &Path) -> bool {
    match Runtime::connect(&socket.display().to_string()).await {
        Ok(rt) => rt.version().await.is_ok(),
        Err(_) => false,
    }
}
