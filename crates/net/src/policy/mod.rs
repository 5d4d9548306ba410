//! NetworkPolicy enforced on this node, in nftables (k3s runs kube-router's controller
//! for this; krust has its own). Every agent watches Pods, Namespaces and
//! NetworkPolicies of the whole cluster (peers can be anywhere) and judges the packets
//! its own pods send and receive, in the forward hook, where a packet between two pods
//! — on one node, bridged (br_netfilter), or from another node — carries both pods'
//! addresses, after the Service rules turned a cluster IP into a pod's:
//!
//! - a packet of a connection already allowed (a reply, or one related to it) passes;
//! - one from a pod isolated for egress goes through that pod's egress chain, then one
//!   to a pod isolated for ingress through that pod's ingress chain; each chain accepts
//!   what some rule allows and drops the rest. A pod no policy isolates costs one
//!   lookup per new connection, and nothing at all while no pod is isolated.
//!
//! Traffic between a pod and its own node (probes, host processes) never passes the
//! forward hook: it is always allowed, as upstream requires. The [`model`] says what the
//! policies mean; every change is loaded as a whole table in one transaction, and the
//! rules stay when the agent stops, so pods stay protected across a restart.

pub mod model;

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use krust_api::cidr::Ipv4Cidr;
use krust_client::cache::Cache;
use krust_client::informer::Informer;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::Notify;

use model::{PolicyPod, Ruleset};

/// The nftables table that holds the policies of the node whose pods are in `pod_cidr`
/// (named after the range, as the node's bridge and egress table are, so that nodes
/// sharing a network namespace keep apart).
pub fn table(pod_cidr: Ipv4Cidr) -> String {
    format!("krust-policy-{}", crate::range_tag(pod_cidr))
}

#[derive(Clone, Debug)]
pub struct Config {
    pub node_name: String,
    /// How often the table is checked, and loaded again when it went missing.
    pub resync: Duration,
}

/// Keeps this node's policy rules in step with the cluster until dropped.
pub async fn run(client: Client, config: Config) {
    let changed = Arc::new(Notify::new());
    let pods =
        Informer::<PolicyPod>::new(Api::<Pod>::all(client.clone()), watcher::Config::default());
    pods.add_handler(changed.clone());
    let namespaces =
        Informer::<Namespace>::notifying(&client, watcher::Config::default(), &changed);
    let policies =
        Informer::<NetworkPolicy>::notifying(&client, watcher::Config::default(), &changed);
    let caches = Caches {
        pods: pods.cache(),
        namespaces: namespaces.cache(),
        policies: policies.cache(),
    };
    tokio::select! {
        _ = pods.run() => {}
        _ = namespaces.run() => {}
        _ = policies.run() => {}
        _ = sync(&client, &config, &caches, &changed) => {}
    }
}

struct Caches {
    pods: Cache<PolicyPod>,
    namespaces: Cache<Namespace>,
    policies: Cache<NetworkPolicy>,
}

async fn sync(client: &Client, config: &Config, caches: &Caches, changed: &Notify) {
    let table = table(own_range(client, &config.node_name).await);
    // Judging from half a picture would drop traffic that is allowed.
    tokio::join!(
        caches.pods.wait_until_ready(),
        caches.namespaces.wait_until_ready(),
        caches.policies.wait_until_ready()
    );
    tracing::info!(%table, "network policy synced its caches");
    // What the kernel holds; `None` before the first load, after a failed one and when
    // the table is due a check.
    let mut loaded: Option<Ruleset> = None;
    loop {
        let rules = model::ruleset(
            &config.node_name,
            &caches.pods.state(),
            &caches.namespaces.state(),
            &caches.policies.state(),
        );
        if loaded.as_ref() != Some(&rules) {
            let text = render(&table, &rules);
            let result = tokio::task::spawn_blocking(move || crate::nft::apply(&text))
                .await
                .unwrap_or_else(|e| Err(crate::nft::NftError::Rejected(e.to_string())));
            match result {
                Ok(()) => {
                    tracing::debug!(
                        %table,
                        isolated_ingress = rules.ingress.len(),
                        isolated_egress = rules.egress.len(),
                        "network policy rules loaded"
                    );
                    loaded = Some(rules);
                }
                Err(err) => {
                    tracing::error!(%table, error = %err, "loading network policy rules failed");
                    loaded = None;
                }
            }
        }
        let wait = if loaded.is_some() {
            config.resync
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(wait) => {
                let table = table.clone();
                let there = tokio::task::spawn_blocking(move || crate::nft::table_exists(&table))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(false);
                if !there {
                    loaded = None;
                }
            }
        }
    }
}

