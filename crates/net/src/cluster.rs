//! The pod network across nodes — flannel's job with its Kubernetes subnet manager.
//! Every node's pods live on its own bridge in the node's podCIDR; this component, in
//! every agent, makes every other node's podCIDR reachable from this node and its pods,
//! from nothing but the Node objects (each node's podCIDR and InternalIP):
//!
//! - `vxlan` (the default, as flannel's): a kernel VXLAN device `flannel.1` (VNI 1, UDP
//!   8472) holding `<podCIDR>.0/32`; for each other node a route to its podCIDR via its
//!   `.0` address on the device, a permanent neighbour entry binding that address to the
//!   node's VTEP MAC, and a forwarding entry sending that MAC to the node's IP. Each
//!   node publishes its VTEP MAC in flannel's annotations on its own Node. The device is
//!   made only once there is another node, so one-node machines stay untouched.
//! - `host-gw`: a route to each other node's podCIDR via that node's IP (the nodes
//!   share a link).
//! - `none`: no routes (another CNI connects the nodes).
//!
//! Routes carry protocol [`ROUTE_PROTOCOL`], so a sync (also after a restart) knows
//! which it owns and removes those of nodes that are gone. Pods' traffic leaving the
//! cluster CIDR is masqueraded (an nftables table per pod range); traffic between pods
//! keeps its source address.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use krust_api::cidr::Ipv4Cidr;
use krust_api::well_known::SIMULATED_NODE_LABEL;
use krust_client::cache::Cache;
use krust_client::informer::Informer;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;

use crate::ip::{self, IpError};

/// The route protocol number that marks krust's routes (unassigned in
/// /etc/iproute2/rt_protos).
pub const ROUTE_PROTOCOL: &str = "75";
/// flannel's device name, VNI and port, so that habits and firewall rules carry over.
pub const VXLAN_DEVICE: &str = "flannel.1";
const VXLAN_VNI: u32 = 1;
const VXLAN_PORT: u16 = 8472;
/// Bytes a VXLAN packet adds (outer IP, UDP, VXLAN and Ethernet headers).
pub const VXLAN_OVERHEAD: u32 = 50;
/// flannel's annotations (the VTEP MAC is what the other nodes need).
const BACKEND_DATA: &str = "flannel.alpha.coreos.com/backend-data";
const BACKEND_TYPE: &str = "flannel.alpha.coreos.com/backend-type";
const PUBLIC_IP: &str = "flannel.alpha.coreos.com/public-ip";

/// How the nodes' pod ranges are joined (k3s's `--flannel-backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Vxlan,
    HostGw,
    None,
}

impl FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vxlan" => Ok(Backend::Vxlan),
            "host-gw" => Ok(Backend::HostGw),
            "none" => Ok(Backend::None),
            other => Err(format!(
                "unknown backend {other:?} (vxlan, host-gw or none)"
            )),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub node_name: String,
    pub node_ip: Ipv4Addr,
    pub cluster_cidr: Ipv4Cidr,
    pub backend: Backend,
    /// How often the tables are checked against the plan even without a change (a
    /// route deleted behind our back comes back).
    pub resync: Duration,
}

/// The MTU for pod interfaces: the node link's, less the VXLAN overhead with `vxlan`;
/// `None` when the node's link is not found (the CNI default then applies).
pub fn pod_mtu(backend: Backend, node_ip: Ipv4Addr) -> Option<u32> {
    let (_, mtu) = ip::interface_of(node_ip).ok()??;
    Some(match backend {
        Backend::Vxlan => mtu - VXLAN_OVERHEAD,
        Backend::HostGw | Backend::None => mtu,
    })
}

/// Another node whose pods this one must reach.
#[derive(Debug, Clone, PartialEq)]
struct Peer {
    pod_cidr: Ipv4Cidr,
    ip: Ipv4Addr,
    vtep_mac: Option<String>,
}

fn internal_ip(node: &Node) -> Option<Ipv4Addr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")?
        .address
        .parse()
        .ok()
}

fn pod_cidr(node: &Node) -> Option<Ipv4Cidr> {
    node.spec.as_ref()?.pod_cidr.as_deref()?.parse().ok()
}

/// The VTEP MAC a node publishes in flannel's backend data.
fn vtep_mac(node: &Node) -> Option<String> {
    let data = node.annotations().get(BACKEND_DATA)?;
    let data: serde_json::Value = serde_json::from_str(data).ok()?;
    data["VtepMAC"].as_str().map(str::to_string)
}

