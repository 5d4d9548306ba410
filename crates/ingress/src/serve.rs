//! The HTTP side: accepts connections, finds each request's rule in the current
//! [`Routes`], and forwards it to one of the backend's ready pods (round robin, or the
//! one its affinity cookie names), with the `X-Forwarded-*` headers a reverse proxy
//! adds; upgraded connections (WebSocket and others) are joined to the pod's. As
//! ingress-nginx answers: no rule, 404; a client outside the allowed ranges, 403; a
//! body over the limit, 413; a Service without ready endpoints, 503; a pod that does
//! not answer, 502, or 504 when it is too slow; plain HTTP for a host served with TLS,
//! 308 to HTTPS.

use std::collections::HashMap;
use std::convert::Infallible;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Empty, Full, LengthLimitError, Limited};
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use krust_api::sync::{Unpoisoned, UnpoisonedRw};
use krust_httpstream::serving::{self, FirstByteDeadline};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::access::{AccessLog, Entry};
use crate::annotations::Options;
use crate::annotations::Verdict;
use crate::gateway::api::HeaderModifier;
use crate::gateway::table::{self, Pick, Table};
use crate::metrics::Metrics;
use crate::routes::{Backend, Routes, Rule, bare_host};
use crate::tls::Resolver;

/// What the proxy routes by: the Ingresses (on the Ingress ports) and the Gateways'
/// routes by listener port.
#[derive(Debug, Default)]
pub struct Tables {
    pub ingress: Routes,
    pub gateways: HashMap<u16, Table>,
}

/// The routing tables in use; replaced whole when routes or endpoints change.
pub type SharedRoutes = Arc<RwLock<Arc<Tables>>>;

type Body = Either<Incoming, Full<Bytes>>;
/// A request body on its way to a backend: cut off past the rule's size limit, or none
/// (a request without one, which can be sent to another pod if the first is gone).
type Upstream = Either<Limited<Incoming>, Empty<Bytes>>;
type BackendClient = Client<HttpConnector, Upstream>;
/// Pods a request without a body is offered to before 502.
const MAX_TRIES: usize = 3;

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
    /// The Ingresses' HTTP port.
    http_port: u16,
    /// The Ingresses' HTTPS port, for redirects (left out of the URL when it is 443).
    https_port: u16,
    /// Clients by (connect timeout, HTTP/2 only), made on first use.
    clients: Mutex<HashMap<(Duration, bool), BackendClient>>,
    next: AtomicUsize,
    /// Turns of the canaries' weights.
    canary_turn: AtomicUsize,
    metrics: Metrics,
    access_log: Option<AccessLog>,
    /// How long a client may take for its TLS handshake, its first byte and each
    /// request's headers (ingress-nginx's `client-header-timeout`).
    header_timeout: Duration,
}

impl Proxy {
    pub fn new(
        routes: SharedRoutes,
        tls: Arc<Resolver>,
        (http_port, https_port): (u16, u16),
        metrics: Metrics,
        (access_log, header_timeout): (Option<AccessLog>, Duration),
    ) -> Arc<Proxy> {
        Arc::new(Proxy {
            routes,
            tls,
            http_port,
            https_port,
            header_timeout,
            clients: Mutex::default(),
            next: AtomicUsize::new(0),
            canary_turn: AtomicUsize::new(0),
            metrics,
            access_log,
        })
    }
}

