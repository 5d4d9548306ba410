//! What the data plane must do, from the API objects: for every port of every Service
//! with a cluster IP, the addresses it answers on and the endpoints traffic goes to —
//! all of them, or only this node's where a traffic policy says `Local`. Pure functions
//! of Services and EndpointSlices, as kube-proxy's change trackers are.

use std::net::{Ipv4Addr, SocketAddrV4};

use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use krust_api::cidr::Ipv4Block;
use krust_client::endpoints::{ipv4_slices_by_service, is_ready};

pub use krust_net::nft::Protocol;

/// A Service's `internalTrafficPolicy` (traffic to its cluster IP) or
/// `externalTrafficPolicy` (to its NodePorts, external IPs and load balancer addresses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// To any endpoint in the cluster.
    #[default]
    Cluster,
    /// To this node's endpoints only (dropped when it has none); external traffic keeps
    /// the client's source address.
    Local,
}

impl TrafficPolicy {
    fn parse(s: Option<&str>) -> TrafficPolicy {
        match s {
            Some("Local") => TrafficPolicy::Local,
            _ => TrafficPolicy::Cluster,
        }
    }
}

/// One port of one Service, as the data plane serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub namespace: String,
    pub service: String,
    /// The port's name, or its number for an unnamed port.
    pub port_name: String,
    pub protocol: Protocol,
    pub cluster_ip: Ipv4Addr,
    /// External IPs and load balancer addresses.
    pub external_ips: Vec<Ipv4Addr>,
    pub port: u16,
    pub node_port: Option<u16>,
    /// Where connections go; empty means they are rejected.
    pub endpoints: Vec<SocketAddrV4>,
    /// The endpoints on this node, chosen the same way (ready, else terminating).
    pub local_endpoints: Vec<SocketAddrV4>,
    /// Whether those are ready ones (not only terminating): what health checks count.
    pub local_ready: bool,
    pub internal_policy: TrafficPolicy,
    pub external_policy: TrafficPolicy,
    /// `sessionAffinity: ClientIP`: for how many seconds a client keeps its endpoint.
    pub affinity_seconds: Option<u32>,
    /// Who may reach the load balancer addresses, when the Service limits it.
    pub firewall: Option<Firewall>,
}

/// `loadBalancerSourceRanges`: the only clients a Service's load balancer addresses
/// accept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Firewall {
    /// The load balancer addresses (also among the port's `external_ips`).
    pub addresses: Vec<Ipv4Addr>,
    /// The ranges allowed; never empty.
    pub allowed: Vec<Ipv4Block>,
}

impl Firewall {
    /// The Service's firewall: its `loadBalancerSourceRanges`, else the older
    /// `service.beta.kubernetes.io/load-balancer-source-ranges` annotation (a comma
    /// separated list), as upstream reads them; none without ranges or addresses.
    fn of(svc: &Service, spec: &ServiceSpec, addresses: Vec<Ipv4Addr>) -> Option<Firewall> {
        let annotation = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("service.beta.kubernetes.io/load-balancer-source-ranges"));
        let ranges: Vec<&str> = match &spec.load_balancer_source_ranges {
            Some(ranges) if !ranges.is_empty() => ranges.iter().map(String::as_str).collect(),
            _ => annotation.map_or(Vec::new(), |a| a.split(',').collect()),
        };
        let allowed: Vec<Ipv4Block> = ranges.iter().filter_map(|r| r.parse().ok()).collect();
        (!allowed.is_empty() && !addresses.is_empty()).then_some(Firewall { addresses, allowed })
    }
}

