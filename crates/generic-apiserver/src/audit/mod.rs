//! Audit logging, as upstream's `--audit-policy-file` and `--audit-log-path`: every
//! request is described by audit.k8s.io/v1 `Event`s, one per stage (RequestReceived;
//! ResponseStarted for watches and streams; ResponseComplete), at the level the first
//! matching policy rule gives — `Metadata` (who, what, when, the outcome), `Request`
//! (plus the request body), `RequestResponse` (plus the response body). Events are
//! built on the request path and written off it ([`log`]). Responses carry the
//! `Audit-Id` header that names their events.

pub mod log;
pub mod rules;

use std::borrow::Cow;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Map, Value, json};

use crate::auth::User;
use crate::request::RequestInfo;
use crate::response::Response;
use rules::{Decision, Policy};
pub use rules::{Level, Stage};

/// The audit flags.
#[derive(Debug, Clone)]
pub struct Config {
    pub policy_file: PathBuf,
    pub log: log::LogConfig,
}

/// Why auditing cannot start.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("reading the audit policy {path}: {reason}")]
    Policy { path: String, reason: String },
    #[error("opening the audit log {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
}

/// The policy and the log.
pub struct Auditor {
    policy: Policy,
    sink: log::Sink,
}

/// What is known of a request when it arrives.
pub struct Facts<'a> {
    pub audit_id: String,
    /// Path and query, as received.
    pub request_uri: &'a str,
    /// The API verb (`list`, `watch`, ...), or the lowercased method of a non-resource
    /// request.
    pub verb: &'a str,
    pub info: Option<&'a RequestInfo>,
    pub path: &'a str,
    /// Who sent the request (`None`: authentication failed) and, when impersonating,
    /// whom it acts as.
    pub requester: Option<&'a User>,
    pub acting: Option<&'a User>,
    pub source_ips: Vec<String>,
    pub user_agent: Option<&'a str>,
}

fn user_json(user: &User) -> Value {
    json!({"username": user.name, "groups": user.groups})
}

/// Upstream's timestamps: RFC 3339 with microseconds.
fn now() -> String {
    format!("{:.6}", jiff::Timestamp::now())
}

