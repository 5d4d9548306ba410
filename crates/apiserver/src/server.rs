//! The HTTPS front door: TLS with optional client certificates (the certificate's CN and
//! O become the user and groups), HTTP/1.1 and HTTP/2, then routing to discovery, health,
//! metrics and the generic REST handlers.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use krust_api::status::ApiError;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::auth::{Credentials, User};
use crate::authz::{self, Attributes, Target};
use crate::request::{self, Query};
use crate::response::{self, Output, Response};
use crate::{Api, audit, discovery, health, rest, server_bootstrap};
use krust_httpstream::serving::{self, FirstByteDeadline};

/// Builds the TLS acceptor: our serving certificate, client certificates optional but
/// verified against the cluster CA when present.
/// The TLS side of the listener: the serving certificate, and client certificates
/// verified against the cluster CA and the `client_cas` (PEM) given besides it.
pub fn tls_acceptor(pki: &crate::pki::Pki, client_cas: Option<&str>) -> Result<TlsAcceptor> {
    let mut roots = rustls::RootCertStore::empty();
    for pem in std::iter::once(pki.ca_cert.as_str()).chain(client_cas) {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(cert?)?;
        }
    }
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .context("building the client certificate verifier")?;
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pki.serving_cert.as_bytes())
            .chain(CertificateDer::pem_slice_iter(pki.ca_cert.as_bytes()))
            .collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(pki.serving_key.as_bytes())
        .context("parsing the serving key")?;
    let mut config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    // No session resumption: a resumed session keeps the client certificate of the
    // first handshake without checking it again, so a certificate that has since
    // expired (or been replaced by rotation) would go on authenticating.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Upstream's max-in-flight filter: separate budgets for reads and writes; long-running
/// requests (watches) are exempt. A request over budget gets 429 with Retry-After.
pub struct InflightLimits {
    readonly: Budget,
    mutating: Budget,
}

struct Budget {
    slots: tokio::sync::Semaphore,
    size: usize,
}

impl Budget {
    fn new(size: usize) -> Budget {
        let size = size.max(1);
        Budget {
            slots: tokio::sync::Semaphore::new(size),
            size,
        }
    }

    fn in_use(&self) -> usize {
        self.size - self.slots.available_permits()
    }
}

impl InflightLimits {
    pub fn new(readonly: usize, mutating: usize) -> Self {
        InflightLimits {
            readonly: Budget::new(readonly),
            mutating: Budget::new(mutating),
        }
    }

    /// Requests holding a slot now: (read-only, mutating).
    fn in_use(&self) -> (usize, usize) {
        (self.readonly.in_use(), self.mutating.in_use())
    }

    fn admit(
        &self,
        verb: request::Verb,
    ) -> Result<Option<tokio::sync::SemaphorePermit<'_>>, ApiError> {
        use request::Verb::*;
        let budget = match verb {
            Watch => return Ok(None),
            Get | List => &self.readonly,
            Create | Update | Patch | Delete | DeleteCollection => &self.mutating,
        };
        budget
            .slots
            .try_acquire()
            .map(Some)
            .map_err(|_| ApiError::too_many_requests(1))
    }
}

/// How long a client may take for its TLS handshake, and then for each request's
/// headers (HTTP/1): kube-apiserver's `ReadHeaderTimeout`, so that slow or silent
/// clients ("slow loris") give their connection back.
const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(32);
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accepts connections until `shutdown` resolves, then drains them for a moment.
pub async fn serve(
    api: Arc<Api>,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    let mut accept_backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    accept_backoff = ACCEPT_BACKOFF_MIN;
                    a
                }
                Err(err) => {
                    // Out of file descriptors (say): retrying at once would spin. Go's
                    // HTTP server waits 5 ms, doubling up to 1 s.
                    tracing::warn!(%err, retry_in = ?accept_backoff, "accept failed");
                    tokio::time::sleep(accept_backoff).await;
                    accept_backoff = (accept_backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let api = api.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(READ_HEADER_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, %err, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            // The connection's certificate is authenticated once, not per request.
            let client_cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first());
            let connection_user = Arc::new(
                api.scope
                    .authenticators
                    .authenticate(&Credentials {
                        client_cert,
                        bearer: None,
                        audiences: &[],
                    })
                    .unwrap_or_else(|_| User::anonymous()),
            );
            let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let api = api.clone();
                let connection_user = connection_user.clone();
                async move {
                    let req = req.map(RequestBody::Streaming);
                    let peer = Some(peer.ip());
                    Ok::<_, std::convert::Infallible>(
                        respond(&api, &connection_user, peer, req).await,
                    )
                }
            });
            // The protocol is the one ALPN agreed (HTTP/1.1 without it, as Go's server),
            // not guessed from the first bytes: that read would wait for ever on a
            // client that sends none.
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            let builder = serving::builder(READ_HEADER_TIMEOUT);
            let builder = if h2 {
                builder.http2_only()
            } else {
                builder.http1_only()
            };
            let io = FirstByteDeadline::new(tls, READ_HEADER_TIMEOUT);
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
            if let Err(err) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        });
    }
    // Watches never end on their own: give in-flight requests a moment, then stop.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), graceful.shutdown()).await;
}

