//! From the Gateway API objects to what the proxy serves and what each object's status
//! says, in one pass over the informers' caches:
//!
//! - GatewayClasses whose `controllerName` is krust's are accepted;
//! - each listener of their Gateways is checked (protocol, TLS certificate and the
//!   ReferenceGrant a Secret of another namespace needs, route kinds, conflicts with the
//!   listeners before it on the same port, whether its port could be opened);
//! - each route (HTTPRoute, GRPCRoute) attaches to the listeners its `parentRefs` name
//!   that allow it (kind, namespace) and share a hostname with it; its rules are
//!   compiled into the [`Table`] of the listener's port;
//! - every object gets the conditions and reasons the Gateway API names.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use krust_client::selector::Selector;
use regex::Regex;
use rustls::sign::CertifiedKey;
use serde_json::{Value, json};

use super::api::{
    self, GRPCRoute, Gateway, GatewayClass, HTTPRoute, Listener, ObjectRef, ParentRef,
    ReferenceGrant,
};
use super::table::{self, Host, Match, PathChange, PathRule, Rule, Table, ValueRule};
use crate::annotations::Options;
use crate::routes::{ServicePort, Services};

/// The controller name in krust's GatewayClass.
pub const CONTROLLER_NAME: &str = "krust.io/gateway-controller";
const HTTP_ROUTE: &str = "HTTPRoute";
const GRPC_ROUTE: &str = "GRPCRoute";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Https,
}

/// What the Gateway objects are read from.
pub struct World<'a> {
    pub classes: &'a [Arc<GatewayClass>],
    pub gateways: &'a [Arc<Gateway>],
    pub http_routes: &'a [Arc<HTTPRoute>],
    pub grpc_routes: &'a [Arc<GRPCRoute>],
    pub grants: &'a [Arc<ReferenceGrant>],
    pub namespaces: &'a [Arc<Namespace>],
    pub secrets: &'a [Arc<Secret>],
    pub services: &'a Services<'a>,
    /// The address Gateways report.
    pub address: Ipv4Addr,
}

/// A status to write: the object's kind, namespace and name, and its status as krust
/// sees it (for routes: only the entries of krust's parents).
#[derive(Debug)]
pub struct Report {
    pub kind: &'static str,
    pub namespace: Option<String>,
    pub name: String,
    pub status: Value,
}

#[derive(Debug, Default)]
pub struct Plan {
    pub tables: HashMap<u16, Table>,
    /// Certificates of HTTPS listeners, by the hostnames they serve.
    pub certificates: Vec<(Host, Arc<CertifiedKey>)>,
    pub reports: Vec<Report>,
}

/// The ports krust's Gateways listen on and their protocols: the first listener of a
/// port (oldest Gateway first) decides it.
pub fn ports(world: &World) -> BTreeMap<u16, Protocol> {
    let mut ports = BTreeMap::new();
    for gateway in ours(world) {
        for listener in &gateway.spec.listeners {
            if let (Some(protocol), Ok(port)) =
                (protocol(&listener.protocol), u16::try_from(listener.port))
            {
                ports.entry(port).or_insert(protocol);
            }
        }
    }
    ports
}

fn protocol(name: &str) -> Option<Protocol> {
    match name {
        "HTTP" => Some(Protocol::Http),
        "HTTPS" => Some(Protocol::Https),
        _ => None,
    }
}

/// The classes whose controller is krust.
fn our_classes<'a>(world: &'a World) -> impl Iterator<Item = &'a GatewayClass> {
    (world.classes.iter())
        .filter(|c| c.spec.controller_name == CONTROLLER_NAME)
        .map(|c| &**c)
}

/// krust's Gateways, oldest first.
fn ours<'a>(world: &'a World) -> Vec<&'a Gateway> {
    let classes: Vec<&str> = our_classes(world)
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    let mut gateways: Vec<&Gateway> = (world.gateways.iter())
        .filter(|g| classes.contains(&g.spec.gateway_class_name.as_str()))
        .map(|g| &**g)
        .collect();
    gateways.sort_by_key(|g| (created(&g.metadata), key(&g.metadata)));
    gateways
}