/// The nodes this one routes to: real nodes (not simulated) on another address, with a
/// pod range.
fn peers(nodes: &[Arc<Node>], config: &Config) -> Vec<Peer> {
    nodes
        .iter()
        .filter(|n| n.name_any() != config.node_name)
        .filter(|n| !n.labels().contains_key(SIMULATED_NODE_LABEL))
        .filter_map(|n| {
            let ip = internal_ip(n).filter(|ip| *ip != config.node_ip)?;
            Some(Peer {
                pod_cidr: pod_cidr(n)?,
                ip,
                vtep_mac: vtep_mac(n),
            })
        })
        .collect()
}

/// What the kernel's tables should hold.
#[derive(Debug, Default, Clone, PartialEq)]
struct Plan {
    /// Destination → the rest of `ip route replace <dst> ...`.
    routes: BTreeMap<String, String>,
    /// VXLAN neighbour entries: a peer's `.0` address → its VTEP MAC.
    neighbours: BTreeMap<Ipv4Addr, String>,
    /// VXLAN forwarding entries: a VTEP MAC → its node's IP.
    fdb: BTreeMap<String, Ipv4Addr>,
}

fn plan(backend: Backend, peers: &[Peer]) -> Plan {
    let mut plan = Plan::default();
    for peer in peers {
        let dst = peer.pod_cidr.to_string();
        match backend {
            Backend::HostGw => {
                plan.routes.insert(dst, format!("via {}", peer.ip));
            }
            Backend::Vxlan => {
                let Some(mac) = &peer.vtep_mac else {
                    continue; // not published yet: its next update brings it
                };
                let gateway = peer.pod_cidr.network();
                plan.routes
                    .insert(dst, format!("via {gateway} dev {VXLAN_DEVICE} onlink"));
                plan.neighbours.insert(gateway, mac.clone());
                plan.fdb.insert(mac.clone(), peer.ip);
            }
            Backend::None => {}
        }
    }
    plan
}

/// Brings the tables to `plan`: adds or replaces what it holds, removes krust's routes
/// and the device's entries it does not.
fn apply(plan: &Plan, vxlan: bool) -> Result<(), IpError> {
    let mut ip_lines = Vec::new();
    for route in ip::ip_json(&["route", "show", "proto", ROUTE_PROTOCOL])? {
        let dst = route["dst"].as_str().unwrap_or_default();
        if !plan.routes.contains_key(dst) {
            ip_lines.push(format!("route del {dst} proto {ROUTE_PROTOCOL}"));
        }
    }
    let mut bridge_lines = Vec::new();
    if vxlan {
        for neigh in ip::ip_json(&["neigh", "show", "dev", VXLAN_DEVICE])? {
            let dst = neigh["dst"].as_str().unwrap_or_default();
            if !dst.parse().is_ok_and(|d| plan.neighbours.contains_key(&d)) {
                ip_lines.push(format!("neigh del {dst} dev {VXLAN_DEVICE}"));
            }
        }
        for entry in ip::bridge_json(&["fdb", "show", "dev", VXLAN_DEVICE])? {
            let (Some(mac), Some(dst)) = (entry["mac"].as_str(), entry["dst"].as_str()) else {
                continue;
            };
            let wanted = plan.fdb.get(mac).map(|ip| ip.to_string());
            if wanted.as_deref() != Some(dst) {
                bridge_lines.push(format!("fdb del {mac} dev {VXLAN_DEVICE} dst {dst} self"));
            }
        }
        for (gateway, mac) in &plan.neighbours {
            ip_lines.push(format!(
                "neigh replace {gateway} lladdr {mac} dev {VXLAN_DEVICE} nud permanent"
            ));
        }
        for (mac, node_ip) in &plan.fdb {
            bridge_lines.push(format!(
                "fdb replace {mac} dev {VXLAN_DEVICE} dst {node_ip} self permanent"
            ));
        }
    }
    for (dst, how) in &plan.routes {
        ip_lines.push(format!("route replace {dst} {how} proto {ROUTE_PROTOCOL}"));
    }
    // Neighbours before routes through them: the batch is in this order.
    ip::ip_batch(&ip_lines)?;
    ip::bridge_batch(&bridge_lines)
}

