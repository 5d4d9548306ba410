//! The cluster's names, after the Kubernetes DNS specification: a snapshot of Services
//! and EndpointSlices, and what a question about a name in the cluster domain (or a
//! reverse name) gets.
//!
//! - `<svc>.<ns>.svc.<domain>`: A of the cluster IP; for a headless Service, A of every
//!   ready endpoint; CNAME (for questions of any type) for an ExternalName Service.
//! - `<hostname>.<svc>.<ns>.svc.<domain>` (or the endpoint's dashed IP): A of one
//!   endpoint of a headless Service.
//! - `_<port>._<proto>.<svc>.<ns>.svc.<domain>`: SRV of a named port, pointing at the
//!   Service (or at each endpoint of a headless one).
//! - `<a-b-c-d>.<ns>.pod.<domain>`: A of that address (CoreDNS's `pods insecure`).
//! - `<d>.<c>.<b>.<a>.in-addr.arpa`: PTR of a cluster IP or of a named endpoint.
//!
//! Names under the domain that exist only as parents of others get an empty answer
//! (NODATA); other names under it do not exist (NXDOMAIN); names elsewhere, and reverse
//! names of addresses the cluster does not know, are forwarded upstream.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use krust_client::endpoints::{ipv4_slices_by_service, is_ready};

/// One answer record. Names are absolute and lowercase (`web.default.svc.cluster.local.`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    A(String, Ipv4Addr),
    Cname(String, String),
    Ptr(String, String),
    Srv {
        name: String,
        port: u16,
        target: String,
    },
}

/// What a question gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Records(Vec<Record>),
    /// The name exists, without records of the asked type.
    NoData,
    NxDomain,
    /// Not the cluster's to answer.
    Forward,
}

/// The record types the cluster answers for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryType {
    A,
    Srv,
    Ptr,
    Cname,
    /// Anything else: names still exist or not, but have no such records.
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Port {
    name: String,
    protocol: String,
    port: u16,
}

#[derive(Clone, Debug)]
struct Endpoint {
    ip: Ipv4Addr,
    hostname: Option<String>,
}

impl Endpoint {
    /// The endpoint's own label: its hostname, or its address with dashes.
    fn label(&self) -> String {
        self.hostname
            .clone()
            .unwrap_or_else(|| self.ip.to_string().replace('.', "-"))
    }
}

#[derive(Clone, Debug)]
enum Entry {
    ClusterIp(Ipv4Addr, Vec<Port>),
    Headless(Vec<Endpoint>, Vec<Port>),
    External(String),
}

/// A snapshot of the cluster's names.
#[derive(Debug, Default)]
pub struct Zone {
    /// `cluster.local.`
    domain: String,
    services: HashMap<(String, String), Entry>,
    namespaces: BTreeSet<String>,
    reverse: HashMap<Ipv4Addr, String>,
}

