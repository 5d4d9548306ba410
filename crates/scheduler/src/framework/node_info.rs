//! What the scheduler knows about one node: the node object and the pods on it,
//! with the aggregates filters need precomputed.
//!
//! Every pod is wrapped once in a [`PodInfo`] (requests summed, host ports and
//! affinity terms parsed) and shared by `Arc`; adding or removing a pod updates
//! the node's totals in O(1), so the basic filters never walk the pod list.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, PodAffinityTerm};

use crate::resource::{PodRequests, Resource};
use crate::selector::{Selector, SelectorError, label_pair_hash, labels_or_empty};

/// The namespace of a pod (empty when unset, as in upstream).
pub fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("")
}

/// `spec.priority`, which admission resolves from the PriorityClass; 0 if unset.
pub fn pod_priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// When the kubelet started the pod, or `None` if it has not started yet.
pub fn pod_start_time(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
}

/// Identity used to find a pod again on removal: its UID, or namespace/name for
/// objects that have none yet (tests, dry runs).
fn pod_key(pod: &Pod) -> String {
    match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_string(),
        _ => format!(
            "{}/{}",
            pod_namespace(pod),
            pod.metadata.name.as_deref().unwrap_or("")
        ),
    }
}

/// Transport protocol of a host port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    fn parse(s: Option<&str>) -> Self {
        match s {
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            _ => Protocol::Tcp,
        }
    }
}

/// The wildcard host IP: a port bound here conflicts with that port on every IP.
pub const BIND_ALL_HOST_IP: &str = "0.0.0.0";

/// A `hostPort` a container binds on the node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub ip: String,
    pub protocol: Protocol,
    pub port: i32,
}

/// The host ports bound by the pods on a node, counted so removal is exact.
#[derive(Clone, Debug, Default)]
pub struct HostPortUsage {
    by_port: HashMap<(Protocol, i32), HashMap<String, u32>>,
}

impl HostPortUsage {
    fn add(&mut self, p: &HostPort) {
        *self
            .by_port
            .entry((p.protocol, p.port))
            .or_default()
            .entry(p.ip.clone())
            .or_insert(0) += 1;
    }

    fn remove(&mut self, p: &HostPort) {
        if let Some(ips) = self.by_port.get_mut(&(p.protocol, p.port)) {
            if let Some(n) = ips.get_mut(&p.ip) {
                *n -= 1;
                if *n == 0 {
                    ips.remove(&p.ip);
                }
            }
            if ips.is_empty() {
                self.by_port.remove(&(p.protocol, p.port));
            }
        }
    }

    /// A wildcard bind conflicts with any bind of the same protocol/port; a
    /// specific IP conflicts with the same IP or the wildcard.
    pub fn conflicts(&self, p: &HostPort) -> bool {
        let Some(ips) = self.by_port.get(&(p.protocol, p.port)) else {
            return false;
        };
        p.ip == BIND_ALL_HOST_IP || ips.contains_key(BIND_ALL_HOST_IP) || ips.contains_key(&p.ip)
    }

    pub fn is_empty(&self) -> bool {
        self.by_port.is_empty()
    }
}

/// A parsed pod (anti-)affinity term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AffinityTerm {
    /// Namespaces listed explicitly (or the pod's own when neither a list nor a
    /// namespace selector is given).
    pub namespaces: BTreeSet<String>,
    pub selector: Selector,
    pub topology_key: String,
    pub namespace_selector: Selector,
    /// `selector.required_label_pairs()`, kept to skip nodes cheaply.
    pub label_pairs: Vec<u64>,
}

impl AffinityTerm {
    fn parse(owner: &Pod, term: &PodAffinityTerm) -> Result<Self, SelectorError> {
        let listed = term.namespaces.as_deref().unwrap_or_default();
        let namespaces = if listed.is_empty() && term.namespace_selector.is_none() {
            BTreeSet::from([pod_namespace(owner).to_string()])
        } else {
            listed.iter().cloned().collect()
        };
        let selector = Selector::parse(term.label_selector.as_ref())?;
        Ok(AffinityTerm {
            namespaces,
            label_pairs: selector.required_label_pairs(),
            selector,
            topology_key: term.topology_key.clone(),
            namespace_selector: Selector::parse(term.namespace_selector.as_ref())?,
        })
    }

