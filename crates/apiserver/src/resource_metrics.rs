//! The resource metrics API (`metrics.k8s.io/v1beta1` NodeMetrics and PodMetrics), served
//! by the apiserver itself — what metrics-server does for upstream clusters and k3s
//! ships it for — so that `kubectl top` and the HorizontalPodAutoscaler work out of the
//! box. Every `resolution` a scraper reads each Ready node's kubelet `/metrics/resource`
//! (with the apiserver's kubelet client certificate, as for logs and exec) and keeps the
//! last two samples of every node and container: CPU usage is the rate between them,
//! memory the latest working set, `window` the time between them. As metrics-server
//! does, a container first seen at least 10 s and less than `resolution` after it
//! started counts from its start (no CPU used then), so one sample is enough. Unlike
//! metrics-server, a read of a Running pod without usage yet scrapes its node then (at
//! most once a second per node): `kubectl top pod` shows a new pod as soon as that rule
//! allows instead of up to a resolution later.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use krust_api::selector::LabelSelector;
use krust_api::status::{ApiError, Target};
use krust_api::sync::Unpoisoned;
use serde_json::{Value, json};

use crate::connect::KubeletClient;
use crate::kinds::metrics::{ContainerMetrics, NodeMetrics, PodMetrics};
use crate::request::Verb;
use crate::response::{self, Response};
use crate::rest::Call;
use crate::watch_cache::{CachedObject, WatchCache};

pub const GROUP: &str = "metrics.k8s.io";
pub const VERBS: &[&str] = &["get", "list"];

/// A cumulative CPU reading and a working set at one time.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    cpu_seconds: f64,
    memory_bytes: f64,
    millis: i64,
    /// When the container started (its kubelet's `container_start_time_seconds`).
    started_millis: Option<i64>,
}

/// A fresh container's first sample is trusted only this long after its start
/// (metrics-server's `freshContainerMinMetricsResolution`: shorter windows mislead).
const FRESH_MIN_MILLIS: i64 = 10_000;

/// Usage over the window between two points.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Usage {
    pub nano_cores: u64,
    pub memory_bytes: u64,
    pub millis: i64,
    pub window_millis: i64,
}

/// The last two points of a series.
#[derive(Default)]
struct Series {
    previous: Option<Point>,
    latest: Option<Point>,
}

impl Series {
    /// Takes in a newer point; without an earlier one of the same run of the container,
    /// a fresh container's start stands in for it (see the module's comment).
    fn push(&mut self, p: Point, resolution_millis: i64) {
        if self.latest.is_some_and(|l| l.millis >= p.millis) {
            return;
        }
        let restarted = |l: &Point| p.started_millis.is_some_and(|s| s > l.millis);
        self.previous = match self.latest.replace(p) {
            Some(l) if !restarted(&l) => Some(l),
            _ => p.started_millis.and_then(|started| {
                let age = p.millis - started;
                (FRESH_MIN_MILLIS..resolution_millis)
                    .contains(&age)
                    .then_some(Point {
                        cpu_seconds: 0.0,
                        millis: started,
                        ..p
                    })
            }),
        };
    }

    /// A restarted container's counter goes back: no usage until two new points.
    fn usage(&self) -> Option<Usage> {
        let (a, b) = (self.previous?, self.latest?);
        let window = b.millis - a.millis;
        if window <= 0 || b.cpu_seconds < a.cpu_seconds {
            return None;
        }
        Some(Usage {
            nano_cores: ((b.cpu_seconds - a.cpu_seconds) / (window as f64 / 1000.0) * 1e9) as u64,
            memory_bytes: b.memory_bytes as u64,
            millis: b.millis,
            window_millis: window,
        })
    }
}

/// A container: (namespace, pod, container name).
type ContainerKey = (String, String, String);

/// The metrics API as metrics-server serves it, in process: it scrapes kubelets for the
/// nodes and pods in the watch cache and answers from what it learned.
pub struct MetricsServer {
    pub samples: Samples,
    pub kubelet: KubeletClient,
    pub cache: Arc<WatchCache>,
}

