//! The HTTP side: accepts connections, finds each request's backend in the current
//! [`Routes`], and forwards it to one of the backend's ready pods (round robin), with
//! the `X-Forwarded-*` headers a reverse proxy adds. No rule: 404; a Service without
//! ready endpoints: 503; a pod that does not answer: 502 — as ingress-nginx answers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use krust_api::sync::UnpoisonedRw;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::routes::{Backend, Routes};

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

struct Proxy {
    routes: SharedRoutes,
    client: Client<HttpConnector, Incoming>,
    next: AtomicUsize,
    metrics: Metrics,
}

/// Serves `listener` until the future is dropped, counting requests in `metrics`.
pub async fn serve(listener: TcpListener, routes: SharedRoutes, metrics: Metrics) {
    let proxy = Arc::new(Proxy {
        routes,
        client: Client::builder(TokioExecutor::new()).build_http(),
        next: AtomicUsize::new(0),
        metrics,
    });
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "ingress: accept failed");
                continue;
            }
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(proxy.handle(req, peer).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(err) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %err, "ingress connection ended");
            }
        });
    }
}

impl Proxy {
    async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let method = req.method().clone();
        let routes = self.routes.read_locked().clone();
        let (backend, response, upstream) = self.forward(&routes, req, peer).await;
        self.metrics.request(
            backend,
            method.as_str(),
            response.status().as_u16(),
            upstream,
        );
        response
    }

    /// The answer to `req`, the backend it went to and how long that took to answer.
    async fn forward<'r>(
        &self,
        routes: &'r Routes,
        mut req: Request<Incoming>,
        peer: SocketAddr,
    ) -> (Option<&'r Backend>, Response<Body>, Option<f64>) {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().host())
            .unwrap_or_default()
            .to_string();
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
        let headers = req.headers_mut();
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
            ("x-forwarded-proto", "http"),
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

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(format!("{text}\n")))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
