//! NetworkPolicy enforced on this node, in nftables (k3s runs kube-router's controller
//! for this; krust has its own). Every agent watches Pods, Namespaces and
//! NetworkPolicies of the whole cluster (peers can be anywhere) and judges the packets
//! its own pods send and receive, in the forward hook, where a packet between two pods
//! — on one node, bridged (br_netfilter), or from another node — carries both pods'
//! addresses, after the Service rules turned a cluster IP into a pod's:
//!
//! - a packet of a connection already allowed (a reply, or one related to it) passes;
//! - one from a pod isolated for egress goes through that pod's egress chain, then one
//!   to a pod isolated for ingress through that pod's ingress chain; each chain accepts
//!   what some rule allows and drops the rest. A pod no policy isolates costs one
//!   lookup per new connection, and nothing at all while no pod is isolated.
//!
//! Traffic between a pod and its own node (probes, host processes) never passes the
//! forward hook: it is always allowed, as upstream requires. The [`model`] says what the
//! policies mean; [`nft`] writes, in one transaction, only what changed since the last
//! load. The rules stay when the agent stops, so pods stay protected across a restart.

pub mod model;
pub mod nft;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use krust_api::cidr::Ipv4Cidr;
use krust_client::cache::Cache;
use krust_client::informer::Informer;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::Notify;

use model::PolicyPod;

/// The nftables table that holds the policies of the node whose pods are in `pod_cidr`
/// (named after the range, as the node's bridge and egress table are, so that nodes
/// sharing a network namespace keep apart).
pub fn table(pod_cidr: Ipv4Cidr) -> String {
    format!("krust-policy-{}", crate::range_tag(pod_cidr))
}

#[derive(Clone, Debug)]
pub struct Config {
    pub node_name: String,
    /// How often the table is checked, and loaded again when it went missing.
    pub resync: Duration,
}

/// Keeps this node's policy rules in step with the cluster until dropped.
pub async fn run(client: Client, config: Config) {
    let changed = Arc::new(Notify::new());
    let pods =
        Informer::<PolicyPod>::new(Api::<Pod>::all(client.clone()), watcher::Config::default());
    pods.add_handler(changed.clone());
    let namespaces =
        Informer::<Namespace>::notifying(&client, watcher::Config::default(), &changed);
    let policies =
        Informer::<NetworkPolicy>::notifying(&client, watcher::Config::default(), &changed);
    let caches = Caches {
        pods: pods.cache(),
        namespaces: namespaces.cache(),
        policies: policies.cache(),
    };
    tokio::select! {
        _ = pods.run() => {}
        _ = namespaces.run() => {}
        _ = policies.run() => {}
        _ = sync(&client, &config, &caches, &changed) => {}
    }
}

struct Caches {
    pods: Cache<PolicyPod>,
    namespaces: Cache<Namespace>,
    policies: Cache<NetworkPolicy>,
}

async fn sync(client: &Client, config: &Config, caches: &Caches, changed: &Notify) {
    let table = table(own_range(client, &config.node_name).await);
    // Judging from half a picture would drop traffic that is allowed.
    tokio::join!(
        caches.pods.wait_until_ready(),
        caches.namespaces.wait_until_ready(),
        caches.policies.wait_until_ready()
    );
    tracing::info!(%table, "network policy synced its caches");
    // What the kernel holds; `None` before the first load, after a failed one and when
    // the table went missing.
    let mut loaded: Option<nft::Loaded> = None;
    loop {
        let rules = model::ruleset(
            &config.node_name,
            &caches.pods.state(),
            &caches.namespaces.state(),
            &caches.policies.state(),
        );
        if loaded.as_ref().map(nft::Loaded::rules) != Some(&rules) {
            let (isolated_ingress, isolated_egress) = (rules.ingress.len(), rules.egress.len());
            let (text, after, full) = nft::transaction(loaded.as_ref(), &table, rules);
            let result = tokio::task::spawn_blocking(move || crate::nft::apply(&text))
                .await
                .unwrap_or_else(|e| Err(crate::nft::NftError::Rejected(e.to_string())));
            match result {
                Ok(()) => {
                    tracing::debug!(
                        %table,
                        full,
                        isolated_ingress,
                        isolated_egress,
                        "network policy rules loaded"
                    );
                    loaded = Some(after);
                }
                Err(err) => {
                    tracing::error!(%table, full, error = %err, "loading network policy rules failed; a full load follows");
                    loaded = None;
                }
            }
        }
        let wait = if loaded.is_some() {
            config.resync
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(wait) => {
                let table = table.clone();
                let there = tokio::task::spawn_blocking(move || crate::nft::table_exists(&table))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(false);
                if !there {
                    loaded = None;
                }
            }
        }
    }
}

/// This node's pod range, once node IPAM has given it one.
async fn own_range(client: &Client, node_name: &str) -> Ipv4Cidr {
    let nodes: Api<Node> = Api::all(client.clone());
    loop {
        match nodes.get_opt(node_name).await {
            Ok(Some(node)) => {
                if let Some(cidr) = (node.spec.as_ref())
                    .and_then(|s| s.pod_cidr.as_deref())
                    .and_then(|c| c.parse().ok())
                {
                    return cidr;
                }
            }
            Ok(None) => {}
            Err(err) => tracing::debug!(error = %err, "reading this node for its pod range"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