impl Zone {
    pub fn new<'a>(
        domain: &str,
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
    ) -> Zone {
        let domain = format!("{}.", domain.trim_end_matches('.').to_lowercase());
        let mut endpoints: HashMap<(&str, &str), Vec<Endpoint>> = HashMap::new();
        let mut endpoint_ports: HashMap<(&str, &str), Vec<Port>> = HashMap::new();
        for (slice, &(ns, svc)) in ipv4_slices_by_service(slices)
            .iter()
            .flat_map(|(key, slices)| slices.iter().map(move |s| (*s, key)))
        {
            let ports = endpoint_ports.entry((ns, svc)).or_default();
            for p in slice.ports.iter().flatten() {
                let port = Port {
                    name: p.name.clone().unwrap_or_default(),
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    port: p.port.and_then(|p| u16::try_from(p).ok()).unwrap_or(0),
                };
                if !ports.contains(&port) {
                    ports.push(port);
                }
            }
            let list = endpoints.entry((ns, svc)).or_default();
            for e in &slice.endpoints {
                let Some(ip) = e.addresses.first().and_then(|a| a.parse().ok()) else {
                    continue;
                };
                if is_ready(e) && !list.iter().any(|x: &Endpoint| x.ip == ip) {
                    list.push(Endpoint {
                        ip,
                        hostname: e.hostname.clone(),
                    });
                }
            }
        }
        let mut zone = Zone {
            domain,
            ..Zone::default()
        };
        for svc in services {
            let (Some(ns), Some(name), Some(spec)) = (
                svc.metadata.namespace.as_deref(),
                svc.metadata.name.as_deref(),
                svc.spec.as_ref(),
            ) else {
                continue;
            };
            let fqdn = format!("{name}.{ns}.svc.{}", zone.domain);
            let service_ports: Vec<Port> = spec
                .ports
                .iter()
                .flatten()
                .map(|p| Port {
                    name: p.name.clone().unwrap_or_default(),
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    port: u16::try_from(p.port).unwrap_or(0),
                })
                .collect();
            let entry = if spec.type_.as_deref() == Some("ExternalName") {
                let Some(target) = spec.external_name.as_deref() else {
                    continue;
                };
                Entry::External(format!("{}.", target.trim_end_matches('.').to_lowercase()))
            } else {
                match spec.cluster_ip.as_deref() {
                    Some("None") => {
                        let eps = endpoints.remove(&(ns, name)).unwrap_or_default();
                        for ep in &eps {
                            if ep.hostname.is_some() {
                                zone.reverse.insert(ep.ip, format!("{}.{fqdn}", ep.label()));
                            }
                        }
                        let ports = endpoint_ports.remove(&(ns, name)).unwrap_or_default();
                        Entry::Headless(eps, ports)
                    }
                    Some(ip) => match ip.parse::<Ipv4Addr>() {
                        Ok(ip) => {
                            zone.reverse.insert(ip, fqdn);
                            Entry::ClusterIp(ip, service_ports)
                        }
                        Err(_) => continue,
                    },
                    None => continue,
                }
            };
            zone.namespaces.insert(ns.to_string());
            zone.services
                .insert((ns.to_string(), name.to_string()), entry);
        }
        zone
    }

    /// The answer to a question about `name` (any case, with or without the final dot).
    pub fn lookup(&self, name: &str, qtype: QueryType) -> Answer {
        let name = format!("{}.", name.trim_end_matches('.').to_lowercase());
        if let Some(reversed) = name.strip_suffix(".in-addr.arpa.") {
            return self.reverse(reversed, qtype);
        }
        let local = match name.strip_suffix(&self.domain) {
            Some(local) if local.is_empty() || local.ends_with('.') => local,
            _ => return Answer::Forward,
        };
        // Labels from the right: `web.default.svc.` -> ["svc", "default", "web"].
        let labels: Vec<&str> = local.trim_end_matches('.').rsplit('.').collect();
        match labels.as_slice() {
            [] | [""] => Answer::NoData,
            ["svc"] | ["pod"] => Answer::NoData,
            ["svc", ns] | ["pod", ns] => {
                if self.namespaces.contains(*ns) {
                    Answer::NoData
                } else {
                    Answer::NxDomain
                }
            }
            ["pod", _, dashed] => match dashed.replace('-', ".").parse::<Ipv4Addr>() {
                Ok(ip) => only(qtype, QueryType::A, Record::A(name.clone(), ip)),
                Err(_) => Answer::NxDomain,
            },
            ["svc", ns, svc] => self.service(&name, ns, svc, qtype),
            ["svc", ns, svc, endpoint] => self.endpoint(&name, ns, svc, endpoint, qtype),
            ["svc", ns, svc, proto, port] => self.srv(&name, ns, svc, proto, port, qtype),
            _ => Answer::NxDomain,
        }
    }

    fn entry(&self, ns: &str, svc: &str) -> Option<&Entry> {
        self.services.get(&(ns.to_string(), svc.to_string()))
    }

    fn service(&self, name: &str, ns: &str, svc: &str, qtype: QueryType) -> Answer {
        match (self.entry(ns, svc), qtype) {
            (None, _) => Answer::NxDomain,
            // A CNAME answers questions of every type; the server adds the target's
            // records.
            (Some(Entry::External(target)), _) => {
                Answer::Records(vec![Record::Cname(name.to_string(), target.clone())])
            }
            (Some(Entry::ClusterIp(ip, _)), QueryType::A) => {
                Answer::Records(vec![Record::A(name.to_string(), *ip)])
            }
            (Some(Entry::Headless(eps, _)), QueryType::A) if !eps.is_empty() => Answer::Records(
                eps.iter()
                    .map(|e| Record::A(name.to_string(), e.ip))
                    .collect(),
            ),
            (Some(Entry::Headless(eps, _)), _) if eps.is_empty() => Answer::NxDomain,
            _ => Answer::NoData,
        }
    }

    fn endpoint(&self, name: &str, ns: &str, svc: &str, label: &str, qtype: QueryType) -> Answer {
        let Some(Entry::Headless(eps, _)) = self.entry(ns, svc) else {
            return Answer::NxDomain;
        };
        match eps.iter().find(|e| e.label() == label) {
            Some(e) => only(qtype, QueryType::A, Record::A(name.to_string(), e.ip)),
            None => Answer::NxDomain,
        }
    }

    fn srv(
        &self,
        name: &str,
        ns: &str,
        svc: &str,
        proto: &str,
        port: &str,
        qtype: QueryType,
    ) -> Answer {
        let (Some(proto), Some(port_name)) = (proto.strip_prefix('_'), port.strip_prefix('_'))
        else {
            return Answer::NxDomain;
        };
        let fqdn = format!("{svc}.{ns}.svc.{}", self.domain);
        let (ports, targets): (&[Port], Vec<String>) = match self.entry(ns, svc) {
            Some(Entry::ClusterIp(_, ports)) => (ports, vec![fqdn]),
            Some(Entry::Headless(eps, ports)) => (
                ports,
                eps.iter()
                    .map(|e| format!("{}.{fqdn}", e.label()))
                    .collect(),
            ),
            _ => return Answer::NxDomain,
        };
        let Some(port) = ports.iter().find(|p| {
            !p.name.is_empty() && p.name == port_name && p.protocol.eq_ignore_ascii_case(proto)
        }) else {
            return Answer::NxDomain;
        };
        if qtype != QueryType::Srv || targets.is_empty() {
            return Answer::NoData;
        }
        Answer::Records(
            targets
                .into_iter()
                .map(|target| Record::Srv {
                    name: name.to_string(),
                    port: port.port,
                    target,
                })
                .collect(),
        )
    }

    fn reverse(&self, reversed: &str, qtype: QueryType) -> Answer {
        let octets: Vec<&str> = reversed.split('.').rev().collect();
        let ip = match octets.join(".").parse::<Ipv4Addr>() {
            Ok(ip) if octets.len() == 4 => ip,
            _ => return Answer::Forward,
        };
        match self.reverse.get(&ip) {
            Some(target) => only(
                qtype,
                QueryType::Ptr,
                Record::Ptr(format!("{reversed}.in-addr.arpa."), target.clone()),
            ),
            None => Answer::Forward,
        }
    }
}