    /// Whether `pod` is selected by this term. `namespace_labels` are the labels
    /// of `pod`'s namespace, for terms that select namespaces by label.
    pub fn matches(
        &self,
        pod: &Pod,
        namespace_labels: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        (self.namespaces.contains(pod_namespace(pod))
            || self.namespace_selector.matches(namespace_labels))
            && self.selector.matches(labels_or_empty(&pod.metadata.labels))
    }
}

/// A preferred (anti-)affinity term with its weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightedAffinityTerm {
    pub term: AffinityTerm,
    pub weight: i32,
}

/// A pod with everything the plugins derive from it computed once.
#[derive(Debug)]
pub struct PodInfo {
    pub pod: Arc<Pod>,
    pub requests: PodRequests,
    /// Ports with `hostPort > 0` of the regular containers.
    pub host_ports: Vec<HostPort>,
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
    pub preferred_affinity: Vec<WeightedAffinityTerm>,
    pub preferred_anti_affinity: Vec<WeightedAffinityTerm>,
    /// Set when an affinity selector did not parse; the terms above are then
    /// incomplete and InterPodAffinity rejects the pod instead of guessing.
    pub parse_error: Option<SelectorError>,
    key: String,
}

impl PodInfo {
    pub fn new(pod: Arc<Pod>) -> Self {
        let spec = pod.spec.as_ref();
        let requests = spec.map(PodRequests::of).unwrap_or_default();
        let host_ports = spec
            .into_iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let port = p.host_port.filter(|hp| *hp > 0)?;
                Some(HostPort {
                    ip: p
                        .host_ip
                        .clone()
                        .filter(|ip| !ip.is_empty())
                        .unwrap_or_else(|| BIND_ALL_HOST_IP.into()),
                    protocol: Protocol::parse(p.protocol.as_deref()),
                    port,
                })
            })
            .collect();
        let affinity = spec.and_then(|s| s.affinity.as_ref());
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let anti_affinity = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let mut parse_error = None;
        let mut required = |terms: Option<&Vec<PodAffinityTerm>>| -> Vec<AffinityTerm> {
            terms
                .into_iter()
                .flatten()
                .filter_map(|t| {
                    AffinityTerm::parse(&pod, t)
                        .map_err(|e| parse_error = Some(e))
                        .ok()
                })
                .collect()
        };
        let required_affinity = required(pod_affinity.and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        }));
        let required_anti_affinity = required(anti_affinity.and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        }));
        let mut preferred =
            |terms: Option<&Vec<k8s_openapi::api::core::v1::WeightedPodAffinityTerm>>| {
                terms
                    .into_iter()
                    .flatten()
                    .filter_map(|w| {
                        AffinityTerm::parse(&pod, &w.pod_affinity_term)
                            .map(|term| WeightedAffinityTerm {
                                term,
                                weight: w.weight,
                            })
                            .map_err(|e| parse_error = Some(e))
                            .ok()
                    })
                    .collect::<Vec<_>>()
            };
        let preferred_affinity = preferred(pod_affinity.and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        }));
        let preferred_anti_affinity = preferred(anti_affinity.and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        }));
        let key = pod_key(&pod);
        PodInfo {
            pod,
            requests,
            host_ports,
            required_affinity,
            required_anti_affinity,
            preferred_affinity,
            preferred_anti_affinity,
            parse_error,
            key,
        }
    }

    /// Whether the pod declares any pod affinity or anti-affinity at all; such
    /// pods are indexed because other pods' scores depend on them.
    pub fn has_affinity(&self) -> bool {
        let affinity = self.pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        affinity.is_some_and(|a| a.pod_affinity.is_some() || a.pod_anti_affinity.is_some())
    }

    pub fn has_required_anti_affinity(&self) -> bool {
        !self.required_anti_affinity.is_empty()
    }

    pub fn namespace(&self) -> &str {
        pod_namespace(&self.pod)
    }

    pub fn labels(&self) -> &std::collections::BTreeMap<String, String> {
        labels_or_empty(&self.pod.metadata.labels)
    }

    pub fn priority(&self) -> i32 {
        pod_priority(&self.pod)
    }

    /// Whether this is the same pod (by UID, or namespace/name without one).
    pub fn is_same_pod(&self, pod: &Pod) -> bool {
        self.key == pod_key(pod)
    }
}