/// Every Service port with a cluster IP (headless and ExternalName Services have none),
/// ordered by namespace, name and port; endpoints on `node_name` are this node's.
pub fn service_ports<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node_name: &str,
) -> Vec<ServicePort> {
    let by_service = ipv4_slices_by_service(slices);
    let mut ports = Vec::new();
    for svc in services {
        let Some((namespace, name, spec)) = parts(svc) else {
            continue;
        };
        if spec.type_.as_deref() == Some("ExternalName") {
            continue;
        }
        let cluster_ip = spec
            .cluster_ip
            .as_deref()
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        let Some(cluster_ip) = cluster_ip else {
            continue;
        };
        let mut external_ips: Vec<Ipv4Addr> = Vec::new();
        external_ips.extend(
            spec.external_ips
                .iter()
                .flatten()
                .filter_map(|ip| ip.parse::<Ipv4Addr>().ok()),
        );
        // Load balancer addresses, as kube-proxy programs them (not those whose
        // balancer proxies the traffic itself: ipMode Proxy).
        let balancer_ips: Vec<Ipv4Addr> = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
            .filter_map(|i| i.ip.as_deref()?.parse::<Ipv4Addr>().ok())
            .collect();
        external_ips.extend(&balancer_ips);
        let firewall = Firewall::of(svc, spec, balancer_ips);
        let slices = by_service
            .get(&(namespace, name))
            .map(Vec::as_slice)
            .unwrap_or_default();
        for p in spec.ports.iter().flatten() {
            let (Some(protocol), Ok(port)) = (
                Protocol::parse(p.protocol.as_deref()),
                u16::try_from(p.port),
            ) else {
                continue;
            };
            let port_name = p.name.clone().unwrap_or_default();
            let (everywhere, _) = endpoints(slices, &port_name, protocol, |_| true);
            let (here, local_ready) = endpoints(slices, &port_name, protocol, |e| {
                e.node_name.as_deref() == Some(node_name)
            });
            ports.push(ServicePort {
                namespace: namespace.to_string(),
                service: name.to_string(),
                endpoints: everywhere,
                local_endpoints: here,
                local_ready,
                port_name: if port_name.is_empty() {
                    port.to_string()
                } else {
                    port_name
                },
                protocol,
                cluster_ip,
                external_ips: external_ips.clone(),
                port,
                node_port: p.node_port.and_then(|n| u16::try_from(n).ok()),
                internal_policy: TrafficPolicy::parse(spec.internal_traffic_policy.as_deref()),
                external_policy: TrafficPolicy::parse(spec.external_traffic_policy.as_deref()),
                affinity_seconds: affinity_seconds(spec),
                firewall: firewall.clone(),
            });
        }
    }
    ports.sort_by(|a, b| {
        (&a.namespace, &a.service, a.port, a.protocol).cmp(&(
            &b.namespace,
            &b.service,
            b.port,
            b.protocol,
        ))
    });
    ports
}

/// How long a client sticks to its endpoint under `sessionAffinity: ClientIP` (upstream's
/// default: 10,800 s, three hours).
fn affinity_seconds(spec: &ServiceSpec) -> Option<u32> {
    if spec.session_affinity.as_deref() != Some("ClientIP") {
        return None;
    }
    let timeout = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
        .and_then(|t| u32::try_from(t).ok())
        .filter(|t| *t > 0);
    Some(timeout.unwrap_or(10_800))
}

/// A Service's namespace, name and spec, if it has all three.
pub(crate) fn parts(svc: &Service) -> Option<(&str, &str, &ServiceSpec)> {
    Some((
        svc.metadata.namespace.as_deref()?,
        svc.metadata.name.as_deref()?,
        svc.spec.as_ref()?,
    ))
}

/// The endpoints of a Service port that `wanted` accepts: the ready ones; when none is
/// ready, the serving ones that are terminating (so connections drain to pods that are
/// shutting down rather than fail, as upstream's kube-proxy does). True with ready ones.
fn endpoints(
    slices: &[&EndpointSlice],
    port_name: &str,
    protocol: Protocol,
    wanted: impl Fn(&Endpoint) -> bool,
) -> (Vec<SocketAddrV4>, bool) {
    let mut ready = Vec::new();
    let mut terminating = Vec::new();
    for slice in slices {
        let port = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or_default() == port_name
                && Protocol::parse(p.protocol.as_deref()) == Some(protocol)
        });
        let Some(port) = port
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for endpoint in slice.endpoints.iter().filter(|e| wanted(e)) {
            let Some(ip) = endpoint
                .addresses
                .first()
                .and_then(|a| a.parse::<Ipv4Addr>().ok())
            else {
                continue;
            };
            let addr = SocketAddrV4::new(ip, port);
            match state(endpoint) {
                State::Ready => ready.push(addr),
                State::Terminating => terminating.push(addr),
                State::Out => {}
            }
        }
    }
    let any_ready = !ready.is_empty();
    let mut chosen = if any_ready { ready } else { terminating };
    chosen.sort();
    chosen.dedup();
    (chosen, any_ready)
}

enum State {
    Ready,
    /// Serving while terminating: used only when nothing is ready.
    Terminating,
    Out,
}

