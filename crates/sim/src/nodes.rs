//! The simulated nodes: their Node objects (labels, taints, capacity, conditions, node
//! info), their Leases in `kube-node-lease`, and the heartbeats that keep both fresh.
//! Each node's pod range comes from its Node's `spec.podCIDR` (node IPAM sets it); the
//! fleet watches its own Nodes to learn it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use krust_api::cidr::Ipv4Cidr;
use krust_api::sync::Unpoisoned;
use krust_client::informer::{EventHandler, Informer};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use std::net::Ipv4Addr;

use crate::{Config, Error, SIMULATED_LABEL};

/// Upstream's kubelet lease duration.
const LEASE_DURATION_SECONDS: i32 = 40;

/// The simulated nodes of this process.
pub struct Fleet {
    client: Client,
    config: Arc<Config>,
    /// Node name → its state.
    nodes: HashMap<String, Mutex<SimNode>>,
}

#[derive(Debug, Default)]
struct SimNode {
    index: usize,
    uid: String,
    pod_cidr: Option<Ipv4Cidr>,
    /// Pod IPs handed out so far (the next one is derived from it).
    ips_given: u32,
}

impl Fleet {
    /// Creates (or takes over) every node and its Lease.
    pub async fn register(client: Client, config: Arc<Config>) -> Result<Arc<Fleet>, Error> {
        let api: Api<Node> = Api::all(client.clone());
        let registered: Vec<(String, SimNode)> = futures::stream::iter(0..config.nodes)
            .map(|i| {
                let api = api.clone();
                let config = config.clone();
                let client = client.clone();
                async move {
                    let node = node_object(&config, i);
                    let name = node.name_any();
                    let register = |source| Error::Register {
                        node: name.clone(),
                        source,
                    };
                    let current = match api.create(&PostParams::default(), &node).await {
                        Ok(created) => created,
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            api.get(&name).await.map_err(register)?
                        }
                        Err(e) => return Err(register(e)),
                    };
                    let status = json_status(&node);
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await
                        .map_err(register)?;
                    let uid = current.uid().unwrap_or_default();
                    renew_lease(&client, &name, &uid).await.map_err(register)?;
                    let pod_cidr = current
                        .spec
                        .as_ref()
                        .and_then(|s| s.pod_cidr.as_deref())
                        .and_then(|c| c.parse().ok());
                    Ok((
                        name,
                        SimNode {
                            index: i,
                            uid,
                            pod_cidr,
                            ips_given: 0,
                        },
                    ))
                }
            })
            .buffer_unordered(config.concurrency.max(1))
            .try_collect()
            .await?;
        let nodes = registered
            .into_iter()
            .map(|(name, node)| (name, Mutex::new(node)))
            .collect();
        Ok(Arc::new(Fleet {
            client,
            config,
            nodes,
        }))
    }

    pub fn contains(&self, node: &str) -> bool {
        self.nodes.contains_key(node)
    }

    /// The index and name of the node whose address is `ip`, if it is one of the fleet's.
    pub fn node_at(&self, ip: std::net::IpAddr) -> Option<(usize, String)> {
        let std::net::IpAddr::V4(ip) = ip else {
            return None;
        };
        let index = node_index(ip)?;
        let name = format!("{}{index}", self.config.name_prefix);
        self.contains(&name).then_some((index, name))
    }

    /// A fleet of `names` that talks to no apiserver (needs a Tokio runtime).
    #[cfg(test)]
    pub(crate) fn for_tests(names: &[&str]) -> Arc<Fleet> {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("a URL"));
        Arc::new(Fleet {
            client: Client::try_from(config).expect("a client"),
            config: Arc::new(Config::default()),
            nodes: names
                .iter()
                .enumerate()
                .map(|(index, name)| {
                    let node = SimNode {
                        index,
                        ..SimNode::default()
                    };
                    (name.to_string(), Mutex::new(node))
                })
                .collect(),
        })
    }

    /// The next pod IP of a node (addresses 2.. of its podCIDR, wrapping), and the
    /// node's own address; `None` until the node has a podCIDR.
    pub fn next_pod_ip(&self, node: &str) -> Option<(Ipv4Addr, Ipv4Addr)> {
        let mut n = self.nodes.get(node)?.locked();
        let cidr = n.pod_cidr?;
        let usable = (cidr.size() as u32).saturating_sub(3).max(1);
        let offset = 2 + n.ips_given % usable;
        n.ips_given += 1;
        let ip = Ipv4Addr::from(u32::from(cidr.network()) + offset);
        Some((ip, node_ip(n.index)))
    }

    /// Keeps Leases and Ready conditions fresh, and learns pod ranges. Never returns.
    pub async fn heartbeats(self: Arc<Self>) {
        let leases = self.clone().renew_leases();
        let status = self.clone().refresh_status();
        let ranges = self.clone().learn_pod_cidrs();
        futures::join!(leases, status, ranges);
    }

    async fn renew_leases(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.lease_interval);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.each_node(
                |client, name, uid| async move { renew_lease(&client, &name, &uid).await },
            )
            .await;
        }
    }

    async fn refresh_status(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.status_interval);
        tick.tick().await;
        loop {
            tick.tick().await;
            let config = self.config.clone();
            self.each_node(move |client, name, _| {
                let config = config.clone();
                async move {
                    let index = name
                        .strip_prefix(&config.name_prefix)
                        .and_then(|i| i.parse().ok())
                        .unwrap_or(0);
                    let status = json_status(&node_object(&config, index));
                    Api::<Node>::all(client)
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await
                        .map(|_| ())
                }
            })
            .await;
        }
    }

    /// One write per node, `concurrency` at a time; failures are logged and retried on
    /// the next round.
    async fn each_node<F, Fut>(&self, write: F)
    where
        F: Fn(Client, String, String) -> Fut,
        Fut: Future<Output = Result<(), kube::Error>>,
    {
        let targets: Vec<(String, String)> = self
            .nodes
            .iter()
            .map(|(name, n)| (name.clone(), n.locked().uid.clone()))
            .collect();
        futures::stream::iter(targets)
            .map(|(name, uid)| {
                let done = write(self.client.clone(), name.clone(), uid);
                async move {
                    if let Err(err) = done.await {
                        tracing::warn!(node = name, error = %err, "simulated node heartbeat failed");
                    }
                }
            })
            .buffer_unordered(self.config.concurrency.max(1))
            .collect::<()>()
            .await;
    }

    async fn learn_pod_cidrs(self: Arc<Self>) {
        let config = watcher::Config::default().labels(&format!("{SIMULATED_LABEL}=true"));
        let nodes = Informer::<Node>::new(Api::all(self.client.clone()), config);
        nodes.add_handler(self);
        nodes.run().await
    }
}

