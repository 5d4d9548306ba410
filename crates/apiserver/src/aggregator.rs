//! API aggregation (apiregistration.k8s.io/v1), as upstream's kube-aggregator: every
//! group version krust serves itself is listed as a Local APIService; an APIService
//! backed by a Service makes its group version served by that Service's apiserver.
//! Requests for it are proxied to a ready endpoint with the front proxy's client
//! certificate and the caller in `X-Remote-User` / `X-Remote-Group`; its discovery is
//! merged into krust's; whether it answers is reported in its Available condition.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use krust_api::status::ApiError;
use krust_api::sync::UnpoisonedRw;
use serde_json::{Value, json};

use crate::auth::User;
use crate::custom::definition::{condition, set_condition};
use crate::loopback::{Loopback, Resource};
use crate::outbound::{self, Trust};
use crate::response::{self, Response};
use crate::{Api, discovery};

const PREFIX: &str = "/registry/apiregistration.k8s.io/apiservices/";
const API_SERVICES: Resource<'static> = Resource {
    group: "apiregistration.k8s.io",
    version: "v1",
    plural: "apiservices",
    namespace: None,
};
const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

/// How often remote APIServices are checked, how long a check may take, and how long a
/// proxied request may take to answer (its body then streams for as long as it lasts).
const CHECK_EVERY: Duration = Duration::from_secs(10);
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
const PROXY_TIMEOUT: Duration = Duration::from_secs(60);

/// A remote group version that answered its last check.
#[derive(Clone)]
pub struct Backend {
    service: Value,
    ca_bundle: Option<Vec<u8>>,
    insecure: bool,
    /// Its APIResourceList (`/apis/<group>/<version>`).
    pub resources: Value,
}

impl Backend {
    fn trust(&self) -> Trust<'_> {
        if self.insecure {
            Trust::Anything
        } else {
            Trust::Bundle(self.ca_bundle.as_deref())
        }
    }
}

/// The remote group versions available now, and the client that reaches them.
pub struct Aggregator {
    client: outbound::Client,
    available: RwLock<HashMap<(String, String), Backend>>,
}

impl Aggregator {
    pub fn new(pki: &crate::pki::Pki) -> Aggregator {
        Aggregator {
            client: outbound::Client::new(
                &pki.ca_cert,
                Some(outbound::Identity {
                    cert: pki.front_proxy_client_cert.clone(),
                    key: pki.front_proxy_client_key.clone(),
                }),
            ),
            available: RwLock::new(HashMap::new()),
        }
    }

    /// The remote apiserver serving `group`/`version`, if one is available. Asked on
    /// every resource request: no allocation (there are a handful of APIServices at most).
    pub fn backend(&self, group: &str, version: &str) -> Option<Backend> {
        self.available
            .read_locked()
            .iter()
            .find(|((g, v), _)| g == group && v == version)
            .map(|(_, b)| b.clone())
    }

    /// Every available remote group version with its resources.
    pub fn all(&self) -> BTreeMap<(String, String), Value> {
        self.available
            .read_locked()
            .iter()
            .map(|(k, b)| (k.clone(), b.resources.clone()))
            .collect()
    }
}