/// A request's body: still arriving on a client's connection, or already read (a
/// request served in process).
enum RequestBody {
    Streaming(Incoming),
    Read(Bytes),
}

/// Serves one request in process, without TLS or a socket, as `user`: everything after
/// the connection (authorization, admission, validation, the store, the watch cache)
/// is the same as for a client's request. Upgrades (exec, attach, port-forward) need a
/// connection and are refused. For tests.
pub async fn serve_in_process(api: &Api, user: &User, req: http::Request<Bytes>) -> Response {
    respond(api, user, None, req.map(RequestBody::Read)).await
}

/// Serves a request inside the panic guard: a panicking handler answers 500.
async fn respond(
    api: &Api,
    connection_user: &User,
    peer: Option<IpAddr>,
    req: http::Request<RequestBody>,
) -> Response {
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let user_agent = req.headers().get(http::header::USER_AGENT);
    let pretty = response::wants_pretty(uri.query(), user_agent.and_then(|v| v.to_str().ok()));
    let resp = crate::recover::catch(
        &api.scope.metrics,
        || format!("{method} {uri}"),
        handle(api, connection_user, peer, req),
    )
    .await
    .unwrap_or_else(|| response::error(&crate::recover::error()));
    if pretty {
        response::indented(resp).await
    } else {
        resp
    }
}