/// Each simulated node learns its pod range (and UID) from its Node object.
impl EventHandler<Node> for Fleet {
    fn on_apply(&self, _old: Option<&Node>, node: &Arc<Node>) {
        let Some(sim) = self.nodes.get(&node.name_any()) else {
            return;
        };
        let cidr = node
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidr.as_deref())
            .and_then(|c| c.parse().ok());
        let mut sim = sim.locked();
        sim.pod_cidr = cidr;
        sim.uid = node.uid().unwrap_or_default();
    }
    fn on_delete(&self, _node: &Arc<Node>) {}
}

/// Simulated nodes' addresses start after this one.
const FIRST_NODE_IP: Ipv4Addr = Ipv4Addr::new(127, 100, 0, 0);

/// The address of node `index`: a loopback address of its own (127.100.0.1 onwards),
/// on which the simulated kubelet endpoint answers for it (see [`crate::kubelet`]).
pub fn node_ip(index: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(FIRST_NODE_IP) + 1 + index as u32)
}

/// The index of the node whose address is `ip`, if it is one.
fn node_index(ip: Ipv4Addr) -> Option<usize> {
    let offset = u32::from(ip).checked_sub(u32::from(FIRST_NODE_IP) + 1)?;
    usize::try_from(offset).ok()
}

/// The Node object of simulated node `index`, status included.
pub fn node_object(config: &Config, index: usize) -> Node {
    let name = format!("{}{index}", config.name_prefix);
    let mut labels: BTreeMap<String, String> = BTreeMap::from([
        ("kubernetes.io/hostname".into(), name.clone()),
        ("kubernetes.io/os".into(), "linux".into()),
        ("kubernetes.io/arch".into(), "amd64".into()),
        (SIMULATED_LABEL.into(), "true".into()),
    ]);
    if config.zones > 0 {
        labels.insert(
            "topology.kubernetes.io/zone".into(),
            format!("zone-{}", index % config.zones),
        );
    }
    labels.extend(config.labels.clone());
    let now = Time(Timestamp::now());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: Some(config.taints.clone()).filter(|t| !t.is_empty()),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(config.capacity.clone()),
            allocatable: Some(config.capacity.clone()),
            conditions: Some(vec![
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                condition(
                    "Ready",
                    "True",
                    "KubeletReady",
                    "kubelet is posting ready status",
                ),
            ]),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: node_ip(index).to_string(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.clone(),
                },
            ]),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(config.kubelet_port),
                }),
            }),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: format!("sim-{index}"),
                container_runtime_version: "krust-sim://0.1.0".into(),
                kernel_version: "simulated".into(),
                kube_proxy_version: String::new(),
                kubelet_version: "v1.33.0-krust-sim".into(),
                machine_id: format!("sim-{index}"),
                operating_system: "linux".into(),
                os_image: "krust simulated node".into(),
                system_uuid: format!("sim-{index}"),
                ..NodeSystemInfo::default()
            }),
            phase: None,
            ..NodeStatus::default()
        }),
    }
}