/// Hasher for keys that already are hashes.
#[derive(Default, Clone, Copy)]
struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// How many pods on a node carry each label pair (by [`label_pair_hash`]).
type LabelPairCounts = HashMap<u64, u32, BuildHasherDefault<PassThroughHasher>>;

/// CPU and memory committed on a node with the scoring defaults substituted for
/// containers that request none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NonZeroRequested {
    pub milli_cpu: i64,
    pub memory: i64,
}

/// One node and the pods the scheduler believes run (or will run) on it.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    node: Arc<Node>,
    allocatable: Resource,
    image_sizes: HashMap<String, i64>,
    pods: Vec<Arc<PodInfo>>,
    pods_with_affinity: Vec<Arc<PodInfo>>,
    pods_with_required_anti_affinity: Vec<Arc<PodInfo>>,
    requested: Resource,
    non_zero_requested: NonZeroRequested,
    used_ports: HostPortUsage,
    pod_label_pairs: LabelPairCounts,
}

impl NodeInfo {
    pub fn new(node: Arc<Node>) -> Self {
        let mut info = NodeInfo {
            node: node.clone(),
            allocatable: Resource::default(),
            image_sizes: HashMap::new(),
            pods: Vec::new(),
            pods_with_affinity: Vec::new(),
            pods_with_required_anti_affinity: Vec::new(),
            requested: Resource::default(),
            non_zero_requested: NonZeroRequested::default(),
            used_ports: HostPortUsage::default(),
            pod_label_pairs: LabelPairCounts::default(),
        };
        info.set_node(node);
        info
    }

    /// Replaces the node object (labels, taints, allocatable or images changed),
    /// keeping the pods.
    pub fn set_node(&mut self, node: Arc<Node>) {
        let status = node.status.as_ref();
        self.allocatable = status
            .and_then(|s| s.allocatable.as_ref())
            .map(Resource::from_list)
            .unwrap_or_default();
        self.image_sizes = status
            .and_then(|s| s.images.as_ref())
            .into_iter()
            .flatten()
            .flat_map(|img| {
                let size = img.size_bytes.unwrap_or(0);
                img.names.iter().flatten().map(move |n| (n.clone(), size))
            })
            .collect();
        self.node = node;
    }

