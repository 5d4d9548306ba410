//! Scheduler benchmark through the real apiserver, in the manner of upstream's
//! scheduler_perf: a release `krust server --disable-controllers --disable-scheduler`,
//! nodes created through the API (4 CPU, 32 Gi, 110 pods each, as scheduler_perf's
//! default node), a separate `krust scheduler` process, then per shape: init pods
//! created and waited for, then measured pods created (64 requests in flight) while a
//! watch notes when each is seen bound.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/scheduler_bench [shape ...]
//! ```
//!
//! Shapes (default: all): `basic` (5,000 nodes, 1,000 init pods, 10,000 measured),
//! `affinity` (required node affinity), `spread` (zone topology spread, maxSkew 1),
//! `antiaffinity` (required pod anti-affinity on the hostname), `preemption` (500 nodes
//! filled with low-priority pods, 500 high-priority pods that each need a victim). The
//! bench plays the kubelet only for deleted pods (removes them at once), so preemption
//! victims go as they would on a real node.
//!
//! Prints per shape: pods/s (measured pods over the time from the first create to the
//! last binding seen), latency from create (request returned) to binding seen, p50 and
//! p99, and the scheduler's CPU time and RSS.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use support::{Cluster, Result, percentile, proc_stat, wait};

struct Shape {
    name: &'static str,
    nodes: usize,
    init_pods: usize,
    measured_pods: usize,
    /// Labels of node `i`.
    node_labels: fn(usize) -> Value,
    /// The pod of index `i`; `init` for the pods created before measuring.
    pod: fn(usize, bool) -> Value,
}

fn plain_labels(_: usize) -> Value {
    json!({})
}

fn zone_labels(i: usize) -> Value {
    json!({"topology.kubernetes.io/zone": format!("zone{}", i % 3 + 1)})
}

fn pod(name: String, cpu: &str, extra: Value) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": cpu, "memory": "500Mi"}}}]}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        if k == "labels" {
            for (lk, lv) in v.as_object().into_iter().flatten() {
                p["metadata"]["labels"][lk] = lv.clone();
            }
        } else {
            p["spec"][k] = v.clone();
        }
    }
    p
}

fn basic_pod(i: usize, init: bool) -> Value {
    pod(
        format!("{}-{i}", if init { "init" } else { "pod" }),
        "100m",
        json!({}),
    )
}

fn affinity_pod(i: usize, init: bool) -> Value {
    pod(
        format!("{}-{i}", if init { "init" } else { "pod" }),
        "100m",
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.kubernetes.io/zone",
                "operator": "In", "values": ["zone1", "zone2"]}]}]}}}}),
    )
}

