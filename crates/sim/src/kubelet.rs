//! The simulated nodes' kubelet endpoint, so that the apiserver reads simulated nodes'
//! resource metrics as it reads real kubelets'. One HTTPS listener serves the whole
//! fleet on the port every simulated Node advertises (`status.daemonEndpoints`); each
//! node's address is a loopback address of its own (see [`crate::nodes::node_ip`]), so
//! a connection's destination says which node it asks. It answers
//! `/metrics/resource` from [`crate::usage`] and 404 to anything else.
//!
//! The serving certificates name the nodes' addresses, 4,096 to a certificate. The
//! simulator requests them from the `kubernetes.io/kubelet-serving` signer and approves
//! the requests itself, as the administrator it runs as (the controllers approve a
//! node's own request only), and asks again until they are issued; they are not renewed
//! (the signer's default is a year). Clients must present a certificate from the
//! cluster CA, as a kubelet requires.

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
/// How many node addresses one serving certificate names: a TLS handshake message may
/// not exceed 64 KiB, which one certificate for every node passes at ~10,000 nodes.
const NODES_PER_CERTIFICATE: usize = 4096;
/// How long a client may take to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a serving certificate could not be had.
#[derive(Debug, thiserror::Error)]
enum CertificateError {
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

/// Obtains the serving certificates, then serves the fleet's nodes for ever.
pub async fn serve(
    client: Client,
    config: Arc<Config>,
    listener: TcpListener,
    fleet: Arc<Fleet>,
    usage: Arc<Usage>,
) {
    let mut acceptors = Vec::new();
    for block in 0..config.nodes.div_ceil(NODES_PER_CERTIFICATE) {
        acceptors.push(acceptor_for(&client, &config, block).await);
    }
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
        let Some((index, node)) = tcp.local_addr().ok().and_then(|a| fleet.node_at(a.ip())) else {
            continue;
        };
        let Some(tls) = acceptors.get(index / NODES_PER_CERTIFICATE).cloned() else {
            continue;
        };
        let usage = usage.clone();
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

/// The TLS acceptor of the nodes of `block`, with their certificate once issued: a
/// request that fails (no signer running yet, approval refused) is made again later.
async fn acceptor_for(client: &Client, config: &Config, block: usize) -> TlsAcceptor {
    const MAX_PAUSE: Duration = Duration::from_secs(300);
    let mut pause = Duration::from_secs(2);
    loop {
        let attempt = async {
            let issued = serving_certificate(client, config, block).await?;
            acceptor(&issued, config.client_ca.as_deref())
        };
        match attempt.await {
            Ok(acceptor) => return acceptor,
            Err(err) => {
                tracing::warn!(%err, retry_in = ?pause, "no serving certificate for the simulated kubelets yet");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
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

/// A certificate for the addresses of the nodes of `block`, requested and approved.
async fn serving_certificate(
    client: &Client,
    config: &Config,
    block: usize,
) -> Result<csr::Issued, CertificateError> {
    let names = addresses(config.nodes, block);
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
        .map_err(|source| CertificateError::Approve {
            name: pending.name.clone(),
            source,
        })?;
    Ok(pending.issued(client, ISSUE_TIMEOUT).await?)
}

/// The addresses of the nodes of `block`, of `nodes` in all.
fn addresses(nodes: usize, block: usize) -> Vec<String> {
    let first = block * NODES_PER_CERTIFICATE;
    let last = (first + NODES_PER_CERTIFICATE).min(nodes);
    (first..last).map(|i| node_ip(i).to_string()).collect()
}

fn acceptor(
    issued: &csr::Issued,
    client_ca: Option<&str>,
) -> Result<TlsAcceptor, CertificateError> {
    let fail = |e: &dyn std::fmt::Display| CertificateError::Tls(e.to_string());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_certificate_names_a_block_of_node_addresses() {
        let (first, second) = (addresses(5000, 0), addresses(5000, 1));
        assert_eq!((first.len(), second.len()), (4096, 904));
        assert_eq!(first[0], "127.100.0.1");
        // Node 4096 is the first of the second block, as the listener picks it.
        assert_eq!(second[0], node_ip(4096).to_string());
        assert_eq!(second[0], "127.100.16.1");
        assert!(addresses(5000, 2).is_empty());
        assert_eq!(5000usize.div_ceil(NODES_PER_CERTIFICATE), 2);
    }
}
