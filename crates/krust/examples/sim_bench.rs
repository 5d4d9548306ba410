//! How fast `krust sim` turns bound pods Running and Ready (issue 12: ≥ 1,000 pods/s on
//! 1,000 simulated nodes), apart from creating and scheduling them: a release `krust
//! server` without controllers, a `krust controller-manager` for the nodes' pod
//! ranges, `krust sim` with the nodes; the simulator is stopped, the pods are created
//! already bound (`spec.nodeName`, round robin), then a fresh simulator starts and a
//! watch times every pod's Ready. Then the resource metrics pipeline with every node
//! answering: until every pod has usage, and what a scrape round costs.
//!
//! ```text
//! cargo build --release -p krust --bins --example sim_bench
//! ./target/release/examples/sim_bench [nodes=1000] [pods=10000]
//! ```

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

mod support;

use support::{Cluster, Result, proc_stat};

fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().map_or(Ok(1000), |a| a.parse())?;
    let pods: usize = args.next().map_or(Ok(10_000), |a| a.parse())?;

    let cluster = Cluster::start(&["--disable-controllers"]).await?;
    // A /26 per node from a /10: ranges for 65,536 nodes (nothing routes them). The
    // cluster CA signs the simulated kubelets' serving certificate.
    let tls = cluster.dir.path().join("data/server/tls");
    let (ca, ca_key) = (tls.join("ca.crt"), tls.join("ca.key"));
    let _cm = cluster.component(
        "controller-manager",
        &[
            "--leader-elect=false",
            "--cluster-cidr=10.64.0.0/10",
            "--node-cidr-mask-size=26",
            &format!("--cluster-signing-cert-file={}", ca.display()),
            &format!("--cluster-signing-key-file={}", ca_key.display()),
        ],
    )?;
    let sim_args = ["--nodes".to_string(), nodes.to_string()];
    let sim_args: Vec<&str> = sim_args.iter().map(String::as_str).collect();
    let sim = cluster.component("sim", &sim_args)?;
    let client = cluster.client().await?;
    let node_api: Api<Node> = Api::all(client.clone());
    let names = loop {
        let list = node_api.list(&ListParams::default()).await?;
        let ready: Vec<String> = list
            .items
            .iter()
            .filter(|n| n.spec.as_ref().is_some_and(|s| s.pod_cidr.is_some()))
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        if ready.len() >= nodes {
            break ready;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("{nodes} simulated nodes with pod ranges");
    drop(sim);

    // The pods, bound, while no simulator runs.
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    stream::iter(0..pods)
        .map(|i| {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("p-{i}"), "labels": {"app": "bench"}},
                "spec": {"nodeName": names[i % names.len()],
                         "containers": [{"name": "c", "image": "busybox"}]}
            }))
            .expect("a pod");
            let api = pod_api.clone();
            async move { api.create(&PostParams::default(), &pod).await }
        })
        .buffer_unordered(64)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    println!("{pods} bound pods created in {:.2?}", started.elapsed());

    // A watch counts them Ready.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    tokio::spawn(async move {
        let mut seen = std::collections::HashSet::new();
        let mut events = watcher::watcher(pod_api, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = events.next().await {
            if let watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) = event
                && is_ready(&pod)
                && seen.insert(pod.metadata.name.clone())
            {
                let _ = tx.send(Instant::now());
            }
        }
    });

    let server_cpu = proc_stat(cluster.server.pid()).0;
    let started = Instant::now();
    let sim = cluster.component("sim", &sim_args)?;
    let (mut first, mut last, mut count) = (None, started, 0usize);
    while count < pods {
        let at = tokio::time::timeout(Duration::from_secs(300), rx.recv())
            .await
            .map_err(|_| format!("{count} of {pods} Ready after 300 s"))?
            .ok_or("the watch ended")?;
        first.get_or_insert(at);
        last = at;
        count += 1;
    }
    let first = first.unwrap_or(started);
    let spread = last.duration_since(first);
    println!(
        "simulator started: first pod Ready after {:.2?}, all {pods} after {:.2?}; {:.0} pods/s from the first to the last",
        first.duration_since(started),
        last.duration_since(started),
        pods as f64 / spread.as_secs_f64().max(1e-3)
    );
    let ((server_now, server_rss), (sim_cpu, sim_rss)) =
        (proc_stat(cluster.server.pid()), proc_stat(sim.pid()));
    println!(
        "meanwhile: server CPU {:.2} s (RSS {server_rss:.0} MB at the end), simulator CPU {sim_cpu:.2} s (RSS {sim_rss:.0} MB)",
        server_now - server_cpu
    );

    // What the resource metrics pipeline costs with every node answering: how long until
    // every pod has usage (two scrapes, the default 15 s apart), then the server's CPU
    // over four scrape rounds with nothing else happening, and a read of all pods' usage.
    let metrics = || async {
        let request = http::Request::get("/apis/metrics.k8s.io/v1beta1/pods").body(Vec::new())?;
        let started = Instant::now();
        let text = client.request_text(request).await?;
        let list: serde_json::Value = serde_json::from_str(&text)?;
        let items = list["items"].as_array().map_or(0, Vec::len);
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((items, started.elapsed()))
    };
    let ready = Instant::now();
    loop {
        let (items, _) = metrics().await?;
        if items >= pods {
            break;
        }
        if ready.elapsed() > Duration::from_secs(120) {
            return Err(format!("{items} of {pods} pods with usage after 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let with_usage = ready.elapsed();
    let (server_before, sim_before) = (proc_stat(cluster.server.pid()).0, proc_stat(sim.pid()).0);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (server_after, sim_after) = (proc_stat(cluster.server.pid()).0, proc_stat(sim.pid()).0);
    let (items, took) = metrics().await?;
    println!(
        "resource metrics: all {pods} pods with usage {with_usage:.2?} after the last Ready; \
         per 15 s scrape round of {nodes} nodes: server CPU {:.2} s, simulator CPU {:.2} s; \
         PodMetrics of all {items} pods read in {took:.2?}",
        (server_after - server_before) / 4.0,
        (sim_after - sim_before) / 4.0,
    );
    Ok(())
}