async fn handle(
    api: &Api,
    connection_user: &User,
    peer: Option<IpAddr>,
    req: http::Request<RequestBody>,
) -> Response {
    let started = Instant::now();
    let (parts, mut body) = req.into_parts();
    let path = parts.uri.path().to_string();
    if path == "/cacerts" && parts.method == Method::GET {
        // Before authentication, as k3s serves it: a joining agent has no trust yet and
        // checks what it gets against the hash in its token.
        return response::full(StatusCode::OK, api.ca_bundle.clone(), "text/plain");
    }
    let query = Query::parse(parts.uri.query());
    let parsed = request::parse(&parts.method, &path, &query);
    let (verb, resource) = match &parsed {
        None => (parts.method.as_str().to_ascii_lowercase(), String::new()),
        Some(Err(_)) => ("unknown".to_string(), String::new()),
        Some(Ok(info)) => (info.verb.as_str().to_string(), info.resource.clone()),
    };
    // Errors to requests for built-in kinds go out in the form the client asked for;
    // custom resources have no protobuf form, so theirs are JSON, as upstream's.
    let accept = parts.headers.get(http::header::ACCEPT);
    let errors = match (
        response::Media::for_errors(accept.and_then(|v| v.to_str().ok())),
        &parsed,
    ) {
        (response::Media::Protobuf, Some(Ok(info)))
            if krust_api::registry::find(&info.group, &info.version, &info.resource)
                .is_some_and(|r| {
                    krust_apimachinery::protobuf::supports(&r.api_version(), r.kind)
                }) =>
        {
            response::Media::Protobuf
        }
        _ => response::Media::Json,
    };
    let identity = identify(api, connection_user, &parts.headers).await;
    let mut trail = api.audit.as_ref().map(|auditor| {
        let (requester, acting) = match &identity {
            Ok((requester, acting)) => (Some(requester.as_ref().unwrap_or(acting)), Some(acting)),
            Err(_) => (None, None),
        };
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        auditor.begin(audit::Facts {
            audit_id: header("audit-id")
                .map(str::to_string)
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            request_uri: parts.uri.path_and_query().map_or(&path, |pq| pq.as_str()),
            verb: &verb,
            info: parsed.as_ref().and_then(|p| p.as_ref().ok()),
            path: &path,
            requester,
            acting,
            source_ips: audit::source_ips(&parts.headers, peer),
            user_agent: header("user-agent"),
        })
    });
    if let Some(trail) = &trail {
        trail.request_received();
    }
    let streams = matches!(&parsed, Some(Ok(info)) if crate::connect::Connect::of(info).is_some());
    if !streams && trail.as_ref().is_some_and(|t| t.wants_request_body()) {
        // Read now, to record it; the handlers take it as read.
        match read_body(body).await {
            Ok(bytes) => {
                if let Some(trail) = &mut trail {
                    let content_type = parts.headers.get(http::header::CONTENT_TYPE);
                    trail.request_body(content_type.and_then(|v| v.to_str().ok()), &bytes);
                }
                body = RequestBody::Read(bytes);
            }
            Err(e) => return finish(api, trail, (&verb, &resource, started, errors), Err(e)).await,
        }
    }
    let result = match identity {
        Err(e) => Err(e),
        // Before authorization: no role grants it, only the server token opens it.
        Ok((_, user)) if path == server_bootstrap::PATH && parts.method == Method::GET => {
            server_bootstrap::serve(api.server_bootstrap.as_ref(), &user)
        }
        Ok((_, user)) => {
            let attrs = match &parsed {
                None => Some(Attributes {
                    user: &user,
                    verb: &verb,
                    target: Target::NonResource { path: &path },
                }),
                Some(Ok(info)) => Some(Attributes::of_request(&user, info)),
                Some(Err(_)) => None,
            };
            let decision = match attrs {
                Some(attrs) => authz::authorize(&api.scope, &attrs).await.map(Some),
                None => Ok(None),
            };
            if let Some(trail) = &mut trail {
                match &decision {
                    Ok(Some(decision)) => trail.authorized(true, decision.reason()),
                    Err(e) if e.code == 403 => trail.authorized(false, ""),
                    _ => {}
                }
            }
            match (decision, parsed) {
                (Err(e), _) => Err(e),
                (Ok(_), None) if path == "/db/snapshots" || path.starts_with("/db/snapshots/") => {
                    let body = std::mem::replace(&mut body, RequestBody::Read(Bytes::new()));
                    db_snapshots(api, &parts.method, &path, body).await
                }
                (Ok(_), None) => {
                    let accept = parts.headers.get(http::header::ACCEPT);
                    let accept = accept.and_then(|v| v.to_str().ok());
                    Ok(non_resource(api, &parts.method, &path, parts.uri.query(), accept).await)
                }
                (Ok(_), Some(Err(e))) => Err(e),
                (Ok(_), Some(Ok(info))) => {
                    let annotations = trail.as_ref().map(audit::Trail::annotations);
                    let request = (info, parts, body, query, annotations.unwrap_or_default());
                    let served = serve_admitted(api, user, request).await;
                    return finish(api, trail, (&verb, &resource, started, errors), served).await;
                }
            }
        }
    };
    // Answered without reading the body: consume it, so the client gets the answer cleanly.
    drain(body).await;
    finish(api, trail, (&verb, &resource, started, errors), result).await
}

/// The response for `result`, counted in the metrics and recorded in the audit log.
async fn finish(
    api: &Api,
    trail: Option<audit::Trail>,
    request: (&str, &str, Instant, response::Media),
    result: Result<Response, ApiError>,
) -> Response {
    let resp = observed(api, request, result);
    match trail {
        Some(trail) => trail.finish(resp).await,
        None => resp,
    }
}

