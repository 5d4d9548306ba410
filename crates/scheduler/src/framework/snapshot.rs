//! A consistent view of the cluster for one scheduling cycle.
//!
//! Nothing in a snapshot changes while a cycle runs (the framework only gets
//! `&Snapshot`). Between cycles the owner updates it in place — a pod assumed
//! or deleted, a node changed — and the node-spanning indexes (nodes with
//! affinity pods, image spread, name lookup) are maintained incrementally, so
//! keeping a 5,000-node snapshot current costs O(change), not O(cluster).
//! One of those indexes maps pod label pairs to the nodes hosting such pods, so
//! plugins that count pods matching a selector (topology spreading, inter-pod
//! affinity) visit only nodes that can have any, instead of every node.
//! Nodes are `Arc`s: updating a node another holder still references copies it
//! first (copy-on-write), so an older snapshot handed out stays intact.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};

use super::{NodeInfo, PodInfo};
use crate::selector::{Selector, label_pair_hash};

/// The nodes (with their pods), node-spanning indexes and namespace labels.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    nodes: Vec<Arc<NodeInfo>>,
    by_name: HashMap<String, usize>,
    with_affinity: BTreeSet<usize>,
    with_required_anti_affinity: BTreeSet<usize>,
    image_node_counts: HashMap<String, usize>,
    /// Label pair hash → nodes with at least one pod carrying that pair.
    nodes_by_pod_label: HashMap<u64, BTreeSet<usize>>,
    namespace_labels: HashMap<String, BTreeMap<String, String>>,
    storage: Storage,
}

