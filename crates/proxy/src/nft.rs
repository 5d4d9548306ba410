//! The nftables ruleset of the Service data plane, written as `nft -f` text and loaded
//! atomically by [`krust_net::nft`] (the whole table is replaced in one transaction, so a packet sees either
//! the old rules or the new ones).
//!
//! The shape follows kube-proxy's nftables mode (checked with Debian 12's nft 1.0.6): a
//! verdict map from (address, protocol, port) to a chain per Service port, which picks
//! an endpoint at random (`numgen random mod N`) and DNATs to it; NodePorts through a
//! second map for traffic to any local address; traffic that does not come from a pod,
//! and a pod reaching itself through its Service (hairpin), is marked and masqueraded,
//! so replies come back through this node's conntrack; new connections to a Service
//! without endpoints are rejected in the filter hooks, so clients fail at once instead
//! of timing out.

use std::fmt::Write as _;

use krust_api::cidr::Ipv4Cidr;

use crate::model::ServicePort;

/// The packet mark that asks for masquerading (kube-proxy's bit).
const MASQUERADE_MARK: &str = "0x4000";

/// The whole table for `ports`: its first two lines make loading it replace any
/// previous version.
pub fn render(table: &str, cluster_cidr: Ipv4Cidr, ports: &[ServicePort]) -> String {
    let mut out = String::new();
    // `table` then `delete table` makes the delete succeed on the first load too.
    let _ = writeln!(
        out,
        "table ip {table}\ndelete table ip {table}\ntable ip {table} {{"
    );
    let mut service_ips = Vec::new();
    let mut node_ports = Vec::new();
    let mut no_endpoint_ips = Vec::new();
    let mut no_endpoint_node_ports = Vec::new();
    let mut chains = String::new();
    for sp in ports {
        let proto = sp.protocol;
        let chain = chain_name(sp);
        let (ips, nodes) = if sp.endpoints.is_empty() {
            (&mut no_endpoint_ips, &mut no_endpoint_node_ports)
        } else {
            (&mut service_ips, &mut node_ports)
        };
        let verdict = if sp.endpoints.is_empty() {
            "goto reject-chain".to_string()
        } else {
            format!("goto {chain}")
        };
        for ip in &sp.addresses {
            ips.push(format!("{ip} . {proto} . {} : {verdict}", sp.port));
        }
        if let Some(node_port) = sp.node_port {
            nodes.push(format!("{proto} . {node_port} : {verdict}"));
        }
        if sp.endpoints.is_empty() {
            continue;
        }
        let picks: Vec<String> = (0..sp.endpoints.len())
            .map(|i| format!("{i} : goto {chain}/{i}"))
            .collect();
        let _ = writeln!(
            chains,
            "\tchain {chain} {{\n\
             \t\tip saddr != {cluster_cidr} meta mark set meta mark | {MASQUERADE_MARK}\n\
             \t\tnumgen random mod {} vmap {{ {} }}\n\t}}",
            sp.endpoints.len(),
            picks.join(", ")
        );
        for (i, endpoint) in sp.endpoints.iter().enumerate() {
            let _ = writeln!(
                chains,
                "\tchain {chain}/{i} {{\n\
                 \t\tip saddr {ip} meta mark set meta mark | {MASQUERADE_MARK}\n\
                 \t\tmeta l4proto {proto} dnat to {endpoint}\n\t}}",
                ip = endpoint.ip(),
            );
        }
    }
    map(
        &mut out,
        "service-ips",
        "ipv4_addr . inet_proto . inet_service",
        &service_ips,
    );
    map(
        &mut out,
        "service-nodeports",
        "inet_proto . inet_service",
        &node_ports,
    );
    map(
        &mut out,
        "no-endpoint-services",
        "ipv4_addr . inet_proto . inet_service",
        &no_endpoint_ips,
    );
    map(
        &mut out,
        "no-endpoint-nodeports",
        "inet_proto . inet_service",
        &no_endpoint_node_ports,
    );
    let _ = write!(
        out,
        "\tchain nat-prerouting {{\n\
         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         \t\tjump services\n\t}}\n\
         \tchain nat-output {{\n\
         \t\ttype nat hook output priority -100; policy accept;\n\
         \t\tjump services\n\t}}\n\
         \tchain nat-postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tmeta mark & {MASQUERADE_MARK} == {MASQUERADE_MARK} masquerade fully-random\n\t}}\n\
         \tchain services {{\n\
         \t\tip daddr . meta l4proto . th dport vmap @service-ips\n\
         \t\tfib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n\t}}\n\
         \tchain filter-input {{\n\
         \t\ttype filter hook input priority -110; policy accept;\n\
         \t\tct state new fib daddr type local meta l4proto . th dport vmap @no-endpoint-nodeports\n\t}}\n\
         \tchain filter-forward {{\n\
         \t\ttype filter hook forward priority -110; policy accept;\n\
         \t\tct state new ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}}\n\
         \tchain filter-output {{\n\
         \t\ttype filter hook output priority -110; policy accept;\n\
         \t\tct state new ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\
         \t\tct state new fib daddr type local meta l4proto . th dport vmap @no-endpoint-nodeports\n\t}}\n\
         \tchain reject-chain {{\n\
         \t\treject\n\t}}\n"
    );
    out.push_str(&chains);
    out.push_str("}\n");
    out
}

