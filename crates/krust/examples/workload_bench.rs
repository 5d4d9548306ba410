//! Workload benchmark on simulated nodes (issue 12): a release `krust server` without a
//! node agent and without controllers, a separate `krust controller-manager`, and
//! `krust sim` with many nodes, then
//! - a DaemonSet rolled out to every node: time until all its pods exist, and until
//!   all are ready (target: 10 s for 1,000 nodes);
//! - a Job of 1,000 completions, 100 at a time, whose simulated pods finish after 1 s
//!   (target: complete within 20 s);
//! - a 100-replica StatefulSet with Parallel pod management (target: ready within 5 s);
//!
//! with the controller-manager's CPU time and RSS after each.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/workload_bench [nodes=1000]
//! ```

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

mod support;

use support::{Cluster, Result, proc_stat, rss_split};

/// Polls `check` every 20 ms until it holds; the time it took.
async fn until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let started = Instant::now();
    while !check().await? {
        if started.elapsed() > timeout {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
}

fn report(what: &str, cm_pid: u32) {
    let (cpu, rss) = proc_stat(cm_pid);
    let (anon, _) = rss_split(cm_pid);
    println!(
        "  controller-manager after {what}: CPU {cpu:.2} s, RSS {rss:.1} MB ({anon:.1} MB its own)"
    );
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let nodes: usize = std::env::args().nth(1).map_or(Ok(1000), |a| a.parse())?;

    // /26 per node: every simulated node gets a pod range from the default /16 (the
    // controller manager allocates them: without the flag it would give /24s, enough
    // for 256 nodes, and the others' pods would wait for a range that never comes).
    let cluster = Cluster::start(&["--disable-controllers"]).await?;
    let cm = cluster.component(
        "controller-manager",
        &["--leader-elect=false", "--node-cidr-mask-size=26"],
    )?;
    let cm_pid = cm.pid();
    let _sim = cluster.component("sim", &["--nodes", &nodes.to_string()])?;
    let client = cluster.client().await?;

    let node_api: Api<Node> = Api::all(client.clone());
    let took = until("the simulated nodes", Duration::from_secs(120), || async {
        let list = node_api.list(&ListParams::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        Ok(ready >= nodes)
    })
    .await?;
    println!("{nodes} simulated nodes Ready in {took:.2?}");

    // DaemonSet: one pod per node.
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": {"metadata": {"labels": {"app": "agent"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))?;
    let started = Instant::now();
    daemonsets.create(&PostParams::default(), &ds).await?;
    let mut all_created = None;
    loop {
        let status = daemonsets.get("agent").await?.status.unwrap_or_default();
        if all_created.is_none() && status.current_number_scheduled as usize >= nodes {
            all_created = Some(started.elapsed());
        }
        if status.desired_number_scheduled as usize == nodes
            && status.number_ready as usize == nodes
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            return Err("timed out waiting for the DaemonSet ready".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "DaemonSet on {nodes} nodes: all pods created in {:.2?}, all ready in {:.2?}",
        all_created.unwrap_or_default(),
        started.elapsed()
    );
    report("the DaemonSet", cm_pid);

    // Job: 1,000 completions, 100 at a time, pods that finish after 1 s.
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "batch"},
        "spec": {"completions": 1000, "parallelism": 100, "backoffLimit": 0,
                 "template": {"metadata": {"annotations": {"sim.krust.io/exit-after": "1s"}},
                              "spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "c", "image": "busybox"}]}}}
    }))?;
    let started = Instant::now();
    jobs.create(&PostParams::default(), &job).await?;
    let outcome = until("the Job to complete", Duration::from_secs(600), || async {
        let status = jobs.get("batch").await?.status.unwrap_or_default();
        let condition = |t: &str| {
            status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == t && c.status == "True")
                .cloned()
        };
        if let Some(failed) = condition("Failed") {
            return Err(format!(
                "the Job failed: {} {} ({} pods failed)",
                failed.reason.unwrap_or_default(),
                failed.message.unwrap_or_default(),
                status.failed.unwrap_or(0)
            )
            .into());
        }
        Ok(condition("Complete").is_some())
    })
    .await;
    // A Job that fails is reported, and the StatefulSet still measured.
    match outcome {
        Ok(_) => println!(
            "Job of 1000 completions, parallelism 100, 1 s pods: complete in {:.2?}",
            started.elapsed()
        ),
        Err(e) => println!(
            "Job of 1000 completions: {e} after {:.2?}",
            started.elapsed()
        ),
    }
    report("the Job", cm_pid);

    // StatefulSet: 100 replicas, Parallel.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "db"},
                "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]}
            }))?,
        )
        .await?;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"replicas": 100, "serviceName": "db", "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))?;
    let started = Instant::now();
    sets.create(&PostParams::default(), &set).await?;
    until(
        "the StatefulSet ready",
        Duration::from_secs(300),
        || async {
            let status = sets.get("db").await?.status.unwrap_or_default();
            Ok(status.ready_replicas == Some(100))
        },
    )
    .await?;
    println!(
        "StatefulSet of 100, Parallel: ready in {:.2?}",
        started.elapsed()
    );
    report("the StatefulSet", cm_pid);
    cluster.stop();
    Ok(())
}
