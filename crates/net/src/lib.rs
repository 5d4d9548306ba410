//! Node networking: the pod network of one node is a Linux bridge with the node's
//! podCIDR, wired by the standard CNI plugins (bridge with hairpin mode so a pod can
//! reach itself through its Service, host-local IPAM, portmap for hostPort), which
//! containerd's CRI plugin runs for every sandbox.

use std::path::{Path, PathBuf};

use krust_api::cidr::Ipv4Cidr;
use serde_json::json;

/// The file name containerd reads (it takes the first conflist in its conf dir).
pub const CONFLIST: &str = "10-krust.conflist";

/// The CNI configuration list for a node whose pods get addresses from `pod_cidr`, on
/// the bridge `bridge`; host-local keeps its leases in `ipam_dir`. The bridge takes
/// the range's first address and is the pods' default gateway.
pub fn bridge_conflist(bridge: &str, pod_cidr: Ipv4Cidr, ipam_dir: &Path) -> serde_json::Value {
    let gateway = std::net::Ipv4Addr::from(u32::from(pod_cidr.network()) + 1);
    json!({
        "cniVersion": "1.0.0",
        "name": "krust",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": true,
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
    })
}

/// Writes the conflist into `conf_dir` (atomically: containerd watches the directory).
pub fn write_conflist(
    conf_dir: &Path,
    bridge: &str,
    pod_cidr: Ipv4Cidr,
    ipam_dir: &Path,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(conf_dir)?;
    let path = conf_dir.join(CONFLIST);
    let tmp = conf_dir.join(format!(".{CONFLIST}.tmp"));
    let body = serde_json::to_vec_pretty(&bridge_conflist(bridge, pod_cidr, ipam_dir))
        .expect("conflist encodes");
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The bridge of a pod range: `krust` and six hex digits of a hash of the range, so
/// that nodes sharing one network namespace (tests, several agents on one machine
/// without netns) never share a bridge, while a restarted node finds its own again.
/// Linux bridge names have at most 15 characters.
pub fn bridge_name(pod_cidr: Ipv4Cidr) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in pod_cidr.to_string().bytes() {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    format!("krust{:06x}", h & 0xff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conflist_uses_the_nodes_range_with_the_bridge_as_gateway() {
        let dir = tempfile::tempdir().unwrap();
        let cidr: Ipv4Cidr = "10.42.3.0/24".parse().unwrap();
        let path =
            write_conflist(dir.path(), "krust0", cidr, Path::new("/var/lib/x/ipam")).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let bridge = &v["plugins"][0];
        assert_eq!(bridge["bridge"], "krust0");
        assert_eq!(bridge["hairpinMode"], true);
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
