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
//! of timing out. A `Local` traffic policy sends traffic to the node's own endpoints
//! (a chain `<service chain>/local`, dropping when there are none), external traffic
//! then unmasqueraded so pods see the client's address.

use std::fmt::Write as _;

use krust_api::cidr::Ipv4Cidr;

use crate::model::{ServicePort, TrafficPolicy};

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
        let external = sp.external_ips.iter();
        if sp.endpoints.is_empty() {
            for ip in std::iter::once(&sp.cluster_ip).chain(external) {
                no_endpoint_ips.push(format!("{ip} . {proto} . {} : goto reject-chain", sp.port));
            }
            if let Some(node_port) = sp.node_port {
                no_endpoint_node_ports.push(format!("{proto} . {node_port} : goto reject-chain"));
            }
            continue;
        }
        let chain = chain_name(sp);
        let internal = match sp.internal_policy {
            TrafficPolicy::Cluster => chain.clone(),
            TrafficPolicy::Local => format!("{chain}/internal"),
        };
        let outside = match sp.external_policy {
            TrafficPolicy::Cluster => chain.clone(),
            TrafficPolicy::Local => format!("{chain}/external"),
        };
        service_ips.push(format!(
            "{} . {proto} . {} : goto {internal}",
            sp.cluster_ip, sp.port
        ));
        for ip in external {
            service_ips.push(format!("{ip} . {proto} . {} : goto {outside}", sp.port));
        }
        if let Some(node_port) = sp.node_port {
            node_ports.push(format!("{proto} . {node_port} : goto {outside}"));
        }
        // One chain per endpoint, whether cluster-wide, local or both.
        let mut all = sp.endpoints.clone();
        all.extend(
            sp.local_endpoints
                .iter()
                .filter(|e| !sp.endpoints.contains(e)),
        );
        let pick = |chosen: &[std::net::SocketAddrV4]| {
            let picks: Vec<String> = chosen
                .iter()
                .filter_map(|e| all.iter().position(|a| a == e))
                .enumerate()
                .map(|(i, at)| format!("{i} : goto {chain}/{at}"))
                .collect();
            format!(
                "numgen random mod {} vmap {{ {} }}",
                chosen.len(),
                picks.join(", ")
            )
        };
        let _ = writeln!(
            chains,
            "\tchain {chain} {{\n\
             \t\tip saddr != {cluster_cidr} meta mark set meta mark | {MASQUERADE_MARK}\n\
             \t\t{}\n\t}}",
            pick(&sp.endpoints)
        );
        if sp.internal_policy == TrafficPolicy::Local || sp.external_policy == TrafficPolicy::Local
        {
            // Endpoints elsewhere only: dropped, as kube-proxy does.
            let local = if sp.local_endpoints.is_empty() {
                "drop".to_string()
            } else {
                pick(&sp.local_endpoints)
            };
            let _ = writeln!(chains, "\tchain {chain}/local {{\n\t\t{local}\n\t}}");
        }
        if sp.internal_policy == TrafficPolicy::Local {
            let _ = writeln!(
                chains,
                "\tchain {internal} {{\n\
                 \t\tip saddr != {cluster_cidr} meta mark set meta mark | {MASQUERADE_MARK}\n\
                 \t\tgoto {chain}/local\n\t}}"
            );
        }
        if sp.external_policy == TrafficPolicy::Local {
            // Pods and the node itself reach the Service as from inside the cluster
            // (kube-proxy's short-circuits); others keep their source address.
            let _ = writeln!(
                chains,
                "\tchain {outside} {{\n\
                 \t\tip saddr {cluster_cidr} goto {chain}\n\
                 \t\tfib saddr type local goto {chain}\n\
                 \t\tgoto {chain}/local\n\t}}"
            );
        }
        for (i, endpoint) in all.iter().enumerate() {
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
            cluster_ip: "10.43.0.20".parse().unwrap(),
            external_ips: Vec::new(),
            port: 80,
            node_port,
            endpoints: endpoints.iter().map(|e| e.parse().unwrap()).collect(),
            local_endpoints: Vec::new(),
            local_ready: false,
            internal_policy: TrafficPolicy::Cluster,
            external_policy: TrafficPolicy::Cluster,
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
    fn local_policies_send_outside_traffic_to_this_nodes_endpoints_unmasqueraded() {
        let mut web = port("web", &["10.42.0.5:8080", "10.42.1.7:8080"], Some(30080));
        web.external_ips = vec!["192.0.2.10".parse().unwrap()];
        web.local_endpoints = vec!["10.42.1.7:8080".parse().unwrap()];
        web.external_policy = TrafficPolicy::Local;
        let text = render("krust", "10.42.0.0/16".parse().unwrap(), &[web.clone()]);
        let svc = "svc/default/web/tcp/http";
        assert!(text.contains(&format!("10.43.0.20 . tcp . 80 : goto {svc},")));
        assert!(text.contains(&format!("192.0.2.10 . tcp . 80 : goto {svc}/external")));
        assert!(text.contains(&format!("tcp . 30080 : goto {svc}/external")));
        assert!(text.contains(&format!(
            "chain {svc}/external {{\n\t\tip saddr 10.42.0.0/16 goto {svc}\n\t\t\
             fib saddr type local goto {svc}\n\t\tgoto {svc}/local\n\t}}"
        )));
        // The local pick names the endpoint's own chain (index 1 of the service's).
        assert!(text.contains(&format!(
            "chain {svc}/local {{\n\t\tnumgen random mod 1 vmap {{ 0 : goto {svc}/1 }}"
        )));

        web.local_endpoints.clear();
        web.internal_policy = TrafficPolicy::Local;
        let text = render("krust", "10.42.0.0/16".parse().unwrap(), &[web]);
        assert!(text.contains(&format!("chain {svc}/local {{\n\t\tdrop\n")));
        assert!(text.contains(&format!("10.43.0.20 . tcp . 80 : goto {svc}/internal")));
    }

    #[test]
    fn the_kernel_accepts_the_ruleset() {
        let mut udp = port("dns", &["10.42.0.9:5353"], None);
        udp.protocol = Protocol::Udp;
        udp.port = 53;
        let mut local = port("local", &["10.42.0.5:8080"], Some(30082));
        local.cluster_ip = "10.43.0.21".parse().unwrap();
        local.local_endpoints = vec!["10.42.0.6:8080".parse().unwrap()];
        local.internal_policy = TrafficPolicy::Local;
        local.external_policy = TrafficPolicy::Local;
        let ports = [
            port("web", &["10.42.0.5:8080", "10.42.1.7:8080"], Some(30080)),
            port("idle", &[], Some(30081)),
            udp,
            local,
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