/// Sends a request for an aggregated group version to its apiserver, as the caller;
/// `watch` as the request's info says (its verb).
pub async fn proxy(
    api: &Api,
    backend: &Backend,
    user: &User,
    parts: &http::request::Parts,
    watch: bool,
    body: Bytes,
) -> Result<Response, ApiError> {
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let target = outbound::service_target(&api.scope.cache, &backend.service, &path)
        .map_err(|e| ApiError::new(503, "ServiceUnavailable", e))?;
    let mut req = http::Request::builder()
        .method(parts.method.clone())
        .uri(&path)
        .header(http::header::HOST, target.host_header())
        .header("X-Remote-User", &user.name);
    for group in &user.groups {
        req = req.header("X-Remote-Group", group);
    }
    for name in [
        http::header::CONTENT_TYPE,
        http::header::ACCEPT,
        http::header::USER_AGENT,
    ] {
        if let Some(v) = parts.headers.get(&name) {
            req = req.header(name, v);
        }
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let unreachable = |e: String| {
        ApiError::new(
            503,
            "ServiceUnavailable",
            format!("error trying to reach service: {e}"),
        )
    };
    let client = &api.aggregator.client;
    // A watch streams for as long as the client keeps it; any other answer comes whole
    // within the limit, as upstream's (a backend failing midway is then a 503, not a
    // short answer).
    let (parts, body) = if watch {
        let resp = client.open(&target, backend.trust(), req, PROXY_TIMEOUT);
        let (parts, body) = resp.await.map_err(unreachable)?.into_parts();
        (parts, response::streamed(body))
    } else {
        let resp = client.send(&target, backend.trust(), req, PROXY_TIMEOUT);
        let (parts, body) = resp.await.map_err(unreachable)?.into_parts();
        (parts, BodyExt::boxed(Full::new(body)))
    };
    let mut out = http::Response::new(body);
    *out.status_mut() = parts.status;
    let content_type = parts.headers.get(http::header::CONTENT_TYPE);
    out.headers_mut().insert(
        http::header::CONTENT_TYPE,
        content_type
            .cloned()
            .unwrap_or(http::HeaderValue::from_static("application/json")),
    );
    Ok(out)
}

/// Keeps the APIServices in step: Local ones for what krust serves, the Available
/// condition of remote ones (checked every few seconds and on every change).
pub async fn run(api: Arc<Api>) {
    let (Some(services), Some(definitions)) = (
        api.scope.cache.cache(PREFIX),
        api.scope.cache.cache(crate::custom::DEFINITIONS),
    ) else {
        return;
    };
    let (mut changed, mut definitions_changed) = (services.subscribe(), definitions.subscribe());
    loop {
        if let Err(err) = register_local(&api).await {
            tracing::warn!(%err, "registering the local APIServices");
        }
        let (objs, _) = services.list(PREFIX);
        let remote: Vec<Value> = objs
            .iter()
            .map(|o| o.value())
            .filter(|s| s["spec"]["service"].is_object())
            .collect();
        let mut available = HashMap::new();
        for service in &remote {
            if let Some((key, backend)) = check(&api, service).await {
                available.insert(key, backend);
            }
        }
        *api.aggregator.available.write_locked() = available;
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            r = definitions_changed.changed() => if r.is_err() { return },
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
}

/// Lists every group version krust serves itself as a Local APIService (those of
/// custom resources come and go with their definitions).
async fn register_local(api: &Api) -> Result<(), ApiError> {
    let internal = Loopback { scope: &api.scope };
    let custom = api.custom.all();
    let catalog = discovery::Catalog::new(custom.iter().map(|k| k.info));
    let mut wanted = BTreeMap::new();
    for (group, versions) in catalog.group_versions() {
        let crd = custom.iter().any(|k| k.info.group == group);
        for version in versions {
            wanted.insert(format!("{version}.{group}"), (group, version, crd));
        }
    }
    let existing: BTreeMap<String, Value> = api
        .scope
        .cache
        .cache(PREFIX)
        .map(|c| c.list(PREFIX).0)
        .unwrap_or_default()
        .iter()
        .map(|o| (o.name.clone(), o.value()))
        .collect();
    for (name, (group, version, crd)) in &wanted {
        let current = match existing.get(name) {
            Some(current) => current.clone(),
            None => {
                let (minimum, priority) = if *crd { (1000, 100) } else { (18000, 15) };
                let obj = json!({
                    "metadata": {"name": name, "labels": {AUTOMANAGED: if *crd { "true" } else { "onstart" }}},
                    "spec": {"group": group, "version": version, "groupPriorityMinimum": minimum, "versionPriority": priority},
                });
                match internal.create(API_SERVICES, &obj).await {
                    Ok(created) => created,
                    Err(e) if e.code == 409 => continue,
                    Err(e) => return Err(e),
                }
            }
        };
        if current["spec"]["service"].is_object() {
            continue;
        }
        let mut new = current.clone();
        set_condition(
            &mut new,
            condition(
                "Available",
                true,
                "Local",
                "Local APIServices are always available",
            ),
        );
        if new != current {
            internal.update_status(API_SERVICES, &new).await?;
        }
    }
    // Those of definitions that are gone.
    for (name, obj) in &existing {
        if obj["metadata"]["labels"][AUTOMANAGED] == "true" && !wanted.contains_key(name) {
            match internal.delete(API_SERVICES, name).await {
                Ok(()) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Checks a remote APIService (its Service, an endpoint, its discovery document) and
/// records the outcome in its Available condition.
async fn check(api: &Api, obj: &Value) -> Option<((String, String), Backend)> {
    let spec = &obj["spec"];
    let (group, version) = (
        spec["group"].as_str().unwrap_or_default().to_string(),
        spec["version"].as_str().unwrap_or_default().to_string(),
    );
    let service = spec["service"].clone();
    let (ns, name) = (
        service["namespace"].as_str().unwrap_or_default(),
        service["name"].as_str().unwrap_or_default(),
    );
    let mut backend = Backend {
        ca_bundle: spec["caBundle"].as_str().and_then(|b| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(b).ok()
        }),
        insecure: spec["insecureSkipTLSVerify"] == json!(true),
        service: service.clone(),
        resources: Value::Null,
    };
    let path = format!("/apis/{group}/{version}");
    let outcome = match outbound::service_target(&api.scope.cache, &service, &path) {
        Err(e) if e.contains("not found") => Err((
            "ServiceNotFound",
            format!("service/{name} in \"{ns}\" is not present"),
        )),
        Err(_) => Err((
            "MissingEndpoints",
            format!("endpoints for service/{name} in \"{ns}\" have no addresses"),
        )),
        Ok(target) => {
            let req = http::Request::get(&target.path)
                .header(http::header::HOST, target.host_header())
                .header(http::header::ACCEPT, "application/json")
                .header("X-Remote-User", "system:kube-aggregator")
                .header("X-Remote-Group", "system:masters")
                .body(Full::new(Bytes::new()))
                .expect("a valid request");
            let answer = api
                .aggregator
                .client
                .send(&target, backend.trust(), req, CHECK_TIMEOUT)
                .await;
            match answer {
                Ok(resp) if resp.status().is_success() => {
                    match serde_json::from_slice::<Value>(resp.body()) {
                        Ok(list) => {
                            backend.resources = list;
                            Ok(())
                        }
                        Err(e) => Err((
                            "FailedDiscoveryCheck",
                            format!("failing or missing response from {}: {e}", target.url),
                        )),
                    }
                }
                Ok(resp) => Err((
                    "FailedDiscoveryCheck",
                    format!(
                        "failing or missing response from {}: bad status from {}: {}",
                        target.url,
                        target.url,
                        resp.status().as_u16()
                    ),
                )),
                Err(e) => Err((
                    "FailedDiscoveryCheck",
                    format!("failing or missing response from {}: {e}", target.url),
                )),
            }
        }
    };
    let mut new = obj.clone();
    let cond = match &outcome {
        Ok(()) => condition("Available", true, "Passed", "all checks passed"),
        Err((reason, message)) => condition("Available", false, reason, message),
    };
    set_condition(&mut new, cond);
    if new != *obj
        && let Err(err) = (Loopback { scope: &api.scope })
            .update_status(API_SERVICES, &new)
            .await
    {
        tracing::warn!(%err, apiservice = %obj["metadata"]["name"], "recording availability");
    }
    outcome.ok().map(|()| ((group, version), backend))
}