fn created(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<jiff::Timestamp> {
    meta.creation_timestamp.as_ref().map(|t| t.0)
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// One condition as the API writes it; the transition time is now (kept from the
/// object's status when the condition did not change, see `super::status`).
fn condition(kind: &str, ok: bool, reason: &str, message: &str, generation: Option<i64>) -> Value {
    json!({
        "type": kind,
        "status": if ok { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "observedGeneration": generation.unwrap_or(0),
        "lastTransitionTime": jiff::Timestamp::now().round(jiff::Unit::Second).unwrap_or_else(|_| jiff::Timestamp::now()).to_string(),
    })
}

/// A listener as checked: whether routes can attach, and what it reports.
struct Checked<'a> {
    gateway: &'a Gateway,
    listener: &'a Listener,
    port: u16,
    host: Host,
    usable: bool,
    kinds: Vec<&'static str>,
    conditions: Vec<Value>,
    attached: u32,
}

/// Whether `grants` let an object of `from_kind` in `from_ns` refer to `to_kind`
/// (core group when `to_group` is empty) `to_name` in `to_ns`.
fn granted(
    grants: &[Arc<ReferenceGrant>],
    from_kind: &str,
    from_ns: &str,
    to_group: &str,
    to_kind: &str,
    to_ns: &str,
    to_name: &str,
) -> bool {
    from_ns == to_ns
        || grants.iter().any(|g| {
            g.metadata.namespace.as_deref() == Some(to_ns)
                && g.spec
                    .from
                    .iter()
                    .any(|f| f.group == api::GROUP && f.kind == from_kind && f.namespace == from_ns)
                && g.spec.to.iter().any(|t| {
                    t.group == to_group
                        && t.kind == to_kind
                        && t.name.as_deref().is_none_or(|n| n == to_name)
                })
        })
}

impl Plan {
    /// `listening(port, protocol)` says whether the proxy serves that port with that
    /// protocol (`Err`: why not).
    pub fn new(world: &World, listening: &dyn Fn(u16, Protocol) -> Result<(), String>) -> Plan {
        let mut plan = Plan::default();
        for class in our_classes(world) {
            let generation = class.metadata.generation;
            plan.reports.push(Report {
                kind: "GatewayClass",
                namespace: None,
                name: class.metadata.name.clone().unwrap_or_default(),
                status: json!({"conditions": [
                    condition("Accepted", true, "Accepted", "Handled by krust", generation),
                    condition("SupportedVersion", true, "SupportedVersion", "Gateway API v1.3 (standard channel)", generation),
                ]}),
            });
        }
        let mut listeners = plan.check_listeners(world, listening);
        let namespaces: HashMap<&str, &Namespace> = (world.namespaces.iter())
            .filter_map(|n| Some((n.metadata.name.as_deref()?, &**n)))
            .collect();
        let http = world.http_routes.iter().map(|r| compile_http(r, world));
        let grpc = world.grpc_routes.iter().map(|r| compile_grpc(r, world));
        for route in http.chain(grpc) {
            // Reported even without parents of krust's: entries it wrote before go.
            let parents = plan.attach(&route, &mut listeners, &namespaces);
            plan.reports.push(Report {
                kind: route.kind,
                namespace: Some(route.namespace.to_string()),
                name: route.name.to_string(),
                status: json!({"parents": parents}),
            });
        }
        plan.report_gateways(world, listeners);
        plan
    }

    fn check_listeners<'a>(
        &mut self,
        world: &'a World,
        listening: &dyn Fn(u16, Protocol) -> Result<(), String>,
    ) -> Vec<Checked<'a>> {
        let mut checked: Vec<Checked> = Vec::new();
        for gateway in ours(world) {
            let generation = gateway.metadata.generation;
            let cond =
                |kind, ok, reason, message: &str| condition(kind, ok, reason, message, generation);
            for listener in &gateway.spec.listeners {
                let port = u16::try_from(listener.port).unwrap_or(0);
                let host = Host::parse(listener.hostname.as_deref());
                let mut accepted = Ok(());
                let mut refs = Ok(());
                let protocol = protocol(&listener.protocol);
                match protocol {
                    None => {
                        accepted = Err((
                            "UnsupportedProtocol",
                            format!(
                                "protocol {} is not supported; krust serves HTTP and HTTPS",
                                listener.protocol
                            ),
                        ));
                    }
                    Some(Protocol::Https) => match self.certificate(world, gateway, listener) {
                        Ok(key) => self.certificates.push((host.clone(), key)),
                        Err(err) if err.0 == "UnsupportedProtocol" => accepted = Err(err),
                        Err(err) => refs = Err(err),
                    },
                    Some(Protocol::Http) => {}
                }
                let (kinds, bad_kinds) = route_kinds(listener);
                if bad_kinds && refs.is_ok() {
                    refs = Err((
                        "InvalidRouteKinds",
                        "only HTTPRoute and GRPCRoute attach to HTTP and HTTPS listeners"
                            .to_string(),
                    ));
                }
                let earlier = checked.iter().filter(|c| c.port == port);
                let mut conflict = None;
                for c in earlier {
                    if protocol.is_some() && c.listener.protocol != listener.protocol {
                        conflict = Some((
                            "ProtocolConflict",
                            format!(
                                "port {port} is used with protocol {} by listener {} of {}",
                                c.listener.protocol,
                                c.listener.name,
                                key(&c.gateway.metadata)
                            ),
                        ));
                        break;
                    }
                    if c.host == host {
                        conflict = Some((
                            "HostnameConflict",
                            format!(
                                "listener {} of {} serves the same hostname on port {port}",
                                c.listener.name,
                                key(&c.gateway.metadata)
                            ),
                        ));
                        break;
                    }
                }
                if let (Ok(()), Some(protocol)) = (&accepted, protocol)
                    && conflict.is_none()
                    && let Err(why) = listening(port, protocol)
                {
                    accepted = Err(("PortUnavailable", why));
                }
                let usable = accepted.is_ok()
                    && conflict.is_none()
                    && (refs.is_ok() || (bad_kinds && !kinds.is_empty()));
                let mut conditions = vec![match &accepted {
                    Ok(()) => cond("Accepted", true, "Accepted", "Listener accepted"),
                    Err((reason, message)) => cond("Accepted", false, reason, message),
                }];
                conditions.push(match &conflict {
                    None => cond("Conflicted", false, "NoConflicts", "No conflicts"),
                    Some((reason, message)) => cond("Conflicted", true, reason, message),
                });
                conditions.push(match &refs {
                    Ok(()) => cond("ResolvedRefs", true, "ResolvedRefs", "References resolved"),
                    Err((reason, message)) => cond("ResolvedRefs", false, reason, message),
                });
                conditions.push(if usable {
                    cond("Programmed", true, "Programmed", "Listener programmed")
                } else {
                    cond("Programmed", false, "Invalid", "Listener is not valid")
                });
                checked.push(Checked {
                    gateway,
                    listener,
                    port,
                    host,
                    usable,
                    kinds,
                    conditions,
                    attached: 0,
                });
            }
        }
        checked
    }

    /// The key an HTTPS listener serves with, or the reason and message of why not.
    fn certificate(
        &self,
        world: &World,
        gateway: &Gateway,
        listener: &Listener,
    ) -> Result<Arc<CertifiedKey>, (&'static str, String)> {
        let invalid = |message: String| ("InvalidCertificateRef", message);
        let tls = listener
            .tls
            .as_ref()
            .ok_or_else(|| invalid("an HTTPS listener needs tls.certificateRefs".into()))?;
        if tls.mode.as_deref() == Some("Passthrough") {
            return Err((
                "UnsupportedProtocol",
                "TLS passthrough is not supported on HTTPS listeners".into(),
            ));
        }
        let first = tls
            .certificate_refs
            .first()
            .ok_or_else(|| invalid("no certificateRefs".into()))?;
        let gateway_ns = gateway.metadata.namespace.as_deref().unwrap_or_default();
        let ns = first.namespace.as_deref().unwrap_or(gateway_ns);
        if first.group_kind("Secret") != ("", "Secret") {
            return Err(invalid(format!(
                "certificate {} is not a core Secret",
                first.name
            )));
        }
        if !granted(
            world.grants,
            "Gateway",
            gateway_ns,
            "",
            "Secret",
            ns,
            &first.name,
        ) {
            return Err((
                "RefNotPermitted",
                format!(
                    "no ReferenceGrant in {ns} lets Gateways of {gateway_ns} use Secret {}",
                    first.name
                ),
            ));
        }
        let secret = (world.secrets.iter())
            .find(|s| {
                s.metadata.namespace.as_deref() == Some(ns)
                    && s.metadata.name.as_deref() == Some(&first.name)
            })
            .ok_or_else(|| invalid(format!("Secret {ns}/{} not found", first.name)))?;
        crate::tls::certified_key(secret)
            .map(Arc::new)
            .map_err(|e| invalid(format!("Secret {ns}/{}: {e}", first.name)))
    }

    /// Attaches `route` to the listeners it names and allow it; the route's status
    /// entries for krust's parents.
    fn attach(
        &mut self,
        route: &Compiled,
        listeners: &mut [Checked],
        namespaces: &HashMap<&str, &Namespace>,
    ) -> Vec<Value> {
        let mut parents = Vec::new();
        for parent in route.parent_refs {
            let (group, kind) = (
                parent.group.as_deref().unwrap_or(api::GROUP),
                parent.kind.as_deref().unwrap_or("Gateway"),
            );
            let gateway_ns = parent.namespace.as_deref().unwrap_or(route.namespace);
            if (group, kind) != (api::GROUP, "Gateway")
                || !listeners.iter().any(|l| {
                    l.gateway.metadata.namespace.as_deref() == Some(gateway_ns)
                        && l.gateway.metadata.name.as_deref() == Some(&parent.name)
                })
            {
                // Not a Gateway of krust's: another controller's to report on.
                continue;
            }
            let accepted = self.attach_to(route, parent, gateway_ns, listeners, namespaces);
            let cond = |kind, ok, reason, message: &str| {
                condition(kind, ok, reason, message, route.generation)
            };
            let accepted = match accepted {
                Ok(()) => cond("Accepted", true, "Accepted", "Route accepted"),
                Err((reason, message)) => cond("Accepted", false, reason, &message),
            };
            let resolved = match &route.refs {
                Ok(()) => cond("ResolvedRefs", true, "ResolvedRefs", "References resolved"),
                Err((reason, message)) => cond("ResolvedRefs", false, reason, message),
            };
            parents.push(json!({
                "parentRef": parent,
                "controllerName": CONTROLLER_NAME,
                "conditions": [accepted, resolved],
            }));
        }
        parents
    }

    fn attach_to(
        &mut self,
        route: &Compiled,
        parent: &ParentRef,
        gateway_ns: &str,
        listeners: &mut [Checked],
        namespaces: &HashMap<&str, &Namespace>,
    ) -> Result<(), (&'static str, String)> {
        if let Some(problem) = &route.unsupported {
            return Err(("UnsupportedValue", problem.clone()));
        }
        let named: Vec<usize> = (0..listeners.len())
            .filter(|&i| {
                let l = &listeners[i];
                l.gateway.metadata.namespace.as_deref() == Some(gateway_ns)
                    && l.gateway.metadata.name.as_deref() == Some(&parent.name)
                    && parent
                        .section_name
                        .as_ref()
                        .is_none_or(|s| *s == l.listener.name)
                    && parent.port.is_none_or(|p| p == l.listener.port)
            })
            .collect();
        if named.is_empty() {
            return Err((
                "NoMatchingParent",
                "no listener of the Gateway has this sectionName and port".into(),
            ));
        }
        let allowed: Vec<usize> = (named.into_iter())
            .filter(|&i| {
                let l = &listeners[i];
                l.usable
                    && l.kinds.contains(&route.kind)
                    && allows_namespace(l, route.namespace, namespaces)
            })
            .collect();
        if allowed.is_empty() {
            return Err((
                "NotAllowedByListeners",
                "no listener allows this route (kind, namespace, or no valid listener)".into(),
            ));
        }
        let mut attached = false;
        for i in allowed {
            let listener = &mut listeners[i];
            let hosts: Vec<Host> = if route.hostnames.is_empty() {
                vec![listener.host.clone()]
            } else {
                (route.hostnames.iter())
                    .filter_map(|h| listener.host.intersect(h))
                    .collect()
            };
            if hosts.is_empty() {
                continue;
            }
            attached = true;
            listener.attached += 1;
            let table = self.tables.entry(listener.port).or_default();
            for host in hosts {
                for (rule_index, (matches, rule)) in route.rules.iter().enumerate() {
                    for (index, matcher) in matches.iter().enumerate() {
                        let origin = table::Origin {
                            created: route.created,
                            route: &route.key,
                            rule: rule_index,
                            index,
                        };
                        table.add(host.clone(), matcher.clone(), rule.clone(), origin);
                    }
                }
            }
        }
        if attached {
            Ok(())
        } else {
            Err((
                "NoMatchingListenerHostname",
                "no hostname of the route matches a listener's".into(),
            ))
        }
    }

    fn report_gateways(&mut self, world: &World, listeners: Vec<Checked>) {
        let mut by_gateway: Vec<(&Gateway, Vec<Checked>)> = Vec::new();
        for l in listeners {
            match by_gateway
                .iter_mut()
                .find(|(g, _)| std::ptr::eq(*g, l.gateway))
            {
                Some((_, list)) => list.push(l),
                None => by_gateway.push((l.gateway, vec![l])),
            }
        }
        for (gateway, listeners) in by_gateway {
            let generation = gateway.metadata.generation;
            let usable = listeners.iter().filter(|l| l.usable).count();
            let accepted = if usable == listeners.len() {
                condition("Accepted", true, "Accepted", "Gateway accepted", generation)
            } else {
                condition(
                    "Accepted",
                    usable > 0,
                    "ListenersNotValid",
                    &format!(
                        "{} of {} listeners are not valid",
                        listeners.len() - usable,
                        listeners.len()
                    ),
                    generation,
                )
            };
            let programmed = if usable > 0 {
                condition(
                    "Programmed",
                    true,
                    "Programmed",
                    "Gateway programmed",
                    generation,
                )
            } else {
                condition(
                    "Programmed",
                    false,
                    "Invalid",
                    "No listener is valid",
                    generation,
                )
            };
            let statuses: Vec<Value> = listeners
                .iter()
                .map(|l| {
                    json!({
                        "name": l.listener.name,
                        "supportedKinds": l.kinds.iter().map(|k| json!({"group": api::GROUP, "kind": k})).collect::<Vec<_>>(),
                        "attachedRoutes": l.attached,
                        "conditions": l.conditions,
                    })
                })
                .collect();
            self.reports.push(Report {
                kind: "Gateway",
                namespace: gateway.metadata.namespace.clone(),
                name: gateway.metadata.name.clone().unwrap_or_default(),
                status: json!({
                    "addresses": [{"type": "IPAddress", "value": world.address.to_string()}],
                    "conditions": [accepted, programmed],
                    "listeners": statuses,
                }),
            });
        }
    }
}