impl Auditor {
    pub fn start(config: &Config) -> Result<Auditor, AuditError> {
        let path = config.policy_file.display().to_string();
        let text =
            std::fs::read_to_string(&config.policy_file).map_err(|e| AuditError::Policy {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        let policy = Policy::parse(&text).map_err(|reason| AuditError::Policy { path, reason })?;
        let sink = log::Sink::start(config.log.clone()).map_err(|source| AuditError::Log {
            path: config.log.path.display().to_string(),
            source,
        })?;
        Ok(Auditor { policy, sink })
    }

    /// Starts the trail of one request: the policy's decision and the event's common
    /// fields.
    pub fn begin(self: &Arc<Self>, facts: Facts<'_>) -> Trail {
        let (name, groups) = match facts.acting.or(facts.requester) {
            Some(u) => (u.name.as_str(), u.groups.as_slice()),
            None => ("", &[][..]),
        };
        let target = match facts.info {
            Some(info) => rules::Target::Resource {
                group: &info.group,
                resource: &info.resource,
                subresource: info.subresource.as_deref(),
                namespace: info.namespace.as_deref().unwrap_or_default(),
                name: info.name.as_deref().unwrap_or_default(),
            },
            None => rules::Target::NonResource { path: facts.path },
        };
        let decision = self.policy.decide(&rules::Request {
            user: facts.requester.map(|_| (name, groups)),
            verb: facts.verb,
            target,
        });
        let mut event = Map::new();
        event.insert("kind".into(), json!("Event"));
        event.insert("apiVersion".into(), json!("audit.k8s.io/v1"));
        event.insert("level".into(), json!(decision.level.as_str()));
        event.insert("auditID".into(), json!(facts.audit_id));
        event.insert("stage".into(), Value::Null);
        event.insert("requestURI".into(), json!(facts.request_uri));
        event.insert("verb".into(), json!(facts.verb));
        event.insert(
            "user".into(),
            facts.requester.map_or_else(|| json!({}), user_json),
        );
        if let (Some(acting), Some(requester)) = (facts.acting, facts.requester)
            && acting != requester
        {
            event.insert("impersonatedUser".into(), user_json(acting));
        }
        event.insert("sourceIPs".into(), json!(facts.source_ips));
        if let Some(agent) = facts.user_agent {
            event.insert("userAgent".into(), json!(agent));
        }
        if let Some(info) = facts.info {
            let mut object = Map::new();
            object.insert("resource".into(), json!(info.resource));
            if let Some(ns) = &info.namespace {
                object.insert("namespace".into(), json!(ns));
            }
            if let Some(name) = &info.name {
                object.insert("name".into(), json!(name));
            }
            if !info.group.is_empty() {
                object.insert("apiGroup".into(), json!(info.group));
            }
            object.insert("apiVersion".into(), json!(info.version));
            if let Some(sub) = &info.subresource {
                object.insert("subresource".into(), json!(sub));
            }
            event.insert("objectRef".into(), Value::Object(object));
        }
        event.insert("requestReceivedTimestamp".into(), json!(now()));
        let long_running = facts.verb == "watch"
            || facts.info.is_some_and(|i| {
                matches!(
                    i.subresource.as_deref(),
                    Some("exec" | "attach" | "portforward" | "log" | "proxy")
                )
            });
        Trail {
            auditor: self.clone(),
            audit_id: facts.audit_id,
            event,
            decision,
            long_running,
            annotations: Annotations::default(),
        }
    }
}

/// Annotations the stages of a request add to its audit events (PodSecurity's), shared
/// by the call's copies.
#[derive(Clone, Default)]
pub struct Annotations(Arc<std::sync::Mutex<Vec<Annotation>>>);

/// A key (fixed, as PodSecurity's, or made, as a webhook's `<name>/<key>`) and its value.
type Annotation = (Cow<'static, str>, String);

impl Annotations {
    pub fn add(&self, key: impl Into<Cow<'static, str>>, value: String) {
        use krust_api::sync::Unpoisoned;
        self.0.locked().push((key.into(), value));
    }

    fn all(&self) -> Vec<Annotation> {
        use krust_api::sync::Unpoisoned;
        self.0.locked().clone()
    }
}

/// One request's audit events, built as it goes.
pub struct Trail {
    auditor: Arc<Auditor>,
    audit_id: String,
    event: Map<String, Value>,
    decision: Decision,
    long_running: bool,
    annotations: Annotations,
}

impl Trail {
    pub fn level(&self) -> Level {
        self.decision.level
    }

    /// Where the request's handlers add annotations for its events.
    pub fn annotations(&self) -> Annotations {
        self.annotations.clone()
    }

    fn emit(&self, stage: Stage) {
        if self.decision.level == Level::None || self.decision.omit_stages.contains(&stage) {
            return;
        }
        let mut event = self.event.clone();
        let added = self.annotations.all();
        if !added.is_empty() {
            let annotations = event.entry("annotations").or_insert_with(|| json!({}));
            for (key, value) in added {
                annotations[&*key] = json!(value);
            }
        }
        event.insert("stage".into(), json!(stage.as_str()));
        event.insert("stageTimestamp".into(), json!(now()));
        self.auditor.sink.send(Value::Object(event));
    }

    pub fn request_received(&self) {
        self.emit(Stage::RequestReceived);
    }

    /// Whether [`Trail::request_body`] needs the body: to record it (level `Request`
    /// and above), or to name what a create creates.
    pub fn wants_request_body(&self) -> bool {
        self.decision.level >= Level::Request
            || (self.decision.level > Level::None && self.event["verb"] == "create")
    }

    /// The request body (JSON, protobuf or YAML): its object's name completes
    /// `objectRef` of a create, as upstream; at level `Request` and above the body is
    /// recorded.
    pub fn request_body(&mut self, content_type: Option<&str>, body: &[u8]) {
        if body.is_empty() {
            return;
        }
        let Ok(object) = crate::rest::decode_body(content_type, body) else {
            return;
        };
        if let Some(name) = object["metadata"]["name"].as_str()
            && let Some(object_ref) = self
                .event
                .get_mut("objectRef")
                .and_then(Value::as_object_mut)
        {
            object_ref.entry("name").or_insert_with(|| json!(name));
        }
        if self.decision.level >= Level::Request {
            let object = self.without_managed_fields(object);
            self.event.insert("requestObject".into(), object);
        }
    }

    /// The authorizer's decision, as upstream's annotations.
    pub fn authorized(&mut self, allowed: bool, reason: &str) {
        let mut annotations = Map::new();
        annotations.insert(
            "authorization.k8s.io/decision".into(),
            json!(if allowed { "allow" } else { "forbid" }),
        );
        annotations.insert("authorization.k8s.io/reason".into(), json!(reason));
        self.event
            .insert("annotations".into(), Value::Object(annotations));
    }

    fn without_managed_fields(&self, mut object: Value) -> Value {
        if self.decision.omit_managed_fields {
            if let Some(meta) = object["metadata"].as_object_mut() {
                meta.remove("managedFields");
            }
            for item in object
                .get_mut("items")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(meta) = item["metadata"].as_object_mut() {
                    meta.remove("managedFields");
                }
            }
        }
        object
    }

    /// Records the response (and writes the remaining events): at once for ordinary
    /// requests; for watches and streams ResponseStarted now and ResponseComplete
    /// when the response body ends.
    pub async fn finish(mut self, mut resp: Response) -> Response {
        if let Ok(id) = http::HeaderValue::from_str(&self.audit_id) {
            resp.headers_mut().insert("audit-id", id);
        }
        if self.decision.level == Level::None {
            return resp;
        }
        let code = resp.status().as_u16();
        self.event.insert(
            "responseStatus".into(),
            json!({"metadata": {}, "code": code}),
        );
        if self.long_running {
            self.emit(Stage::ResponseStarted);
            let guard = CompleteOnDrop(Some(self));
            return resp.map(|body| {
                body.map_frame(move |f| {
                    let _ = &guard;
                    f
                })
                .boxed()
            });
        }
        let wants_body = code >= 400 || self.decision.level == Level::RequestResponse;
        if wants_body {
            // Objects in JSON or protobuf; the log holds them as JSON either way.
            let content_type = resp
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .filter(|ct| {
                    ct.starts_with("application/json") || ct.starts_with(crate::response::PROTOBUF)
                })
                .map(str::to_string);
            let (parts, body) = resp.into_parts();
            let bytes: Bytes = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let object =
                content_type.and_then(|ct| crate::rest::decode_body(Some(&ct), &bytes).ok());
            if let Some(object) = object {
                if code >= 400 && object["kind"] == "Status" {
                    let mut status = json!({"metadata": {}, "code": code});
                    for field in ["status", "message", "reason", "details"] {
                        if !object[field].is_null() {
                            status[field] = object[field].clone();
                        }
                    }
                    self.event.insert("responseStatus".into(), status);
                }
                // As upstream, only a resource request's answer is an object to record:
                // non-resource answers (`/version`, a server's bootstrap keys) are not.
                let resource = self.event.contains_key("objectRef");
                if self.decision.level == Level::RequestResponse && resource {
                    let object = self.without_managed_fields(object);
                    self.event.insert("responseObject".into(), object);
                }
            }
            resp = http::Response::from_parts(parts, Full::new(bytes).boxed());
        }
        self.emit(Stage::ResponseComplete);
        resp
    }
}

/// Writes ResponseComplete when a streamed response ends (or its client goes away).
struct CompleteOnDrop(Option<Trail>);

impl Drop for CompleteOnDrop {
    fn drop(&mut self) {
        if let Some(trail) = self.0.take() {
            trail.emit(Stage::ResponseComplete);
        }
    }
}

/// The client's addresses, as upstream lists them: `X-Forwarded-For`, `X-Real-Ip`, then
/// the connection's peer.
pub fn source_ips(headers: &http::HeaderMap, peer: Option<IpAddr>) -> Vec<String> {
    let mut ips: Vec<String> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|ip| ip.trim().parse::<IpAddr>().ok())
        .map(|ip| ip.to_string())
        .collect();
    let real = headers
        .get("x-real-ip")
        .and_then(|v| v.to_str().ok())
        .and_then(|ip| ip.trim().parse::<IpAddr>().ok());
    for ip in real.into_iter().chain(peer) {
        let ip = ip.to_string();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips
}
