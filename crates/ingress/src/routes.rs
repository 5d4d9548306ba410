//! Where a request goes: the Ingress rules of the class this controller serves, with
//! their backends resolved to the ready endpoints of each Service port, following the
//! Ingress specification's matching rules:
//! - hosts: an exact host beats a wildcard (`*.example.com` covers exactly one more
//!   label), and both beat rules without a host;
//! - paths: the longest match wins, `Exact` before `Prefix` at equal length; a `Prefix`
//!   matches whole path elements (`/foo` matches `/foo` and `/foo/bar`, not `/foobar`);
//!   `ImplementationSpecific` is a `Prefix` here;
//! - `spec.defaultBackend` takes what no rule matches;
//! - an Ingress whose paths are regular expressions (ingress-nginx's `use-regex` or
//!   `rewrite-target`) matches them case-insensitively from the path's start;
//! - a canary Ingress (see [`annotations`](crate::annotations)) adds no paths: it is the
//!   alternative backend of the same host and path of another Ingress.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use krust_client::endpoints::{ipv4_slices_by_service, is_ready};
use kube::ResourceExt;
use regex::Regex;

use crate::annotations::{self, Canary, Options};

/// A Service port behind a rule, with its ready endpoints (empty: answer 503).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// `namespace/service:port`, for logs and error pages.
    pub name: String,
    /// The Ingress whose rule leads here, its namespace and the Service (for metrics).
    pub ingress: String,
    pub namespace: String,
    pub service: String,
    pub endpoints: Vec<SocketAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PathType {
    Prefix,
    Exact,
}

/// One path of an Ingress rule (or the default backend): where its requests go, and how.
#[derive(Clone, Debug)]
pub struct Rule {
    path: String,
    kind: PathType,
    /// The path as a regular expression, when the Ingress's paths are.
    pattern: Option<Regex>,
    pub backend: Backend,
    pub options: Options,
    /// A canary Ingress's backend for the same host and path, and when to take it.
    pub canary: Option<(Canary, Backend)>,
}

impl Rule {
    fn new(path: String, kind: PathType, backend: Backend, options: Options) -> Option<Rule> {
        let pattern = if options.regex {
            let end = if kind == PathType::Exact { "$" } else { "" };
            match Regex::new(&format!("(?i)^{path}{end}")) {
                Ok(re) => Some(re),
                Err(err) => {
                    tracing::warn!(%path, ingress = %backend.ingress, error = %err, "an Ingress path is not a regular expression; it is left out");
                    return None;
                }
            }
        } else {
            None
        };
        Some(Rule {
            path,
            kind,
            pattern,
            backend,
            options,
            canary: None,
        })
    }

    fn matches(&self, request: &str) -> bool {
        if let Some(pattern) = &self.pattern {
            return pattern.is_match(request);
        }
        match self.kind {
            PathType::Exact => request == self.path,
            PathType::Prefix => {
                let prefix = self.path.trim_end_matches('/');
                prefix.is_empty()
                    || request == prefix
                    || request
                        .strip_prefix(prefix)
                        .is_some_and(|rest| rest.starts_with('/'))
            }
        }
    }

    /// The path the backend gets for `request`: the rewrite target with the groups of
    /// the rule's path filled in (nginx replaces the whole path), or the path as it came.
    pub fn backend_path<'a>(&self, request: &'a str) -> Cow<'a, str> {
        let (Some(target), Some(pattern)) = (&self.options.rewrite_target, &self.pattern) else {
            return Cow::Borrowed(request);
        };
        match pattern.captures(request) {
            Some(groups) => {
                let mut out = String::new();
                groups.expand(&braced(target), &mut out);
                Cow::Owned(out)
            }
            None => Cow::Borrowed(request),
        }
    }

    /// The path an affinity cookie is set for: the annotation's, else the rule's own
    /// (`/` for a regular expression, which is no path).
    pub fn cookie_path(&self) -> &str {
        match self
            .options
            .affinity
            .as_ref()
            .and_then(|a| a.path.as_deref())
        {
            Some(path) => path,
            None if self.pattern.is_none() => &self.path,
            None => "/",
        }
    }
}

/// nginx's `$1` as the regex crate writes it (`${1}`, so that `$1a` stays group 1
/// followed by `a`); any other `$` is literal.
fn braced(target: &str) -> String {
    let mut out = String::with_capacity(target.len() + 4);
    let mut chars = target.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let mut digits = String::new();
        while let Some(d) = chars.next_if(char::is_ascii_digit) {
            digits.push(d);
        }
        if digits.is_empty() {
            out.push_str("$$");
        } else {
            out.push_str(&format!("${{{digits}}}"));
        }
    }
    out
}