/// Serves `listener` until the future is dropped: plain HTTP, or HTTPS through
/// `tls` (HTTP/2 or HTTP/1.1, as the client's ALPN chooses). A client that does not
/// finish its TLS handshake, send its first byte or a request's headers within the
/// header timeout loses its connection, so that silent or slow clients ("slow loris")
/// cannot hold connections for ever.
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>, tls: Option<TlsAcceptor>) {
    let port = listener.local_addr().map_or(0, |a| a.port());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "ingress: accept failed");
                continue;
            }
        };
        // Answers go out at once, not after the client's next ACK (nginx's tcp_nodelay).
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %err, "ingress: TCP_NODELAY");
        }
        let (proxy, tls) = (proxy.clone(), tls.clone());
        tokio::spawn(async move {
            let secure = tls.is_some();
            let within = proxy.header_timeout;
            let service = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(proxy.handle(req, peer, secure, port).await) }
            });
            let builder = serving::builder(within);
            let served = match tls {
                None => {
                    let io = FirstByteDeadline::new(stream, within);
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(io), service)
                        .await
                }
                Some(tls) => match tokio::time::timeout(within, tls.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let io = FirstByteDeadline::new(stream, within);
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(io), service)
                            .await
                    }
                    Ok(Err(err)) => {
                        tracing::debug!(%peer, error = %err, "ingress TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "ingress TLS handshake timed out");
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

/// What becomes of a request: an answer made here, or a backend to forward it to.
enum Routed<'r> {
    Answer(Option<&'r Backend>, Response<Body>),
    Forward(Plan<'r>),
}

/// How a request goes to its backend, whichever API routed it.
struct Plan<'r> {
    backend: &'r Backend,
    options: &'r Options,
    /// The path sent (the request's query is added to it).
    path: String,
    /// The Host sent instead of the client's (a Gateway route's URL rewrite).
    host: Option<&'r str>,
    request_headers: Option<&'r HeaderModifier>,
    response_headers: Option<&'r HeaderModifier>,
    /// Where an affinity cookie applies.
    cookie_path: &'r str,
}

impl Proxy {
    async fn handle(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
        port: u16,
    ) -> Response<Body> {
        let started = std::time::Instant::now();
        let method = req.method().clone();
        let logged = self.access_log.as_ref().map(|_| Logged::of(&req));
        let tables = self.routes.read_locked().clone();
        let grpc = is_grpc(&req);
        let (backend, mut response, upstream) = match self.route(&tables, &req, peer, secure, port)
        {
            Routed::Answer(backend, response) => (backend, response, None),
            Routed::Forward(plan) => self.forward(plan, req, peer, secure).await,
        };
        if grpc && matches!(response.body(), Either::Right(_)) {
            response = grpc_local_reply(response);
        }
        let status = response.status().as_u16();
        self.metrics.request(
            backend,
            method.as_str(),
            status,
            upstream.map(|(_, seconds)| seconds),
        );
        if let (Some(log), Some(logged)) = (&self.access_log, logged) {
            // ingress-nginx's upstream names: `namespace-service-port`.
            let upstream_name = backend.map_or("upstream-default-backend".to_string(), |b| {
                let port = b.name.rsplit(':').next().unwrap_or_default();
                format!("{}-{}-{port}", b.namespace, b.service)
            });
            log.record(&Entry {
                client: peer,
                request: &logged.line,
                status,
                body_bytes: response.body().size_hint().exact().unwrap_or(0),
                referer: &logged.referer,
                user_agent: &logged.user_agent,
                request_length: logged.length,
                seconds: started.elapsed().as_secs_f64(),
                upstream_name: &upstream_name,
                alternative_name: "",
                upstream,
            });
        }
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

    /// Where `req`, which came to `port`, goes: a Gateway route of the port, else (on
    /// the Ingress ports) an Ingress rule.
    fn route<'r>(
        &self,
        tables: &'r Tables,
        req: &Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
        port: u16,
    ) -> Routed<'r> {
        let host = host_of(req);
        if let Some(table) = tables.gateways.get(&port) {
            let name = bare_host(&host).to_ascii_lowercase();
            let uri = req.uri();
            if let Some(found) =
                table.route(&name, req.method(), uri.path(), uri.query(), req.headers())
            {
                return gateway_plan(&found, uri, &name, secure, port);
            }
        }
        if port != self.http_port && port != self.https_port {
            return Routed::Answer(None, not_found());
        }
        if let Some(redirect) = self.redirect(req, secure) {
            return Routed::Answer(None, redirect);
        }
        let Some(rule) = tables.ingress.route(&host, req.uri().path()) else {
            return Routed::Answer(None, not_found());
        };
        let allowed = match peer.ip() {
            IpAddr::V4(ip) => rule.options.allows(ip),
            IpAddr::V6(ip) => ip
                .to_ipv4_mapped()
                .is_some_and(|ip| rule.options.allows(ip)),
        };
        if !allowed {
            return Routed::Answer(
                Some(&rule.backend),
                plain(StatusCode::FORBIDDEN, "403 Forbidden"),
            );
        }
        Routed::Forward(Plan {
            backend: self.choose(rule, req),
            options: &rule.options,
            path: rule.backend_path(req.uri().path()).into_owned(),
            host: None,
            request_headers: None,
            response_headers: None,
            cookie_path: rule.cookie_path(),
        })
    }

    /// The answer to `req`, the backend it went to and how long that took to answer.
    async fn forward<'r>(
        &self,
        plan: Plan<'r>,
        mut req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> (
        Option<&'r Backend>,
        Response<Body>,
        Option<(SocketAddr, f64)>,
    ) {
        let host = host_of(&req);
        let (backend, options) = (plan.backend, plan.options);
        let answer = |response| (Some(backend), response, None);
        if backend.endpoints.is_empty() {
            return answer(plain(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("no ready endpoints for {}", backend.name),
            ));
        }
        if let (Some(limit), Some(length)) = (options.body_limit, req.body().size_hint().exact())
            && length > limit
        {
            return answer(too_large());
        }
        let (mut endpoint, mut cookie) = self.endpoint(&plan, &req);
        let mut target = plan.path;
        if let Some(query) = req.uri().query() {
            // nginx appends the request's query to a rewrite that has one of its own.
            let joint = if target.contains('?') { '&' } else { '?' };
            target = format!("{target}{joint}{query}");
        }
        let uri = |endpoint: SocketAddr| Uri::try_from(format!("http://{endpoint}{target}"));
        if uri(endpoint).is_err() {
            return answer(plain(StatusCode::BAD_REQUEST, "bad request target"));
        }
        // An upgrade (HTTP/1.1 only) keeps its headers, and its connection is joined to
        // the backend's once both sides switch.
        let upgrade = upgrade_of(&req);
        let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
        // Backends speak HTTP/1.1, whatever the client spoke; gRPC backends HTTP/2.
        let version = if options.grpc {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let method = req.method().clone();
        let mut headers = std::mem::take(req.headers_mut());
        if let Some(rewritten) = plan.host.and_then(|h| HeaderValue::from_str(h).ok()) {
            headers.insert(header::HOST, rewritten);
        } else if !headers.contains_key(header::HOST)
            && let Ok(value) = HeaderValue::from_str(&host)
        {
            headers.insert(header::HOST, value);
        }
        if let Some(modifier) = plan.request_headers {
            modify(&mut headers, modifier);
        }
        for h in HOP_BY_HOP {
            headers.remove(h);
        }
        if let Some(protocol) = upgrade {
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, protocol);
        }
        if options.grpc {
            // gRPC needs trailers, and says so (nginx's grpc_pass does too).
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
        let client_ip = peer.ip().to_string();
        let forwarded_for = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(earlier) => format!("{earlier}, {client_ip}"),
            None => client_ip.clone(),
        };
        for (name, value) in [
            ("x-forwarded-for", forwarded_for.as_str()),
            ("x-forwarded-host", host.as_str()),
            ("x-forwarded-proto", if secure { "https" } else { "http" }),
            ("x-real-ip", &client_ip),
        ] {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
        // A request without a body can be sent again: when a pod cannot be reached
        // (it went away before the routes knew), the next one is tried, as nginx's
        // `proxy_next_upstream error` does, up to three.
        let body = req.into_body();
        let resendable = body.is_end_stream();
        let tries = if resendable {
            backend.endpoints.len().min(MAX_TRIES)
        } else {
            1
        };
        let limit = options
            .body_limit
            .map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
        let mut body = (!resendable).then(|| Either::Left(Limited::new(body, limit)));
        let client = self.client(options.connect_timeout, options.grpc);
        let asked = std::time::Instant::now();
        let mut tried = 0;
        let outcome = loop {
            tried += 1;
            let mut upstream = Request::new(body.take().unwrap_or(Either::Right(Empty::new())));
            *upstream.method_mut() = method.clone();
            *upstream.uri_mut() = uri(endpoint).expect("checked above");
            *upstream.version_mut() = version;
            *upstream.headers_mut() = if tried < tries {
                headers.clone()
            } else {
                std::mem::take(&mut headers)
            };
            let outcome =
                tokio::time::timeout(options.read_timeout, client.request(upstream)).await;
            match &outcome {
                Ok(Err(err)) if err.is_connect() && tried < tries => {
                    tracing::debug!(%endpoint, backend = %backend.name, error = %err, "ingress: backend unreachable, trying the next");
                    // The pod after the one that failed, whatever turn others took meanwhile.
                    let failed = backend.endpoints.iter().position(|e| *e == endpoint);
                    endpoint =
                        backend.endpoints[failed.map_or(0, |i| i + 1) % backend.endpoints.len()];
                    cookie = affinity_cookie(options, plan.cookie_path, endpoint);
                }
                _ => break outcome,
            }
        };
        let response = match outcome {
            Ok(Ok(mut response)) => {
                // Affinity to a pod that answered, never to one that failed.
                if let Some(cookie) = cookie {
                    response.headers_mut().append(header::SET_COOKIE, cookie);
                }
                match client_side {
                    Some(client_side) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                        join_upgraded(client_side, hyper::upgrade::on(&mut response), endpoint);
                    }
                    _ => {
                        for h in HOP_BY_HOP {
                            response.headers_mut().remove(h);
                        }
                    }
                }
                if let Some(modifier) = plan.response_headers {
                    modify(response.headers_mut(), modifier);
                }
                response.map(Either::Left)
            }
            Ok(Err(err)) => {
                tracing::debug!(%endpoint, backend = %backend.name, error = %err, "ingress: backend failed");
                if cause::<LengthLimitError>(&err).is_some() {
                    too_large()
                } else if cause::<std::io::Error>(&err)
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
                {
                    timed_out()
                } else {
                    plain(
                        StatusCode::BAD_GATEWAY,
                        &format!("{} did not answer", backend.name),
                    )
                }
            }
            Err(_) => timed_out(),
        };
        (
            Some(backend),
            response,
            Some((endpoint, asked.elapsed().as_secs_f64())),
        )
    }

    /// The rule's backend, or its canary's when the request's header or cookie says so,
    /// else in the canary's share of the turns.
    fn choose<'r>(&self, rule: &'r Rule, req: &Request<Incoming>) -> &'r Backend {
        // A canary without ready pods takes nothing, as ingress-nginx skips it.
        let Some((canary, alternative)) = rule
            .canary
            .as_ref()
            .filter(|(_, b)| !b.endpoints.is_empty())
        else {
            return &rule.backend;
        };
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        match canary.verdict(header, |name| cookie(req, name)) {
            Verdict::Canary => alternative,
            Verdict::Main => &rule.backend,
            Verdict::Undecided => {
                let turn = self.canary_turn.fetch_add(1, Ordering::Relaxed);
                if (turn % canary.weight_total as usize) < canary.weight as usize {
                    alternative
                } else {
                    &rule.backend
                }
            }
        }
    }

    /// The endpoint for a request: the one its affinity cookie names while it is ready,
    /// else the next in turn — with the cookie to set when the rule keeps affinity.
    fn endpoint(&self, plan: &Plan, req: &Request<Incoming>) -> (SocketAddr, Option<HeaderValue>) {
        let backend = plan.backend;
        let affinity = plan.options.affinity.as_ref();
        if let Some(affinity) = affinity
            && let Some(kept) = cookie(req, &affinity.cookie)
            && let Some(endpoint) = backend.endpoints.iter().find(|e| token(e) == kept)
        {
            return (*endpoint, None);
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let endpoint = backend.endpoints[n % backend.endpoints.len()];
        (
            endpoint,
            affinity_cookie(plan.options, plan.cookie_path, endpoint),
        )
    }

    /// The client for backends with this connect timeout and protocol.
    fn client(&self, connect_timeout: Duration, http2: bool) -> BackendClient {
        self.clients
            .locked()
            .entry((connect_timeout, http2))
            .or_insert_with(|| {
                let mut connector = HttpConnector::new();
                connector.set_connect_timeout(Some(connect_timeout));
                connector.set_nodelay(true);
                Client::builder(TokioExecutor::new())
                    .http2_only(http2)
                    .build(connector)
            })
            .clone()
    }
}