/// The route kinds a listener takes, and whether it named kinds krust cannot serve.
fn route_kinds(listener: &Listener) -> (Vec<&'static str>, bool) {
    let named = listener
        .allowed_routes
        .as_ref()
        .map(|a| a.kinds.as_slice())
        .unwrap_or_default();
    if named.is_empty() {
        return (vec![HTTP_ROUTE, GRPC_ROUTE], false);
    }
    let mut kinds = Vec::new();
    let mut bad = false;
    for k in named {
        let group_ok = k.group.as_deref().unwrap_or(api::GROUP) == api::GROUP;
        match k.kind.as_str() {
            HTTP_ROUTE if group_ok => kinds.push(HTTP_ROUTE),
            GRPC_ROUTE if group_ok => kinds.push(GRPC_ROUTE),
            _ => bad = true,
        }
    }
    (kinds, bad)
}

/// Whether the listener takes routes from `namespace` (`Same` unless it says).
fn allows_namespace(l: &Checked, namespace: &str, namespaces: &HashMap<&str, &Namespace>) -> bool {
    let from = (l.listener.allowed_routes.as_ref()).and_then(|a| a.namespaces.as_ref());
    match from.and_then(|f| f.from.as_deref()).unwrap_or("Same") {
        "All" => true,
        "Selector" => {
            let Ok(selector) = Selector::parse(from.and_then(|f| f.selector.as_ref())) else {
                return false;
            };
            namespaces.get(namespace).is_some_and(|ns| {
                selector.matches(krust_client::selector::labels_or_empty(&ns.metadata.labels))
            })
        }
        _ => l.gateway.metadata.namespace.as_deref() == Some(namespace),
    }
}