/// `svc/<namespace>/<name>/<protocol>/<port>`: nft names may hold `/`, `.` and `-`, and
/// these parts cannot: the name is unique per Service port.
fn chain_name(sp: &ServicePort) -> String {
    format!(
        "svc/{}/{}/{}/{}",
        sp.namespace, sp.service, sp.protocol, sp.port_name
    )
}

fn map(out: &mut String, name: &str, key: &str, elements: &[String]) {
    let _ = write!(out, "\tmap {name} {{\n\t\ttype {key} : verdict\n");
    if !elements.is_empty() {
        let _ = writeln!(out, "\t\telements = {{ {} }}", elements.join(",\n\t\t\t"));
    }
    out.push_str("\t}\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;
    use krust_net::nft::{apply, check, delete_table, table_exists};

    fn port(name: &str, endpoints: &[&str], node_port: Option<u16>) -> ServicePort {
        ServicePort {
            namespace: "default".into(),
            service: name.into(),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
            addresses: vec!["10.43.0.20".parse().unwrap()],
            port: 80,
            node_port,
            endpoints: endpoints.iter().map(|e| e.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn a_service_port_maps_to_a_chain_that_picks_an_endpoint_at_random() {
        let text = render(
            "krust",
            "10.42.0.0/16".parse().unwrap(),
            &[port(
                "web",
                &["10.42.0.5:8080", "10.42.1.7:8080"],
                Some(30080),
            )],
        );
        assert!(text.starts_with("table ip krust\ndelete table ip krust\n"));
        assert!(text.contains("10.43.0.20 . tcp . 80 : goto svc/default/web/tcp/http"));
        assert!(text.contains("tcp . 30080 : goto svc/default/web/tcp/http"));
        assert!(text.contains("numgen random mod 2 vmap { 0 : goto svc/default/web/tcp/http/0, 1 : goto svc/default/web/tcp/http/1 }"));
        assert!(text.contains("ip saddr != 10.42.0.0/16 meta mark set meta mark | 0x4000"));
        assert!(text.contains("ip saddr 10.42.1.7 meta mark set meta mark | 0x4000\n\t\tmeta l4proto tcp dnat to 10.42.1.7:8080"));
        let no_endpoints = text
            .split("map no-endpoint-services")
            .nth(1)
            .unwrap()
            .split('}')
            .next()
            .unwrap();
        assert!(!no_endpoints.contains("elements"), "{text}");
    }

    #[test]
    fn a_service_port_without_endpoints_is_rejected() {
        let text = render(
            "krust",
            "10.42.0.0/16".parse().unwrap(),
            &[port("idle", &[], Some(30081))],
        );
        assert!(text.contains("elements = { 10.43.0.20 . tcp . 80 : goto reject-chain }"));
        assert!(text.contains("elements = { tcp . 30081 : goto reject-chain }"));
        assert!(!text.contains("chain svc/"));
    }

    #[test]
    fn the_kernel_accepts_the_ruleset() {
        let mut udp = port("dns", &["10.42.0.9:5353"], None);
        udp.protocol = Protocol::Udp;
        udp.port = 53;
        let ports = [
            port("web", &["10.42.0.5:8080", "10.42.1.7:8080"], Some(30080)),
            port("idle", &[], Some(30081)),
            udp,
        ];
        let text = render("krust-check", "10.42.0.0/16".parse().unwrap(), &ports);
        // Check mode: parsed and validated by the kernel, nothing committed.
        check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let empty = render("krust-check", "10.42.0.0/16".parse().unwrap(), &[]);
        check(&empty).unwrap_or_else(|e| panic!("{e}\n{empty}"));
    }

    #[test]
    fn a_loaded_table_exists_until_deleted() {
        let table = "krust-unit-exists";
        assert!(!table_exists(table).unwrap());
        apply(&render(table, "10.42.0.0/16".parse().unwrap(), &[])).unwrap();
        assert!(table_exists(table).unwrap());
        delete_table(table).unwrap();
        assert!(!table_exists(table).unwrap());
    }
}
