//! How long `krust doctor` takes on a large cluster (issue 37: `deploy/NAME` ≤ 200 ms
//! with 10,000 pods on simulated nodes, the cluster screen ≤ 1 s): a release `krust
//! server` (controllers, scheduler), `krust sim` with NODES nodes, a Deployment of PODS
//! pods all Ready, a Deployment of PODS pods with one that cannot be scheduled, and a
//! Service; then each command run ROUNDS times as a user runs it — a process that reads
//! the kubeconfig, dials TLS and walks — with p50 and the slowest.
//!
//! ```text
//! cargo build --release -p krust --bins --example doctor_bench
//! ./target/release/examples/doctor_bench [nodes=1000] [pods=10000] [rounds=10]
//! ```

use std::process::Command;

use futures::{StreamExt, TryStreamExt, stream};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

mod support;

use support::{Cluster, Result, krust_binary, percentile};

fn deployment(name: &str, replicas: usize) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox",
                    "resources": {"requests": {"cpu": "1m"}}}]}}}
    }))?)
}

/// Waits until the Deployment counts `ready` pods Ready.
async fn ready(api: &Api<Deployment>, name: &str, ready: i32) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let d = api.get(name).await?;
        if d.status.and_then(|s| s.ready_replicas).unwrap_or(0) >= ready {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("{name}: not {ready} ready in 10 minutes").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().map_or(Ok(1000), |a| a.parse())?;
    let pods: usize = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(10), |a| a.parse())?;

    // A /26 per node (the default /16 holds 1,024 of them).
    let cluster = Cluster::start(&["--node-cidr-mask-size=26"]).await?;
    let sim_args = ["--nodes".to_string(), nodes.to_string()];
    let _sim = cluster.component(
        "sim",
        &sim_args.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;
    let client = cluster.client().await?;
    let node_api: Api<Node> = Api::all(client.clone());
    while node_api
        .list(&ListParams::default().limit(1))
        .await?
        .items
        .is_empty()
        || node_api.list(&ListParams::default()).await?.items.len() < nodes
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let api: Api<Deployment> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &deployment("web", pods)?)
        .await?;
    println!(
        "{pods} pods on {nodes} simulated nodes Ready in {:.1?}",
        ready(&api, "web", pods as i32).await?
    );
    // Its Service, whose EndpointSlices are complete long before the rounds.
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}});
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), &serde_json::from_value(svc)?)
        .await?;
    // The same size, then, every node cordoned, one pod more that fits nowhere: the
    // doctor must find it among 10,000.
    api.create(&PostParams::default(), &deployment("stuck", pods)?)
        .await?;
    ready(&api, "stuck", pods as i32).await?;
    let cordon = json!({"spec": {"unschedulable": true}});
    let names: Vec<String> = (node_api.list(&ListParams::default()).await?.items)
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    stream::iter(names)
        .map(|name| {
            let (api, cordon) = (node_api.clone(), cordon.clone());
            async move {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&cordon))
                    .await
            }
        })
        .buffer_unordered(32)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    // The scheduler has seen every cordon before the pod comes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let more = json!({"spec": {"replicas": pods + 1}});
    api.patch("stuck", &PatchParams::default(), &Patch::Merge(&more))
        .await?;
    let kubeconfig = cluster.kubeconfig.display().to_string();

    println!("command                     p50       slowest   exit");
    for target in ["deploy/web", "deploy/stuck", "svc/web", ""] {
        let mut times = Vec::new();
        let mut code = None;
        let mut found = String::new();
        for _ in 0..rounds {
            let started = Instant::now();
            let mut cmd = Command::new(krust_binary());
            cmd.args(["doctor", "--kubeconfig", &kubeconfig]);
            if !target.is_empty() {
                cmd.arg(target);
            }
            let out = cmd.output()?;
            times.push(started.elapsed());
            code = out.status.code();
            found = String::from_utf8_lossy(&out.stdout)
                .lines()
                .find(|l| l.starts_with("Broken:") || l.starts_with("Waiting:"))
                .map(|l| l.chars().take(110).collect())
                .unwrap_or_else(|| "every link ok".into());
        }
        times.sort();
        let shown = if target.is_empty() {
            "(the cluster)"
        } else {
            target
        };
        println!(
            "krust doctor {shown:<14} {:>7.1?}  {:>7.1?}  {}",
            percentile(&times, 0.5),
            times.last().copied().unwrap_or_default(),
            code.unwrap_or(-1)
        );
        println!("    {found}");
    }
    Ok(())
}