/// A route made ready to attach: its rules compiled, its references resolved.
struct Compiled<'a> {
    kind: &'static str,
    namespace: &'a str,
    name: &'a str,
    key: String,
    created: Option<jiff::Timestamp>,
    generation: Option<i64>,
    parent_refs: &'a [ParentRef],
    hostnames: Vec<Host>,
    rules: Vec<(Vec<Match>, Arc<Rule>)>,
    /// The first reference that did not resolve: reason and message.
    refs: Result<(), (&'static str, String)>,
    /// What krust cannot do for this route (it is then not accepted).
    unsupported: Option<String>,
}

impl<'a> Compiled<'a> {
    fn new(
        kind: &'static str,
        meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        parent_refs: &'a [ParentRef],
        hostnames: &[String],
    ) -> Compiled<'a> {
        Compiled {
            kind,
            namespace: meta.namespace.as_deref().unwrap_or_default(),
            name: meta.name.as_deref().unwrap_or_default(),
            key: key(meta),
            created: created(meta),
            generation: meta.generation,
            parent_refs,
            hostnames: hostnames.iter().map(|h| Host::parse(Some(h))).collect(),
            rules: Vec::new(),
            refs: Ok(()),
            unsupported: None,
        }
    }

    /// A rule's action: filters and backends; `grpc` backends get HTTP/2.
    fn rule(
        &mut self,
        world: &World,
        filters: &[api::Filter],
        backend_refs: &[ObjectRef],
        grpc: bool,
        timeout: Option<Duration>,
    ) -> Rule {
        let mut rule = Rule {
            route: self.key.clone(),
            options: Options {
                body_limit: None,
                grpc,
                read_timeout: timeout.unwrap_or(Options::default().read_timeout),
                ..Options::default()
            },
            ..Rule::default()
        };
        for filter in filters {
            match filter.kind.as_str() {
                "RequestHeaderModifier" => {
                    rule.request_headers = filter.request_header_modifier.clone()
                }
                "ResponseHeaderModifier" => {
                    rule.response_headers = filter.response_header_modifier.clone()
                }
                "RequestRedirect" => {
                    let r = filter.request_redirect.clone().unwrap_or_default();
                    rule.redirect = Some(table::Redirect {
                        scheme: r.scheme,
                        hostname: r.hostname,
                        path: r.path.as_ref().and_then(path_change),
                        port: r.port.and_then(|p| u16::try_from(p).ok()),
                        status: StatusCode::from_u16(r.status_code.unwrap_or(302))
                            .unwrap_or(StatusCode::FOUND),
                    });
                }
                "URLRewrite" => {
                    let r = filter.url_rewrite.clone().unwrap_or_default();
                    rule.rewrite_host = r.hostname;
                    rule.rewrite_path = r.path.as_ref().and_then(path_change);
                }
                "ExtensionRef" => {
                    rule.unsupported = Some("ExtensionRef".into());
                    self.refs_failed(
                        "InvalidKind",
                        "ExtensionRef filters are not supported".into(),
                    );
                }
                other => self.unsupported = Some(format!("filter {other} is not supported")),
            }
        }
        for backend in backend_refs {
            let weight = u32::try_from(backend.weight.unwrap_or(1)).unwrap_or(0);
            let resolved = self.backend(world, backend);
            rule.backends.push((resolved, weight));
        }
        rule
    }

    fn refs_failed(&mut self, reason: &'static str, message: String) {
        if self.refs.is_ok() {
            self.refs = Err((reason, message));
        }
    }

    /// A backend reference resolved to a Service port's endpoints, or why it cannot be.
    fn backend(
        &mut self,
        world: &World,
        backend: &ObjectRef,
    ) -> Result<crate::routes::Backend, String> {
        let ns = backend.namespace.as_deref().unwrap_or(self.namespace);
        let name = &backend.name;
        let failure = if backend.group_kind("Service") != ("", "Service") {
            Some((
                "InvalidKind",
                format!("backend {name} is not a core Service"),
            ))
        } else if !granted(
            world.grants,
            self.kind,
            self.namespace,
            "",
            "Service",
            ns,
            name,
        ) {
            Some((
                "RefNotPermitted",
                format!(
                    "no ReferenceGrant in {ns} lets {}s of {} refer to Service {name}",
                    self.kind, self.namespace
                ),
            ))
        } else if !world.services.exists(ns, name) {
            Some(("BackendNotFound", format!("Service {ns}/{name} not found")))
        } else {
            None
        };
        if let Some((reason, message)) = failure {
            self.refs_failed(reason, message.clone());
            return Err(message);
        }
        let resolved = backend.port.and_then(|port| {
            world
                .services
                .backend(ns, name, ServicePort::Number(port), &self.key)
        });
        resolved.ok_or_else(|| {
            let message = format!(
                "Service {ns}/{name} has no port {}",
                backend.port.unwrap_or(0)
            );
            self.refs_failed("BackendNotFound", message.clone());
            message
        })
    }

    fn bad_value(&mut self, message: String) {
        self.unsupported.get_or_insert(message);
    }

    fn regex(&mut self, pattern: &str) -> Option<Regex> {
        match Regex::new(&format!("^(?:{pattern})$")) {
            Ok(re) => Some(re),
            Err(err) => {
                self.bad_value(format!("{pattern:?} is not a regular expression: {err}"));
                None
            }
        }
    }

    fn value_rule(&mut self, m: &api::ValueMatch) -> Option<ValueRule> {
        match m.kind.as_deref() {
            Some("RegularExpression") => self.regex(&m.value).map(ValueRule::Regex),
            _ => Some(ValueRule::Exact(m.value.clone())),
        }
    }

    fn headers(&mut self, headers: &[api::ValueMatch]) -> Vec<(HeaderName, ValueRule)> {
        let mut out = Vec::new();
        for h in headers {
            let Ok(name) = HeaderName::from_bytes(h.name.to_ascii_lowercase().as_bytes()) else {
                self.bad_value(format!("{:?} is not a header name", h.name));
                continue;
            };
            if let Some(rule) = self.value_rule(h) {
                out.push((name, rule));
            }
        }
        out
    }
}