fn json_status(node: &Node) -> k8s_openapi::serde_json::Value {
    k8s_openapi::serde_json::json!({ "status": node.status })
}

/// Creates or renews the node's Lease (holder the node, owned by the Node object).
async fn renew_lease(client: &Client, node: &str, uid: &str) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let now = MicroTime(Timestamp::now());
    let renew = k8s_openapi::serde_json::json!({"spec": {"renewTime": now}});
    match api
        .patch(node, &PatchParams::default(), &Patch::Merge(&renew))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(node.to_string()),
                    namespace: Some("kube-node-lease".into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: node.to_string(),
                        uid: uid.to_string(),
                        ..OwnerReference::default()
                    }]),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.to_string()),
                    lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
                    renew_time: Some(now),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            zones: 2,
            taints: vec![k8s_openapi::api::core::v1::Taint {
                key: "dedicated".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }],
            kubelet_port: 40123,
            ..Config::default()
        }
    }

    #[test]
    fn a_node_object_looks_like_a_registered_kubelets() {
        let node = node_object(&config(), 3);
        assert_eq!(node.name_any(), "sim-node-3");
        let labels = node.labels();
        assert_eq!(labels["kubernetes.io/hostname"], "sim-node-3");
        assert_eq!(labels["topology.kubernetes.io/zone"], "zone-1");
        assert_eq!(labels[SIMULATED_LABEL], "true");
        let spec = node.spec.as_ref().unwrap();
        assert_eq!(spec.taints.as_ref().unwrap()[0].key, "dedicated");
        let status = node.status.as_ref().unwrap();
        assert_eq!(status.capacity, status.allocatable);
        assert_eq!(status.capacity.as_ref().unwrap()["pods"].0, "110");
        let ready = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("True", Some("KubeletReady"))
        );
        assert_eq!(status.addresses.as_ref().unwrap()[0].address, "127.100.0.4");
        let port = &status.daemon_endpoints.as_ref().unwrap().kubelet_endpoint;
        assert_eq!(port.as_ref().unwrap().port, 40123);
    }

    #[tokio::test]
    async fn the_fleet_learns_pod_ranges_from_its_nodes_and_hands_out_addresses() {
        let fleet = Fleet::for_tests(&["sim-node-0"]);
        assert_eq!(fleet.next_pod_ip("sim-node-0"), None, "no range yet");
        let mut node = node_object(&config(), 0);
        node.metadata.uid = Some("u0".into());
        node.spec.as_mut().unwrap().pod_cidr = Some("10.42.7.0/30".into());
        fleet.on_apply(None, &Arc::new(node.clone()));
        let ip = |fleet: &Fleet| fleet.next_pod_ip("sim-node-0").map(|(p, _)| p.to_string());
        assert_eq!(ip(&fleet).as_deref(), Some("10.42.7.2"));
        // A /30 has one usable pod address after the gateway: it wraps.
        assert_eq!(ip(&fleet).as_deref(), Some("10.42.7.2"));
        assert_eq!(fleet.nodes["sim-node-0"].locked().uid, "u0");
        // Nodes of other fleets are not ours.
        node.metadata.name = Some("elsewhere".into());
        fleet.on_apply(None, &Arc::new(node));
        assert_eq!(fleet.next_pod_ip("elsewhere"), None);
    }

    #[tokio::test]
    async fn each_node_has_its_own_loopback_address() {
        let fleet = Fleet::for_tests(&["sim-node-0", "sim-node-1"]);
        let at = |ip: &str| fleet.node_at(ip.parse().unwrap());
        assert_eq!(node_ip(1).to_string(), "127.100.0.2");
        assert!(node_ip(1).is_loopback());
        assert_eq!(at("127.100.0.2"), Some((1, "sim-node-1".to_string())));
        assert_eq!(at("127.100.0.1"), Some((0, "sim-node-0".to_string())));
        assert_eq!(at("127.100.0.3"), None, "not in the fleet");
        assert_eq!(at("127.100.0.0"), None);
        assert_eq!(at("10.0.0.1"), None);
        assert_eq!(at("::1"), None);
    }
}
