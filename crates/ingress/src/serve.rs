//! The HTTP side: accepts connections, finds each request's backend in the current
//! [`Routes`], and forwards it to one of the backend's ready pods (round robin), with
//! the `X-Forwarded-*` headers a reverse proxy adds. No rule: 404; a Service without
//! ready endpoints: 503; a pod that does not answer: 502; plain HTTP for a host served
//! with TLS: 308 to HTTPS — as ingress-nginx answers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use krust_api::sync::UnpoisonedRw;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::metrics::Metrics;
use crate::routes::{Backend, Routes};
use crate::tls::Resolver;

/// The routing table in use; replaced whole when Ingresses or endpoints change.
pub type SharedRoutes = Arc<RwLock<Arc<Routes>>>;

type Body = Either<Incoming, Full<Bytes>>;

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub struct Proxy {
    routes: SharedRoutes,
    tls: Arc<Resolver>,
    /// The HTTPS port, for redirects (left out of the URL when it is 443).
    https_port: u16,
    client: Client<HttpConnector, Incoming>,
    next: AtomicUsize,
    metrics: Metrics,
}

impl Proxy {
    pub fn new(
        routes: SharedRoutes,
        tls: Arc<Resolver>,
        https_port: u16,
        metrics: Metrics,
    ) -> Arc<Proxy> {
        Arc::new(Proxy {
            routes,
            tls,
            https_port,
            client: Client::builder(TokioExecutor::new()).build_http(),
            next: AtomicUsize::new(0),
            metrics,
        })
    }
}

/// Serves `listener` until the future is dropped: plain HTTP, or HTTPS through
/// `tls` (HTTP/2 or HTTP/1.1, as the client's ALPN chooses).
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>, tls: Option<TlsAcceptor>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "ingress: accept failed");
                continue;
            }
        };
        let (proxy, tls) = (proxy.clone(), tls.clone());
        tokio::spawn(async move {
            let secure = tls.is_some();
            let service = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(proxy.handle(req, peer, secure).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let served = match tls {
                None => {
                    builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                }
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => {
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    Err(err) => {
                        tracing::debug!(%peer, error = %err, "ingress TLS handshake failed");
                        return;
                    }
                },
            };
            if let Err(err) = served {
                tracing::debug!(%peer, error = %err, "ingress connection ended");
            }
        });
    }
}

impl Proxy {
    async fn handle(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> Response<Body> {
        let method = req.method().clone();
        let routes = self.routes.read_locked().clone();
        let (backend, response, upstream) = match self.redirect(&req, secure) {
            Some(redirect) => (None, redirect, None),
            None => self.forward(&routes, req, peer, secure).await,
        };
        self.metrics.request(
            backend,
            method.as_str(),
            response.status().as_u16(),
            upstream,
        );
        response
    }

    /// A plain HTTP request for a host served with TLS goes to HTTPS: 308, as
    /// ingress-nginx answers (the method and body are kept).
    fn redirect(&self, req: &Request<Incoming>, secure: bool) -> Option<Response<Body>> {
        let host = host_of(req);
        let name = host.split(':').next().unwrap_or_default();
        if secure || !self.tls.current().redirects(name) {
            return None;
        }
        let port = match self.https_port {
            443 => String::new(),
            port => format!(":{port}"),
        };
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let location = HeaderValue::from_str(&format!("https://{name}{port}{path}")).ok()?;
        let mut response = plain(StatusCode::PERMANENT_REDIRECT, "308 Permanent Redirect");
        response.headers_mut().insert(header::LOCATION, location);
        Some(response)
    }

    /// The answer to `req`, the backend it went to and how long that took to answer.
    async fn forward<'r>(
        &self,
        routes: &'r Routes,
        mut req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> (Option<&'r Backend>, Response<Body>, Option<f64>) {
        let host = host_of(&req);
        let Some(backend) = routes.route(&host, req.uri().path()) else {
            return (
                None,
                plain(StatusCode::NOT_FOUND, "default backend - 404"),
                None,
            );
        };
        let answer = |response| (Some(backend), response, None);
        if backend.endpoints.is_empty() {
            return answer(plain(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("no ready endpoints for {}", backend.name),
            ));
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let endpoint = backend.endpoints[n % backend.endpoints.len()];
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let Ok(uri) = Uri::try_from(format!("http://{endpoint}{path}")) else {
            return answer(plain(StatusCode::BAD_REQUEST, "bad request target"));
        };
        *req.uri_mut() = uri;
        // Backends speak HTTP/1.1, whatever the client spoke.
        *req.version_mut() = Version::HTTP_11;
        let headers = req.headers_mut();
        if !headers.contains_key(header::HOST)
            && let Ok(value) = HeaderValue::from_str(&host)
        {
            headers.insert(header::HOST, value);
        }
        for h in HOP_BY_HOP {
            headers.remove(h);
        }
        let forwarded_for = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(earlier) => format!("{earlier}, {}", peer.ip()),
            None => peer.ip().to_string(),
        };
        for (name, value) in [
            ("x-forwarded-for", forwarded_for.as_str()),
            ("x-forwarded-host", host.as_str()),
            ("x-forwarded-proto", if secure { "https" } else { "http" }),
            ("x-real-ip", &peer.ip().to_string()),
        ] {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
        let asked = std::time::Instant::now();
        let response = match self.client.request(req).await {
            Ok(mut response) => {
                for h in HOP_BY_HOP {
                    response.headers_mut().remove(h);
                }
                response.map(Either::Left)
            }
            Err(err) => {
                tracing::debug!(%endpoint, backend = %backend.name, error = %err, "ingress: backend failed");
                plain(
                    StatusCode::BAD_GATEWAY,
                    &format!("{} did not answer", backend.name),
                )
            }
        };
        (Some(backend), response, Some(asked.elapsed().as_secs_f64()))
    }
}

/// The host a request names: its Host header, else (HTTP/2) the URI's authority.
fn host_of(req: &Request<Incoming>) -> String {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().host())
        .unwrap_or_default()
        .to_string()
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(format!("{text}\n")))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
