//! The kubelet's own Node: registered with the machine's capacity, addresses and node
//! info, kept alive by a Lease in `kube-node-lease` renewed every [`LEASE_RENEW`], and
//! its conditions reported at start and at least every [`STATUS_REPORT`].

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::serde_json::{Value, json};
use krust_api::cidr::Ipv4Cidr;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use crate::eviction::{PRESSURES, Pressures};
use crate::machine::Machine;
use crate::{Config, Error};

/// Upstream's node lease: renewed every 10 s, valid for 40 s.
pub const LEASE_RENEW: Duration = Duration::from_secs(10);
const LEASE_DURATION_SECONDS: i32 = 40;
/// Upstream's nodeStatusReportFrequency when nothing changes.
pub const STATUS_REPORT: Duration = Duration::from_secs(300);
/// Upstream's default pod capacity.
const MAX_PODS: u32 = 110;

/// Labels every node carries.
fn labels(config: &Config) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubernetes.io/hostname".into(), config.node_name.clone()),
        ("kubernetes.io/os".into(), "linux".into()),
        ("kubernetes.io/arch".into(), "amd64".into()),
        ("beta.kubernetes.io/os".into(), "linux".into()),
        ("beta.kubernetes.io/arch".into(), "amd64".into()),
    ])
}

/// The status the node reports: capacity, addresses, node info, healthy conditions.
pub fn status(config: &Config, machine: &Machine, runtime_version: &str, port: u16) -> Value {
    let now = Timestamp::now().to_string();
    let capacity = json!({
        "cpu": machine.cpus.to_string(),
        "memory": format!("{}Ki", machine.memory_kib),
        "ephemeral-storage": format!("{}Ki", machine.storage_bytes / 1024),
        "pods": MAX_PODS.to_string(),
    });
    let condition = |t: &str, s: &str, reason: &str, message: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({"status": {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": PRESSURES.iter().map(|p| {
            let (kind, reason, message) = p.condition(false);
            condition(kind, "False", reason, message)
        }).chain([condition("Ready", "True", "KubeletReady", "kubelet is posting ready status")])
        .collect::<Vec<_>>(),
        "addresses": [
            {"type": "InternalIP", "address": config.node_ip.to_string()},
            {"type": "Hostname", "address": config.node_name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {
            "machineID": machine.machine_id, "systemUUID": machine.machine_id,
            "bootID": machine.boot_id, "kernelVersion": machine.kernel,
            "osImage": machine.os_image, "containerRuntimeVersion": runtime_version,
            "kubeletVersion": crate::KUBELET_VERSION, "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": "amd64",
        },
    }})
}

/// Creates the Node (or takes over the existing one) and reports its status; returns
/// the Node as stored.
pub async fn register(client: &Client, config: &Config, status: &Value) -> Result<Node, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let node: Node = k8s_openapi::serde_json::from_value(json!({
        "metadata": {"name": config.node_name, "labels": labels(config)}
    }))
    .expect("node object");
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(node = config.node_name, "node registered"),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            tracing::info!(
                node = config.node_name,
                "node already registered; taking it over"
            );
        }
        Err(e) => return Err(Error::api("registering node", &config.node_name, e)),
    }
    api.patch_status(
        &config.node_name,
        &PatchParams::default(),
        &Patch::Merge(status),
    )
    .await
    .map_err(|e| Error::api("reporting the status of node", &config.node_name, e))
}