/// The response for `result`, counted in the request metrics.
fn observed(
    api: &Api,
    (verb, resource, started, errors): (&str, &str, Instant, response::Media),
    result: Result<Response, ApiError>,
) -> Response {
    let resp = match result {
        Ok(resp) => resp,
        Err(e) => response::error_in(&e, errors),
    };
    api.scope.metrics.observe(
        verb,
        resource,
        resp.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    resp
}

/// Who sent a request and whom it acts as: the connection's certificate user, else whom
/// its bearer token names (upstream's union authenticator: a client certificate wins);
/// then whom it impersonates, if anyone (the sender is returned only then).
async fn identify(
    api: &Api,
    connection_user: &User,
    headers: &http::HeaderMap,
) -> Result<(Option<User>, User), ApiError> {
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "));
    let user = match bearer {
        Some(token) if connection_user.is_anonymous() => {
            api.scope.authenticators.authenticate(&Credentials {
                client_cert: None,
                bearer: Some(token),
                audiences: &[],
            })?
        }
        _ => connection_user.clone(),
    };
    if !headers
        .keys()
        .any(|k| k.as_str().starts_with("impersonate-"))
    {
        return Ok((None, user));
    }
    let acting = authz::impersonation::acting_user(&api.scope, user.clone(), headers).await?;
    Ok((Some(user), acting))
}

/// An authorized resource request: what it asks for, its head and body, its query, and
/// where it adds audit annotations.
type Admitted = (
    request::RequestInfo,
    http::request::Parts,
    RequestBody,
    Query,
    audit::Annotations,
);

/// Serves an authorized resource request within the in-flight limits.
async fn serve_admitted(
    api: &Api,
    user: User,
    (info, parts, body, query, annotations): Admitted,
) -> Result<Response, ApiError> {
    let _permit = match api.inflight.admit(info.verb) {
        Ok(permit) => permit,
        Err(e) => {
            drain(body).await;
            return Err(e);
        }
    };
    match crate::connect::Connect::of(&info) {
        // Streams and upgrades go to the kubelet with their body unread.
        Some(connect) => match body {
            RequestBody::Streaming(body) => {
                let kind = api
                    .scope
                    .kind("", "v1", "pods")
                    .ok_or_else(|| ApiError::internal("the pods kind is missing"))?;
                let call = crate::rest::Call {
                    scope: &api.scope,
                    kind,
                    info,
                    query,
                    output: Output::Json,
                    user,
                    content_type: None,
                    user_agent: None,
                    body: Bytes::new(),
                    warnings: Default::default(),
                    audit: annotations,
                };
                let req = http::Request::from_parts(parts, body);
                crate::connect::serve(&api.kubelet, connect, call, req).await
            }
            RequestBody::Read(_) => Err(ApiError::bad_request(
                "streaming subresources need a client connection",
            )),
        },
        None => {
            // Read the whole body first: answering before it is consumed makes clients
            // still sending see a reset instead of the Status.
            let body = read_body(body).await?;
            if let Some(backend) = api.aggregator.backend(&info.group, &info.version) {
                let watch = info.verb == crate::request::Verb::Watch;
                return crate::aggregator::proxy(api, &backend, &user, &parts, watch, body).await;
            }
            serve_resource(api, user, (info, query, annotations), &parts.headers, body).await
        }
    }
}

async fn serve_resource(
    api: &Api,
    user: User,
    (info, query, audit): (request::RequestInfo, Query, audit::Annotations),
    headers: &http::HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let header = |name: http::header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let accept = header(http::header::ACCEPT);
    let accept = accept.as_deref();
    let kind = api
        .scope
        .kind(&info.group, &info.version, &info.resource)
        .ok_or_else(ApiError::path_not_found)?;
    if info.verb == request::Verb::Create
        && info.subresource.is_none()
        && api.custom.terminating(kind)
    {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "create not allowed while custom resource definition is terminating",
        ));
    }
    if kind.info.plural == "bindings"
        && info.subresource.is_none()
        && info.verb != request::Verb::Create
    {
        return Err(ApiError::method_not_allowed(info.verb.as_str(), "bindings"));
    }
    // Looked up only for the clients that ask for protobuf at all.
    let protobuf = accept.is_some_and(|a| a.contains(response::PROTOBUF))
        && krust_apimachinery::protobuf::supports(&kind.info.api_version(), kind.info.kind);
    let output = Output::negotiate(accept, query.get("includeObject"), protobuf)?;
    let mut call = rest::Call {
        scope: &api.scope,
        kind,
        info,
        query,
        output,
        user,
        content_type: header(http::header::CONTENT_TYPE),
        user_agent: header(http::header::USER_AGENT),
        body,
        warnings: Default::default(),
        audit,
    };
    if kind.info.group == crate::resource_metrics::GROUP {
        return crate::resource_metrics::serve(&api.resource_metrics, &mut call).await;
    }
    if kind.info.group.is_empty() && kind.info.plural == "componentstatuses" {
        return crate::component_status::serve(&mut call).await;
    }
    if kind.info.is_virtual() {
        return crate::authz::reviews::serve(&mut call).await;
    }
    rest::serve(call).await
}

