//! What NetworkPolicies mean for the pods of one node, as upstream defines it: a pod is
//! isolated in a direction once a policy of its namespace selects it with that policy
//! type; an isolated pod admits a connection only when some rule of some policy
//! selecting it allows the peer and the port. Peers are pods (by pod selector in the
//! policy's namespace, by namespace selector, or both together) or address blocks; named
//! ports resolve on the pod that listens — the selected pod for ingress, the
//! destination for egress.
//!
//! The result is a [`Ruleset`]: nftables chains per isolated local pod, the peer address
//! sets they name, and the maps that send a packet to its pod's chain.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as WireSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use krust_api::cidr::Ipv4Block;
use krust_client::cache::Cached;
use krust_client::selector::Selector;

pub use crate::nft::Protocol;

/// What policies need of a pod, kept for every pod of the cluster (peers live on any node).
#[derive(Debug, Clone)]
pub struct PolicyPod {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub node: Option<String>,
    /// `None` while it has no address, for host-network pods (they share the node's
    /// address, which policies never judge) and once it has finished.
    pub ip: Option<Ipv4Addr>,
    /// Its containers' named ports.
    pub ports: Vec<(String, Protocol, u16)>,
}

impl Cached for PolicyPod {
    type Wire = Pod;

    fn from_wire(pod: Pod) -> PolicyPod {
        let spec = pod.spec.unwrap_or_default();
        let status = pod.status.unwrap_or_default();
        let finished = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
        let ip = (!spec.host_network.unwrap_or(false) && !finished)
            .then(|| {
                let listed = status.pod_ips.iter().flatten().map(|p| p.ip.as_str());
                status
                    .pod_ip
                    .as_deref()
                    .into_iter()
                    .chain(listed)
                    .find_map(|ip| ip.parse::<Ipv4Addr>().ok())
            })
            .flatten();
        let ports = spec
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let protocol = Protocol::parse(p.protocol.as_deref())?;
                Some((
                    p.name.clone()?,
                    protocol,
                    u16::try_from(p.container_port).ok()?,
                ))
            })
            .collect();
        PolicyPod {
            namespace: pod.metadata.namespace.unwrap_or_default(),
            name: pod.metadata.name.unwrap_or_default(),
            labels: pod.metadata.labels.unwrap_or_default(),
            node: spec.node_name,
            ip,
            ports,
        }
    }

    fn namespace(&self) -> Option<&str> {
        Some(&self.namespace)
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// The packet field that holds the peer's address.
    fn peer_field(self) -> &'static str {
        match self {
            Direction::Ingress => "ip saddr",
            Direction::Egress => "ip daddr",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    /// The `policyTypes` entry that isolates pods in this direction.
    fn policy_type(self) -> &'static str {
        match self {
            Direction::Ingress => "Ingress",
            Direction::Egress => "Egress",
        }
    }
}

/// The nftables objects that carry the policies of one node.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// Peer pods' addresses of one rule.
    pub peers: BTreeMap<String, BTreeSet<Ipv4Addr>>,
    /// (address, protocol, port) of the destinations an egress rule's named port
    /// resolves to.
    pub named_ports: BTreeMap<String, BTreeSet<(Ipv4Addr, Protocol, u16)>>,
    /// Each isolated pod's chain (per direction): what it admits, then `drop`.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Isolated local pods' addresses → their ingress chain.
    pub ingress: BTreeMap<Ipv4Addr, String>,
    /// Isolated local pods' addresses → their egress chain.
    pub egress: BTreeMap<Ipv4Addr, String>,
}

impl Ruleset {
    /// Whether no local pod is isolated: then no packet needs judging.
    pub fn is_empty(&self) -> bool {
        self.ingress.is_empty() && self.egress.is_empty()
    }
}

/// One rule of a policy, its peers resolved.
struct Rule<'a> {
    /// nftables matches for the allowed peers; one empty match when any peer is.
    peers: Vec<String>,
    /// The pods among the peers (every pod with an address when any peer is), for
    /// named ports of egress rules.
    peer_pods: Vec<&'a PolicyPod>,
    ports: &'a [NetworkPolicyPort],
    /// Where this rule's named-port sets are called.
    name: String,
}

struct Compiled<'a> {
    namespace: &'a str,
    selector: Selector,
    ingress: Option<Vec<Rule<'a>>>,
    egress: Option<Vec<Rule<'a>>>,
}

