//! Pod network benchmark on a real node: TCP throughput and UDP round trips from one pod
//! to another, straight to the pod's address and through its Service's cluster IP (the
//! Service proxy's DNAT), side by side.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/pod_network_bench [seconds=5] [rounds=3]
//! ```
//!
//! A release `krust server` with its agent (containerd, runc, the CNI bridge, the
//! Service proxy); the pods run the network policy tests' program (`netexec`, built
//! static by this bench with `rustc`). Each round sends for `seconds` over one TCP
//! connection to the pod, then to the cluster IP, and times 5,000 UDP round trips each
//! way; prints each figure and the cluster IP's ratio to the direct path.

#[path = "../tests/e2e/network_policy/image.rs"]
mod netexec_image;
mod support;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::{Cluster, Result, krust_binary, wait};

const IMAGE: &str = "krust.bench/netexec:1";
const CLUSTER_CIDR: &str = "10.71.0.0/16";
const TABLE: &str = "krust-bench-net";
const PORT: u16 = 5001;

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().map_or(Ok(5), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(3), |a| a.parse())?;
    let cluster = Cluster::start_server(&[
        &format!("--cluster-cidr={CLUSTER_CIDR}"),
        &format!("--nftables-table={TABLE}"),
        "--kubelet-port=0",
        "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%",
    ])
    .await?;
    let result = measure(&cluster, seconds, rounds).await;
    // Deleted as a user would: the kubelet ends the pods (and their sandboxes) before
    // the API lets them go.
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["server", "client"] {
        let _ = pods.delete(name, &DeleteParams::default()).await;
    }
    for _ in 0..600 {
        if pods.list(&ListParams::default()).await?.items.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stopping reaps the node's range (bridge, egress and policy tables); the proxy's
    // own table stays after it, as kube-proxy's does.
    cluster.stop();
    let _ = krust_net::nft::delete_table(TABLE);
    result
}

async fn measure(cluster: &Cluster, seconds: u64, rounds: usize) -> Result {
    import_netexec(cluster)?;
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["server", "client"] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "netexec",
                "image": IMAGE, "args": ["serve", PORT.to_string()]}]}}))?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "server"},
        "spec": {"selector": {"app": "server"}, "ports": [
            {"name": "tcp", "port": PORT, "protocol": "TCP"},
            {"name": "udp", "port": PORT, "protocol": "UDP"}]}}))?;
    let service = Api::<Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &service)
        .await?;
    let cluster_ip = service
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or("the Service has no cluster IP")?;
    let mut pod_ip = None;
    for _ in 0..1200 {
        let server = pods.get("server").await?;
        let ready = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        if ready(&server) && ready(&pods.get("client").await?) {
            pod_ip = server.status.and_then(|s| s.pod_ip);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pod_ip = pod_ip.ok_or("the pods did not become Ready")?;
    // The Service's rules are loaded once its endpoint answers through the cluster IP.
    let target = format!("{cluster_ip}:{PORT}");
    wait("the cluster IP answering", Duration::from_secs(60), || {
        exec(cluster, &["probe", "500", &format!("tcp:{target}")]).is_ok_and(|o| o.ends_with(" ok"))
    })
    .await?;
    let paths = [
        ("pod → pod", pod_ip.clone()),
        ("pod → cluster IP → pod", cluster_ip),
    ];
    let mut throughput = [Vec::new(), Vec::new()];
    let mut round_trips = [Vec::new(), Vec::new()];
    for round in 1..=rounds {
        for (i, (name, ip)) in paths.iter().enumerate() {
            let address = format!("{ip}:{PORT}");
            let sent = exec(cluster, &["blast", &seconds.to_string(), &address])?;
            let gbits = field(&sent, "bytes") * 8.0 / field(&sent, "seconds") / 1e9;
            let rtt = exec(cluster, &["rtt", "5000", &address])?;
            let (p50, p99) = (field(&rtt, "p50_us"), field(&rtt, "p99_us"));
            println!(
                "round {round}, {name}: TCP {gbits:.2} Gbit/s; UDP round trip p50 {p50} µs, p99 {p99} µs"
            );
            throughput[i].push(gbits);
            round_trips[i].push(p50);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "mean over {rounds} rounds: TCP {:.2} vs {:.2} Gbit/s (cluster IP {:.3}× the direct path); UDP p50 {:.0} vs {:.0} µs ({:.3}×)",
        mean(&throughput[0]),
        mean(&throughput[1]),
        mean(&throughput[1]) / mean(&throughput[0]),
        mean(&round_trips[0]),
        mean(&round_trips[1]),
        mean(&round_trips[1]) / mean(&round_trips[0]),
    );
    Ok(())
}

/// The value of `name=<number>` in `text`.
fn field(text: &str, name: &str) -> f64 {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or(0.0)
}

/// `/netexec <args>` in the client pod (through `kubectl exec`): its output.
fn exec(cluster: &Cluster, args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(["exec", "client", "--", "/netexec"])
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(format!("netexec {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Builds the pod program static and imports its image into the node's containerd.
fn import_netexec(cluster: &Cluster) -> Result {
    let tarball = netexec_image::build(cluster.dir.path(), IMAGE)?;
    // The agent starts containerd after the server answers: try until it is there.
    let mut last = String::new();
    for _ in 0..300 {
        let imported = Command::new(krust_binary())
            .args(["images", "import", "--data-dir"])
            .arg(cluster.dir.path().join("data"))
            .arg(&tarball)
            .output()?;
        if imported.status.success() {
            return Ok(());
        }
        last = String::from_utf8_lossy(&imported.stderr).into_owned();
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("importing the image: {last}").into())
}