/// `record` if the question asks for its type, else an empty answer.
fn only(asked: QueryType, has: QueryType, record: Record) -> Answer {
    if asked == has {
        Answer::Records(vec![record])
    } else {
        Answer::NoData
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use krust_client::endpoints::SERVICE_NAME_LABEL;
    use serde_json::json;

    fn zone() -> Zone {
        let services: Vec<Service> = [
            json!({"metadata": {"namespace": "default", "name": "web"},
                   "spec": {"clusterIP": "10.43.0.20",
                            "ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}}),
            json!({"metadata": {"namespace": "db", "name": "pg"},
                   "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}}),
            json!({"metadata": {"namespace": "default", "name": "ext"},
                   "spec": {"type": "ExternalName", "externalName": "Example.com"}}),
            json!({"metadata": {"namespace": "default", "name": "empty"},
                   "spec": {"clusterIP": "None"}}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
        let slices: Vec<EndpointSlice> = [json!({
            "metadata": {"namespace": "db", "name": "pg-1", "labels": {SERVICE_NAME_LABEL: "pg"}},
            "addressType": "IPv4",
            "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.42.0.7"], "hostname": "pg-0", "conditions": {"ready": true}},
                {"addresses": ["10.42.0.8"], "conditions": {"ready": true}},
                {"addresses": ["10.42.0.9"], "conditions": {"ready": false}},
            ],
        })]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
        Zone::new("cluster.local", &services, &slices)
    }

    fn a(name: &str, ip: &str) -> Record {
        Record::A(name.into(), ip.parse().unwrap())
    }

    #[test]
    fn services_resolve_to_their_cluster_ip_or_ready_endpoints() {
        let z = zone();
        assert_eq!(
            z.lookup("Web.Default.svc.cluster.local", QueryType::A),
            Answer::Records(vec![a("web.default.svc.cluster.local.", "10.43.0.20")])
        );
        assert_eq!(
            z.lookup("pg.db.svc.cluster.local.", QueryType::A),
            Answer::Records(vec![
                a("pg.db.svc.cluster.local.", "10.42.0.7"),
                a("pg.db.svc.cluster.local.", "10.42.0.8"),
            ])
        );
        assert_eq!(
            z.lookup("pg-0.pg.db.svc.cluster.local.", QueryType::A),
            Answer::Records(vec![a("pg-0.pg.db.svc.cluster.local.", "10.42.0.7")])
        );
        assert_eq!(
            z.lookup("10-42-0-8.pg.db.svc.cluster.local.", QueryType::A),
            Answer::Records(vec![a("10-42-0-8.pg.db.svc.cluster.local.", "10.42.0.8")])
        );
        assert_eq!(
            z.lookup("ext.default.svc.cluster.local.", QueryType::A),
            Answer::Records(vec![Record::Cname(
                "ext.default.svc.cluster.local.".into(),
                "example.com.".into()
            )])
        );
        assert_eq!(
            z.lookup("10-1-2-3.default.pod.cluster.local.", QueryType::A),
            Answer::Records(vec![a("10-1-2-3.default.pod.cluster.local.", "10.1.2.3")])
        );
    }

    #[test]
    fn named_ports_have_srv_records() {
        let z = zone();
        assert_eq!(
            z.lookup("_http._tcp.web.default.svc.cluster.local.", QueryType::Srv),
            Answer::Records(vec![Record::Srv {
                name: "_http._tcp.web.default.svc.cluster.local.".into(),
                port: 80,
                target: "web.default.svc.cluster.local.".into(),
            }])
        );
        assert_eq!(
            z.lookup("_dns._udp.web.default.svc.cluster.local.", QueryType::Srv),
            Answer::Records(vec![Record::Srv {
                name: "_dns._udp.web.default.svc.cluster.local.".into(),
                port: 53,
                target: "web.default.svc.cluster.local.".into(),
            }])
        );
        let Answer::Records(pg) = z.lookup("_pg._tcp.pg.db.svc.cluster.local.", QueryType::Srv)
        else {
            panic!()
        };
        assert_eq!(pg.len(), 2);
        assert!(pg.contains(&Record::Srv {
            name: "_pg._tcp.pg.db.svc.cluster.local.".into(),
            port: 5432,
            target: "pg-0.pg.db.svc.cluster.local.".into(),
        }));
        assert_eq!(
            z.lookup("_http._udp.web.default.svc.cluster.local.", QueryType::Srv),
            Answer::NxDomain
        );
    }

    #[test]
    fn missing_names_are_nxdomain_parents_are_nodata_and_the_rest_is_forwarded() {
        let z = zone();
        assert_eq!(
            z.lookup("nope.default.svc.cluster.local.", QueryType::A),
            Answer::NxDomain
        );
        assert_eq!(
            z.lookup("empty.default.svc.cluster.local.", QueryType::A),
            Answer::NxDomain
        );
        assert_eq!(
            z.lookup("web.nope.svc.cluster.local.", QueryType::A),
            Answer::NxDomain
        );
        assert_eq!(
            z.lookup("example.com.default.svc.cluster.local.", QueryType::A),
            Answer::NxDomain
        );
        assert_eq!(
            z.lookup("default.svc.cluster.local.", QueryType::A),
            Answer::NoData
        );
        assert_eq!(z.lookup("cluster.local.", QueryType::A), Answer::NoData);
        assert_eq!(
            z.lookup("web.default.svc.cluster.local.", QueryType::Other),
            Answer::NoData
        );
        assert_eq!(z.lookup("example.com.", QueryType::A), Answer::Forward);
        assert_eq!(z.lookup("notcluster.local.", QueryType::A), Answer::Forward);
        assert_eq!(
            z.lookup("1.1.168.192.in-addr.arpa.", QueryType::Ptr),
            Answer::Forward
        );
    }

    #[test]
    fn cluster_ips_and_named_endpoints_have_ptr_records() {
        let z = zone();
        assert_eq!(
            z.lookup("20.0.43.10.in-addr.arpa.", QueryType::Ptr),
            Answer::Records(vec![Record::Ptr(
                "20.0.43.10.in-addr.arpa.".into(),
                "web.default.svc.cluster.local.".into()
            )])
        );
        assert_eq!(
            z.lookup("7.0.42.10.in-addr.arpa.", QueryType::Ptr),
            Answer::Records(vec![Record::Ptr(
                "7.0.42.10.in-addr.arpa.".into(),
                "pg-0.pg.db.svc.cluster.local.".into()
            )])
        );
    }
}