fn path_change(m: &api::PathModifier) -> Option<PathChange> {
    match m.kind.as_str() {
        "ReplaceFullPath" => Some(PathChange::Full(
            m.replace_full_path.clone().unwrap_or_else(|| "/".into()),
        )),
        "ReplacePrefixMatch" => Some(PathChange::Prefix(
            m.replace_prefix_match.clone().unwrap_or_else(|| "/".into()),
        )),
        _ => None,
    }
}

/// Upstream's duration format (`1h2m3s`, `500ms`).
fn duration(text: &str) -> Option<Duration> {
    let re = Regex::new(r"([0-9]+)(h|ms|m|s)").ok()?;
    let mut total = Duration::ZERO;
    for c in re.captures_iter(text) {
        let n: u64 = c[1].parse().ok()?;
        total += match &c[2] {
            "h" => Duration::from_secs(n * 3600),
            "m" => Duration::from_secs(n * 60),
            "s" => Duration::from_secs(n),
            _ => Duration::from_millis(n),
        };
    }
    // Zero means no timeout, as the API says.
    (!total.is_zero()).then_some(total)
}

/// The list, or one item of defaults when it is empty (a rule without matches matches
/// every request; a route without rules has one such rule).
fn or_default<T: Default + Clone>(list: &[T]) -> std::borrow::Cow<'_, [T]> {
    if list.is_empty() {
        std::borrow::Cow::Owned(vec![T::default()])
    } else {
        std::borrow::Cow::Borrowed(list)
    }
}

