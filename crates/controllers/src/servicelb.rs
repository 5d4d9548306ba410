//! `ServiceLbController`, k3s's ServiceLB in controller form: a Service of type
//! LoadBalancer (without a `loadBalancerClass`, which names another implementation)
//! gets the addresses of the Ready nodes in `status.loadBalancer.ingress`, so it leaves
//! `<pending>`; every node's Service proxy answers the Service's ports on those
//! addresses (they are the nodes' own). As in k3s, when some nodes carry
//! `svccontroller.k3s.cattle.io/enablelb=true` only those serve; simulated nodes never
//! do (their addresses lead nowhere). Upstream's service controller asks a cloud
//! provider instead.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::serde_json::json;
use krust_api::well_known::SIMULATED_NODE_LABEL;
use krust_client::cache::Cache;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::owner::{key_of, split_key};

/// k3s's node label choosing the nodes that serve load balancers.
const ENABLE_LB_LABEL: &str = "svccontroller.k3s.cattle.io/enablelb";

pub struct ServiceLbController {
    client: Client,
    services: Cache<Service>,
    nodes: Cache<Node>,
    queue: Arc<WorkQueue>,
}

impl ServiceLbController {
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let services = informers.get::<Service>();
        let nodes = informers.get::<Node>();
        let controller = Arc::new(ServiceLbController {
            client,
            services: services.cache(),
            nodes: nodes.cache(),
            queue: WorkQueue::new("servicelb"),
        });
        services.add_handler(Arc::new(ServiceEvents(controller.clone())));
        nodes.add_handler(Arc::new(NodeEvents(controller.clone())));
        controller
    }
}

fn ours(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| {
        s.type_.as_deref() == Some("LoadBalancer") && s.load_balancer_class.is_none()
    })
}

fn ready(node: &Node) -> bool {
    crate::nodelifecycle::health::ready_status(node) == "True"
}

/// A node's address for load balancers: its ExternalIP, else its InternalIP.
fn address(node: &Node) -> Option<String> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    ["ExternalIP", "InternalIP"].iter().find_map(|kind| {
        addresses
            .iter()
            .find(|a| a.type_ == *kind)
            .map(|a| a.address.clone())
    })
}

/// The addresses a load balancer gets: the Ready nodes' (those labelled to serve, when
/// any is), sorted.
fn ingress(nodes: &[Arc<Node>]) -> Vec<String> {
    let real: Vec<&Arc<Node>> = nodes
        .iter()
        .filter(|n| !n.labels().contains_key(SIMULATED_NODE_LABEL))
        .collect();
    let labelled = real
        .iter()
        .any(|n| n.labels().get(ENABLE_LB_LABEL).is_some_and(|v| v == "true"));
    let mut ips: Vec<String> = real
        .into_iter()
        .filter(|n| !labelled || n.labels().get(ENABLE_LB_LABEL).is_some_and(|v| v == "true"))
        .filter(|n| ready(n))
        .filter_map(|n| address(n))
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

fn current(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ingress| ingress.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

impl Reconciler for ServiceLbController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (namespace, name) = split_key(key);
        let Some(svc) = self.services.get(Some(namespace), name) else {
            return Ok(None);
        };
        let wanted = if ours(&svc) {
            ingress(&self.nodes.state())
        } else if svc.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer") {
            Vec::new() // no longer a load balancer: nothing to advertise
        } else {
            return Ok(None); // another implementation's
        };
        if current(&svc) == wanted {
            return Ok(None);
        }
        let ingress: Vec<_> = wanted
            .iter()
            .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
            .collect();
        let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        let api: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(service = key, ingress = ?wanted, "load balancer addresses");
                Ok(None)
            }
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(Error::api("setting load balancer addresses", key, e)),
        }
    }
}

struct ServiceEvents(Arc<ServiceLbController>);

impl EventHandler<Service> for ServiceEvents {
    fn on_apply(&self, old: Option<&Service>, new: &Arc<Service>) {
        // A Service that was a load balancer is looked at once more, to clear it.
        if ours(new) || old.is_some_and(ours) {
            self.0.queue.add(key_of(&new.metadata));
        }
    }
    fn on_delete(&self, _svc: &Arc<Service>) {}
}

struct NodeEvents(Arc<ServiceLbController>);

impl EventHandler<Node> for NodeEvents {
    fn on_apply(&self, old: Option<&Node>, new: &Arc<Node>) {
        let changed = old.is_none_or(|o| {
            ready(o) != ready(new)
                || address(o) != address(new)
                || o.labels().get(ENABLE_LB_LABEL) != new.labels().get(ENABLE_LB_LABEL)
        });
        if changed {
            self.requeue_all();
        }
    }
    fn on_delete(&self, _node: &Arc<Node>) {
        self.requeue_all();
    }
}

impl NodeEvents {
    fn requeue_all(&self) {
        for svc in self.0.services.state_filter(ours) {
            self.0.queue.add(key_of(&svc.metadata));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ip: &str, ready: bool, labels: &[(&str, &str)]) -> Arc<Node> {
        let labels: std::collections::BTreeMap<_, _> = labels.iter().cloned().collect();
        Arc::new(
            k8s_openapi::serde_json::from_value(json!({
                "metadata": {"name": name, "labels": labels},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": ip}],
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                },
            }))
            .unwrap(),
        )
    }

    #[test]
    fn ready_real_nodes_serve_and_the_label_narrows_them() {
        let nodes = vec![
            node("b", "10.0.0.12", true, &[]),
            node("a", "10.0.0.11", true, &[]),
            node("down", "10.0.0.13", false, &[]),
            node("sim", "10.99.0.1", true, &[(SIMULATED_NODE_LABEL, "true")]),
        ];
        assert_eq!(ingress(&nodes), ["10.0.0.11", "10.0.0.12"]);
        let mut labelled = nodes.clone();
        labelled.push(node("lb", "10.0.0.14", true, &[(ENABLE_LB_LABEL, "true")]));
        assert_eq!(ingress(&labelled), ["10.0.0.14"]);
    }
}