/// This node's pod range, once node IPAM has given it one.
async fn own_range(client: &Client, node_name: &str) -> Ipv4Cidr {
    let nodes: Api<Node> = Api::all(client.clone());
    loop {
        match nodes.get_opt(node_name).await {
            Ok(Some(node)) => {
                if let Some(cidr) = (node.spec.as_ref())
                    .and_then(|s| s.pod_cidr.as_deref())
                    .and_then(|c| c.parse().ok())
                {
                    return cidr;
                }
            }
            Ok(None) => {}
            Err(err) => tracing::debug!(error = %err, "reading this node for its pod range"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Base chains' priorities in the forward hook: before the filter tables of others,
/// egress (the sender's side) before ingress (the receiver's). An `accept` only ends
/// a base chain; the packet then meets the next.
const EGRESS_PRIORITY: i32 = -20;
const INGRESS_PRIORITY: i32 = -10;

/// The whole table, replacing what is there in one transaction.
pub fn render(table: &str, rules: &Ruleset) -> String {
    let mut t = format!("table ip {table}\ndelete table ip {table}\ntable ip {table} {{\n");
    if rules.is_empty() {
        t.push_str("}\n");
        return t;
    }
    for (name, addresses) in &rules.peers {
        let _ = write!(t, "\tset {name} {{\n\t\ttype ipv4_addr\n");
        if !addresses.is_empty() {
            let list: Vec<String> = addresses.iter().map(|a| a.to_string()).collect();
            let _ = writeln!(t, "\t\telements = {{ {} }}", list.join(", "));
        }
        t.push_str("\t}\n");
    }
    for (name, elements) in &rules.named_ports {
        let _ = write!(
            t,
            "\tset {name} {{\n\t\ttype ipv4_addr . inet_proto . inet_service\n"
        );
        if !elements.is_empty() {
            let list: Vec<String> = (elements.iter())
                .map(|(ip, proto, port)| format!("{ip} . {proto} . {port}"))
                .collect();
            let _ = writeln!(t, "\t\telements = {{ {} }}", list.join(", "));
        }
        t.push_str("\t}\n");
    }
    for (name, body) in &rules.chains {
        let _ = writeln!(t, "\tchain {name} {{");
        for rule in body {
            let _ = writeln!(t, "\t\t{rule}");
        }
        t.push_str("\t}\n");
    }
    for (map, pods) in [
        ("pods-egress", &rules.egress),
        ("pods-ingress", &rules.ingress),
    ] {
        let _ = write!(t, "\tmap {map} {{\n\t\ttype ipv4_addr : verdict\n");
        if !pods.is_empty() {
            let list: Vec<String> = (pods.iter())
                .map(|(ip, chain)| format!("{ip} : jump {chain}"))
                .collect();
            let _ = writeln!(t, "\t\telements = {{ {} }}", list.join(", "));
        }
        t.push_str("\t}\n");
    }
    for (chain, priority, field, map) in [
        ("forward-egress", EGRESS_PRIORITY, "ip saddr", "pods-egress"),
        (
            "forward-ingress",
            INGRESS_PRIORITY,
            "ip daddr",
            "pods-ingress",
        ),
    ] {
        let _ = write!(
            t,
            "\tchain {chain} {{\n\
             \t\ttype filter hook forward priority {priority}; policy accept;\n\
             \t\tct state established,related accept\n\
             \t\t{field} vmap @{map}\n\
             \t}}\n"
        );
    }
    t.push_str("}\n");
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use serde_json::json;

    #[test]
    fn the_rendered_table_is_one_the_kernel_accepts() {
        let pod = |ns: &str, name: &str, ip: &str| {
            Arc::new(PolicyPod {
                namespace: ns.into(),
                name: name.into(),
                labels: [("app".to_string(), "web".to_string())].into(),
                node: Some("n1".into()),
                ip: Some(ip.parse().unwrap()),
                ports: vec![("http".into(), model::Protocol::Tcp, 80)],
            })
        };
        let pods = [pod("x", "a", "10.0.0.2"), pod("y", "b", "10.0.0.3")];
        let policy: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"namespace": "x", "name": "all-shapes"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"namespaceSelector": {}}, {"ipBlock": {"cidr": "10.9.0.0/16", "except": ["10.9.1.0/24"]}}],
                             "ports": [{"port": "http"}, {"protocol": "UDP", "port": 53, "endPort": 60}]}],
                "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                            "ports": [{"port": "http"}, {"protocol": "SCTP"}]}]}}))
        .unwrap();
        let rules = model::ruleset("n1", &pods, &[], &[Arc::new(policy)]);
        assert!(!rules.is_empty());
        let text = render("krust-policy-test", &rules);
        crate::nft::check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        // Nothing isolated: an empty table, no chain in the forward hook.
        let empty = render("krust-policy-test", &Ruleset::default());
        assert!(!empty.contains("hook"));
        crate::nft::check(&empty).unwrap_or_else(|e| panic!("{e}\n{empty}"));
    }
}