/// Makes sure `flannel.1` exists, bound to the node's address, with the node's `.0`
/// address and the lowered MTU; returns its MAC.
fn ensure_vxlan(node_ip: Ipv4Addr, own_cidr: Ipv4Cidr) -> Result<String, IpError> {
    let local = ip::ip_json(&["-d", "link", "show", "dev", VXLAN_DEVICE])
        .ok()
        .and_then(|links| links.into_iter().next())
        .map(|link| link["linkinfo"]["info_data"]["local"].clone());
    let mut lines = Vec::new();
    if local
        .as_ref()
        .is_some_and(|l| *l != node_ip.to_string().as_str())
    {
        lines.push(format!("link del {VXLAN_DEVICE}"));
    }
    if local.is_none() || !lines.is_empty() {
        let (iface, mtu) = ip::interface_of(node_ip)?.unwrap_or(("".into(), 1500));
        let dev = if iface.is_empty() {
            String::new()
        } else {
            format!(" dev {iface}")
        };
        lines.push(format!(
            "link add {VXLAN_DEVICE} type vxlan id {VXLAN_VNI} local {node_ip}{dev} \
             dstport {VXLAN_PORT} nolearning"
        ));
        lines.push(format!(
            "link set {VXLAN_DEVICE} mtu {} up",
            mtu - VXLAN_OVERHEAD
        ));
        tracing::info!(device = VXLAN_DEVICE, local = %node_ip, "creating the VXLAN device");
    }
    lines.push(format!(
        "addr replace {}/32 dev {VXLAN_DEVICE}",
        own_cidr.network()
    ));
    ip::ip_batch(&lines)?;
    ip::link_mac(VXLAN_DEVICE).ok_or(IpError::Failed {
        tool: "ip",
        args: format!("link show {VXLAN_DEVICE}"),
        stderr: "the device has no MAC address".into(),
    })
}

/// The nftables table that masquerades `pod_cidr`'s traffic leaving the cluster.
pub fn egress_table(pod_cidr: Ipv4Cidr) -> String {
    format!("krust-egress-{}", crate::range_tag(pod_cidr))
}

/// Only packets that come from this node's own pod bridge: with `br_netfilter`, packets
/// merely bridged through a namespace (another node's, on a shared bridge) pass its nat
/// hooks too, and must not be rewritten.
fn egress_ruleset(pod_cidr: Ipv4Cidr, cluster_cidr: Ipv4Cidr) -> String {
    let table = egress_table(pod_cidr);
    let bridge = crate::bridge_name(pod_cidr);
    format!(
        "table ip {table}\ndelete table ip {table}\ntable ip {table} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tiifname \"{bridge}\" ip saddr {pod_cidr} ip daddr != {cluster_cidr} \
         ip daddr != 224.0.0.0/4 masquerade fully-random\n\
         \t}}\n}}\n"
    )
}

/// Keeps this node's routes to every other node's pods, and its pods' egress
/// masquerade, in step with the Node objects until dropped.
pub async fn run(client: Client, config: Config) {
    let changed = Arc::new(Notify::new());
    let nodes = Informer::<Node>::notifying(&client, watcher::Config::default(), &changed);
    let cache = nodes.cache();
    tokio::select! {
        _ = nodes.run() => {}
        _ = sync(&client, &config, &cache, &changed) => {}
    }
}

async fn sync(client: &Client, config: &Config, cache: &Cache<Node>, changed: &Notify) {
    let nodes_api: Api<Node> = Api::all(client.clone());
    // What was last made true in the kernel; cleared at every resync so that what was
    // deleted behind our back comes back.
    let mut applied: Option<Plan> = None;
    let mut egress: Option<Ipv4Cidr> = None;
    let mut vtep: Option<String> = None;
    loop {
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(config.resync) => (applied, egress, vtep) = (None, None, None),
        }
        let nodes = cache.state();
        let own = nodes.iter().find(|n| n.name_any() == config.node_name);
        let Some(own_cidr) = own.and_then(|n| pod_cidr(n)) else {
            continue; // no range yet: node IPAM gives one
        };
        if egress != Some(own_cidr) {
            vtep = None; // the device's address follows the range
            let ruleset = egress_ruleset(own_cidr, config.cluster_cidr);
            match blocking(move || crate::nft::apply(&ruleset)).await {
                Ok(()) => egress = Some(own_cidr),
                Err(e) => tracing::warn!(error = %e, "loading the pods' egress masquerade"),
            }
        }
        let peers = peers(&nodes, config);
        let vxlan = config.backend == Backend::Vxlan && !peers.is_empty();
        if vxlan && vtep.is_none() {
            let node_ip = config.node_ip;
            match blocking(move || ensure_vxlan(node_ip, own_cidr)).await {
                Ok(mac) => vtep = Some(mac),
                Err(e) => {
                    tracing::warn!(error = %e, "setting up the VXLAN device");
                    continue;
                }
            }
        }
        if let Some(mac) = vtep.as_deref().filter(|_| vxlan)
            && own.and_then(|n| vtep_mac(n)).as_deref() != Some(mac)
        {
            publish_vtep(&nodes_api, config, mac).await;
        }
        let wanted = plan(config.backend, &peers);
        if applied.as_ref() == Some(&wanted) {
            continue;
        }
        let plan = wanted.clone();
        match blocking(move || apply(&plan, vxlan)).await {
            Ok(()) => {
                tracing::info!(
                    peers = wanted.routes.len(),
                    backend = ?config.backend,
                    "routes to other nodes' pods synced"
                );
                applied = Some(wanted);
            }
            Err(e) => tracing::warn!(error = %e, "syncing routes to other nodes' pods"),
        }
    }
}