/// How a backend names the port of its Service.
#[derive(Clone, Copy, Debug)]
pub enum ServicePort<'a> {
    Number(i32),
    Name(&'a str),
}

/// The Services and their EndpointSlices, indexed to turn a backend reference into the
/// ready endpoints of one Service port.
pub struct Services<'a> {
    by_name: HashMap<(&'a str, &'a str), &'a Service>,
    slices: HashMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>,
}

impl<'a> Services<'a> {
    pub fn new(
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
    ) -> Services<'a> {
        let by_name = services
            .into_iter()
            .filter_map(|s| {
                let meta = &s.metadata;
                Some(((meta.namespace.as_deref()?, meta.name.as_deref()?), s))
            })
            .collect();
        Services {
            by_name,
            slices: ipv4_slices_by_service(slices),
        }
    }

    /// Whether Service `ns/name` exists.
    pub fn exists(&self, ns: &str, name: &str) -> bool {
        self.by_name.contains_key(&(ns, name))
    }

    /// The backend for `port` of Service `ns/name` (`None`: no such Service or port),
    /// with its ready TCP endpoints; `route` names what leads there, for metrics.
    pub fn backend(
        &self,
        ns: &str,
        name: &str,
        port: ServicePort<'_>,
        route: &str,
    ) -> Option<Backend> {
        let service = self.by_name.get(&(ns, name))?;
        let service_port =
            (service.spec.as_ref()?.ports.iter().flatten()).find(|p| match port {
                ServicePort::Number(n) => p.port == n,
                ServicePort::Name(wanted) => p.name.as_deref() == Some(wanted),
            })?;
        let port_name = service_port.name.clone().unwrap_or_default();
        let mut endpoints = Vec::new();
        for slice in self.slices.get(&(ns, name)).into_iter().flatten() {
            let Some(target) = slice.ports.iter().flatten().find(|p| {
                p.name.clone().unwrap_or_default() == port_name
                    && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
            }) else {
                continue;
            };
            let Some(target) = target.port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            for e in &slice.endpoints {
                let ip = e.addresses.first().and_then(|a| a.parse::<Ipv4Addr>().ok());
                if let (true, Some(ip)) = (is_ready(e), ip) {
                    endpoints.push(SocketAddr::from((ip, target)));
                }
            }
        }
        endpoints.sort();
        endpoints.dedup();
        let shown = match port {
            ServicePort::Number(n) => n.to_string(),
            ServicePort::Name(name) => name.to_string(),
        };
        Some(Backend {
            name: format!("{ns}/{name}:{shown}"),
            ingress: route.to_string(),
            namespace: ns.to_string(),
            service: name.to_string(),
            endpoints,
        })
    }
}

/// The routing table of every Ingress this controller serves.
#[derive(Debug, Default)]
pub struct Routes {
    exact_hosts: HashMap<String, Vec<Rule>>,
    /// By the part after `*.`.
    wildcard_hosts: HashMap<String, Vec<Rule>>,
    any_host: Vec<Rule>,
    default_backend: Option<Rule>,
}

