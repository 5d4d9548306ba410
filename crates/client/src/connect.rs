//! The API client every krust component uses: kube-rs's request stack over an HTTP
//! client that speaks HTTP/2 when the apiserver offers it, as client-go does. kube-rs's
//! own client is HTTP/1.1 only, so each concurrent request holds a TLS connection of its
//! own and a burst of creates leaves hundreds of idle connections (and their buffers)
//! in the pool; over HTTP/2 every request and watch shares one connection.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::{BoxError, ServiceBuilder};

use crate::certificate::{RotatingCertificate, RotatingConnector};

/// client-go's HTTP/2 health check: a ping after 30 s without frames, and the
/// connection is dropped (requests fail over to a new one) if no answer comes in 15 s.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client for the apiserver that `config` describes.
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    client_with_certificate(config, None)
}

/// A client for the apiserver that `config` describes that presents `certificate` (when
/// given, instead of the config's) and dials again whenever it is replaced.
pub fn client_with_certificate(
    config: kube::Config,
    certificate: Option<RotatingCertificate>,
) -> Result<kube::Client, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    // As Go's dialer (client-go) does: without it, Nagle holds a request's second
    // small write (HTTP/2 DATA after HEADERS) until the server's delayed ACK, ~40 ms.
    http.set_nodelay(true);
    let mut tls_config = config.rustls_client_config()?;
    if let Some(certificate) = &certificate {
        tls_config.client_auth_cert_resolver = Arc::new(certificate.clone());
    }
    let tls = HttpsConnectorBuilder::new()
        .with_tls_config(tls_config)
        .https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => tls.with_server_name_resolver(FixedServerNameResolver::new(
            name.clone().try_into().map_err(|_| {
                kube::Error::Service(format!("invalid tls-server-name {name:?}").into())
            })?,
        )),
        None => tls,
    };
    let connector = tls.enable_all_versions().wrap_connector(RotatingConnector {
        inner: http,
        certificate,
    });
    let http_client: HttpClient<_, Body> = HttpClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_adaptive_window(true)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http_client);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// Why a kubeconfig gave no client.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("parsing the kubeconfig: {0}")]
    Parse(#[source] kube::config::KubeconfigError),
    #[error("loading the kubeconfig: {0}")]
    Load(#[source] kube::config::KubeconfigError),
    #[error("building the API client: {0}")]
    Client(#[source] kube::Error),
    #[error("decoding certificate-authority-data: {0}")]
    CaData(String),
    #[error("reading {path}: {source}")]
    CaFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A client for the apiserver of `kubeconfig` (YAML), and the cluster CA bundle it
/// trusts (PEM), which the controllers publish as `kube-root-ca.crt`.
pub async fn from_kubeconfig(
    kubeconfig: &str,
) -> Result<(kube::Client, Option<String>), KubeconfigError> {
    from_kubeconfig_with_certificate(kubeconfig, None).await
}

/// As [`from_kubeconfig`], presenting `certificate` instead of the kubeconfig's own.
pub async fn from_kubeconfig_with_certificate(
    kubeconfig: &str,
    certificate: Option<RotatingCertificate>,
) -> Result<(kube::Client, Option<String>), KubeconfigError> {
    let kubeconfig = Kubeconfig::from_yaml(kubeconfig).map_err(KubeconfigError::Parse)?;
    let ca = root_ca(&kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(KubeconfigError::Load)?;
    let client = client_with_certificate(config, certificate).map_err(KubeconfigError::Client)?;
    Ok((client, ca))
}

/// The CA bundle (PEM) the kubeconfig trusts for its current context's cluster, verbatim
/// (inline `certificate-authority-data` or the `certificate-authority` file), as
/// upstream's controller-manager publishes its `--root-ca-file`.
fn root_ca(kubeconfig: &Kubeconfig) -> Result<Option<String>, KubeconfigError> {
    let cluster = kubeconfig
        .current_context
        .as_ref()
        .and_then(|current| kubeconfig.contexts.iter().find(|c| &c.name == current))
        .and_then(|c| c.context.as_ref())
        .and_then(|c| kubeconfig.clusters.iter().find(|n| n.name == c.cluster))
        .and_then(|n| n.cluster.as_ref());
    let Some(cluster) = cluster else {
        return Ok(None);
    };
    if let Some(data) = &cluster.certificate_authority_data {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| KubeconfigError::CaData(e.to_string()))?;
        let pem =
            String::from_utf8(bytes).map_err(|_| KubeconfigError::CaData("not PEM text".into()))?;
        return Ok(Some(pem));
    }
    match &cluster.certificate_authority {
        Some(path) => {
            std::fs::read_to_string(path)
                .map(Some)
                .map_err(|source| KubeconfigError::CaFile {
                    path: path.clone(),
                    source,
                })
        }
        None => Ok(None),
    }
}