/// An endpoint's conditions; absent ones mean ready and serving, not terminating.
fn state(endpoint: &Endpoint) -> State {
    let c = endpoint.conditions.as_ref();
    let ready = is_ready(endpoint);
    let serving = c.and_then(|c| c.serving).unwrap_or(ready);
    let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
    if ready && !terminating {
        State::Ready
    } else if serving && terminating {
        State::Terminating
    } else {
        State::Out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use krust_client::endpoints::SERVICE_NAME_LABEL;
    use serde_json::json;

    fn service(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn slice(
        service: &str,
        port: serde_json::Value,
        endpoints: serde_json::Value,
    ) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": format!("{service}-x"),
                         "labels": {SERVICE_NAME_LABEL: service}},
            "addressType": "IPv4",
            "ports": [port],
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    fn ep(ip: &str, ready: bool, serving: bool, terminating: bool) -> serde_json::Value {
        json!({"addresses": [ip],
               "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
    }

    #[test]
    fn ports_get_their_cluster_ip_external_and_balancer_addresses_node_port_and_ready_endpoints() {
        let web = service(json!({
            "metadata": {"namespace": "default", "name": "web"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.43.0.20", "externalIPs": ["192.0.2.9"],
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080},
                               {"name": "dns", "port": 53, "protocol": "UDP"}]},
            "status": {"loadBalancer": {"ingress": [
                {"ip": "192.0.2.10", "ipMode": "VIP"}, {"ip": "192.0.2.11"},
                {"ip": "192.0.2.12", "ipMode": "Proxy"}, {"hostname": "lb.example"}]}},
        }));
        let slices = [
            slice(
                "web",
                json!({"name": "http", "port": 8080, "protocol": "TCP"}),
                json!([ep("10.42.0.5", true, true, false), ep("10.42.0.4", false, false, false),
                       {"addresses": ["10.42.0.6"]}]),
            ),
            slice(
                "web",
                json!({"name": "dns", "port": 5353, "protocol": "UDP"}),
                json!([ep("10.42.0.5", true, true, false)]),
            ),
            slice(
                "other",
                json!({"name": "http", "port": 1}),
                json!([ep("10.42.0.9", true, true, false)]),
            ),
        ];
        let ports = service_ports([&web], &slices, "n1");
        assert_eq!(ports.len(), 2);
        let dns = &ports[0];
        assert_eq!(
            (dns.port, dns.protocol, dns.node_port),
            (53, Protocol::Udp, None)
        );
        assert_eq!(dns.endpoints, ["10.42.0.5:5353".parse().unwrap()]);
        let http = &ports[1];
        assert_eq!(http.port_name, "http");
        assert_eq!(http.cluster_ip, "10.43.0.20".parse::<Ipv4Addr>().unwrap());
        assert_eq!(
            http.external_ips,
            [
                "192.0.2.9".parse::<Ipv4Addr>().unwrap(),
                "192.0.2.10".parse().unwrap(),
                "192.0.2.11".parse().unwrap(),
            ],
            "external IPs and load balancer addresses, not those of a proxying balancer"
        );
        assert_eq!(http.node_port, Some(30080));
        assert_eq!(
            http.endpoints,
            [
                "10.42.0.5:8080".parse().unwrap(),
                "10.42.0.6:8080".parse().unwrap()
            ],
            "not-ready endpoints are left out; absent conditions mean ready"
        );
    }

    #[test]
    fn terminating_endpoints_serve_only_when_none_is_ready() {
        let web = service(json!({
            "metadata": {"namespace": "default", "name": "web"},
            "spec": {"clusterIP": "10.43.0.20", "ports": [{"port": 80}]},
        }));
        let draining = slice(
            "web",
            json!({"port": 8080}),
            json!([
                ep("10.42.0.5", false, true, true),
                ep("10.42.0.6", false, false, true)
            ]),
        );
        let ports = service_ports([&web], [&draining], "n1");
        assert_eq!(ports[0].port_name, "80");
        assert_eq!(ports[0].endpoints, ["10.42.0.5:8080".parse().unwrap()]);
        let both = slice(
            "web",
            json!({"port": 8080}),
            json!([
                ep("10.42.0.5", false, true, true),
                ep("10.42.0.7", true, true, false)
            ]),
        );
        let ports = service_ports([&web], [&both], "n1");
        assert_eq!(ports[0].endpoints, ["10.42.0.7:8080".parse().unwrap()]);
    }

    #[test]
    fn source_ranges_guard_only_load_balancer_addresses() {
        let lb = |extra: serde_json::Value, annotations: serde_json::Value| {
            let mut spec = json!({"type": "LoadBalancer", "clusterIP": "10.43.0.20",
                "externalIPs": ["192.0.2.9"], "ports": [{"port": 80}]});
            spec.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            service(json!({
                "metadata": {"namespace": "default", "name": "web", "annotations": annotations},
                "spec": spec,
                "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}},
            }))
        };
        let firewall = |svc: &Service| service_ports([svc], [], "n1")[0].firewall.clone();
        assert_eq!(firewall(&lb(json!({}), json!({}))), None);
        let ranges =
            json!({"loadBalancerSourceRanges": ["10.1.2.3/8", "198.51.100.7/32", "bogus"]});
        let guarded = firewall(&lb(ranges, json!({}))).unwrap();
        assert_eq!(
            guarded.addresses,
            ["192.0.2.10".parse::<Ipv4Addr>().unwrap()]
        );
        let allowed: Vec<String> = guarded.allowed.iter().map(ToString::to_string).collect();
        assert_eq!(allowed, ["10.0.0.0/8", "198.51.100.7/32"]);
        // The older annotation, when the field is empty.
        let annotated = json!({"service.beta.kubernetes.io/load-balancer-source-ranges":
            "203.0.113.0/24, 10.0.0.0/16"});
        let allowed: Vec<String> = firewall(&lb(json!({}), annotated))
            .unwrap()
            .allowed
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(allowed, ["203.0.113.0/24", "10.0.0.0/16"]);
    }

    #[test]
    fn client_ip_affinity_keeps_its_timeout_or_upstreams_three_hours() {
        let spec = |extra: serde_json::Value| {
            let mut spec = json!({"clusterIP": "10.43.0.20", "ports": [{"port": 80}]});
            spec.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            service(json!({"metadata": {"namespace": "default", "name": "web"}, "spec": spec}))
        };
        let affinity = |svc: &Service| service_ports([svc], [], "n1")[0].affinity_seconds;
        assert_eq!(affinity(&spec(json!({}))), None);
        assert_eq!(affinity(&spec(json!({"sessionAffinity": "None"}))), None);
        assert_eq!(
            affinity(&spec(json!({"sessionAffinity": "ClientIP"}))),
            Some(10_800)
        );
        assert_eq!(
            affinity(&spec(json!({"sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}))),
            Some(60)
        );
    }

    #[test]
    fn headless_and_external_name_services_have_no_rules() {
        let headless = service(json!({
            "metadata": {"namespace": "default", "name": "h"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]},
        }));
        let external = service(json!({
            "metadata": {"namespace": "default", "name": "e"},
            "spec": {"type": "ExternalName", "externalName": "example.com"},
        }));
        assert!(service_ports([&headless, &external], [], "n1").is_empty());
    }

    #[test]
    fn local_endpoints_are_this_nodes_chosen_as_the_others_and_policies_are_read() {
        let web = service(json!({
            "metadata": {"namespace": "default", "name": "web"},
            "spec": {"type": "NodePort", "clusterIP": "10.43.0.20", "ports": [{"port": 80}],
                     "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster"},
        }));
        let on = |mut e: serde_json::Value, node: &str| {
            e["nodeName"] = json!(node);
            e
        };
        let slices = [slice(
            "web",
            json!({"port": 8080}),
            json!([
                on(ep("10.42.0.5", true, true, false), "n2"),
                on(ep("10.42.1.6", false, true, true), "n1"),
                ep("10.42.2.7", true, true, false),
            ]),
        )];
        let ports = service_ports([&web], &slices, "n1");
        let port = &ports[0];
        assert_eq!(port.external_policy, TrafficPolicy::Local);
        assert_eq!(port.internal_policy, TrafficPolicy::Cluster);
        assert_eq!(
            port.endpoints,
            [
                "10.42.0.5:8080".parse().unwrap(),
                "10.42.2.7:8080".parse().unwrap()
            ]
        );
        assert_eq!(
            port.local_endpoints,
            ["10.42.1.6:8080".parse().unwrap()],
            "this node's only endpoint drains while terminating, as upstream's"
        );
        assert!(!port.local_ready, "and health checks do not count it");
        let ports = service_ports([&web], &slices, "n3");
        assert!(ports[0].local_endpoints.is_empty());
    }
}