/// What the scraper learned, by node and by (namespace, pod, container).
#[derive(Default)]
pub struct Samples {
    /// How often nodes are scraped (zero: never).
    resolution: Duration,
    nodes: Mutex<HashMap<String, Series>>,
    /// Each node's containers' series (by node, so that a scrape replaces its node's
    /// containers without looking at the others').
    containers: Mutex<HashMap<String, BTreeMap<ContainerKey, Series>>>,
    /// Nodes whose kubelet did not answer: (failures in a row, rounds still skipped).
    /// A node that never answers (a simulated one, a dead one) costs a connection
    /// attempt every few minutes, not every round.
    failing: Mutex<HashMap<String, (u32, u32)>>,
    /// When each node was last scraped for a read (see [`Samples::refresh`]).
    refreshed: Mutex<HashMap<String, std::time::Instant>>,
    /// Each node's kubelet connection, kept between scrapes (see [`fetch`]).
    connections: Mutex<HashMap<String, Connection>>,
}

/// Most rounds a failing node is skipped (5 minutes at the default resolution).
const MAX_SKIPPED_ROUNDS: u32 = 20;

impl Samples {
    pub fn new(resolution: Duration) -> Samples {
        Samples {
            resolution,
            ..Samples::default()
        }
    }

    pub fn node(&self, name: &str) -> Option<Usage> {
        self.nodes.locked().get(name)?.usage()
    }

    /// Each container's usage of a pod on `node`, by container name.
    pub fn pod(&self, node: &str, namespace: &str, pod: &str) -> Vec<(String, Usage)> {
        let containers = self.containers.locked();
        let Some(on_node) = containers.get(node) else {
            return Vec::new();
        };
        let first = (namespace.to_string(), pod.to_string(), String::new());
        on_node
            .range(first..)
            .take_while(|((ns, p, _), _)| ns == namespace && p == pod)
            .filter_map(|((_, _, c), series)| Some((c.clone(), series.usage()?)))
            .collect()
    }

    /// Takes in one scrape of a node's kubelet; the node's containers that were not in
    /// it are gone and forgotten.
    fn record(&self, node: &str, text: &str) {
        self.failing.locked().remove(node);
        let scrape = parse(text);
        let resolution = self.resolution.as_millis() as i64;
        if let Some(p) = scrape.node {
            self.nodes
                .locked()
                .entry(node.to_string())
                .or_default()
                .push(p, resolution);
        }
        let mut containers = self.containers.locked();
        let on_node = containers.entry(node.to_string()).or_default();
        on_node.retain(|k, _| scrape.containers.contains_key(k));
        for (key, p) in scrape.containers {
            on_node.entry(key).or_default().push(p, resolution);
        }
    }

    /// Whether to scrape `node` this round.
    fn due(&self, node: &str) -> bool {
        match self.failing.locked().get_mut(node) {
            Some((_, skip)) if *skip > 0 => {
                *skip -= 1;
                false
            }
            _ => true,
        }
    }

    /// A failed scrape: skip the node 1, 2, 4, ... rounds.
    fn failed(&self, node: &str) {
        let mut failing = self.failing.locked();
        let (failures, skip) = failing.entry(node.to_string()).or_default();
        *failures += 1;
        *skip = (1u32 << (*failures - 1).min(5)).min(MAX_SKIPPED_ROUNDS);
    }

    /// Whether a read may scrape `node` now: scraping is on, the node answered its last
    /// scrape, and no read scraped it in the last second.
    fn may_refresh(&self, node: &str) -> bool {
        if self.resolution.is_zero() || self.failing.locked().contains_key(node) {
            return false;
        }
        let now = std::time::Instant::now();
        let mut refreshed = self.refreshed.locked();
        if refreshed
            .get(node)
            .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(1))
        {
            return false;
        }
        refreshed.insert(node.to_string(), now);
        true
    }

    /// Forgets nodes that are gone.
    fn keep_nodes(&self, live: &HashSet<&str>) {
        self.connections
            .locked()
            .retain(|n, _| live.contains(n.as_str()));
        self.refreshed
            .locked()
            .retain(|n, _| live.contains(n.as_str()));
        self.failing
            .locked()
            .retain(|n, _| live.contains(n.as_str()));
        self.nodes.locked().retain(|n, _| live.contains(n.as_str()));
        self.containers
            .locked()
            .retain(|n, _| live.contains(n.as_str()));
    }
}