/// What the access log keeps of a request before it goes on.
struct Logged {
    /// `METHOD /path?query HTTP/1.1`.
    line: String,
    referer: String,
    user_agent: String,
    /// The request line, headers and body, in bytes (as nginx counts them).
    length: u64,
}

impl Logged {
    fn of(req: &Request<Incoming>) -> Logged {
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let line = format!("{} {path} {:?}", req.method(), req.version());
        let header = |name: header::HeaderName| {
            (req.headers().get(name))
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let headers: usize = (req.headers().iter())
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum();
        let body = req.body().size_hint().exact().unwrap_or(0);
        Logged {
            length: (line.len() + 2 + headers + 2) as u64 + body,
            line,
            referer: header(header::REFERER),
            user_agent: header(header::USER_AGENT),
        }
    }
}

/// The protocol an HTTP/1.1 request asks to switch to (`Connection: upgrade` and an
/// `Upgrade` header), if it does.
fn upgrade_of(req: &Request<Incoming>) -> Option<HeaderValue> {
    let asks = req.version() == Version::HTTP_11
        && (req.headers().get_all(header::CONNECTION).iter())
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| req.headers().get(header::UPGRADE).cloned())
        .flatten()
}

/// Copies both ways between the client's and the backend's upgraded connections, once
/// both have switched, until either side closes.
fn join_upgraded(
    client_side: hyper::upgrade::OnUpgrade,
    backend_side: hyper::upgrade::OnUpgrade,
    endpoint: SocketAddr,
) {
    tokio::spawn(async move {
        match tokio::try_join!(client_side, backend_side) {
            Ok((client, backend)) => {
                let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
                if let Err(err) = tokio::io::copy_bidirectional(&mut client, &mut backend).await {
                    tracing::debug!(%endpoint, error = %err, "ingress: upgraded connection ended");
                }
            }
            Err(err) => tracing::debug!(%endpoint, error = %err, "ingress: upgrade failed"),
        }
    });
}

