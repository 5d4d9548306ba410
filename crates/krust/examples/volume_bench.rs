//! What a provisioned volume adds to a pod's start on a real node: a release `krust
//! server` with its agent and scheduler; one pod at a time, alternately with an emptyDir
//! and with a new claim of the built-in `local-path` class (WaitForFirstConsumer: the
//! scheduler picks the node, the node's provisioner makes the volume, the binder binds
//! it, the scheduler binds the pod, the kubelet publishes the volume through CSI). The
//! time measured runs from the first create (the claim, or the pod) to the pod seen
//! Running on a watch.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/volume_bench [pods=20]
//! ```

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use support::{Cluster, Result, percentile, wait};

fn pod(name: &str, volume: Value) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [volume]}}))?)
}

fn report(what: &str, latencies: &mut [Duration]) {
    latencies.sort();
    println!(
        "{what:<28} create → Running  p50 {:>7.1?}  p90 {:>7.1?}  max {:>7.1?}  ({} pods)",
        percentile(latencies, 0.5),
        percentile(latencies, 0.9),
        latencies.last().copied().unwrap_or_default(),
        latencies.len()
    );
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let count: usize = std::env::args().nth(1).map_or(Ok(20), |a| a.parse())?;
    let cluster = Cluster::start_server(&[
        "--cluster-cidr=10.71.0.0/16",
        "--kubelet-port=0",
        "--eviction-hard=memory.available<100Mi,nodefs.available<1%,imagefs.available<1%",
        // Services are not measured: no nftables table left behind.
        "--disable-kube-proxy",
    ])
    .await?;
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let running: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    {
        let running = running.clone();
        let api = pods.clone();
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
            while let Some(Ok(event)) = stream.next().await {
                if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = event
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                {
                    let name = p.metadata.name.unwrap_or_default();
                    running
                        .lock()
                        .unwrap()
                        .entry(name)
                        .or_insert_with(Instant::now);
                }
            }
        });
    }
    let until_running = |name: String, started: Instant| {
        let running = running.clone();
        async move {
            wait(&name, Duration::from_secs(120), || {
                running.lock().unwrap().contains_key(&name)
            })
            .await?;
            Ok::<_, support::Error>(running.lock().unwrap()[&name] - started)
        }
    };
    // The first pod waits for the node, the class and the image: not measured.
    let warm = pod("warm", json!({"name": "data", "emptyDir": {}}))?;
    wait_created(&pods, &warm).await?;
    until_running("warm".into(), Instant::now()).await?;

    let (mut empty_dir, mut claimed) = (Vec::new(), Vec::new());
    for i in 0..count {
        let name = format!("e{i}");
        let started = Instant::now();
        pods.create(
            &PostParams::default(),
            &pod(&name, json!({"name": "data", "emptyDir": {}}))?,
        )
        .await?;
        empty_dir.push(until_running(name.clone(), started).await?);
        pods.delete(&name, &DeleteParams::default()).await?;

        let name = format!("v{i}");
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                "resources": {"requests": {"storage": "16Mi"}}}}))?;
        let started = Instant::now();
        claims.create(&PostParams::default(), &claim).await?;
        pods.create(
            &PostParams::default(),
            &pod(
                &name,
                json!({"name": "data", "persistentVolumeClaim": {"claimName": name}}),
            )?,
        )
        .await?;
        claimed.push(until_running(name.clone(), started).await?);
        pods.delete(&name, &DeleteParams::default()).await?;
        claims.delete(&name, &DeleteParams::default()).await?;
    }
    report("emptyDir", &mut empty_dir);
    report("new local-path claim", &mut claimed);
    println!(
        "the claim adds (p50): {:.1?}",
        percentile(&claimed, 0.5).saturating_sub(percentile(&empty_dir, 0.5))
    );
    for _ in 0..600 {
        if pods.list(&ListParams::default()).await?.items.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.stop();
    Ok(())
}

/// Creates `pod` once the default service account and namespace admit it (right after
/// start they may not exist yet).
async fn wait_created(pods: &Api<Pod>, pod: &Pod) -> Result {
    for _ in 0..300 {
        if pods.create(&PostParams::default(), pod).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the first pod was never admitted".into())
}
