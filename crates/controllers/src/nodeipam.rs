//! `NodeIpamController`: gives every Node a pod range (`spec.podCIDR` and
//! `spec.podCIDRs`) cut from the cluster CIDR, as upstream's range allocator does
//! (`--allocate-node-cidrs` with `--cluster-cidr` and `--node-cidr-mask-size`).
//!
//! The ranges in use are learned from the cache when the controller starts (every Node
//! that already has one) and kept in memory. A range is remembered for its Node from the
//! moment it is picked, so a pass that runs again before the cache shows the write
//! patches the same range instead of picking a second one. A deleted Node's range is
//! free again, and Nodes still waiting for a range are queued. When the cluster CIDR is
//! exhausted the Node gets a `CIDRNotAvailable` event and is looked at again later.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::serde_json::json;
use krust_api::cidr::Ipv4Cidr;
use krust_api::sync::Unpoisoned;
use krust_client::cache::Cache;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::Error;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};

/// How soon a Node that found the range exhausted is looked at again.
const EXHAUSTED_RETRY: Duration = Duration::from_secs(30);

/// The free and used `/mask` ranges of the cluster CIDR.
#[derive(Debug)]
pub struct CidrSet {
    cluster: Ipv4Cidr,
    mask: u8,
    /// Node name → index of its range.
    by_node: HashMap<String, u64>,
    used: Vec<bool>,
    /// Where the next search starts, so freed ranges are not reused at once.
    next: u64,
}

impl CidrSet {
    pub fn new(cluster: Ipv4Cidr, mask: u8) -> Self {
        let count = cluster.subnet_count(mask);
        CidrSet {
            cluster,
            mask,
            by_node: HashMap::new(),
            used: vec![false; count as usize],
            next: 0,
        }
    }

    /// Records a range a Node already has (if it lies in the cluster CIDR).
    pub fn occupy(&mut self, node: &str, cidr: &str) {
        let Ok(sub) = cidr.parse::<Ipv4Cidr>() else {
            return;
        };
        if sub.prefix() != self.mask {
            return;
        }
        if let Some(i) = self.cluster.subnet_index(&sub) {
            self.used[i as usize] = true;
            self.by_node.insert(node.to_string(), i);
        }
    }

    /// The Node's range: the one it was given before, else the next free one.
    pub fn allocate(&mut self, node: &str) -> Option<Ipv4Cidr> {
        if let Some(i) = self.by_node.get(node) {
            return self.cluster.subnet(self.mask, *i);
        }
        let count = self.used.len() as u64;
        let i = (0..count)
            .map(|k| (self.next + k) % count)
            .find(|i| !self.used[*i as usize])?;
        self.used[i as usize] = true;
        self.by_node.insert(node.to_string(), i);
        self.next = (i + 1) % count;
        self.cluster.subnet(self.mask, i)
    }

    pub fn release(&mut self, node: &str) {
        if let Some(i) = self.by_node.remove(node) {
            self.used[i as usize] = false;
        }
    }
}

pub struct NodeIpamController {
    client: Client,
    nodes: Cache<Node>,
    cluster: Ipv4Cidr,
    mask: u8,
    /// Filled from the cache on the first pass (the caches are complete by then).
    set: OnceLock<Mutex<CidrSet>>,
    events: EventRecorder,
    queue: Arc<WorkQueue>,
}

impl NodeIpamController {
    pub fn new(
        client: Client,
        informers: &SharedInformers,
        cluster: Ipv4Cidr,
        mask: u8,
        events: EventRecorder,
    ) -> Arc<Self> {
        let nodes = informers.get::<Node>();
        let controller = Arc::new(NodeIpamController {
            client,
            nodes: nodes.cache(),
            cluster,
            mask,
            set: OnceLock::new(),
            events,
            queue: WorkQueue::new("nodeipam"),
        });
        nodes.add_handler(Arc::new(NodeEvents(controller.clone())));
        controller
    }

    fn set(&self) -> &Mutex<CidrSet> {
        self.set.get_or_init(|| {
            let mut set = CidrSet::new(self.cluster, self.mask);
            for node in self.nodes.state() {
                if let Some(cidr) = pod_cidr(&node) {
                    set.occupy(&node.name_any(), cidr);
                }
            }
            Mutex::new(set)
        })
    }
}

impl Reconciler for NodeIpamController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, name: &str) -> Result<Option<Duration>, Error> {
        let Some(node) = self.nodes.get(None, name) else {
            return Ok(None);
        };
        if let Some(cidr) = pod_cidr(&node) {
            self.set().locked().occupy(name, cidr);
            return Ok(None);
        }
        let Some(cidr) = self.set().locked().allocate(name) else {
            let message = format!("Node {name} status is now: CIDRNotAvailable");
            // Upstream reports it as a node status change, a Normal event.
            self.events
                .record(&*node, EventType::Normal, "CIDRNotAvailable", message);
            return Ok(Some(EXHAUSTED_RETRY));
        };
        let patch = json!({"spec": {"podCIDR": cidr.to_string(), "podCIDRs": [cidr.to_string()]}});
        let api: Api<Node> = Api::all(self.client.clone());
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = name, %cidr, "pod CIDR allocated");
                Ok(None)
            }
            Err(e) if is_status(&e, 404) => {
                self.set().locked().release(name);
                Ok(None)
            }
            Err(e) => Err(Error::api("setting the pod CIDR of node", name, e)),
        }
    }
}

fn pod_cidr(node: &Node) -> Option<&str> {
    node.spec.as_ref()?.pod_cidr.as_deref()
}

struct NodeEvents(Arc<NodeIpamController>);

impl EventHandler<Node> for NodeEvents {
    fn on_apply(&self, _old: Option<&Node>, new: &Arc<Node>) {
        if pod_cidr(new).is_none() {
            self.0.queue.add(new.name_any());
        }
    }
    fn on_delete(&self, obj: &Arc<Node>) {
        if let Some(set) = self.0.set.get() {
            set.locked().release(&obj.name_any());
        }
        // A range is free: Nodes waiting for one need not wait for their retry.
        for node in self.0.nodes.state() {
            if pod_cidr(&node).is_none() {
                self.0.queue.add(node.name_any());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_get_distinct_ranges_and_keep_theirs() {
        let mut set = CidrSet::new("10.42.0.0/16".parse().unwrap(), 24);
        set.occupy("old", "10.42.0.0/24");
        let a = set.allocate("a").unwrap();
        assert_eq!(a.to_string(), "10.42.1.0/24");
        assert_eq!(
            set.allocate("a"),
            Some(a),
            "asking again gives the same range"
        );
        assert_eq!(set.allocate("b").unwrap().to_string(), "10.42.2.0/24");
        set.release("a");
        // A freed range is not handed out at once.
        assert_eq!(set.allocate("c").unwrap().to_string(), "10.42.3.0/24");
    }

    #[test]
    fn an_exhausted_range_allocates_nothing_until_a_node_goes() {
        let mut set = CidrSet::new("10.42.0.0/23".parse().unwrap(), 24);
        assert!(set.allocate("a").is_some());
        assert!(set.allocate("b").is_some());
        assert_eq!(set.allocate("c"), None);
        set.release("a");
        assert_eq!(set.allocate("c").unwrap().to_string(), "10.42.0.0/24");
        // Ranges outside the cluster CIDR or of another size are not ours.
        set.occupy("x", "192.168.0.0/24");
        set.occupy("y", "10.42.0.0/16");
        assert_eq!(set.allocate("d"), None);
    }
}