/// One parsed `/metrics/resource` answer.
#[derive(Default)]
struct Scrape {
    node: Option<Point>,
    containers: HashMap<ContainerKey, Point>,
}

/// Reads the four series krust uses from the Prometheus text format.
fn parse(text: &str) -> Scrape {
    let mut scrape = Scrape::default();
    let mut node_cpu = None;
    let mut node_memory = None;
    let mut cpu: HashMap<ContainerKey, (f64, i64)> = HashMap::new();
    let mut memory: HashMap<ContainerKey, f64> = HashMap::new();
    let mut started: HashMap<ContainerKey, f64> = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name_labels, rest) = match line.find('}') {
            Some(end) => (&line[..=end], line[end + 1..].trim()),
            None => match line.split_once(' ') {
                Some((n, r)) => (n, r.trim()),
                None => continue,
            },
        };
        let mut fields = rest.split_whitespace();
        let Some(value) = fields.next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let millis = fields.next().and_then(|t| t.parse().ok()).unwrap_or(0);
        let (name, labels) = match name_labels.split_once('{') {
            Some((n, l)) => (n, labels_of(l.trim_end_matches('}'))),
            None => (name_labels, HashMap::new()),
        };
        let key = || {
            let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
            (get("namespace"), get("pod"), get("container"))
        };
        match name {
            "node_cpu_usage_seconds_total" => node_cpu = Some((value, millis)),
            "node_memory_working_set_bytes" => node_memory = Some(value),
            "container_cpu_usage_seconds_total" => {
                cpu.insert(key(), (value, millis));
            }
            "container_memory_working_set_bytes" => {
                memory.insert(key(), value);
            }
            "container_start_time_seconds" => {
                started.insert(key(), value);
            }
            _ => {}
        }
    }
    if let (Some((cpu_seconds, millis)), Some(memory_bytes)) = (node_cpu, node_memory) {
        scrape.node = Some(Point {
            cpu_seconds,
            memory_bytes,
            millis,
            started_millis: None,
        });
    }
    for (key, (cpu_seconds, millis)) in cpu {
        let memory_bytes = memory.get(&key).copied().unwrap_or(0.0);
        let started_millis = started.get(&key).map(|s| (s * 1000.0) as i64);
        scrape.containers.insert(
            key,
            Point {
                cpu_seconds,
                memory_bytes,
                millis,
                started_millis,
            },
        );
    }
    scrape
}

/// `a="x",b="y"` (values without escaped quotes, as the kubelet writes them).
fn labels_of(text: &str) -> HashMap<String, String> {
    text.split("\",")
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.trim().to_string(), v.trim_matches('"').to_string()))
        })
        .collect()
}

/// Scrapes every Ready node's kubelet each `resolution`, forever.
pub async fn scrape(server: Arc<MetricsServer>, resolution: Duration) {
    let mut tick = tokio::time::interval(resolution);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(nodes) = server.cache.cache("/registry/minions/") else {
            continue;
        };
        let nodes: Vec<Value> = nodes
            .list("/registry/minions/")
            .0
            .iter()
            .map(|n| n.value())
            .collect();
        let names: Vec<String> = nodes
            .iter()
            .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
            .collect();
        server
            .samples
            .keep_nodes(&names.iter().map(String::as_str).collect());
        let scrapes = nodes
            .iter()
            .filter(|n| crate::json::ready(n))
            .filter(|n| {
                n["metadata"]["name"]
                    .as_str()
                    .is_some_and(|name| server.samples.due(name))
            })
            .map(|node| scrape_node(&server, node));
        futures::future::join_all(scrapes).await;
    }
}

/// Scrapes one node's kubelet into the samples.
async fn scrape_node(server: &MetricsServer, node: &Value) {
    let Some(name) = node["metadata"]["name"].as_str() else {
        return;
    };
    let Some((host, port)) = crate::connect::kubelet_address(node) else {
        return;
    };
    match fetch(server, name, &host, port).await {
        Ok(text) => server.samples.record(name, &text),
        Err(err) => {
            tracing::debug!(node = %name, %err, "scraping the kubelet failed");
            server.samples.failed(name);
        }
    }
}