/// Consumes a request body we will not use, so the client gets our answer cleanly.
async fn drain(body: RequestBody) {
    if let RequestBody::Streaming(body) = body {
        let _ = Limited::new(body, rest::MAX_BODY).collect().await;
    }
}

async fn read_body(body: RequestBody) -> Result<Bytes, ApiError> {
    let body = match body {
        RequestBody::Streaming(body) => body,
        RequestBody::Read(bytes) if bytes.len() > rest::MAX_BODY => {
            return Err(rest::body_too_large());
        }
        RequestBody::Read(bytes) => return Ok(bytes),
    };
    match Limited::new(body, rest::MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err)
            if err
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(rest::body_too_large())
        }
        Err(err) => Err(ApiError::bad_request(format!(
            "reading the request body: {err}"
        ))),
    }
}

/// `/db/snapshots[/...]`: the store's backups, for `krust etcd-snapshot`.
async fn db_snapshots(
    api: &Api,
    method: &Method,
    path: &str,
    body: RequestBody,
) -> Result<Response, ApiError> {
    let Some(snapshots) = &api.snapshots else {
        return Err(ApiError::path_not_found());
    };
    let rest: Vec<&str> = path["/db/snapshots".len()..]
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let body = read_body(body).await?;
    snapshots.serve(api, method, &rest, &body).await
}

/// Discovery, version, health, metrics and OpenAPI.
async fn non_resource(
    api: &Api,
    method: &Method,
    path: &str,
    query: Option<&str>,
    accept: Option<&str>,
) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return response::error(&ApiError::method_not_allowed(method.as_str(), path));
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let catalog = || {
        discovery::Catalog::new(api.custom.all().into_iter().map(|k| k.info))
            .with_remote(api.aggregator.all())
    };
    match parts.as_slice() {
        [endpoint @ ("healthz" | "livez" | "readyz"), rest @ ..] if rest.len() <= 1 => {
            let check = rest.first().copied();
            let (code, body) = health::serve(endpoint, check, query, &*api.scope.store).await;
            response::full(code, body, "text/plain; charset=utf-8")
        }
        ["version"] => response::json(StatusCode::OK, &crate::version_info()),
        ["metrics"] => {
            api.scope.metrics.read_store(&*api.scope.store).await;
            response::full(
                StatusCode::OK,
                api.scope.metrics.render(api.inflight.in_use()),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        }
        ["api"] => match discovery::wants_aggregated(accept) {
            Some(ct) => response::full(
                StatusCode::OK,
                serde_json::to_vec(&catalog().aggregated(true, api_version_of(ct)))
                    .unwrap_or_default(),
                ct,
            ),
            None => response::json(StatusCode::OK, &discovery::api_versions(&api.advertise)),
        },
        ["apis"] => match discovery::wants_aggregated(accept) {
            Some(ct) => response::full(
                StatusCode::OK,
                serde_json::to_vec(&catalog().aggregated(false, api_version_of(ct)))
                    .unwrap_or_default(),
                ct,
            ),
            None => response::json(StatusCode::OK, &catalog().api_group_list()),
        },
        ["openapi", "v2"] => {
            let (body, content_type) = crate::openapi_v2::negotiate(accept);
            response::full(StatusCode::OK, body, content_type)
        }
        ["openapi", "v3"] => {
            response::json(StatusCode::OK, &crate::openapi::root(&api.custom.all()))
        }
        ["openapi", "v3", rest @ ..] => {
            match crate::openapi::document(&rest.join("/"), &api.custom.all()) {
                Some(doc) => response::full(StatusCode::OK, doc, "application/json"),
                None => response::error(&ApiError::path_not_found()),
            }
        }
        ["api", version] => found(catalog().api_resource_list("", version)),
        ["apis", group] => found(catalog().api_group(group)),
        ["apis", group, version] => found(catalog().api_resource_list(group, version)),
        _ => response::error(&ApiError::path_not_found()),
    }
}

fn api_version_of(content_type: &str) -> &'static str {
    if content_type.contains("v=v2beta1") {
        "apidiscovery.k8s.io/v2beta1"
    } else {
        "apidiscovery.k8s.io/v2"
    }
}

fn found(v: Option<serde_json::Value>) -> Response {
    match v {
        Some(v) => response::json(StatusCode::OK, &v),
        None => response::error(&ApiError::path_not_found()),
    }
}
