//! Pod startup on a real node, side by side with the bare runtime: the same pods (the
//! locally built busybox image, no volumes, no Service environment) started (a) by krust,
//! from the create request's return to the pod seen Ready on a watch, and (b) straight
//! through CRI on the same containerd by this program, making exactly the calls the
//! kubelet makes for such a pod (RunPodSandbox, PodSandboxStatus, CreateContainer,
//! StartContainer, with the kubelet's own configs), from the first call to the
//! container started. Both at the same parallelism, for runc and, where installed, crun
//! (a RuntimeClass names it for krust; the CRI handler for the bare path).
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/pod_startup_bench [pods=30 ...]
//! ```
//!
//! Each argument is one round (default: 30 and 100); the pods of a round start at
//! once, are measured, then deleted.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use krust_cri::api::{
    CreateContainerRequest, PodSandboxStatusRequest, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopPodSandboxRequest,
};
use krust_kubelet::pods::{lifecycle, spec};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use support::{Cluster, Result, machine_cpu, percentile, proc_stat, wait};

/// One round's figures.
struct Round {
    latencies: Vec<Duration>,
    /// CPU seconds of the whole machine, and of krust's server (krust rounds only).
    machine: f64,
    krust: Option<f64>,
}

impl Round {
    fn print(&self, what: &str) {
        let krust = match self.krust {
            Some(k) => format!(", krust {k:.2} s ({:.1} %)", 100.0 * k / self.machine),
            None => String::new(),
        };
        println!(
            "{what:<22} p50 {:>8.1?}  p99 {:>8.1?}  max {:>8.1?}  CPU: machine {:.1} s{krust}",
            percentile(&self.latencies, 0.5),
            percentile(&self.latencies, 0.99),
            self.latencies.last().copied().unwrap_or_default(),
            self.machine,
        );
    }
}

/// The pod both paths start: no volumes and no Service variables, so that the bare
/// path has nothing to leave out.
fn pod_spec(name: &str, class: Option<&str>) -> Value {
    let mut spec = json!({"terminationGracePeriodSeconds": 1, "enableServiceLinks": false,
        "automountServiceAccountToken": false,
        "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", "3600"]}]});
    if let Some(class) = class {
        spec["runtimeClassName"] = json!(class);
    }
    json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

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
    // crun, where the node offers it, through a RuntimeClass of that name.
    let crun = krust_cri::runtimes::Runtimes::default().has_crun();
    if crun {
        let classes: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(client.clone());
        let class =
            serde_json::from_value(json!({"metadata": {"name": "crun"}, "handler": "crun"}))?;
        classes.create(&PostParams::default(), &class).await?;
    }
    let handlers: &[&str] = if crun { &["runc", "crun"] } else { &["runc"] };
    let data = cluster.dir.path().join("data");
    let socket =
        krust_cri::containerd::Layout::new(krust_cri::containerd::default_dir(&data)).socket();
    let runtime = krust_cri::Runtime::connect(&socket.display().to_string()).await?;
    let bare = Bare {
        runtime,
        config: kubelet_config(&data, &node),
    };
    let server = cluster.server.pid();
    let mut serial = 0;
    for count in rounds {
        for handler in handlers {
            serial += 1;
            let class = (*handler != "runc").then_some(*handler);
            let k = krust_round(&pods, &node, &ready, server, (serial, count), class).await?;
            let b = bare.round((serial, count), handler).await?;
            println!("{count} pods at once, {handler}:");
            k.print("  krust");
            b.print("  bare CRI");
            let ratio = |q| {
                percentile(&k.latencies, q).as_secs_f64()
                    / percentile(&b.latencies, q).as_secs_f64()
            };
            println!(
                "  krust / bare: p50 {:.2}x, p99 {:.2}x",
                ratio(0.5),
                ratio(0.99)
            );
        }
    }
    cluster.stop();
    Ok(())
}