impl Routes {
    pub fn new<'a>(
        ingresses: impl IntoIterator<Item = &'a Ingress>,
        services: &Services,
    ) -> Routes {
        let resolve = |ns: &str, ingress: &str, backend: &IngressBackend| -> Option<Backend> {
            let svc = backend.service.as_ref()?;
            let port = svc.port.as_ref()?;
            let port = match (port.number, port.name.as_deref()) {
                (Some(number), _) => ServicePort::Number(number),
                (None, Some(name)) => ServicePort::Name(name),
                (None, None) => return None,
            };
            services.backend(ns, &svc.name, port, ingress)
        };
        let mut routes = Routes::default();
        // Oldest first, as ingress-nginx: on a conflict the first Ingress keeps the path.
        // Canaries after every other: they attach to paths the others made.
        let mut ingresses: Vec<(&Ingress, Option<Canary>)> = ingresses
            .into_iter()
            .map(|i| (i, annotations::canary(i.annotations())))
            .collect();
        ingresses.sort_by_key(|(i, canary)| {
            (
                canary.is_some(),
                i.metadata.creation_timestamp.clone(),
                i.metadata.name.clone(),
            )
        });
        for (ingress, canary) in ingresses {
            let (Some(ns), Some(spec)) = (ingress.metadata.namespace.as_deref(), &ingress.spec)
            else {
                continue;
            };
            let name = ingress.metadata.name.as_deref().unwrap_or_default();
            let options = annotations::options(ingress.annotations());
            if canary.is_none() && routes.default_backend.is_none() {
                routes.default_backend = (spec.default_backend.as_ref())
                    .and_then(|b| resolve(ns, name, b))
                    .and_then(|b| Rule::new("/".into(), PathType::Prefix, b, Options::default()));
            }
            for rule in spec.rules.iter().flatten() {
                let table = match rule.host.as_deref().map(str::to_lowercase) {
                    None => &mut routes.any_host,
                    Some(host) => match host.strip_prefix("*.") {
                        Some(parent) => {
                            routes.wildcard_hosts.entry(parent.to_string()).or_default()
                        }
                        None => routes.exact_hosts.entry(host).or_default(),
                    },
                };
                for p in rule.http.iter().flat_map(|h| &h.paths) {
                    let path = p.path.clone().unwrap_or_else(|| "/".into());
                    let Some(backend) = resolve(ns, name, &p.backend) else {
                        continue;
                    };
                    match &canary {
                        Some(canary) => {
                            match table
                                .iter_mut()
                                .find(|r| r.path == path && r.canary.is_none())
                            {
                                Some(main) => main.canary = Some((canary.clone(), backend)),
                                None => {
                                    tracing::debug!(ingress = %name, %path, "a canary path that no other Ingress serves is ignored")
                                }
                            }
                        }
                        None => {
                            let kind = if p.path_type == "Exact" {
                                PathType::Exact
                            } else {
                                PathType::Prefix
                            };
                            table.extend(Rule::new(path, kind, backend, options.clone()));
                        }
                    }
                }
            }
        }
        routes
    }

    /// The rule for a request to `host` (the Host header; a port is ignored) and
    /// `path`, if any rule or default backend takes it.
    pub fn route(&self, host: &str, path: &str) -> Option<&Rule> {
        let host = bare_host(host).to_lowercase();
        let wildcard = host
            .split_once('.')
            .and_then(|(_, parent)| self.wildcard_hosts.get(parent));
        [self.exact_hosts.get(&host), wildcard, Some(&self.any_host)]
            .into_iter()
            .flatten()
            .find_map(|paths| best(paths, path))
            .or(self.default_backend.as_ref())
    }
}