fn compile_http<'a>(route: &'a HTTPRoute, world: &World) -> Compiled<'a> {
    let spec = &route.spec;
    let mut c = Compiled::new(
        HTTP_ROUTE,
        &route.metadata,
        &spec.parent_refs,
        &spec.hostnames,
    );
    let rules = or_default(&spec.rules);
    for r in rules.iter() {
        let timeout = (r.timeouts.as_ref())
            .and_then(|t| t.request.as_deref().or(t.backend_request.as_deref()))
            .and_then(duration);
        let rule = c.rule(world, &r.filters, &r.backend_refs, false, timeout);
        let matches = or_default(&r.matches);
        let mut compiled = Vec::new();
        for m in matches.iter() {
            let value = m
                .path
                .as_ref()
                .and_then(|p| p.value.clone())
                .unwrap_or_else(|| "/".into());
            let path = match m.path.as_ref().and_then(|p| p.kind.as_deref()) {
                Some("Exact") => PathRule::Exact(value),
                Some("RegularExpression") => match c.regex(&value) {
                    Some(re) => PathRule::Regex(re),
                    None => continue,
                },
                _ => PathRule::Prefix(value.trim_end_matches('/').to_string()),
            };
            let method = match m
                .method
                .as_deref()
                .map(|m| Method::from_bytes(m.as_bytes()))
            {
                None => None,
                Some(Ok(method)) => Some(method),
                Some(Err(_)) => {
                    c.bad_value(format!("{:?} is not a method", m.method));
                    continue;
                }
            };
            let headers = c.headers(&m.headers);
            let mut query = Vec::new();
            for q in &m.query_params {
                if let Some(rule) = c.value_rule(q) {
                    query.push((q.name.clone(), rule));
                }
            }
            compiled.push(Match {
                path,
                method,
                headers,
                query,
            });
        }
        c.rules.push((compiled, Arc::new(rule)));
    }
    c
}

