//! Controller-manager benchmark: starts a release `krust server --disable-controllers`
//! and a separate `krust controller-manager` on a temp dir, plays the kubelet (every new
//! pod is patched Ready through pods/status at once), and measures what issue 4 targets.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/controller_bench [replicas=1000] [pods-for-rss=10000]
//! ```
//!
//! Prints: time from creating a Deployment of `replicas` to all its pods existing, and to
//! the rollout completing; time for a rolling update (image change, default 25 % surge and
//! unavailable) of all replicas to complete; the controller-manager's CPU time and RSS
//! after scaling to `pods-for-rss` pods.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

mod support;

use support::{Cluster, Result, proc_stat, rss_split, wait};

/// Live pods seen on a watch, and which of them were patched ready.
#[derive(Default)]
struct Pods {
    live: HashSet<String>,
    marked: HashSet<String>,
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let replicas: i32 = args.next().map_or(Ok(1000), |a| a.parse())?;
    let rss_pods: i32 = args.next().map_or(Ok(10_000), |a| a.parse())?;

    let cluster = Cluster::start(&["--disable-controllers", "--disable-scheduler"]).await?;
    let cm = cluster.component("controller-manager", &["--leader-elect=false"])?;
    let cm_pid = cm.pid();
    let client = cluster.client().await?;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");

    // The kubelet stand-in: every new pod becomes Running and Ready at once.
    let pods = Arc::new(Mutex::new(Pods::default()));
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    {
        let pods = pods.clone();
        let api = pods_api.clone();
        tokio::spawn(async move {
            let mut stream = watcher(api.clone(), watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = stream.next().await {
                // The watcher starts again after an error; only say what it was.
                let event = match event {
                    Ok(event) => event,
                    Err(err) => {
                        eprintln!("kubelet stand-in: watch failed, resuming: {err}");
                        continue;
                    }
                };
                let (pod, gone) = match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let gone = p.metadata.deletion_timestamp.is_some();
                        (p, gone)
                    }
                    watcher::Event::Delete(p) => (p, true),
                    _ => continue,
                };
                let name = pod.metadata.name.clone().unwrap_or_default();
                let new = {
                    let mut state = pods.lock().unwrap();
                    if gone {
                        state.live.remove(&name);
                        false
                    } else {
                        state.live.insert(name.clone());
                        state.marked.insert(name.clone())
                    }
                };
                if !new {
                    continue;
                }
                // The permit is taken in the task, never here: a watch left unread (all
                // permits held) fills the HTTP/2 connection's window, and the patches'
                // answers, on the same connection, never arrive.
                let (api, limit) = (api.clone(), limit.clone());
                tokio::spawn(async move {
                    let permit = limit.acquire_owned().await;
                    let now = k8s_openapi::jiff::Timestamp::now()
                        .strftime("%Y-%m-%dT%H:%M:%SZ")
                        .to_string();
                    let patch = json!({"status": {"phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                        "containerStatuses": [{"name": "c", "image": "x", "imageID": "", "ready": true,
                            "restartCount": 0, "started": true, "state": {"running": {"startedAt": now}}}]}});
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                    drop(permit);
                });
            }
        });
    }

    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "bench"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "bench"}},
                 "template": {"metadata": {"labels": {"app": "bench"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}}
    }))?;
    let complete = |d: &Deployment, n: i32| {
        let s = d.status.clone().unwrap_or_default();
        s.observed_generation >= d.metadata.generation
            && s.updated_replicas == Some(n)
            && s.replicas == Some(n)
            && s.available_replicas == Some(n)
    };

    let started = Instant::now();
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let p = pods.clone();
    wait("all pods created", Duration::from_secs(120), || {
        p.lock().unwrap().live.len() >= replicas as usize
    })
    .await?;
    let created = started.elapsed();
    loop {
        if complete(&deployments.get("bench").await?, replicas) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let available = started.elapsed();
    println!(
        "deployment of {replicas}: all pods created in {created:.2?}, rollout complete in {available:.2?}"
    );

    let started = Instant::now();
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}}});
    deployments
        .patch("bench", &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    loop {
        if complete(&deployments.get("bench").await?, replicas) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "rolling update of {replicas}: complete in {:.2?}",
        started.elapsed()
    );

    let (cpu_before, _) = proc_stat(cm_pid);
    let started = Instant::now();
    let scale = json!({"spec": {"replicas": rss_pods}});
    deployments
        .patch("bench", &PatchParams::default(), &Patch::Merge(&scale))
        .await?;
    loop {
        if complete(&deployments.get("bench").await?, rss_pods) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    let (cpu, rss) = proc_stat(cm_pid);
    let (anon, file) = rss_split(cm_pid);
    println!(
        "scale to {rss_pods} pods: complete in {took:.2?}; controller-manager CPU {:.2} s for the scale ({cpu:.2} s total), RSS {rss:.1} MB ({anon:.1} MB its own, {file:.1} MB mapped from the binary)",
        cpu - cpu_before
    );
    Ok(())
}