/// The ruleset for the pods of `node`.
pub fn ruleset(
    node: &str,
    pods: &[Arc<PolicyPod>],
    namespaces: &[Arc<Namespace>],
    policies: &[Arc<NetworkPolicy>],
) -> Ruleset {
    let namespace_labels: HashMap<&str, BTreeMap<String, String>> = namespaces
        .iter()
        .filter_map(|ns| {
            let name = ns.metadata.name.as_deref()?;
            let mut labels = ns.metadata.labels.clone().unwrap_or_default();
            // The apiserver sets it; a namespace read before it did still has its name.
            labels
                .entry("kubernetes.io/metadata.name".into())
                .or_insert_with(|| name.to_string());
            Some((name, labels))
        })
        .collect();
    let addressed: Vec<&PolicyPod> = pods
        .iter()
        .filter(|p| p.ip.is_some())
        .map(|p| &**p)
        .collect();
    let mut out = Ruleset::default();
    let compiled: Vec<Compiled> = policies
        .iter()
        .filter_map(|p| compile(p, &addressed, &namespace_labels, &mut out))
        .collect();
    for pod in addressed.iter().filter(|p| p.node.as_deref() == Some(node)) {
        let ip = pod.ip.expect("addressed");
        for direction in [Direction::Ingress, Direction::Egress] {
            let selecting: Vec<&Compiled> = compiled
                .iter()
                .filter(|c| c.namespace == pod.namespace && c.selector.matches(&pod.labels))
                .filter(|c| c.rules(direction).is_some())
                .collect();
            if selecting.is_empty() {
                continue;
            }
            let mut chain = Vec::new();
            for policy in selecting {
                for rule in policy.rules(direction).into_iter().flatten() {
                    allow(direction, rule, pod, &mut chain, &mut out.named_ports);
                }
            }
            chain.push("drop".to_string());
            let prefix = match direction {
                Direction::Ingress => "pod-in",
                Direction::Egress => "pod-out",
            };
            let name = nft_name(&format!("{prefix}/{}/{}", pod.namespace, pod.name));
            match direction {
                Direction::Ingress => out.ingress.insert(ip, name.clone()),
                Direction::Egress => out.egress.insert(ip, name.clone()),
            };
            out.chains.insert(name, chain);
        }
    }
    out
}

impl<'a> Compiled<'a> {
    fn rules(&self, direction: Direction) -> Option<&Vec<Rule<'a>>> {
        match direction {
            Direction::Ingress => self.ingress.as_ref(),
            Direction::Egress => self.egress.as_ref(),
        }
    }
}