/// Runs a kernel-table change (it spawns `ip`, `bridge` or `nft`) off the async threads.
async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, String>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(e) => Err(format!("the task failed: {e}")),
    }
}

/// Puts flannel's annotations on this node's Node, so the others can reach its VTEP.
async fn publish_vtep(nodes: &Api<Node>, config: &Config, mac: &str) {
    let data = json!({"VNI": VXLAN_VNI, "VtepMAC": mac}).to_string();
    let patch = json!({"metadata": {"annotations": {
        BACKEND_DATA: data,
        BACKEND_TYPE: "vxlan",
        PUBLIC_IP: config.node_ip.to_string(),
    }}});
    match nodes
        .patch(
            &config.node_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => tracing::info!(mac, "published this node's VTEP"),
        Err(e) => tracing::warn!(error = %e, "publishing this node's VTEP"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ip: &str, cidr: &str, mac: Option<&str>, simulated: bool) -> Arc<Node> {
        let mut annotations = BTreeMap::new();
        if let Some(mac) = mac {
            annotations.insert(
                BACKEND_DATA.to_string(),
                json!({"VNI": 1, "VtepMAC": mac}).to_string(),
            );
        }
        let mut labels = BTreeMap::new();
        if simulated {
            labels.insert(SIMULATED_NODE_LABEL.to_string(), "true".to_string());
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": annotations, "labels": labels},
                "spec": {"podCIDR": cidr},
                "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
            }))
            .unwrap(),
        )
    }

    fn config(backend: Backend) -> Config {
        Config {
            node_name: "a".into(),
            node_ip: "10.99.8.11".parse().unwrap(),
            cluster_cidr: "10.42.0.0/16".parse().unwrap(),
            backend,
            resync: Duration::from_secs(30),
        }
    }

    #[test]
    fn only_real_nodes_elsewhere_are_peers() {
        let nodes = vec![
            node("a", "10.99.8.11", "10.42.0.0/24", None, false),
            node(
                "b",
                "10.99.8.12",
                "10.42.1.0/24",
                Some("aa:bb:cc:dd:ee:01"),
                false,
            ),
            node("same-host", "10.99.8.11", "10.42.2.0/24", None, false),
            node("sim", "10.99.9.1", "10.42.3.0/24", None, true),
        ];
        let peers = peers(&nodes, &config(Backend::Vxlan));
        assert_eq!(peers.len(), 1);
        assert_eq!(peers[0].pod_cidr.to_string(), "10.42.1.0/24");
        assert_eq!(peers[0].vtep_mac.as_deref(), Some("aa:bb:cc:dd:ee:01"));
    }

    #[test]
    fn vxlan_routes_through_the_peers_vtep_and_host_gw_through_its_address() {
        let peers = vec![
            Peer {
                pod_cidr: "10.42.1.0/24".parse().unwrap(),
                ip: "10.99.8.12".parse().unwrap(),
                vtep_mac: Some("aa:bb:cc:dd:ee:01".into()),
            },
            Peer {
                pod_cidr: "10.42.2.0/24".parse().unwrap(),
                ip: "10.99.8.13".parse().unwrap(),
                vtep_mac: None,
            },
        ];
        let vxlan = plan(Backend::Vxlan, &peers);
        assert_eq!(
            vxlan.routes["10.42.1.0/24"],
            "via 10.42.1.0 dev flannel.1 onlink"
        );
        assert!(!vxlan.routes.contains_key("10.42.2.0/24"), "no VTEP yet");
        assert_eq!(
            vxlan.neighbours[&"10.42.1.0".parse().unwrap()],
            "aa:bb:cc:dd:ee:01"
        );
        assert_eq!(vxlan.fdb["aa:bb:cc:dd:ee:01"].to_string(), "10.99.8.12");
        let host_gw = plan(Backend::HostGw, &peers);
        assert_eq!(host_gw.routes["10.42.2.0/24"], "via 10.99.8.13");
        assert!(host_gw.neighbours.is_empty() && host_gw.fdb.is_empty());
        assert_eq!(plan(Backend::None, &peers), Plan::default());
    }

    #[test]
    fn egress_leaves_pod_to_pod_traffic_alone() {
        let rules = egress_ruleset(
            "10.42.1.0/24".parse().unwrap(),
            "10.42.0.0/16".parse().unwrap(),
        );
        assert!(rules.contains("ip saddr 10.42.1.0/24 ip daddr != 10.42.0.0/16"));
        let bridge = crate::bridge_name("10.42.1.0/24".parse().unwrap());
        assert!(rules.contains(&format!("iifname \"{bridge}\"")), "{rules}");
        assert!(rules.contains("masquerade"));
        crate::nft::check(&rules).unwrap_or_else(|e| panic!("{e}\n{rules}"));
    }
}
