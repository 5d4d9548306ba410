//! The kubelet's HTTPS API (upstream's `:10250` server): container logs, exec, attach
//! and port-forward, which the apiserver proxies `pods/log`, `pods/exec`,
//! `pods/attach` and `pods/portforward` to, and `/metrics/resource`, the CPU and memory
//! usage the apiserver's metrics API scrapes. Callers must present a client certificate
//! from the cluster CA that names the apiserver's kubelet client or a `system:masters`
//! member (upstream authorizes the same callers through its webhook).

mod logs;
mod resource_metrics;
mod streams;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use krust_api::status::ApiError;
use krust_client::certificate::RotatingCertificate;
use krust_cri::Runtime;
use krust_cri::api::{Container, ContainerFilter, ContainerState, ListContainersRequest};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::pods::spec::{CONTAINER_NAME, POD_NAME, POD_NAMESPACE};
use crate::{Config, Error};
use streams::RemoteCommand::{Attach, Exec};

pub type Body = BoxBody<Bytes, std::io::Error>;

/// The bound listener and its TLS settings; [`Server::serve`] answers requests.
pub struct Server {
    listener: TcpListener,
    acceptor: TlsAcceptor,
}

impl Server {
    /// Binds `0.0.0.0:<kubelet_port>` (port 0 picks a free one; the Node reports the
    /// real port in `status.daemonEndpoints`).
    pub async fn bind(config: &Config, serving: &RotatingCertificate) -> Result<Server, Error> {
        let acceptor = tls::acceptor(config, serving)?;
        let listener = TcpListener::bind(("0.0.0.0", config.kubelet_port))
            .await
            .map_err(|e| Error::Server(format!("binding port {}: {e}", config.kubelet_port)))?;
        Ok(Server { listener, acceptor })
    }

    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Serves until dropped.
    pub async fn serve(self, runtime: Runtime) {
        let runtime = Arc::new(runtime);
        loop {
            let (tcp, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(%err, "kubelet server accept failed");
                    continue;
                }
            };
            let (acceptor, runtime) = (self.acceptor.clone(), runtime.clone());
            tokio::spawn(async move { connection(acceptor, runtime, tcp, peer).await });
        }
    }
}

async fn connection(
    acceptor: TlsAcceptor,
    runtime: Arc<Runtime>,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    let tls = match acceptor.accept(tcp).await {
        Ok(tls) => tls,
        Err(err) => {
            tracing::debug!(%peer, %err, "kubelet server TLS handshake failed");
            return;
        }
    };
    let allowed = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .is_some_and(|cert| tls::may_call(cert));
    let service = hyper::service::service_fn(move |req| {
        let runtime = runtime.clone();
        async move {
            let resp = if allowed {
                route(&runtime, req).await.unwrap_or_else(|e| error(&e))
            } else {
                error(&ApiError::forbidden(
                    "only the apiserver may call the kubelet",
                ))
            };
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(err) = builder
        .serve_connection_with_upgrades(TokioIo::new(tls), service)
        .await
    {
        tracing::debug!(%peer, %err, "kubelet server connection ended with an error");
    }
}

async fn route(runtime: &Runtime, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    if method != Method::GET && method != Method::POST {
        return Err(ApiError::method_not_allowed(method.as_str(), &path));
    }
    match parts.as_slice() {
        ["healthz"] => Ok(text(StatusCode::OK, "ok")),
        ["metrics"] => Ok(prometheus_text(crate::metrics::render())),
        ["metrics", "resource"] => Ok(prometheus_text(resource_metrics::serve(runtime).await?)),
        ["containerLogs", ns, pod, container] => {
            logs::serve(runtime, ns, pod, container, req.uri().query()).await
        }
        ["exec", ns, pod, container] => {
            streams::remote_command(Exec, runtime, (ns, pod, container), req).await
        }
        ["attach", ns, pod, container] => {
            streams::remote_command(Attach, runtime, (ns, pod, container), req).await
        }
        ["portForward", ns, pod] => streams::port_forward(runtime, ns, pod, req).await,
        _ => Err(ApiError::path_not_found()),
    }
}

/// A `/metrics` answer.
fn prometheus_text(body: String) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(krust_client::metrics::TEXT_FORMAT),
    );
    resp
}

/// The containers of one pod container name, newest attempt first.
async fn containers(
    runtime: &Runtime,
    ns: &str,
    pod: &str,
    container: &str,
) -> Result<Vec<Container>, ApiError> {
    let filter = ContainerFilter {
        label_selector: [
            (POD_NAMESPACE, ns),
            (POD_NAME, pod),
            (CONTAINER_NAME, container),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..ContainerFilter::default()
    };
    let mut found = runtime
        .runtime
        .clone()
        .list_containers(ListContainersRequest {
            filter: Some(filter),
        })
        .await
        .map_err(|e| ApiError::internal(format!("listing containers: {}", e.message())))?
        .into_inner()
        .containers;
    found.sort_by_key(|c| std::cmp::Reverse(c.metadata.as_ref().map_or(0, |m| m.attempt)));
    Ok(found)
}

/// The running container of `container` in the pod, for exec and attach.
async fn running(
    runtime: &Runtime,
    ns: &str,
    pod: &str,
    container: &str,
) -> Result<Container, ApiError> {
    containers(runtime, ns, pod, container)
        .await?
        .into_iter()
        .find(|c| c.state() == ContainerState::ContainerRunning)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "container {container} is not running in pod {ns}/{pod}"
            ))
        })
}

fn text(code: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from_static(body.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = code;
    resp
}

/// A metav1.Status answer, which the apiserver passes on to the client as is.
fn error(err: &ApiError) -> Response<Body> {
    let body = serde_json::to_vec(&err.to_status()).unwrap_or_default();
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() =
        StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}