/// A policy with its peers resolved to addresses (peer sets go into `out`); `None` for
/// one whose pod selector cannot be read (validation keeps those out).
fn compile<'a>(
    policy: &'a NetworkPolicy,
    pods: &[&'a PolicyPod],
    namespace_labels: &HashMap<&str, BTreeMap<String, String>>,
    out: &mut Ruleset,
) -> Option<Compiled<'a>> {
    let namespace = policy.metadata.namespace.as_deref()?;
    let name = policy.metadata.name.as_deref()?;
    let spec = policy.spec.as_ref()?;
    let selects = selector(spec.pod_selector.as_ref())?;
    // Ingress always; Egress when the policy has egress rules (upstream's default).
    let types: Vec<&str> = match &spec.policy_types {
        Some(types) => types.iter().map(String::as_str).collect(),
        None if spec.egress.is_some() => vec!["Ingress", "Egress"],
        None => vec!["Ingress"],
    };
    let mut resolve =
        |direction: Direction, index: usize, peers: Option<&'a [NetworkPolicyPeer]>, ports| {
            let rule_name = format!("{namespace}/{name}/{}/{index}", direction.name());
            let mut rule = Rule {
                peers: Vec::new(),
                peer_pods: Vec::new(),
                ports,
                name: rule_name.clone(),
            };
            let peers = peers.unwrap_or_default();
            if peers.is_empty() {
                rule.peers.push(String::new());
                rule.peer_pods = pods.to_vec();
                return rule;
            }
            let mut addresses = BTreeSet::new();
            let mut by_selector = false;
            for peer in peers {
                if let Some(block) = &peer.ip_block {
                    let Ok(cidr) = block.cidr.parse::<Ipv4Block>() else {
                        continue; // an IPv6 block: no IPv4 address is in it
                    };
                    let except: Vec<Ipv4Block> = (block.except.iter().flatten())
                        .filter_map(|e| e.parse().ok())
                        .collect();
                    let field = direction.peer_field();
                    let mut m = format!("{field} {cidr}");
                    if !except.is_empty() {
                        let list: Vec<String> = except.iter().map(Ipv4Block::to_string).collect();
                        m.push_str(&format!(" {field} != {{ {} }}", list.join(", ")));
                    }
                    rule.peers.push(m);
                    rule.peer_pods.extend(pods.iter().copied().filter(|p| {
                        let ip = p.ip.expect("addressed");
                        cidr.contains(ip) && !except.iter().any(|e| e.contains(ip))
                    }));
                    continue;
                }
                by_selector = true;
                // Without a namespace selector the policy's own namespace; without a pod
                // selector every pod of the selected namespaces.
                let namespaces = match &peer.namespace_selector {
                    None => None,
                    Some(s) => match selector(Some(s)) {
                        Some(sel) => Some(sel),
                        None => continue,
                    },
                };
                let Some(pod_selector) = selector(peer.pod_selector.as_ref()) else {
                    continue;
                };
                for pod in pods {
                    let in_namespace = match &namespaces {
                        None => pod.namespace == namespace,
                        Some(sel) => namespace_labels
                            .get(pod.namespace.as_str())
                            .is_some_and(|labels| sel.matches(labels)),
                    };
                    if in_namespace && pod_selector.matches(&pod.labels) {
                        addresses.insert(pod.ip.expect("addressed"));
                        rule.peer_pods.push(pod);
                    }
                }
            }
            if by_selector {
                let set = nft_name(&format!("peers/{rule_name}"));
                rule.peers
                    .push(format!("{} @{set}", direction.peer_field()));
                out.peers.insert(set, addresses);
            }
            rule
        };
    // A rule of either direction is its peers (`from` or `to`) and its ports.
    type Wire<'a> = (
        Option<&'a [NetworkPolicyPeer]>,
        Option<&'a [NetworkPolicyPort]>,
    );
    let mut rules = |direction: Direction, wire: Vec<Wire<'a>>| {
        types.contains(&direction.policy_type()).then(|| {
            (wire.into_iter().enumerate())
                .map(|(i, (peers, ports))| resolve(direction, i, peers, ports.unwrap_or_default()))
                .collect()
        })
    };
    let ingress = rules(
        Direction::Ingress,
        (spec.ingress.iter().flatten())
            .map(|r| (r.from.as_deref(), r.ports.as_deref()))
            .collect(),
    );
    let egress = rules(
        Direction::Egress,
        (spec.egress.iter().flatten())
            .map(|r| (r.to.as_deref(), r.ports.as_deref()))
            .collect(),
    );
    Some(Compiled {
        namespace,
        selector: selects,
        ingress,
        egress,
    })
}

/// The lines of `pod`'s chain that a rule allows: each allowed peer with each allowed port.
fn allow(
    direction: Direction,
    rule: &Rule<'_>,
    pod: &PolicyPod,
    chain: &mut Vec<String>,
    named_ports: &mut BTreeMap<String, BTreeSet<(Ipv4Addr, Protocol, u16)>>,
) {
    let mut ports: Vec<String> = Vec::new();
    for (index, port) in rule.ports.iter().enumerate() {
        let Some(protocol) = Protocol::parse(port.protocol.as_deref()) else {
            continue;
        };
        let proto = protocol;
        match &port.port {
            None => ports.push(format!("meta l4proto {proto}")),
            Some(IntOrString::Int(n)) => match port.end_port {
                Some(end) => ports.push(format!("meta l4proto {proto} th dport {n}-{end}")),
                None => ports.push(format!("meta l4proto {proto} th dport {n}")),
            },
            Some(IntOrString::String(name)) => match direction {
                // The selected pod listens: its own port of that name.
                Direction::Ingress => ports.extend(
                    (pod.ports.iter())
                        .filter(|(n, p, _)| n == name && *p == protocol)
                        .map(|(_, _, number)| format!("meta l4proto {proto} th dport {number}")),
                ),
                // Each destination's own port of that name: the peers' (address,
                // protocol, port), matched together.
                Direction::Egress => {
                    let set = nft_name(&format!("ports/{}/{index}", rule.name));
                    let elements = (rule.peer_pods.iter())
                        .flat_map(|p| {
                            let ip = p.ip.expect("addressed");
                            (p.ports.iter())
                                .filter(|(n, p, _)| n == name && *p == protocol)
                                .map(move |(_, p, number)| (ip, *p, *number))
                        })
                        .collect();
                    chain.push(format!("ip daddr . meta l4proto . th dport @{set} accept"));
                    named_ports.insert(set, elements);
                }
            },
        }
    }
    if rule.ports.is_empty() {
        ports.push(String::new());
    }
    for peer in &rule.peers {
        for port in &ports {
            let line = [peer.as_str(), port.as_str(), "accept"]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(" ");
            chain.push(line);
        }
    }
}