/// The claims, volumes, storage classes, CSI drivers and capacities the volume plugins
/// read.
#[derive(Clone, Debug, Default)]
pub struct Storage {
    /// By `(namespace, name)`.
    pub claims: HashMap<(String, String), Arc<PersistentVolumeClaim>>,
    pub volumes: HashMap<String, Arc<PersistentVolume>>,
    pub classes: HashMap<String, Arc<StorageClass>>,
    /// CSIDrivers by name (whether a driver reports its capacity).
    pub drivers: HashMap<String, Arc<CSIDriver>>,
    /// CSIStorageCapacities by `(namespace, name)`.
    pub capacities: HashMap<(String, String), Arc<CSIStorageCapacity>>,
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl Snapshot {
    /// Builds the indexes. `namespace_labels` maps namespace name to its labels
    /// (needed for affinity terms with a `namespaceSelector`).
    pub fn new(
        nodes: Vec<Arc<NodeInfo>>,
        namespace_labels: HashMap<String, BTreeMap<String, String>>,
    ) -> Self {
        let mut snapshot = Snapshot {
            namespace_labels,
            ..Default::default()
        };
        for node in nodes {
            snapshot.upsert_node(node);
        }
        snapshot
    }

    /// Adds a node, or replaces the node of the same name.
    pub fn upsert_node(&mut self, node: Arc<NodeInfo>) {
        match self.by_name.get(node.name()).copied() {
            Some(i) => {
                self.unindex(i);
                self.nodes[i] = node;
                self.index(i);
            }
            None => {
                let i = self.nodes.len();
                self.by_name.insert(node.name().to_string(), i);
                self.nodes.push(node);
                self.index(i);
            }
        }
    }

    /// Removes a node (and the pods on it); the last node takes its slot.
    pub fn remove_node(&mut self, name: &str) -> Option<Arc<NodeInfo>> {
        let i = self.by_name.remove(name)?;
        self.unindex(i);
        let last = self.nodes.len() - 1;
        if i != last {
            self.unindex(last);
        }
        let removed = self.nodes.swap_remove(i);
        if i != last {
            self.by_name.insert(self.nodes[i].name().to_string(), i);
            self.index(i);
        }
        Some(removed)
    }

    /// Accounts a pod on a node (assumed or bound); false if the node is unknown.
    pub fn add_pod(&mut self, node_name: &str, pod: Arc<PodInfo>) -> bool {
        let Some(&i) = self.by_name.get(node_name) else {
            return false;
        };
        for (k, v) in pod.labels() {
            self.nodes_by_pod_label
                .entry(label_pair_hash(k, v))
                .or_default()
                .insert(i);
        }
        Arc::make_mut(&mut self.nodes[i]).add_pod(pod);
        self.index_affinity(i);
        true
    }

    /// Removes a pod from a node; false if the node or pod is unknown.
    pub fn remove_pod(&mut self, node_name: &str, pod: &Pod) -> bool {
        let Some(&i) = self.by_name.get(node_name) else {
            return false;
        };
        let Some(removed) = Arc::make_mut(&mut self.nodes[i]).remove_pod(pod) else {
            return false;
        };
        for (k, v) in removed.labels() {
            let hash = label_pair_hash(k, v);
            if !self.nodes[i].may_have_pods_with(&[hash]) {
                self.unindex_label_pair(hash, i);
            }
        }
        self.index_affinity(i);
        true
    }

    fn unindex_label_pair(&mut self, hash: u64, i: usize) {
        if let Some(set) = self.nodes_by_pod_label.get_mut(&hash) {
            set.remove(&i);
            if set.is_empty() {
                self.nodes_by_pod_label.remove(&hash);
            }
        }
    }

    pub fn set_namespace_labels(&mut self, namespace: &str, labels: BTreeMap<String, String>) {
        self.namespace_labels.insert(namespace.to_string(), labels);
    }

    pub fn remove_namespace(&mut self, namespace: &str) {
        self.namespace_labels.remove(namespace);
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    fn index(&mut self, i: usize) {
        for image in self.nodes[i].image_names() {
            *self.image_node_counts.entry(image.to_string()).or_insert(0) += 1;
        }
        for hash in self.nodes[i].pod_label_pair_hashes() {
            self.nodes_by_pod_label.entry(hash).or_default().insert(i);
        }
        self.index_affinity(i);
    }

    fn index_affinity(&mut self, i: usize) {
        let node = &self.nodes[i];
        let flag = |set: &mut BTreeSet<usize>, present: bool| {
            if present {
                set.insert(i);
            } else {
                set.remove(&i);
            }
        };
        flag(
            &mut self.with_affinity,
            !node.pods_with_affinity().is_empty(),
        );
        flag(
            &mut self.with_required_anti_affinity,
            !node.pods_with_required_anti_affinity().is_empty(),
        );
    }

    fn unindex(&mut self, i: usize) {
        for image in self.nodes[i].image_names() {
            if let Some(n) = self.image_node_counts.get_mut(image) {
                *n -= 1;
                if *n == 0 {
                    self.image_node_counts.remove(image);
                }
            }
        }
        let hashes: Vec<u64> = self.nodes[i].pod_label_pair_hashes().collect();
        for hash in hashes {
            self.unindex_label_pair(hash, i);
        }
        self.with_affinity.remove(&i);
        self.with_required_anti_affinity.remove(&i);
    }

    pub fn nodes(&self) -> &[Arc<NodeInfo>] {
        &self.nodes
    }

    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.by_name.get(name).map(|i| &self.nodes[*i])
    }

    /// Nodes hosting at least one pod with pod affinity or anti-affinity.
    pub fn nodes_with_affinity_pods(&self) -> impl Iterator<Item = &NodeInfo> {
        self.with_affinity.iter().map(|i| &*self.nodes[*i])
    }

    /// Nodes hosting at least one pod with required anti-affinity.
    pub fn nodes_with_required_anti_affinity_pods(&self) -> impl Iterator<Item = &NodeInfo> {
        self.with_required_anti_affinity
            .iter()
            .map(|i| &*self.nodes[*i])
    }

    /// Nodes that may host a pod carrying every label pair in `pairs` (see
    /// [`Selector::required_label_pairs`]), or all nodes when `pairs` is empty.
    /// Callers still check each pod: this only rules nodes out.
    pub fn nodes_maybe_hosting<'a>(
        &'a self,
        pairs: &'a [u64],
    ) -> Box<dyn Iterator<Item = &'a NodeInfo> + 'a> {
        if pairs.is_empty() {
            return Box::new(self.nodes.iter().map(|n| &**n));
        }
        let smallest = pairs
            .iter()
            .map(|p| self.nodes_by_pod_label.get(p).map_or(0, BTreeSet::len))
            .enumerate()
            .min_by_key(|(_, len)| *len)
            .map(|(i, _)| pairs[i]);
        match smallest.and_then(|p| self.nodes_by_pod_label.get(&p)) {
            None => Box::new(std::iter::empty()),
            Some(set) => Box::new(
                set.iter()
                    .map(|i| &*self.nodes[*i])
                    .filter(move |n| n.may_have_pods_with(pairs)),
            ),
        }
    }