    /// Accounts for a pod placed on this node.
    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.requested.add(&pod.requests.requests);
        self.non_zero_requested.milli_cpu += pod.requests.non_zero_milli_cpu;
        self.non_zero_requested.memory += pod.requests.non_zero_memory;
        for p in &pod.host_ports {
            self.used_ports.add(p);
        }
        for (k, v) in pod.labels() {
            *self
                .pod_label_pairs
                .entry(label_pair_hash(k, v))
                .or_insert(0) += 1;
        }
        if pod.has_affinity() {
            self.pods_with_affinity.push(pod.clone());
        }
        if pod.has_required_anti_affinity() {
            self.pods_with_required_anti_affinity.push(pod.clone());
        }
        self.pods.push(pod);
    }

    /// Removes a pod (matched by UID) and its accounting; returns the removed
    /// entry (as it was added, so with its labels at that time).
    pub fn remove_pod(&mut self, pod: &Pod) -> Option<Arc<PodInfo>> {
        let key = pod_key(pod);
        let index = self.pods.iter().position(|p| p.key == key)?;
        let removed = self.pods.swap_remove(index);
        self.pods_with_affinity.retain(|p| p.key != key);
        self.pods_with_required_anti_affinity
            .retain(|p| p.key != key);
        self.requested.subtract(&removed.requests.requests);
        self.non_zero_requested.milli_cpu -= removed.requests.non_zero_milli_cpu;
        self.non_zero_requested.memory -= removed.requests.non_zero_memory;
        for p in &removed.host_ports {
            self.used_ports.remove(p);
        }
        for (k, v) in removed.labels() {
            let hash = label_pair_hash(k, v);
            if let Some(n) = self.pod_label_pairs.get_mut(&hash) {
                *n -= 1;
                if *n == 0 {
                    self.pod_label_pairs.remove(&hash);
                }
            }
        }
        Some(removed)
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    pub fn node_arc(&self) -> &Arc<Node> {
        &self.node
    }

    pub fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or("")
    }

    pub fn labels(&self) -> &std::collections::BTreeMap<String, String> {
        labels_or_empty(&self.node.metadata.labels)
    }

    pub fn taints(&self) -> &[k8s_openapi::api::core::v1::Taint] {
        self.node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
    }

    pub fn allocatable(&self) -> &Resource {
        &self.allocatable
    }

    pub fn requested(&self) -> &Resource {
        &self.requested
    }

    pub fn non_zero_requested(&self) -> NonZeroRequested {
        self.non_zero_requested
    }

    pub fn pods(&self) -> &[Arc<PodInfo>] {
        &self.pods
    }

    /// Pods with any pod affinity or anti-affinity.
    pub fn pods_with_affinity(&self) -> &[Arc<PodInfo>] {
        &self.pods_with_affinity
    }

    /// Pods with required anti-affinity terms (these can reject an incoming pod).
    pub fn pods_with_required_anti_affinity(&self) -> &[Arc<PodInfo>] {
        &self.pods_with_required_anti_affinity
    }

    /// False when no pod here can carry all of `pairs` (see
    /// [`Selector::required_label_pairs`]); true means "maybe".
    pub fn may_have_pods_with(&self, pairs: &[u64]) -> bool {
        pairs.iter().all(|p| self.pod_label_pairs.contains_key(p))
    }

    /// Hashes of every label pair carried by at least one pod here.
    pub fn pod_label_pair_hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.pod_label_pairs.keys().copied()
    }

    pub fn used_ports(&self) -> &HostPortUsage {
        &self.used_ports
    }

    /// Size in bytes of an image present on the node, by any of its names.
    pub fn image_size(&self, name: &str) -> Option<i64> {
        self.image_sizes.get(name).copied()
    }

    pub fn image_names(&self) -> impl Iterator<Item = &str> {
        self.image_sizes.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{container, node, pod};

    #[test]
    fn add_and_remove_pod_keep_aggregates_exact() {
        let mut info = NodeInfo::new(Arc::new(
            node("n1").alloc("cpu", "4").alloc("memory", "8Gi").build(),
        ));
        let a = pod("a")
            .container(
                container("c")
                    .req("cpu", "1")
                    .req("memory", "1Gi")
                    .host_port(8080),
            )
            .pod_anti_affinity_required("app", "a", "kubernetes.io/hostname")
            .info();
        let b = pod("b").container(container("c")).info();
        info.add_pod(a.clone());
        info.add_pod(b.clone());
        assert_eq!(info.requested().milli_cpu, 1000);
        assert_eq!(info.non_zero_requested().milli_cpu, 1100);
        assert_eq!(info.pods().len(), 2);
        assert_eq!(info.pods_with_affinity().len(), 1);
        assert_eq!(info.pods_with_required_anti_affinity().len(), 1);
        let port = HostPort {
            ip: BIND_ALL_HOST_IP.into(),
            protocol: Protocol::Tcp,
            port: 8080,
        };
        assert!(info.used_ports().conflicts(&port));

        assert!(info.remove_pod(&a.pod).is_some());
        assert!(info.remove_pod(&a.pod).is_none());
        assert_eq!(info.requested().milli_cpu, 0);
        assert_eq!(info.requested().memory, 0);
        assert_eq!(info.non_zero_requested().milli_cpu, 100);
        assert!(info.pods_with_affinity().is_empty());
        assert!(info.used_ports().is_empty());
    }

    #[test]
    fn host_port_conflicts_respect_wildcard_ip() {
        let mut usage = HostPortUsage::default();
        let on = |ip: &str, port| HostPort {
            ip: ip.into(),
            protocol: Protocol::Tcp,
            port,
        };
        usage.add(&on("10.0.0.1", 80));
        assert!(usage.conflicts(&on("10.0.0.1", 80)));
        assert!(usage.conflicts(&on(BIND_ALL_HOST_IP, 80)));
        assert!(!usage.conflicts(&on("10.0.0.2", 80)));
        assert!(!usage.conflicts(&HostPort {
            protocol: Protocol::Udp,
            ..on("10.0.0.1", 80)
        }));
        usage.add(&on(BIND_ALL_HOST_IP, 443));
        assert!(usage.conflicts(&on("10.0.0.9", 443)));
    }
}