/// The host of a Host header without its port.
pub fn bare_host(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The longest matching path, `Exact` first at equal length.
fn best<'a>(rules: &'a [Rule], request: &str) -> Option<&'a Rule> {
    rules
        .iter()
        .filter(|r| r.matches(request))
        .max_by_key(|r| (r.path.trim_end_matches('/').len(), r.kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use krust_client::endpoints::SERVICE_NAME_LABEL;
    use serde_json::json;

    fn routes() -> Routes {
        let services: Vec<Service> = ["web", "api", "fallback"]
            .iter()
            .map(|name| {
                serde_json::from_value(json!({
                    "metadata": {"namespace": "default", "name": name},
                    "spec": {"ports": [{"name": "http", "port": 80}]},
                }))
                .unwrap()
            })
            .collect();
        let slices: Vec<EndpointSlice> = [("web", "10.42.0.5"), ("api", "10.42.0.6")]
            .iter()
            .map(|(svc, ip)| {
                serde_json::from_value(json!({
                    "metadata": {"namespace": "default", "name": format!("{svc}-1"),
                                 "labels": {SERVICE_NAME_LABEL: svc}},
                    "addressType": "IPv4",
                    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [ip], "conditions": {"ready": true}},
                                  {"addresses": ["10.42.9.9"], "conditions": {"ready": false}}],
                }))
                .unwrap()
            })
            .collect();
        let backend = |svc: &str| json!({"service": {"name": svc, "port": {"number": 80}}});
        let ingress: Ingress = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "site"},
            "spec": {
                "defaultBackend": {"service": {"name": "fallback", "port": {"name": "http"}}},
                "rules": [
                    {"host": "shop.example", "http": {"paths": [
                        {"path": "/", "pathType": "Prefix", "backend": backend("web")},
                        {"path": "/api", "pathType": "Prefix", "backend": backend("api")},
                        {"path": "/api/exact", "pathType": "Exact", "backend": backend("web")},
                    ]}},
                    {"host": "*.example", "http": {"paths": [
                        {"path": "/", "pathType": "Prefix", "backend": backend("api")},
                    ]}},
                    {"http": {"paths": [
                        {"path": "/any", "pathType": "ImplementationSpecific", "backend": backend("web")},
                    ]}},
                ],
            },
        }))
        .unwrap();
        Routes::new([&ingress], &Services::new(&services, &slices))
    }

    fn to(r: &Routes, host: &str, path: &str) -> Option<String> {
        r.route(host, path).map(|r| r.backend.name.clone())
    }

    #[test]
    fn the_longest_path_of_the_most_specific_host_wins() {
        let r = routes();
        assert_eq!(
            to(&r, "shop.example", "/").as_deref(),
            Some("default/web:80")
        );
        assert_eq!(
            to(&r, "Shop.Example:8080", "/api").as_deref(),
            Some("default/api:80")
        );
        assert_eq!(
            to(&r, "shop.example", "/api/v1").as_deref(),
            Some("default/api:80")
        );
        assert_eq!(
            to(&r, "shop.example", "/apiv1").as_deref(),
            Some("default/web:80")
        );
        assert_eq!(
            to(&r, "shop.example", "/api/exact").as_deref(),
            Some("default/web:80")
        );
        assert_eq!(
            to(&r, "shop.example", "/api/exact/x").as_deref(),
            Some("default/api:80")
        );
    }

    #[test]
    fn wildcards_cover_one_label_and_the_rest_falls_to_hostless_rules_then_the_default() {
        let r = routes();
        assert_eq!(
            to(&r, "blog.example", "/x").as_deref(),
            Some("default/api:80")
        );
        assert_eq!(
            to(&r, "a.blog.example", "/any/thing").as_deref(),
            Some("default/web:80")
        );
        assert_eq!(to(&r, "example", "/any").as_deref(), Some("default/web:80"));
        assert_eq!(
            to(&r, "other", "/nothing").as_deref(),
            Some("default/fallback:http")
        );
    }

    #[test]
    fn backends_are_the_ready_endpoints_of_the_service_port() {
        let r = routes();
        let web = &r.route("shop.example", "/").unwrap().backend;
        assert_eq!(web.endpoints, ["10.42.0.5:8080".parse().unwrap()]);
        let fallback = &r.route("other", "/").unwrap().backend;
        assert!(
            fallback.endpoints.is_empty(),
            "no slices: nothing to send to"
        );
    }

    fn service_and_slice(name: &str, ip: &str) -> (Service, EndpointSlice) {
        (
            serde_json::from_value(json!({"metadata": {"namespace": "default", "name": name},
                "spec": {"ports": [{"name": "http", "port": 80}]}}))
            .unwrap(),
            serde_json::from_value(json!({
                "metadata": {"namespace": "default", "name": format!("{name}-1"),
                             "labels": {SERVICE_NAME_LABEL: name}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]}))
            .unwrap(),
        )
    }

    fn ingress(name: &str, annotations: serde_json::Value, path: &str, service: &str) -> Ingress {
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": name, "annotations": annotations},
            "spec": {"rules": [{"host": "site.example", "http": {"paths": [
                {"path": path, "pathType": "ImplementationSpecific",
                 "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}]}}))
        .unwrap()
    }

    #[test]
    fn rewrites_fill_the_groups_of_a_regular_expression_path() {
        let (svc, slice) = service_and_slice("api", "10.42.0.6");
        let rewrite = ingress(
            "rw",
            json!({"nginx.ingress.kubernetes.io/rewrite-target": "/$2"}),
            "/API(/|$)(.*)",
            "api",
        );
        let r = Routes::new([&rewrite], &Services::new([&svc], [&slice]));
        let rule = r.route("site.example", "/api/v1/users").unwrap();
        assert_eq!(rule.backend_path("/api/v1/users"), "/v1/users");
        assert_eq!(
            r.route("site.example", "/api")
                .unwrap()
                .backend_path("/api"),
            "/"
        );
        assert!(r.route("site.example", "/apiv1").is_none());
        assert!(r.route("site.example", "/v1").is_none());
        assert_eq!(braced("/$1x/$$/$"), "/${1}x/$$$$/$$");
    }

    #[test]
    fn a_canary_joins_the_same_host_and_path_of_another_ingress() {
        let (main_svc, main_slice) = service_and_slice("main", "10.42.0.5");
        let (canary_svc, canary_slice) = service_and_slice("next", "10.42.0.6");
        let main = ingress("main", json!({}), "/", "main");
        let canary = ingress(
            "canary",
            json!({"nginx.ingress.kubernetes.io/canary": "true",
                   "nginx.ingress.kubernetes.io/canary-weight": "20"}),
            "/",
            "next",
        );
        let lonely = ingress(
            "lonely",
            json!({"nginx.ingress.kubernetes.io/canary": "true"}),
            "/other",
            "next",
        );
        // Whatever order they come in.
        let services = Services::new([&main_svc, &canary_svc], [&main_slice, &canary_slice]);
        let r = Routes::new([&canary, &lonely, &main], &services);
        let rule = r.route("site.example", "/x").unwrap();
        assert_eq!(rule.backend.name, "default/main:80");
        let (c, backend) = rule.canary.as_ref().unwrap();
        assert_eq!((c.weight, backend.name.as_str()), (20, "default/next:80"));
        // A canary adds no path of its own.
        assert_eq!(
            r.route("site.example", "/other").unwrap().backend.name,
            "default/main:80"
        );
    }
}