/// The value of cookie `name` in the request, if it has one.
fn cookie<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    (req.headers().get_all(header::COOKIE).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key == name).then_some(value)
        })
}

/// What an affinity cookie holds for `endpoint`: a digest, not the pod's address.
fn token(endpoint: &SocketAddr) -> String {
    let mut hasher = DefaultHasher::new();
    endpoint.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// The first error of type `E` in `err`'s chain of sources (itself included).
fn cause<'e, E: std::error::Error + 'static>(
    err: &'e (dyn std::error::Error + 'static),
) -> Option<&'e E> {
    std::iter::successors(Some(err), |e| e.source()).find_map(|e| e.downcast_ref::<E>())
}

/// The `Set-Cookie` that keeps a client on `endpoint`, when the rule keeps affinity.
fn affinity_cookie(options: &Options, path: &str, endpoint: SocketAddr) -> Option<HeaderValue> {
    let affinity = options.affinity.as_ref()?;
    let mut value = format!(
        "{}={}; Path={path}; HttpOnly",
        affinity.cookie,
        token(&endpoint),
    );
    if let Some(age) = affinity.max_age {
        value.push_str(&format!("; Max-Age={age}"));
    }
    HeaderValue::from_str(&value).ok()
}

/// What a Gateway route does with a request it matched: redirect it, fail it (no
/// usable backend), or forward it with its filters applied.
fn gateway_plan<'r>(
    found: &table::Found<'r>,
    uri: &Uri,
    host: &str,
    secure: bool,
    port: u16,
) -> Routed<'r> {
    let rule = found.rule;
    let path = uri.path();
    if let Some(redirect) = &rule.redirect {
        let scheme = if secure { "https" } else { "http" };
        let location = table::location(redirect, found, scheme, host, port, path, uri.query());
        let mut response = plain(redirect.status, redirect.status.as_str());
        if let Ok(location) = HeaderValue::from_str(&location) {
            response.headers_mut().insert(header::LOCATION, location);
        }
        return Routed::Answer(None, response);
    }
    let backend = match rule.pick() {
        Pick::Backend(backend) => backend,
        Pick::Fail(status, why) => return Routed::Answer(None, plain(status, &why)),
    };
    let path = match &rule.rewrite_path {
        Some(change) => found.changed_path(change, path),
        None => path.to_string(),
    };
    Routed::Forward(Plan {
        backend,
        options: &rule.options,
        path,
        host: rule.rewrite_host.as_deref(),
        request_headers: rule.request_headers.as_ref(),
        response_headers: rule.response_headers.as_ref(),
        cookie_path: "/",
    })
}