/// The node's pod range once node IPAM has set it, or `fallback` after `wait`.
pub async fn pod_cidr(client: &Client, config: &Config, wait: Duration) -> Result<Ipv4Cidr, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let node = api
            .get(&config.node_name)
            .await
            .map_err(|e| Error::api("reading node", &config.node_name, e))?;
        if let Some(cidr) = node
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidr.as_deref())
            .and_then(|c| c.parse().ok())
        {
            return Ok(cidr);
        }
        if tokio::time::Instant::now() >= deadline
            && let Some(fallback) = config.fallback_pod_cidr
        {
            tracing::warn!(%fallback, "no podCIDR from node IPAM; using the local fallback");
            return Ok(fallback);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Renews the Lease every [`LEASE_RENEW`] and re-reports the status every
/// [`STATUS_REPORT`], and at once when the pressures the node is under change. Never
/// returns.
pub async fn heartbeats(
    client: Client,
    config: std::sync::Arc<Config>,
    node: Node,
    mut status: Value,
    mut pressures: watch::Receiver<Pressures>,
    mut images: watch::Receiver<Value>,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client);
    let mut lease_tick = tokio::time::interval(LEASE_RENEW);
    let mut status_tick = tokio::time::interval(STATUS_REPORT);
    status_tick.tick().await;
    loop {
        tokio::select! {
            _ = lease_tick.tick() => {
                if let Err(err) = renew_lease(&leases, &config.node_name, &node.uid().unwrap_or_default()).await {
                    tracing::warn!(error = %err, "renewing the node lease failed");
                } else if !api_agrees(&nodes, &config.node_name, &status).await {
                    // The node lifecycle controller marked the node Unknown while this
                    // kubelet could not reach the apiserver: say it is back at once.
                    report(&nodes, &config, &mut status, None).await;
                }
            }
            _ = status_tick.tick() => report(&nodes, &config, &mut status, None).await,
            Ok(()) = pressures.changed() => {
                let under = pressures.borrow_and_update().clone();
                report(&nodes, &config, &mut status, Some(&under)).await;
            }
            // The images the node has (what ImageLocality scores), when they change.
            Ok(()) = images.changed() => {
                status["status"]["images"] = images.borrow_and_update().clone();
                report(&nodes, &config, &mut status, None).await;
            }
        }
    }
}

/// Whether the Node in the API shows each of our conditions with our status (upstream's
/// kubelet compares with the API's Node every update period).
async fn api_agrees(nodes: &Api<Node>, name: &str, status: &Value) -> bool {
    let Ok(node) = nodes.get(name).await else {
        return true; // unreachable now: the next period asks again
    };
    let api = node.status.and_then(|s| s.conditions).unwrap_or_default();
    crate::pods::status::conditions_shown(
        api.iter().map(|c| (c.type_.as_str(), c.status.as_str())),
        &status["status"]["conditions"],
    )
}

/// Patches the node's status with fresh heartbeat times; with `under`, the pressure
/// conditions first follow it (a flip moves their transition time).
async fn report(nodes: &Api<Node>, config: &Config, status: &mut Value, under: Option<&Pressures>) {
    let now = Timestamp::now().to_string();
    for c in status["status"]["conditions"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        c["lastHeartbeatTime"] = json!(now);
        let Some(under) = under else { continue };
        for p in PRESSURES {
            let on = under.contains(&p);
            let (kind, reason, message) = p.condition(on);
            if c["type"] != kind {
                continue;
            }
            let value = if on { "True" } else { "False" };
            if c["status"] != value {
                c["lastTransitionTime"] = json!(now);
            }
            c["status"] = json!(value);
            c["reason"] = json!(reason);
            c["message"] = json!(message);
        }
    }
    if let Err(err) = nodes
        .patch_status(
            &config.node_name,
            &PatchParams::default(),
            &Patch::Strategic(&*status),
        )
        .await
    {
        tracing::warn!(error = %err, "reporting node status failed");
    }
}

async fn renew_lease(api: &Api<Lease>, node: &str, uid: &str) -> Result<(), kube::Error> {
    let now = MicroTime(Timestamp::now());
    let renew = json!({"spec": {"renewTime": now, "holderIdentity": node,
        "leaseDurationSeconds": LEASE_DURATION_SECONDS}});
    match api
        .patch(node, &PatchParams::default(), &Patch::Merge(&renew))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let lease: Lease = k8s_openapi::serde_json::from_value(json!({
                "metadata": {"name": node, "namespace": "kube-node-lease",
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_DURATION_SECONDS, "renewTime": now},
            }))
            .expect("lease object");
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}