/// A label selector from its wire form; `None` when it cannot be read. An absent
/// selector selects everything, as an empty one does.
fn selector(wire: Option<&WireSelector>) -> Option<Selector> {
    let Some(wire) = wire else {
        return Some(Selector::everything());
    };
    match Selector::parse(Some(wire)) {
        Ok(s) => Some(s),
        Err(err) => {
            tracing::warn!(error = %err, "a NetworkPolicy selector cannot be read; it selects nothing");
            None
        }
    }
}

/// An nftables object name from `name`: names of pods and policies can be longer than
/// the kernel's 256 bytes, so long ones keep their start and gain a hash of the whole.
fn nft_name(name: &str) -> String {
    const MAX: usize = 200;
    if name.len() <= MAX {
        return name.to_string();
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    let mut cut = MAX - 17;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{h:016x}", &name[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NODE: &str = "n1";

    fn pod(ns: &str, name: &str, node: &str, ip: &str) -> Arc<PolicyPod> {
        Arc::new(PolicyPod {
            namespace: ns.into(),
            name: name.into(),
            labels: [("pod".to_string(), name.to_string())].into(),
            node: Some(node.into()),
            ip: Some(ip.parse().unwrap()),
            ports: vec![
                ("http".into(), Protocol::Tcp, 8080),
                ("dns".into(), Protocol::Udp, 53),
            ],
        })
    }

    fn namespace(name: &str, team: &str) -> Arc<Namespace> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"team": team}}}))
                .unwrap(),
        )
    }

    fn policy(ns: &str, name: &str, spec: serde_json::Value) -> Arc<NetworkPolicy> {
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"namespace": ns, "name": name}, "spec": spec}),
            )
            .unwrap(),
        )
    }

    /// x/a and x/b on this node, y/a on another; namespaces x (team red), y (team blue).
    fn cluster() -> (Vec<Arc<PolicyPod>>, Vec<Arc<Namespace>>) {
        (
            vec![
                pod("x", "a", NODE, "10.0.0.2"),
                pod("x", "b", NODE, "10.0.0.3"),
                pod("y", "a", "n2", "10.0.1.2"),
            ],
            vec![namespace("x", "red"), namespace("y", "blue")],
        )
    }

    #[test]
    fn pods_no_policy_selects_are_not_judged() {
        let (pods, namespaces) = cluster();
        let other = policy("y", "deny", json!({"podSelector": {}}));
        let r = ruleset(NODE, &pods, &namespaces, &[other]);
        // y's policy selects y/a, which lives on another node: nothing here.
        assert!(r.is_empty(), "{r:#?}");
    }

    #[test]
    fn default_deny_isolates_every_pod_of_its_namespace_in_its_types() {
        let (pods, namespaces) = cluster();
        let deny = policy(
            "x",
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        );
        let r = ruleset(NODE, &pods, &namespaces, &[deny]);
        assert_eq!(r.chains["pod-in/x/a"], ["drop"]);
        assert_eq!(r.chains["pod-out/x/b"], ["drop"]);
        assert_eq!(r.ingress.len(), 2);
        assert_eq!(r.egress.len(), 2);
        // Without policyTypes: Ingress only, unless the policy has egress rules.
        let ingress_only = policy("x", "deny", json!({"podSelector": {}}));
        let r = ruleset(NODE, &pods, &namespaces, &[ingress_only]);
        assert_eq!((r.ingress.len(), r.egress.len()), (2, 0));
        let with_egress = policy("x", "out", json!({"podSelector": {}, "egress": [{}]}));
        let r = ruleset(NODE, &pods, &namespaces, &[with_egress]);
        assert_eq!((r.ingress.len(), r.egress.len()), (2, 2));
        assert_eq!(r.chains["pod-out/x/a"], ["accept", "drop"]);
    }

    #[test]
    fn peers_by_pod_namespace_and_both_resolve_to_addresses() {
        let (pods, namespaces) = cluster();
        let p = policy(
            "x",
            "peers",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]},
                {"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]},
                {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "a"}}}]},
                {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}},
                           "podSelector": {"matchLabels": {"pod": "c"}}}]}
            ]}),
        );
        let r = ruleset(NODE, &pods, &namespaces, &[p]);
        let set = |i: usize| -> Vec<String> {
            r.peers[&format!("peers/x/peers/ingress/{i}")]
                .iter()
                .map(|a| a.to_string())
                .collect()
        };
        assert_eq!(set(0), ["10.0.0.3"]);
        assert_eq!(set(1), ["10.0.1.2"]);
        assert_eq!(set(2), ["10.0.0.2", "10.0.1.2"]);
        assert!(set(3).is_empty());
        assert_eq!(
            r.chains["pod-in/x/a"][0],
            "ip saddr @peers/x/peers/ingress/0 accept"
        );
        assert_eq!(r.chains["pod-in/x/a"].len(), 5);
        assert!(!r.chains.contains_key("pod-in/x/b"));
    }

    #[test]
    fn ports_by_number_range_and_name_and_blocks_with_exceptions() {
        let (pods, namespaces) = cluster();
        let p = policy(
            "x",
            "ports",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{
                "from": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24", "192.168.2.7/32"]}}],
                "ports": [{"port": 80}, {"protocol": "UDP", "port": 1000, "endPort": 2000},
                          {"port": "http"}, {"protocol": "UDP", "port": "http"}, {"protocol": "SCTP"}]
            }]}),
        );
        let r = ruleset(NODE, &pods, &namespaces, &[p]);
        let block = "ip saddr 192.168.0.0/16 ip saddr != { 192.168.1.0/24, 192.168.2.7/32 }";
        assert_eq!(
            r.chains["pod-in/x/a"],
            [
                format!("{block} meta l4proto tcp th dport 80 accept"),
                format!("{block} meta l4proto udp th dport 1000-2000 accept"),
                // The selected pod's port named http is TCP 8080; it has no UDP one.
                format!("{block} meta l4proto tcp th dport 8080 accept"),
                format!("{block} meta l4proto sctp accept"),
                "drop".to_string(),
            ]
        );
    }

    #[test]
    fn egress_named_ports_resolve_on_each_destination() {
        let (pods, namespaces) = cluster();
        let p = policy(
            "x",
            "out",
            json!({"podSelector": {"matchLabels": {"pod": "b"}}, "policyTypes": ["Egress"],
                "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}],
                            "ports": [{"protocol": "UDP", "port": "dns"}]}]}),
        );
        let r = ruleset(NODE, &pods, &namespaces, &[p]);
        let set = "ports/x/out/egress/0/0";
        assert_eq!(
            r.chains["pod-out/x/b"],
            [
                format!("ip daddr . meta l4proto . th dport @{set} accept"),
                "drop".into()
            ]
        );
        assert_eq!(
            r.named_ports[set],
            [("10.0.1.2".parse().unwrap(), Protocol::Udp, 53)].into()
        );
    }

    #[test]
    fn pods_without_an_address_are_neither_judged_nor_peers() {
        let wire: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "x", "name": "h"},
            "spec": {"nodeName": NODE, "hostNetwork": true, "containers": []},
            "status": {"podIP": "192.168.0.9"}}))
        .unwrap();
        assert_eq!(PolicyPod::from_wire(wire).ip, None);
        let wire: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "x", "name": "done"},
            "spec": {"nodeName": NODE, "containers": []},
            "status": {"podIP": "10.0.0.9", "phase": "Succeeded"}}))
        .unwrap();
        assert_eq!(PolicyPod::from_wire(wire).ip, None);
        let wire: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "x", "name": "web"},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": 80}, {"containerPort": 81}]}]},
            "status": {"podIP": "10.0.0.9", "phase": "Running"}}))
        .unwrap();
        let pod = PolicyPod::from_wire(wire);
        assert_eq!(pod.ip, Some("10.0.0.9".parse().unwrap()));
        assert_eq!(pod.ports, [("http".to_string(), Protocol::Tcp, 80)]);
    }

    #[test]
    fn long_names_are_shortened_distinctly() {
        let long = format!("pod-in/{}/{}", "n".repeat(63), "p".repeat(253));
        let other = format!("{long}q");
        assert!(nft_name(&long).len() <= 200);
        assert_ne!(nft_name(&long), nft_name(&other));
        assert_eq!(nft_name("pod-in/x/a"), "pod-in/x/a");
    }
}