/// A Gateway route's header changes: set (replace), add (append), remove.
fn modify(headers: &mut http::HeaderMap, modifier: &HeaderModifier) {
    let pairs = |list: &[crate::gateway::api::NameValue]| {
        list.iter()
            .filter_map(|nv| {
                let name = HeaderName::from_bytes(nv.name.to_ascii_lowercase().as_bytes()).ok()?;
                Some((name, HeaderValue::from_str(&nv.value).ok()?))
            })
            .collect::<Vec<_>>()
    };
    for (name, value) in pairs(&modifier.set) {
        headers.insert(name, value);
    }
    for (name, value) in pairs(&modifier.add) {
        headers.append(name, value);
    }
    for name in &modifier.remove {
        headers.remove(name.to_ascii_lowercase().as_str());
    }
}

/// Whether a request is a gRPC call (its clients read answers as gRPC only).
fn is_grpc<B>(req: &Request<B>) -> bool {
    (req.headers().get(header::CONTENT_TYPE))
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// An answer made here, for a gRPC call: a trailers-only gRPC response whose status is
/// the HTTP status's by gRPC's mapping (404 → UNIMPLEMENTED, 502/503/504 → UNAVAILABLE),
/// as Envoy's local replies to gRPC calls are; a gRPC client cannot read plain text.
fn grpc_local_reply(response: Response<Body>) -> Response<Body> {
    let code = match response.status().as_u16() {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502..=504 => 14,
        _ => 2,
    };
    let message = match response.into_body() {
        Either::Right(full) => {
            String::from_utf8_lossy(&full.into_inner().unwrap_or_default()).into_owned()
        }
        Either::Left(_) => String::new(),
    };
    let mut reply = Response::new(Either::Right(Full::new(Bytes::new())));
    let headers = reply.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(code));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(message.trim())) {
        headers.insert("grpc-message", message);
    }
    reply
}

/// gRPC's `grpc-message` encoding: printable ASCII but `%` as is, the rest `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b' '..=b'~' if byte != b'%' => out.push(char::from(byte)),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

fn not_found() -> Response<Body> {
    plain(StatusCode::NOT_FOUND, "default backend - 404")
}

fn too_large() -> Response<Body> {
    plain(
        StatusCode::PAYLOAD_TOO_LARGE,
        "413 Request Entity Too Large",
    )
}

fn timed_out() -> Response<Body> {
    plain(StatusCode::GATEWAY_TIMEOUT, "504 Gateway Time-out")
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