/// Before a read answers: scrapes the Ready ones of `names` (the nodes of Running pods
/// without usage) that may be scraped for a read now, waiting at most a second.
/// Whether any node was scraped.
async fn refresh(server: &MetricsServer, names: &std::collections::BTreeSet<&str>) -> bool {
    let Some(nodes) = server.cache.cache("/registry/minions/") else {
        return false;
    };
    let wanted: Vec<Value> = names
        .iter()
        .filter_map(|n| nodes.get(&format!("/registry/minions/{n}")))
        .map(|n| n.value())
        .filter(crate::json::ready)
        .filter(|n| {
            n["metadata"]["name"]
                .as_str()
                .is_some_and(|name| server.samples.may_refresh(name))
        })
        .collect();
    if wanted.is_empty() {
        return false;
    }
    let scrapes = wanted.iter().map(|node| scrape_node(server, node));
    let _ = tokio::time::timeout(Duration::from_secs(1), futures::future::join_all(scrapes)).await;
    true
}

/// GET `https://host:port/metrics/resource` with the kubelet client certificate, over
/// the node's kept connection when it has one (as metrics-server's HTTP client keeps
/// them: a TLS handshake per node and round would cost more than the scrape).
async fn fetch(
    server: &MetricsServer,
    node: &str,
    host: &str,
    port: u16,
) -> anyhow::Result<String> {
    const TIMEOUT: Duration = Duration::from_secs(5);
    let work = async {
        let kept = server.samples.connections.locked().remove(node);
        let reusable = kept.filter(|k| k.host == host && k.port == port && !k.sender.is_closed());
        let reused = reusable.is_some();
        let mut kept = match reusable {
            Some(kept) => kept,
            None => dial(server, host, port).await?,
        };
        let text = match get_metrics(&mut kept).await {
            Ok(text) => text,
            // The kubelet may close a kept connection at any moment: one more try on a
            // new one, as Go's HTTP client retries an idempotent request.
            Err(_) if reused => {
                kept = dial(server, host, port).await?;
                get_metrics(&mut kept).await?
            }
            Err(err) => return Err(err),
        };
        server
            .samples
            .connections
            .locked()
            .insert(node.to_string(), kept);
        Ok(text)
    };
    tokio::time::timeout(TIMEOUT, work).await?
}

