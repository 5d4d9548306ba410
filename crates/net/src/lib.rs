//! Node networking: the pod network of one node is a Linux bridge with the node's
//! podCIDR, wired by the standard CNI plugins (bridge with hairpin mode so a pod can
//! reach itself through its Service, host-local IPAM, portmap for hostPort), which
//! containerd's CRI plugin runs for every sandbox; [`cluster`] joins the nodes' ranges
//! (routes, VXLAN) and masquerades what leaves the cluster.

pub mod cluster;
pub mod ip;
pub mod nft;
pub mod policy;

use std::path::{Path, PathBuf};

use krust_api::cidr::Ipv4Cidr;
use serde_json::json;

/// The file name containerd reads (it takes the first conflist in its conf dir).
pub const CONFLIST: &str = "10-krust.conflist";

/// How a node's pods are wired to its bridge.
#[derive(Debug, Clone)]
pub struct BridgeNetwork<'a> {
    pub bridge: &'a str,
    pub pod_cidr: Ipv4Cidr,
    /// Where host-local keeps its leases.
    pub ipam_dir: &'a Path,
    /// The pods' MTU (lower than the link's under VXLAN); `None`: the plugin's default.
    pub mtu: Option<u32>,
}

/// The CNI configuration list of `net`. The bridge takes the range's first address and
/// is the pods' default gateway. The bridge plugin does not masquerade: its rule would
/// hide pods' addresses from pods on other nodes; [`cluster`] masquerades only traffic
/// that leaves the cluster CIDR.
pub fn bridge_conflist(net: &BridgeNetwork<'_>) -> serde_json::Value {
    let BridgeNetwork {
        bridge,
        pod_cidr,
        ipam_dir,
        mtu,
    } = net;
    let gateway = std::net::Ipv4Addr::from(u32::from(pod_cidr.network()) + 1);
    let mut conflist = json!({
        "cniVersion": "1.0.0",
        "name": "krust",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": ipam_dir,
                    "ranges": [[{"subnet": pod_cidr.to_string(), "gateway": gateway.to_string()}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    if let Some(mtu) = mtu {
        conflist["plugins"][0]["mtu"] = json!(mtu);
    }
    conflist
}

/// Writes the conflist into `conf_dir` (atomically: containerd watches the directory).
pub fn write_conflist(conf_dir: &Path, net: &BridgeNetwork<'_>) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(conf_dir)?;
    let path = conf_dir.join(CONFLIST);
    let tmp = conf_dir.join(format!(".{CONFLIST}.tmp"));
    let body = serde_json::to_vec_pretty(&bridge_conflist(net)).expect("conflist encodes");
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The bridge of a pod range: `krust` and six hex digits of a hash of the range, so
/// that nodes sharing one network namespace (tests, several agents on one machine
/// without netns) never share a bridge, while a restarted node finds its own again.
/// Linux bridge names have at most 15 characters.
pub fn bridge_name(pod_cidr: Ipv4Cidr) -> String {
    format!("krust{}", range_tag(pod_cidr))
}

/// Six hex digits of an FNV-1a hash of a pod range: what names a node's per-range
/// objects (bridge, egress table).
fn range_tag(pod_cidr: Ipv4Cidr) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in pod_cidr.to_string().bytes() {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    format!("{:06x}", h & 0xff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conflist_uses_the_nodes_range_with_the_bridge_as_gateway() {
        let dir = tempfile::tempdir().unwrap();
        let cidr: Ipv4Cidr = "10.42.3.0/24".parse().unwrap();
        let net = BridgeNetwork {
            bridge: "krust0",
            pod_cidr: cidr,
            ipam_dir: Path::new("/var/lib/x/ipam"),
            mtu: Some(1450),
        };
        let path = write_conflist(dir.path(), &net).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let bridge = &v["plugins"][0];
        assert_eq!(bridge["bridge"], "krust0");
        assert_eq!(bridge["hairpinMode"], true);
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["mtu"], 1450);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.42.3.0/24");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["gateway"], "10.42.3.1");
        assert_eq!(v["plugins"][1]["type"], "portmap");
    }

    #[test]
    fn bridge_names_fit_and_differ_per_range() {
        let a = bridge_name("10.42.0.0/24".parse().unwrap());
        let b = bridge_name("10.42.1.0/24".parse().unwrap());
        assert!(a.len() <= 15 && b.len() <= 15);
        assert_ne!(a, b);
        assert_eq!(a, bridge_name("10.42.0.0/24".parse().unwrap()));
    }
}
