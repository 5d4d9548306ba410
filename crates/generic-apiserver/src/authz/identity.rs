//! The users krust's own components authenticate as (client certificates issued by the
//! server at every start). Upstream's names where upstream has the component; the
//! bootstrap policy binds each to what upstream grants that role, and krust's own DNS and
//! Ingress controller to roles of their own.

pub const CONTROLLER_MANAGER: &str = "system:kube-controller-manager";
pub const SCHEDULER: &str = "system:kube-scheduler";
pub const PROXY: &str = "system:kube-proxy";
pub const DNS: &str = "system:krust-dns";
pub const INGRESS: &str = "system:krust-ingress";
/// The provisioner of the built-in CSI driver (upstream's external-provisioner role).
pub const LOCAL_STORAGE: &str = "system:krust-local-storage";
/// The group of every kubelet.
pub const NODES_GROUP: &str = "system:nodes";

/// The user of the kubelet of `node`.
pub fn node(node: &str) -> String {
    format!("system:node:{node}")
}