    /// How many nodes report having an image (by this exact name).
    pub fn image_node_count(&self, image: &str) -> usize {
        self.image_node_counts.get(image).copied().unwrap_or(0)
    }

    /// Labels of a namespace (empty if unknown).
    pub fn namespace_labels(&self, namespace: &str) -> &BTreeMap<String, String> {
        self.namespace_labels.get(namespace).unwrap_or(&NO_LABELS)
    }

    /// Namespaces whose labels satisfy `selector`.
    pub fn namespaces_matching<'a>(
        &'a self,
        selector: &'a Selector,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.namespace_labels
            .iter()
            .filter(|(_, labels)| selector.matches(labels))
            .map(|(name, _)| name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{node, node_with, pod, snapshot};

    #[test]
    fn incremental_updates_keep_indexes_exact() {
        let mut snap = snapshot(vec![
            node_with(node("a").image(&["app:v1"], 10), vec![]),
            node_with(node("b").image(&["app:v1"], 10), vec![]),
            node_with(node("c"), vec![]),
        ]);
        assert_eq!(snap.image_node_count("app:v1"), 2);
        let shared = snap.clone();

        let anti = pod("x")
            .pod_anti_affinity_required("app", "x", "kubernetes.io/hostname")
            .info();
        assert!(snap.add_pod("c", anti.clone()));
        assert!(!snap.add_pod("nope", anti.clone()));
        let names = |s: &Snapshot| {
            s.nodes_with_required_anti_affinity_pods()
                .map(|n| n.name().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&snap), ["c"]);
        assert_eq!(snap.get("c").unwrap().pods().len(), 1);
        // The earlier copy is untouched (copy-on-write).
        assert!(shared.get("c").unwrap().pods().is_empty());

        assert!(snap.remove_node("a").is_some());
        assert_eq!(snap.image_node_count("app:v1"), 1);
        assert_eq!(snap.num_nodes(), 2);
        // "c" moved into a's slot and is still indexed under its new position.
        assert_eq!(names(&snap), ["c"]);
        assert_eq!(snap.get("c").unwrap().name(), "c");
        assert!(snap.remove_pod("c", &anti.pod));
        assert!(names(&snap).is_empty());

        let web = pod("w").label("app", "web").info();
        snap.add_pod("b", web.clone());
        let pairs = [label_pair_hash("app", "web")];
        let hosts = |s: &Snapshot| {
            s.nodes_maybe_hosting(&pairs)
                .map(|n| n.name().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(hosts(&snap), ["b"]);
        assert_eq!(snap.nodes_maybe_hosting(&[]).count(), 2);
        snap.remove_pod("b", &web.pod);
        assert!(hosts(&snap).is_empty());
        snap.add_pod("b", web);

        snap.upsert_node(Arc::new(NodeInfo::new(Arc::new(node("b").build()))));
        assert!(hosts(&snap).is_empty());
        assert_eq!(snap.image_node_count("app:v1"), 0);
        assert_eq!(snap.num_nodes(), 2);
    }
}
