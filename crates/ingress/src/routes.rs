//! Where a request goes: the Ingress rules of the class this controller serves, with
//! their backends resolved to the ready endpoints of each Service port, following the
//! Ingress specification's matching rules:
//! - hosts: an exact host beats a wildcard (`*.example.com` covers exactly one more
//!   label), and both beat rules without a host;
//! - paths: the longest match wins, `Exact` before `Prefix` at equal length; a `Prefix`
//!   matches whole path elements (`/foo` matches `/foo` and `/foo/bar`, not `/foobar`);
//!   `ImplementationSpecific` is a `Prefix` here;
//! - `spec.defaultBackend` takes what no rule matches.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use krust_client::endpoints::{ipv4_slices_by_service, is_ready};

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

#[derive(Clone, Debug)]
struct Path {
    path: String,
    kind: PathType,
    backend: Backend,
}

impl Path {
    fn matches(&self, request: &str) -> bool {
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
}

/// The routing table of every Ingress this controller serves.
#[derive(Debug, Default)]
pub struct Routes {
    exact_hosts: HashMap<String, Vec<Path>>,
    /// By the part after `*.`.
    wildcard_hosts: HashMap<String, Vec<Path>>,
    any_host: Vec<Path>,
    default_backend: Option<Backend>,
}

impl Routes {
    pub fn new<'a>(
        ingresses: impl IntoIterator<Item = &'a Ingress>,
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
    ) -> Routes {
        let services: HashMap<(&str, &str), &Service> = services
            .into_iter()
            .filter_map(|s| {
                Some((
                    (
                        s.metadata.namespace.as_deref()?,
                        s.metadata.name.as_deref()?,
                    ),
                    s,
                ))
            })
            .collect();
        let slices_of = ipv4_slices_by_service(slices);
        let resolve = |ns: &str, ingress: &str, backend: &IngressBackend| -> Option<Backend> {
            let svc = backend.service.as_ref()?;
            let port = svc.port.as_ref()?;
            let service = services.get(&(ns, svc.name.as_str()))?;
            let service_port = service.spec.as_ref()?.ports.iter().flatten().find(|p| {
                port.number == Some(p.port) || (port.name.is_some() && port.name == p.name)
            })?;
            let port_name = service_port.name.clone().unwrap_or_default();
            let mut endpoints = Vec::new();
            for slice in slices_of
                .get(&(ns, svc.name.as_str()))
                .into_iter()
                .flatten()
            {
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
            let shown = port
                .number
                .map(|n| n.to_string())
                .or_else(|| port.name.clone())
                .unwrap_or_default();
            Some(Backend {
                name: format!("{ns}/{}:{shown}", svc.name),
                ingress: ingress.to_string(),
                namespace: ns.to_string(),
                service: svc.name.clone(),
                endpoints,
            })
        };
        let mut routes = Routes::default();
        // Oldest first, as ingress-nginx: on a conflict the first Ingress keeps the path.
        let mut ingresses: Vec<&Ingress> = ingresses.into_iter().collect();
        ingresses.sort_by_key(|i| {
            (
                i.metadata.creation_timestamp.clone(),
                i.metadata.name.clone(),
            )
        });
        for ingress in ingresses {
            let (Some(ns), Some(spec)) = (ingress.metadata.namespace.as_deref(), &ingress.spec)
            else {
                continue;
            };
            let name = ingress.metadata.name.as_deref().unwrap_or_default();
            if routes.default_backend.is_none() {
                routes.default_backend = spec
                    .default_backend
                    .as_ref()
                    .and_then(|b| resolve(ns, name, b));
            }
            for rule in spec.rules.iter().flatten() {
                let paths = rule.http.iter().flat_map(|h| &h.paths).filter_map(|p| {
                    Some(Path {
                        path: p.path.clone().unwrap_or_else(|| "/".into()),
                        kind: if p.path_type == "Exact" {
                            PathType::Exact
                        } else {
                            PathType::Prefix
                        },
                        backend: resolve(ns, name, &p.backend)?,
                    })
                });
                let table = match rule.host.as_deref().map(str::to_lowercase) {
                    None => &mut routes.any_host,
                    Some(host) => match host.strip_prefix("*.") {
                        Some(parent) => {
                            routes.wildcard_hosts.entry(parent.to_string()).or_default()
                        }
                        None => routes.exact_hosts.entry(host).or_default(),
                    },
                };
                table.extend(paths);
            }
        }
        routes
    }

    /// The backend for a request to `host` (the Host header; a port is ignored) and
    /// `path`, if any rule or default backend takes it.
    pub fn route(&self, host: &str, path: &str) -> Option<&Backend> {
        let host = host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        });
        let host = host.to_lowercase();
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

/// The longest matching path, `Exact` first at equal length.
fn best<'a>(paths: &'a [Path], request: &str) -> Option<&'a Backend> {
    paths
        .iter()
        .filter(|p| p.matches(request))
        .max_by_key(|p| (p.path.trim_end_matches('/').len(), p.kind))
        .map(|p| &p.backend)
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
        Routes::new([&ingress], &services, &slices)
    }

    fn to(r: &Routes, host: &str, path: &str) -> Option<String> {
        r.route(host, path).map(|b| b.name.clone())
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
        let web = r.route("shop.example", "/").unwrap();
        assert_eq!(web.endpoints, ["10.42.0.5:8080".parse().unwrap()]);
        let fallback = r.route("other", "/").unwrap();
        assert!(
            fallback.endpoints.is_empty(),
            "no slices: nothing to send to"
        );
    }
}
