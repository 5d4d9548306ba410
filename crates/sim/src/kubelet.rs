//! The simulated nodes' kubelet endpoint, so that the apiserver reads simulated nodes'
//! resource metrics as it reads real kubelets'. One HTTPS listener serves the whole
//! fleet on the port every simulated Node advertises (`status.daemonEndpoints`); each
//! node's address is a loopback address of its own (see [`crate::nodes::node_ip`]), so
//! a connection's destination says which node it asks. It answers
//! `/metrics/resource` from [`crate::usage`] and 404 to anything else.
//!
//! The serving certificate names every node's address. The simulator requests it from
//! the `kubernetes.io/kubelet-serving` signer and approves the request itself, as the
//! administrator it runs as: the controllers approve a node's own request only. Clients
//! must present a certificate from the cluster CA, as a kubelet requires.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use krust_api::resource_metrics::{now_millis, render};
use krust_client::csr;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::Config;
use crate::nodes::{Fleet, node_ip};
use crate::usage::Usage;

/// How long the serving certificate may take to be signed.
const ISSUE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a client may take to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("requesting the serving certificate: {0}")]
    Request(#[from] csr::Error),
    #[error("approving CertificateSigningRequest {name}: {source}")]
    Approve {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the TLS configuration: {0}")]
    Tls(String),
}

/// Listens on every address (the nodes' loopback ones among them) at `port`.
pub async fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)).await
}

/// Obtains the serving certificate, then serves the fleet's nodes for ever.
pub async fn serve(
    client: Client,
    config: Arc<Config>,
    listener: TcpListener,
    fleet: Arc<Fleet>,
    usage: Arc<Usage>,
) -> Result<(), EndpointError> {
    let issued = serving_certificate(&client, &config).await?;
    let tls = acceptor(&issued, config.client_ca.as_deref())?;
    tracing::info!(
        port = config.kubelet_port,
        "simulated kubelets serve /metrics/resource"
    );
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(%err, "accepting a simulated kubelet connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Only the nodes' own addresses are served.
        let Some(node) = tcp.local_addr().ok().and_then(|a| fleet.node_at(a.ip())) else {
            continue;
        };
        let (tls, usage) = (tls.clone(), usage.clone());
        tokio::spawn(async move {
            let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await
            else {
                return;
            };
            let answer = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = answer(&req, &node, &usage);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), answer)
                .await;
        });
    }
}

fn answer(req: &Request<Incoming>, node: &str, usage: &Usage) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        response
    };
    if req.method() != Method::GET || req.uri().path() != "/metrics/resource" {
        return text(StatusCode::NOT_FOUND, "404 page not found\n".into());
    }
    let (node, containers) = usage.sample(node, now_millis());
    text(StatusCode::OK, render(&node, &containers))
}

/// A certificate for every node address, requested and approved.
async fn serving_certificate(
    client: &Client,
    config: &Config,
) -> Result<csr::Issued, EndpointError> {
    let names: Vec<String> = (0..config.nodes).map(|i| node_ip(i).to_string()).collect();
    let common_name = format!("system:node:{}", config.name_prefix.trim_end_matches('-'));
    let request = csr::Request {
        common_name: &common_name,
        organization: "system:nodes",
        names: &names,
        signer: "kubernetes.io/kubelet-serving",
        usages: &["digital signature", "server auth"],
        generate_name: "csr-sim-",
    };
    let pending = csr::create(client, &request).await?;
    let approval = k8s_openapi::serde_json::json!({"status": {"conditions": [{
        "type": "Approved", "status": "True", "reason": "SimulatedNodes",
        "message": "krust sim approved the serving certificate of its simulated nodes",
    }]}});
    Api::<CertificateSigningRequest>::all(client.clone())
        .patch_approval(
            &pending.name,
            &PatchParams::default(),
            &Patch::Merge(&approval),
        )
        .await
        .map_err(|source| EndpointError::Approve {
            name: pending.name.clone(),
            source,
        })?;
    Ok(pending.issued(client, ISSUE_TIMEOUT).await?)
}

fn acceptor(issued: &csr::Issued, client_ca: Option<&str>) -> Result<TlsAcceptor, EndpointError> {
    let fail = |e: &dyn std::fmt::Display| EndpointError::Tls(e.to_string());
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(issued.cert.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| fail(&e))?;
    let key = PrivateKeyDer::from_pem_slice(issued.key.as_bytes()).map_err(|e| fail(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(&e))?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots
                    .add(cert.map_err(|e| fail(&e))?)
                    .map_err(|e| fail(&e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| fail(&e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder.with_single_cert(chain, key).map_err(|e| fail(&e))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(tls)))
}