fn spread_pod(i: usize, init: bool) -> Value {
    if init {
        return basic_pod(i, true);
    }
    pod(
        format!("pod-{i}"),
        "100m",
        json!({"labels": {"color": "blue"}, "topologySpreadConstraints": [{"maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"color": "blue"}}}]}),
    )
}

fn anti_affinity_pod(i: usize, init: bool) -> Value {
    pod(
        format!("{}-{i}", if init { "init" } else { "pod" }),
        "100m",
        json!({"labels": {"color": "green"}, "affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"color": "green"}}}]}}}),
    )
}

fn preemption_pod(i: usize, init: bool) -> Value {
    if init {
        pod(
            format!("low-{i}"),
            "900m",
            json!({"priorityClassName": "low"}),
        )
    } else {
        pod(
            format!("high-{i}"),
            "900m",
            json!({"priorityClassName": "high"}),
        )
    }
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "basic",
        nodes: 5000,
        init_pods: 1000,
        measured_pods: 10_000,
        node_labels: plain_labels,
        pod: basic_pod,
    },
    Shape {
        name: "affinity",
        nodes: 5000,
        init_pods: 1000,
        measured_pods: 5000,
        node_labels: zone_labels,
        pod: affinity_pod,
    },
    Shape {
        name: "spread",
        nodes: 5000,
        init_pods: 1000,
        measured_pods: 2000,
        node_labels: zone_labels,
        pod: spread_pod,
    },
    Shape {
        name: "antiaffinity",
        nodes: 5000,
        init_pods: 1000,
        measured_pods: 1000,
        node_labels: plain_labels,
        pod: anti_affinity_pod,
    },
    Shape {
        name: "preemption",
        nodes: 500,
        init_pods: 2000,
        measured_pods: 500,
        node_labels: plain_labels,
        pod: preemption_pod,
    },
];

/// When each pod was created (request returned) and seen bound.
#[derive(Default)]
struct Seen {
    created: HashMap<String, Instant>,
    bound: HashMap<String, Instant>,
}

async fn create_nodes(client: &kube::Client, shape: &Shape) -> Result {
    let api: Api<Node> = Api::all(client.clone());
    let status = json!({"status": {
        "capacity": {"cpu": "4", "memory": "32Gi", "pods": "110"},
        "allocatable": {"cpu": "4", "memory": "32Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
    }});
    let results: Vec<Result> = futures::stream::iter(0..shape.nodes)
        .map(|i| {
            let api = api.clone();
            let status = status.clone();
            async move {
                let name = format!("node-{i}");
                let mut labels = (shape.node_labels)(i);
                labels["kubernetes.io/hostname"] = json!(name);
                let node: Node =
                    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
                api.create(&PostParams::default(), &node).await?;
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn create_pods(
    api: &Api<Pod>,
    seen: &Arc<Mutex<Seen>>,
    pods: impl Iterator<Item = Value>,
) -> Result {
    let results: Vec<Result> = futures::stream::iter(pods)
        .map(|p| {
            let api = api.clone();
            let seen = seen.clone();
            async move {
                let pod: Pod = serde_json::from_value(p)?;
                let created = api.create(&PostParams::default(), &pod).await?;
                let name = created.metadata.name.unwrap_or_default();
                seen.lock().unwrap().created.insert(name, Instant::now());
                Ok(())
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn run(shape: &Shape) -> Result {
    let cluster = Cluster::start(&["--disable-controllers", "--disable-scheduler"]).await?;
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let seen = Arc::new(Mutex::new(Seen::default()));
    {
        // The watch that sees bindings, and the kubelet stand-in for deleted pods.
        let seen = seen.clone();
        let api = pods.clone();
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
            while let Some(Ok(event)) = stream.next().await {
                let (watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = event else {
                    continue;
                };
                let name = p.metadata.name.clone().unwrap_or_default();
                if p.metadata.deletion_timestamp.is_some() {
                    let api = api.clone();
                    tokio::spawn(async move {
                        let _ = api
                            .delete(&name, &DeleteParams::default().grace_period(0))
                            .await;
                    });
                    continue;
                }
                if p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
                    seen.lock()
                        .unwrap()
                        .bound
                        .entry(name)
                        .or_insert_with(Instant::now);
                }
            }
        });
    }
    if shape.name == "preemption" {
        let classes: Api<PriorityClass> = Api::all(client.clone());
        for (name, value) in [("low", 10), ("high", 1000)] {
            let pc: PriorityClass =
                serde_json::from_value(json!({"metadata": {"name": name}, "value": value}))?;
            classes.create(&PostParams::default(), &pc).await?;
        }
    }
    let started = Instant::now();
    create_nodes(&client, shape).await?;
    eprintln!(
        "{}: {} nodes created in {:.1?}",
        shape.name,
        shape.nodes,
        started.elapsed()
    );
    let scheduler = cluster.component("scheduler", &["--leader-elect=false"])?;

    create_pods(
        &pods,
        &seen,
        (0..shape.init_pods).map(|i| (shape.pod)(i, true)),
    )
    .await?;
    let init = shape.init_pods;
    wait("init pods bound", Duration::from_secs(600), || {
        seen.lock().unwrap().bound.len() >= init
    })
    .await?;
    let (cpu_before, _) = proc_stat(scheduler.pid());

    let start = Instant::now();
    create_pods(
        &pods,
        &seen,
        (0..shape.measured_pods).map(|i| (shape.pod)(i, false)),
    )
    .await?;
    let measured_names: Vec<String> = (0..shape.measured_pods)
        .map(|i| {
            (shape.pod)(i, false)["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    wait("measured pods bound", Duration::from_secs(900), || {
        let s = seen.lock().unwrap();
        measured_names.iter().all(|n| s.bound.contains_key(n))
    })
    .await?;
    let s = seen.lock().unwrap();
    let last = measured_names
        .iter()
        .filter_map(|n| s.bound.get(n))
        .max()
        .copied()
        .unwrap_or(start);
    let elapsed = last - start;
    let mut latencies: Vec<Duration> = measured_names
        .iter()
        .filter_map(|n| {
            Some(
                s.bound
                    .get(n)?
                    .saturating_duration_since(*s.created.get(n)?),
            )
        })
        .collect();
    latencies.sort();
    let (cpu, rss) = proc_stat(scheduler.pid());
    println!(
        "{:<13} nodes {:>5}  init {:>5}  measured {:>6}: {:>7.0} pods/s  latency p50 {:>8.1?} p99 {:>8.1?}  scheduler CPU {:.1} s, RSS {:.1} MB",
        shape.name,
        shape.nodes,
        shape.init_pods,
        shape.measured_pods,
        shape.measured_pods as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        cpu - cpu_before,
        rss,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    for shape in SHAPES {
        if wanted.is_empty() || wanted.iter().any(|w| w == shape.name) {
            run(shape).await?;
        }
    }
    Ok(())
}