/// `count` pods created at once through the API, bound to the node (no scheduler:
/// what is measured is the kubelet), each timed from its create's return to Ready.
async fn krust_round(
    pods: &Api<Pod>,
    node: &str,
    ready: &Mutex<HashMap<String, Instant>>,
    server: u32,
    (serial, count): (usize, usize),
    class: Option<&str>,
) -> Result<Round> {
    let (machine_before, (krust_before, _)) = (machine_cpu(), proc_stat(server));
    let created: Vec<(String, Instant)> = futures::stream::iter(0..count)
        .map(|i| async move {
            let name = format!("k{serial}-{i}");
            let mut pod = pod_spec(&name, class);
            pod["spec"]["nodeName"] = json!(node);
            pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
                .await?;
            Ok::<_, support::Error>((name, Instant::now()))
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
    let round = Round {
        latencies,
        machine: machine_cpu() - machine_before,
        krust: Some(proc_stat(server).0 - krust_before),
    };
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
    Ok(round)
}

/// A kubelet configuration for the bare path's pods: only what the sandbox and
/// container configs read (the pod directory, the cluster DNS) matters.
fn kubelet_config(data: &std::path::Path, node: &str) -> krust_kubelet::Config {
    krust_kubelet::Config {
        node_name: node.to_string(),
        node_ip: std::net::Ipv4Addr::LOCALHOST,
        data_dir: data.join("bare"),
        cluster_dns: std::net::Ipv4Addr::new(10, 43, 0, 10),
        cluster_domain: "cluster.local".into(),
        fallback_pod_cidr: None,
        pod_mtu: None,
        cni_conf_dir: data.join("bare/net.d"),
        kubelet_port: 0,
        client_ca: String::new(),
        serving_cert: None,
        eviction_hard: Vec::new(),
        housekeeping_interval: Duration::from_secs(10),
        image_fs: data.join("bare/images"),
        image_gc: Default::default(),
        pinned_images: Default::default(),
        parallel_pulls: None,
        local_storage: None,
    }
}

/// The bare CRI path on the node's containerd.
struct Bare {
    runtime: krust_cri::Runtime,
    config: krust_kubelet::Config,
}

impl Bare {
    /// `count` pods started at once under `handler`, each timed from its first CRI call
    /// to its container started; then stopped and removed.
    async fn round(&self, (serial, count): (usize, usize), handler: &str) -> Result<Round> {
        let machine_before = machine_cpu();
        let started: Vec<(String, Duration)> = futures::stream::iter(0..count)
            .map(|i| async move {
                let mut pod: Pod =
                    serde_json::from_value(pod_spec(&format!("b{serial}-{i}"), None))?;
                pod.metadata.uid = Some(format!("bare-{serial}-{i}"));
                let began = Instant::now();
                let sandbox = self.start(&pod, handler).await?;
                Ok::<_, support::Error>((sandbox, began.elapsed()))
            })
            .buffer_unordered(count.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<std::result::Result<_, _>>()?;
        let machine = machine_cpu() - machine_before;
        let mut rt = self.runtime.runtime.clone();
        for (sandbox, _) in &started {
            rt.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: sandbox.clone(),
            })
            .await?;
            rt.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: sandbox.clone(),
            })
            .await?;
        }
        let mut latencies: Vec<Duration> = started.into_iter().map(|(_, d)| d).collect();
        latencies.sort();
        Ok(Round {
            latencies,
            machine,
            krust: None,
        })
    }

    /// The kubelet's calls for one pod of one container: its sandbox, the sandbox's
    /// address (for /etc/hosts), the container, its start. Returns the sandbox.
    async fn start(&self, pod: &Pod, handler: &str) -> Result<String> {
        let mut rt = self.runtime.runtime.clone();
        // Without the pod-uid label, which makes the node's kubelet reap a sandbox of a
        // pod the API does not have.
        let mut sandbox_config = spec::sandbox_config(&self.config, pod, 0);
        sandbox_config.labels.remove(spec::POD_UID);
        let sandbox = rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(sandbox_config.clone()),
                runtime_handler: handler.to_string(),
            })
            .await?
            .into_inner()
            .pod_sandbox_id;
        let ip = rt
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: sandbox.clone(),
                verbose: false,
            })
            .await?
            .into_inner()
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default();
        let container = &pod.spec.as_ref().ok_or("a pod spec")?.containers[0];
        let hosts = spec::write_hosts(&self.config, pod, &ip)?;
        let message = lifecycle::message_file(&self.config, pod, &container.name, 0);
        let mounts = vec![lifecycle::message_mount(&message, container)?];
        let mut config = spec::container_config(pod, container, 0, Vec::new(), mounts, &hosts);
        config.labels.remove(spec::POD_UID);
        let id = rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            })
            .await?
            .into_inner()
            .container_id;
        rt.start_container(StartContainerRequest { container_id: id })
            .await?;
        Ok(sandbox)
    }
}