/// An open HTTP/1.1 connection to a kubelet.
struct Connection {
    host: String,
    port: u16,
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

async fn dial(server: &MetricsServer, host: &str, port: u16) -> anyhow::Result<Connection> {
    let tls = server.kubelet.dial(host, port).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(Connection {
        host: host.to_string(),
        port,
        sender,
    })
}

async fn get_metrics(c: &mut Connection) -> anyhow::Result<String> {
    c.sender.ready().await?;
    let req = http::Request::get("/metrics/resource")
        .header(http::header::HOST, format!("{}:{}", c.host, c.port))
        .body(Empty::<Bytes>::new())?;
    let resp = c.sender.send_request(req).await?;
    anyhow::ensure!(
        resp.status() == StatusCode::OK,
        "answered {}",
        resp.status()
    );
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn cpu(nano_cores: u64) -> Quantity {
    Quantity(format!("{nano_cores}n"))
}

fn memory(bytes: u64) -> Quantity {
    Quantity(if bytes.is_multiple_of(1024) {
        format!("{}Ki", bytes / 1024)
    } else {
        bytes.to_string()
    })
}

fn window(u: &Usage) -> String {
    format!("{}s", u.window_millis as f64 / 1000.0)
}

fn time(millis: i64) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::from_millisecond(millis)
        .ok()
        .map(Time)
}

fn meta(obj: &Value) -> ObjectMeta {
    ObjectMeta {
        name: obj["metadata"]["name"].as_str().map(String::from),
        namespace: obj["metadata"]["namespace"].as_str().map(String::from),
        labels: serde_json::from_value(obj["metadata"]["labels"].clone()).ok(),
        creation_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        ..Default::default()
    }
}

fn node_metrics(server: &MetricsServer, node: &Value) -> Option<NodeMetrics> {
    let u = server.samples.node(node["metadata"]["name"].as_str()?)?;
    Some(NodeMetrics {
        metadata: meta(node),
        timestamp: time(u.millis),
        window: window(&u),
        usage: [
            ("cpu".into(), cpu(u.nano_cores)),
            ("memory".into(), memory(u.memory_bytes)),
        ]
        .into(),
    })
}

fn pod_metrics(server: &MetricsServer, pod: &Value) -> Option<PodMetrics> {
    if pod["status"]["phase"] != "Running" {
        return None;
    }
    let usage = server.samples.pod(
        pod["spec"]["nodeName"].as_str()?,
        pod["metadata"]["namespace"].as_str()?,
        pod["metadata"]["name"].as_str()?,
    );
    let first = usage.first()?.1;
    Some(PodMetrics {
        metadata: meta(pod),
        timestamp: time(first.millis),
        window: window(&first),
        containers: usage
            .into_iter()
            .map(|(name, u)| ContainerMetrics {
                name,
                usage: [
                    ("cpu".into(), cpu(u.nano_cores)),
                    ("memory".into(), memory(u.memory_bytes)),
                ]
                .into(),
            })
            .collect(),
    })
}

/// GET and LIST of NodeMetrics and PodMetrics (`labelSelector` honoured), from the
/// nodes and pods in the watch cache and the scraped samples.
pub async fn serve(server: &MetricsServer, call: &mut Call<'_>) -> Result<Response, ApiError> {
    let verb = call.read_only_verb()?;
    let selector = LabelSelector::parse(call.query.get("labelSelector").unwrap_or_default())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let nodes = call.kind.info.plural == "nodes";
    let source = krust_api::registry::find("", "v1", if nodes { "nodes" } else { "pods" })
        .expect("nodes and pods are served");
    let cache = call
        .scope
        .cache
        .cache(&source.storage_prefix())
        .ok_or_else(|| ApiError::internal("no cache of nodes or pods"))?;
    let (kind, single) = if nodes {
        ("NodeMetrics", "nodemetrics")
    } else {
        ("PodMetrics", "podmetrics")
    };
    let item = |obj: &Value| -> Option<Value> {
        if nodes {
            serde_json::to_value(node_metrics(server, obj)?).ok()
        } else {
            serde_json::to_value(pod_metrics(server, obj)?).ok()
        }
    };
    let namespace = call.namespace();
    let entries: Vec<Arc<CachedObject>> = if verb == Verb::Get {
        cache
            .get(&source.storage_key(namespace, call.name()))
            .into_iter()
            .collect()
    } else {
        let (mut all, _) = cache.list(&source.storage_prefix_in(namespace));
        all.retain(|o| selector.matches(&o.labels));
        all
    };
    // One object decoded at a time: a list of 100,000 pods decoded at once took over
    // a gigabyte for a moment, and seconds.
    let mut items: Vec<Option<Value>> = Vec::with_capacity(entries.len());
    let mut waiting: Vec<(usize, String)> = Vec::new();
    for entry in &entries {
        let obj = entry.value();
        let found = item(&obj);
        // Running pods without usage yet: their nodes are scraped now, if they may be.
        if !nodes && found.is_none() && obj["status"]["phase"] == "Running" {
            let node = obj["spec"]["nodeName"].as_str().unwrap_or_default();
            waiting.push((items.len(), node.to_string()));
        }
        items.push(found);
    }
    let waiting_nodes = waiting.iter().map(|(_, node)| node.as_str()).collect();
    if !waiting.is_empty() && refresh(server, &waiting_nodes).await {
        for (i, _) in &waiting {
            items[*i] = item(&entries[*i].value());
        }
    }
    if verb == Verb::Get {
        return match items.into_iter().flatten().next() {
            Some(mut found) => {
                found["kind"] = json!(kind);
                found["apiVersion"] = json!("metrics.k8s.io/v1beta1");
                Ok(response::json(StatusCode::OK, &found))
            }
            None => Err(ApiError::not_found(Target {
                group: GROUP,
                resource: single,
                name: call.name(),
            })),
        };
    }
    let items: Vec<Value> = items.into_iter().flatten().collect();
    Ok(response::json(
        StatusCode::OK,
        &json!({"kind": format!("{kind}List"), "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": {}, "items": items}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE_1: &str = "# HELP container_cpu_usage_seconds_total x\n\
        container_cpu_usage_seconds_total{container=\"c\",namespace=\"default\",pod=\"web\"} 1.5 10000\n\
        container_memory_working_set_bytes{container=\"c\",namespace=\"default\",pod=\"web\"} 4096 10000\n\
        node_cpu_usage_seconds_total 100 10000\n\
        node_memory_working_set_bytes 2048 10000\n";
    const SCRAPE_2: &str = "container_cpu_usage_seconds_total{container=\"c\",namespace=\"default\",pod=\"web\"} 2.0 12000\n\
        container_memory_working_set_bytes{container=\"c\",namespace=\"default\",pod=\"web\"} 8192 12000\n\
        node_cpu_usage_seconds_total 103 12000\n\
        node_memory_working_set_bytes 4096 12000\n";

    #[test]
    fn usage_is_the_rate_between_the_last_two_scrapes() {
        let samples = Samples::default();
        samples.record("n1", SCRAPE_1);
        assert_eq!(samples.node("n1"), None, "one point is no rate");
        samples.record("n1", SCRAPE_2);
        let node = samples.node("n1").unwrap();
        assert_eq!(node.nano_cores, 1_500_000_000, "3 core-seconds in 2 s");
        assert_eq!((node.memory_bytes, node.window_millis), (4096, 2000));
        let pod = samples.pod("n1", "default", "web");
        assert_eq!(pod.len(), 1);
        assert_eq!(pod[0].0, "c");
        assert_eq!(pod[0].1.nano_cores, 250_000_000);
        assert_eq!(memory(pod[0].1.memory_bytes), Quantity("8Ki".into()));
        // A container that is gone from the node's scrape is forgotten.
        samples.record(
            "n1",
            "node_cpu_usage_seconds_total 104 13000\nnode_memory_working_set_bytes 1 13000\n",
        );
        assert!(samples.pod("n1", "default", "web").is_empty());
        samples.keep_nodes(&HashSet::new());
        assert_eq!(samples.node("n1"), None);
    }

    /// One scrape at 100 s of container `c` started at `started` s, 3 core-seconds used.
    fn fresh_scrape(started: f64) -> String {
        format!(
            "container_cpu_usage_seconds_total{{container=\"c\",namespace=\"default\",pod=\"web\"}} 3 100000\n\
             container_memory_working_set_bytes{{container=\"c\",namespace=\"default\",pod=\"web\"}} 4096 100000\n\
             container_start_time_seconds{{container=\"c\",namespace=\"default\",pod=\"web\"}} {started} 100000\n"
        )
    }

    #[test]
    fn a_fresh_container_counts_from_its_start() {
        let usage = |started: f64| {
            let samples = Samples::new(Duration::from_secs(15));
            samples.record("n1", &fresh_scrape(started));
            samples.pod("n1", "default", "web").first().map(|(_, u)| *u)
        };
        let u = usage(88.0).expect("12 s old: one sample is enough");
        assert_eq!((u.nano_cores, u.window_millis), (250_000_000, 12_000));
        assert_eq!(usage(95.0), None, "5 s old: too short a window");
        assert_eq!(usage(70.0), None, "30 s old: should have been seen before");

        // A restart between two scrapes: the old run's point is not the previous one.
        let samples = Samples::new(Duration::from_secs(15));
        samples.record("n1", &fresh_scrape(50.0).replace(" 100000", " 60000"));
        samples.record("n1", &fresh_scrape(89.0));
        let (_, u) = samples.pod("n1", "default", "web")[0];
        assert_eq!(u.window_millis, 11_000, "counted from the new start");
    }

    #[test]
    fn a_node_that_does_not_answer_is_tried_less_and_less_often() {
        let samples = Samples::default();
        let rounds = |n: usize| (0..n).filter(|_| samples.due("sim-0")).count();
        assert_eq!(rounds(3), 3);
        samples.failed("sim-0");
        assert_eq!(rounds(2), 1, "one round skipped");
        samples.failed("sim-0");
        samples.failed("sim-0");
        assert_eq!(rounds(5), 1, "four rounds skipped after the third failure");
        for _ in 0..10 {
            samples.failed("sim-0");
        }
        assert_eq!(rounds(21), 1, "at most twenty");
        samples.record("sim-0", "");
        assert_eq!(rounds(2), 2, "an answer resets it");
    }
}
