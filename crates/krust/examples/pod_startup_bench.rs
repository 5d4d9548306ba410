//! Pod startup latency on a real node: a release `krust server` with its agent
//! (containerd, runc, the CNI bridge), pods of the locally built busybox image created
//! at once, and the time from each create (request returned) to the pod seen Ready on a
//! watch.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/pod_startup_bench [pods=30 ...]
//! ```
//!
//! Each argument is one round (default: 30 and 100); pods of a round are created
//! concurrently, measured, then deleted.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::{Cluster, Result, machine_cpu, percentile, proc_stat, wait};

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rounds: Vec<usize> = {
        let args: Vec<usize> = std::env::args()
            .skip(1)
            .map(|a| a.parse())
            .collect::<std::result::Result<_, _>>()?;
        if args.is_empty() { vec![30, 100] } else { args }
    };
    // Disk thresholds low enough for a nearly full test disk (upstream's 10%/15% would
    // evict the pods being measured).
    let cluster = Cluster::start_server(&[
        "--cluster-cidr=10.70.0.0/16",
        "--disable-scheduler",
        "--kubelet-port=0",
        "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%",
        // Services are not measured: no nftables table left behind.
        "--disable-kube-proxy",
    ])
    .await?;
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let node = Cluster::node(&client).await?;
    let ready: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    {
        let ready = ready.clone();
        let api = pods.clone();
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
            while let Some(Ok(event)) = stream.next().await {
                if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = event
                    && is_ready(&p)
                {
                    let name = p.metadata.name.unwrap_or_default();
                    ready
                        .lock()
                        .unwrap()
                        .entry(name)
                        .or_insert_with(Instant::now);
                }
            }
        });
    }
    let server = cluster.server.pid();
    for (round, count) in rounds.into_iter().enumerate() {
        let (machine_before, (krust_before, _)) = (machine_cpu(), proc_stat(server));
        // Bound straight to the node (no scheduler): what is measured is the kubelet.
        let created: Vec<(String, Instant)> = futures::stream::iter(0..count)
            .map(|i| {
                let pods = pods.clone();
                let node = node.clone();
                async move {
                    let name = format!("r{round}-{i}");
                    let pod: Pod = serde_json::from_value(json!({
                        "metadata": {"name": name},
                        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                            "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                "command": ["sleep", "3600"]}]}}))?;
                    pods.create(&PostParams::default(), &pod).await?;
                    Ok::<_, support::Error>((name, Instant::now()))
                }
            })
            .buffer_unordered(count.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<std::result::Result<_, _>>()?;
        let names: Vec<String> = created.iter().map(|(n, _)| n.clone()).collect();
        wait("pods ready", Duration::from_secs(600), || {
            let r = ready.lock().unwrap();
            names.iter().all(|n| r.contains_key(n))
        })
        .await?;
        let mut latencies: Vec<Duration> = {
            let r = ready.lock().unwrap();
            created
                .iter()
                .map(|(n, at)| r[n].saturating_duration_since(*at))
                .collect()
        };
        latencies.sort();
        let machine = machine_cpu() - machine_before;
        let krust = proc_stat(server).0 - krust_before;
        println!(
            "{count:>4} pods at once: create → Ready p50 {:>8.1?}  p99 {:>8.1?}  max {:>8.1?}  \
             CPU: machine {machine:.1} s, krust {krust:.1} s (the rest: containerd, shims, runc, CNI)",
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            latencies.last().copied().unwrap_or_default()
        );
        for n in &names {
            let _ = pods.delete(n, &DeleteParams::default()).await;
        }
        // Teardown takes a while (one sandbox after another): up to 5 minutes.
        for _ in 0..3000 {
            if pods.list(&ListParams::default()).await?.items.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    cluster.stop();
    Ok(())
}
