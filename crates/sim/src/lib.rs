//! `krust sim`: simulated nodes, krust's answer to kwok. Each simulated node is a Node
//! object kept alive like a kubelet keeps its own (a Lease in `kube-node-lease` renewed
//! every [`Config::lease_interval`], a Ready condition refreshed every
//! [`Config::status_interval`]), and every pod bound to one goes Running and Ready after
//! [`Config::pod_ready_delay`], with an IP from the node's podCIDR and filled container
//! statuses; a deleted pod finishes terminating at once. No containers run: this is the
//! harness for scheduler, controller and apiserver scale work, and for demos.
//!
//! Like every component it only talks to the apiserver (lists, watches, writes), so
//! thousands of nodes fit in one process: a node costs its name, its pod range and a
//! counter.
//!
//! - [`nodes`]: the Node and Lease objects and their heartbeats;
//! - [`pods`]: the pods bound to simulated nodes;
//! - [`usage`]: what their containers use, which [`kubelet`] serves as a kubelet's
//!   `/metrics/resource` for `kubectl top` and the HorizontalPodAutoscaler.

pub mod kubelet;
pub mod nodes;
pub mod pods;
pub mod usage;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;

/// The label every simulated node carries.
pub use krust_api::well_known::SIMULATED_NODE_LABEL as SIMULATED_LABEL;

/// What each simulated node looks like and how the simulation behaves.
#[derive(Clone, Debug)]
pub struct Config {
    /// How many nodes, named `<prefix><index>` from 0.
    pub nodes: usize,
    pub name_prefix: String,
    /// Capacity (= allocatable): cpu, memory, pods, ephemeral-storage, and any extended
    /// resources.
    pub capacity: BTreeMap<String, Quantity>,
    /// Labels on every node (besides hostname, os, arch and the simulated label).
    pub labels: BTreeMap<String, String>,
    /// Nodes are spread round-robin over this many zones
    /// (`topology.kubernetes.io/zone=zone-<i>`); 0 sets no zone.
    pub zones: usize,
    pub taints: Vec<Taint>,
    /// How long a bound pod waits before it is Running and Ready.
    pub pod_ready_delay: Duration,
    /// How often each node's Lease is renewed (the kubelet's 10 s).
    pub lease_interval: Duration,
    /// How often each node's Ready condition heartbeat is refreshed (the kubelet's
    /// status report frequency, 5 min, when nothing changes).
    pub status_interval: Duration,
    /// Writes in flight at once.
    pub concurrency: usize,
    /// The port of the simulated kubelet endpoint (0: any free one, chosen when it
    /// starts listening), which every node advertises.
    pub kubelet_port: u16,
    /// The CA whose client certificates may read the simulated kubelets (the
    /// apiserver's kubelet client); without one, any client may.
    pub client_ca: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        let q = |s: &str| Quantity(s.to_string());
        Config {
            nodes: 1,
            name_prefix: "sim-node-".into(),
            capacity: BTreeMap::from([
                ("cpu".into(), q("32")),
                ("memory".into(), q("256Gi")),
                ("pods".into(), q("110")),
                ("ephemeral-storage".into(), q("1Ti")),
            ]),
            labels: BTreeMap::new(),
            zones: 0,
            taints: Vec::new(),
            pod_ready_delay: Duration::ZERO,
            lease_interval: Duration::from_secs(10),
            status_interval: Duration::from_secs(300),
            concurrency: 32,
            kubelet_port: 0,
            client_ca: None,
        }
    }
}

/// Why the simulation could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("registering node {node}: {source}")]
    Register {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("listening on the simulated kubelet port {port}: {source}")]
    Listen {
        port: u16,
        #[source]
        source: std::io::Error,
    },
}

/// Registers the nodes, then keeps them alive and runs their pods until `shutdown`.
pub async fn run(
    client: Client,
    mut config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let listen = |source| Error::Listen {
        port: config.kubelet_port,
        source,
    };
    let listener = kubelet::bind(config.kubelet_port).await.map_err(listen)?;
    config.kubelet_port = listener.local_addr().map_err(listen)?.port();
    let config = Arc::new(config);
    let started = std::time::Instant::now();
    let fleet = nodes::Fleet::register(client.clone(), config.clone()).await?;
    tracing::info!(
        nodes = config.nodes,
        ms = started.elapsed().as_millis() as u64,
        "simulated nodes registered"
    );
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(fleet.clone().heartbeats());
    let usage = Arc::new(usage::Usage::new(fleet.clone()));
    tasks.spawn(pods::run(
        client.clone(),
        config.clone(),
        fleet.clone(),
        usage.clone(),
    ));
    tasks.spawn(kubelet::serve(client, config, listener, fleet, usage));
    tokio::select! {
        _ = shutdown => {}
        _ = tasks.join_next() => tracing::error!("a simulation task ended"),
    }
    Ok(())
}
