//! CSI on this node: the kubelet runs the built-in driver (`krust_csi::local`) and
//! registers it as upstream's kubelet registers a driver — NodeGetInfo, then the node's
//! CSINode object lists the driver with its node ID and topology keys.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::serde_json::json;
use krust_csi::Driver;
use krust_csi::local::{LocalDriver, NAME};
use krust_csi::v1::NodeGetInfoRequest;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use crate::Config;

/// How long a driver that just started may take to answer.
const REGISTRATION_WAIT: Duration = Duration::from_secs(30);

/// Serves the built-in driver and registers it, if configured (never returns then).
pub async fn run(client: Client, config: Arc<Config>, node_uid: Option<String>) {
    let Some(root) = config.local_storage.clone() else {
        return;
    };
    let socket = krust_csi::socket_path(&config.csi_plugins_dir(), NAME);
    let driver = LocalDriver::new(config.node_name.clone(), root);
    let serving = async {
        if let Err(err) = driver.serve(&socket).await {
            tracing::error!(error = %err, "the built-in CSI driver stopped");
        }
    };
    let registering = async {
        if let Err(err) = register(&client, &config.node_name, node_uid, &socket).await {
            tracing::warn!(driver = NAME, error = %err, "registering the CSI driver failed");
        }
    };
    futures::join!(serving, registering);
}

/// Asks the driver who this node is to it, and lists it in the node's CSINode.
async fn register(
    client: &Client,
    node: &str,
    node_uid: Option<String>,
    socket: &std::path::Path,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + REGISTRATION_WAIT;
    let mut driver = loop {
        match Driver::connect(socket).await {
            Ok(driver) => break driver,
            Err(err) if tokio::time::Instant::now() > deadline => return Err(err.to_string()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let info = driver
        .node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .map_err(|s| format!("NodeGetInfo: {}", s.message()))?
        .into_inner();
    let topology_keys: Vec<String> = info
        .accessible_topology
        .map(|t| t.segments.into_keys().collect())
        .unwrap_or_default();
    // Owned by the Node, so that it goes with it (as upstream's kubelet makes it).
    let csi_node = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": node, "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
            "name": node, "uid": node_uid.unwrap_or_default()}]},
        "spec": {"drivers": [{"name": NAME, "nodeID": info.node_id,
            "topologyKeys": topology_keys}]},
    });
    Api::<CSINode>::all(client.clone())
        .patch(
            node,
            &PatchParams::apply("kubelet").force(),
            &Patch::Apply(&csi_node),
        )
        .await
        .map_err(|e| format!("writing CSINode {node}: {e}"))?;
    tracing::info!(driver = NAME, node, "CSI driver registered");
    Ok(())
}
