//! krust's kubelet: registers this machine as a Node and runs the pods bound to it
//! through CRI (containerd → runc).
//!
//! - [`machine`]: what the Node reports about the machine;
//! - [`node`]: registration, the node Lease, status heartbeats;
//! - [`pods`]: the pod watch, one worker per pod ([`pods::worker`]), the translation of
//!   pod specs into CRI configs ([`pods::spec`]) and of runtime state into pod status
//!   ([`pods::status`]);
//! - [`csi`]: CSI drivers registered through the plugin-registration socket (the
//!   built-in one among them), and the staging and publishing of pods' CSI volumes.
//!
//! It talks only to the apiserver, the container runtime and CSI drivers.

pub mod certificate;
pub mod csi;
pub mod eviction;
pub mod images;
pub mod keyring;
pub mod logfile;
pub mod machine;
pub mod metrics;
pub mod node;
pub mod pods;
pub mod server;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use krust_api::cidr::Ipv4Cidr;
use krust_cri::Runtime;
use kube::Client;

/// The version the Node reports (the API it implements).
pub const KUBELET_VERSION: &str = "v1.33.0-krust";
/// How long to wait for node IPAM to give the node a pod range before using the
/// fallback.
const POD_CIDR_WAIT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct Config {
    pub node_name: String,
    pub node_ip: Ipv4Addr,
    /// The agent's directory (pods' files, the CNI IPAM state).
    pub data_dir: PathBuf,
    pub cluster_dns: Ipv4Addr,
    pub cluster_domain: String,
    /// The pod range to use if node IPAM gives none (a single-node server).
    pub fallback_pod_cidr: Option<Ipv4Cidr>,
    /// The MTU of pods' interfaces (lowered under VXLAN); `None`: the CNI default.
    pub pod_mtu: Option<u32>,
    /// Where containerd reads the CNI configuration.
    pub cni_conf_dir: PathBuf,
    /// The port of the kubelet's HTTPS server (0: any free port).
    pub kubelet_port: u16,
    /// The cluster CA (PEM) that the server's callers' certificates must chain to.
    pub client_ca: String,
    /// The server's certificate and key (PEM); when absent the kubelet requests one
    /// (and renews it) through the CSR API, self-signed until the first is issued.
    pub serving_cert: Option<(String, String)>,
    /// Hard eviction thresholds (`--eviction-hard`).
    pub eviction_hard: Vec<eviction::Threshold>,
    /// How often eviction signals are measured.
    pub housekeeping_interval: Duration,
    /// Where images and container layers live (containerd's root): `imagefs`.
    pub image_fs: PathBuf,
    /// When unused images are collected.
    pub image_gc: images::Policy,
    /// Images never collected.
    pub pinned_images: images::Pinned,
    /// How many image pulls may run at once (`--serialize-image-pulls`: one;
    /// `--max-parallel-image-pulls`); `None`: no limit.
    pub parallel_pulls: Option<usize>,
    /// The root of the built-in CSI driver's volumes (`None`: the driver is not run).
    pub local_storage: Option<PathBuf>,
}

impl Config {
    /// Where CSI drivers listen (`<plugins>/<driver name>/csi.sock`) and volumes are
    /// staged (`<plugins>/kubernetes.io/csi/...`).
    pub fn csi_plugins_dir(&self) -> PathBuf {
        self.data_dir.join("plugins")
    }

    /// Where plugins put their registration sockets (upstream's `plugins_registry`).
    pub fn plugins_registry_dir(&self) -> PathBuf {
        self.data_dir.join("plugins_registry")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {object}: {source}")]
    Api {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Runtime(#[from] krust_cri::Error),
    #[error("writing the CNI configuration: {0}")]
    Cni(#[source] std::io::Error),
    #[error("kubelet server: {0}")]
    Server(String),
}

impl Error {
    pub(crate) fn api(action: &'static str, object: &str, source: kube::Error) -> Self {
        Error::Api {
            action,
            object: object.to_string(),
            source,
        }
    }
}

/// Registers the node, sets up its pod network and runs its pods until dropped.
pub async fn run(client: Client, runtime: Runtime, config: Config) -> Result<(), Error> {
    let config = Arc::new(config);
    let version = runtime.version().await?;
    let runtime_version = format!("{}://{}", version.runtime_name, version.runtime_version);
    let machine = machine::Machine::probe(&config.data_dir);
    let (serving_cert, serving_rotation) = certificate::serving(&config)?;
    let server = server::Server::bind(&config, &serving_cert).await?;
    let status = node::status(&config, &machine, &runtime_version, server.port());
    let node = node::register(&client, &config, &status).await?;
    let node_uid = node.metadata.uid.clone();
    let cidr = node::pod_cidr(&client, &config, POD_CIDR_WAIT).await?;
    let ipam_dir = config.data_dir.join("ipam");
    let network = krust_net::BridgeNetwork {
        bridge: &krust_net::bridge_name(cidr),
        pod_cidr: cidr,
        ipam_dir: &ipam_dir,
        mtu: config.pod_mtu,
    };
    krust_net::write_conflist(&config.cni_conf_dir, &network).map_err(Error::Cni)?;
    tracing::info!(node = config.node_name, %cidr, runtime = runtime_version, "kubelet running");
    let (events, sender) = krust_client::events::EventRecorder::new(client.clone(), "kubelet");
    let events = events.on_host(&config.node_name);
    let (images, image_list) = images::Images::new(runtime.clone(), config.pinned_images.clone());
    let (pressures, pressure_changes) = tokio::sync::watch::channel(eviction::Pressures::new());
    let evictions = eviction::Evictions::default();
    let eviction = eviction::Manager {
        client: client.clone(),
        config: config.clone(),
        thresholds: config.eviction_hard.clone(),
        interval: config.housekeeping_interval,
        image_fs: config.image_fs.clone(),
        images: images.clone(),
        evictions: evictions.clone(),
        pressures,
        events: events.clone(),
    };
    let heartbeats = node::heartbeats(
        client.clone(),
        config.clone(),
        node,
        status,
        pressure_changes,
        image_list,
    );
    let image_manager = images.run(config.clone(), events.clone(), config.housekeeping_interval);
    let serving = server.serve(runtime.clone());
    let drivers = csi::Drivers::default();
    let csi = csi::run(client.clone(), config.clone(), drivers.clone(), node_uid);
    // After registration: the serving certificate is approved for the Node's addresses.
    let serving_rotation = {
        let client = client.clone();
        async move {
            match serving_rotation {
                Some(rotation) => rotation.run(client).await,
                None => std::future::pending().await,
            }
        }
    };
    let pods = pods::run(client, runtime, config, events, evictions, drivers);
    futures::join!(
        heartbeats,
        pods,
        sender,
        serving,
        serving_rotation,
        eviction.run(),
        image_manager,
        csi
    );
    Ok(())
}

/// A gRPC error as upstream's kubelet words it (Go's status error).
pub fn rpc_error(status: &tonic::Status) -> String {
    let code = match status.code() {
        // Go spells it with one l.
        tonic::Code::Cancelled => "Canceled".to_string(),
        code => format!("{code:?}"),
    };
    format!("rpc error: code = {code} desc = {}", status.message())
}
