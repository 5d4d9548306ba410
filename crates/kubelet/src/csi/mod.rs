//! CSI on this node, as upstream's kubelet does it:
//! - [`Drivers`]: the drivers registered on this node, by name (their CSI sockets);
//! - [`registration`]: the plugin watcher — drivers announce themselves through a
//!   socket in `<agent>/plugins_registry` (upstream's plugin-registration service), the
//!   kubelet asks them who this node is to them and lists them in the node's CSINode;
//! - [`publish`]: staging and publishing a pod's CSI volumes, and the reverse;
//! - the built-in driver (`krust_csi::local`), served with a registrar of its own, so
//!   that it registers as any third-party driver does.

pub mod publish;
pub mod registration;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use krust_csi::Driver;
use krust_csi::local::{LocalDriver, NAME};
use krust_csi::registration::Registrar;
use kube::Client;

use crate::Config;

/// A driver the kubelet took: where it listens, and this node's ID for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    pub endpoint: PathBuf,
    pub node_id: String,
}

/// The CSI drivers registered on this node; cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct Drivers {
    registered: Arc<RwLock<HashMap<String, Registered>>>,
    /// One lock per staged volume: its pods' workers stage, check and unstage it one
    /// at a time (upstream's per-volume pending operations).
    staging: Arc<std::sync::Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>>,
}

impl Drivers {
    fn insert(&self, name: &str, driver: Registered) {
        self.registered
            .write()
            .unwrap()
            .insert(name.to_string(), driver);
    }

    fn remove(&self, name: &str) {
        self.registered.write().unwrap().remove(name);
    }

    /// The lock of the volume staged at `path`.
    pub(crate) fn staging_lock(&self, path: &std::path::Path) -> Arc<tokio::sync::Mutex<()>> {
        self.staging
            .lock()
            .unwrap()
            .entry(path.to_path_buf())
            .or_default()
            .clone()
    }

    /// Each driver's node ID (the Node's `csi.volume.kubernetes.io/nodeid` annotation).
    fn node_ids(&self) -> HashMap<String, String> {
        let drivers = self.registered.read().unwrap();
        drivers
            .iter()
            .map(|(name, d)| (name.clone(), d.node_id.clone()))
            .collect()
    }

    /// The clients of a registered driver; upstream's wording when it is not.
    pub async fn connect(&self, name: &str) -> Result<Driver, String> {
        let endpoint = self
            .registered
            .read()
            .unwrap()
            .get(name)
            .map(|d| d.endpoint.clone());
        let Some(endpoint) = endpoint else {
            return Err(format!(
                "kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name {name} not found in the list of registered CSI drivers"
            ));
        };
        Driver::connect(&endpoint).await.map_err(|e| e.to_string())
    }
}

/// Serves the built-in driver and its registrar (if configured), and registers every
/// driver that announces itself; never returns.
pub async fn run(client: Client, config: Arc<Config>, drivers: Drivers, node_uid: Option<String>) {
    let registry = config.plugins_registry_dir();
    let built_in = async {
        let Some(root) = config.local_storage.clone() else {
            return std::future::pending().await;
        };
        let socket = krust_csi::socket_path(&config.csi_plugins_dir(), NAME);
        let registrar = Registrar {
            driver: NAME.to_string(),
            endpoint: socket.clone(),
        };
        let registration = krust_csi::registration::socket_path(&registry, NAME);
        let driver = LocalDriver::new(config.node_name.clone(), root);
        let (served, announced) =
            futures::join!(driver.serve(&socket), registrar.serve(&registration));
        for err in [served.err(), announced.err()].into_iter().flatten() {
            tracing::error!(driver = NAME, error = %err, "the built-in CSI driver stopped");
        }
    };
    let watcher = registration::Watcher {
        client,
        node: config.node_name.clone(),
        node_uid,
        drivers,
        dir: registry.clone(),
    };
    futures::join!(built_in, watcher.run());
}