fn compile_grpc<'a>(route: &'a GRPCRoute, world: &World) -> Compiled<'a> {
    let spec = &route.spec;
    let mut c = Compiled::new(
        GRPC_ROUTE,
        &route.metadata,
        &spec.parent_refs,
        &spec.hostnames,
    );
    let rules = or_default(&spec.rules);
    for r in rules.iter() {
        let rule = c.rule(world, &r.filters, &r.backend_refs, true, None);
        let matches = or_default(&r.matches);
        let mut compiled = Vec::new();
        for m in matches.iter() {
            // A gRPC call is a POST to `/<service>/<method>`.
            let method = m.method.clone().unwrap_or_default();
            let path = match (method.kind.as_deref(), &method.service, &method.method) {
                (Some("RegularExpression"), service, name) => {
                    let service = service.as_deref().unwrap_or("[^/]+");
                    let name = name.as_deref().unwrap_or("[^/]+");
                    match c.regex(&format!("/(?:{service})/(?:{name})")) {
                        Some(re) => PathRule::Regex(re),
                        None => continue,
                    }
                }
                (_, Some(service), Some(name)) => PathRule::Exact(format!("/{service}/{name}")),
                (_, Some(service), None) => PathRule::Prefix(format!("/{service}")),
                (_, None, Some(name)) => {
                    match c.regex(&format!("/[^/]+/{}", regex::escape(name))) {
                        Some(re) => PathRule::Regex(re),
                        None => continue,
                    }
                }
                (_, None, None) => PathRule::Prefix(String::new()),
            };
            let headers = c.headers(&m.headers);
            compiled.push(Match {
                path,
                method: None,
                headers,
                query: Vec::new(),
            });
        }
        c.rules.push((compiled, Arc::new(rule)));
    }
    c
}
