//! `/metrics/resource`: the node's and its containers' CPU and memory, in the
//! Prometheus text format and with the metric names of upstream's kubelet, which is
//! what a metrics server scrapes. Containers' figures come from the runtime
//! (CRI `ListContainerStats`: cumulative CPU time, working set; `ListContainers`: when
//! each was created, which upstream's CRI stats report as its start time); the node's
//! from `/proc/stat` and `/proc/meminfo`.

use std::collections::BTreeMap;
use std::fmt::Write;

use krust_api::status::ApiError;
use krust_cri::Runtime;
use krust_cri::api::{ContainerStatsFilter, ListContainerStatsRequest, ListContainersRequest};

use crate::pods::spec::{CONTAINER_NAME, POD_NAME, POD_NAMESPACE};

/// One container's sample.
struct Sample {
    cpu_seconds: f64,
    memory_bytes: u64,
    millis: i64,
    /// When the container started, in seconds since the epoch (none for the node).
    started: Option<f64>,
}

pub async fn serve(runtime: &Runtime) -> Result<String, ApiError> {
    let mut cri = runtime.runtime.clone();
    let stats = cri
        .list_container_stats(ListContainerStatsRequest {
            filter: Some(ContainerStatsFilter::default()),
        })
        .await
        .map_err(|e| ApiError::internal(format!("listing container stats: {}", e.message())))?
        .into_inner()
        .stats;
    let created: std::collections::HashMap<String, i64> = cri
        .list_containers(ListContainersRequest { filter: None })
        .await
        .map_err(|e| ApiError::internal(format!("listing containers: {}", e.message())))?
        .into_inner()
        .containers
        .into_iter()
        .map(|c| (c.id, c.created_at))
        .collect();
    let mut containers: BTreeMap<(String, String, String), Sample> = BTreeMap::new();
    for s in stats {
        let Some(attributes) = s.attributes else {
            continue;
        };
        let label = |k: &str| attributes.labels.get(k).cloned().unwrap_or_default();
        let key = (label(POD_NAMESPACE), label(POD_NAME), label(CONTAINER_NAME));
        let (Some(cpu), Some(memory)) = (s.cpu, s.memory) else {
            continue;
        };
        let Some(used) = cpu.usage_core_nano_seconds else {
            continue;
        };
        containers.insert(
            key,
            Sample {
                cpu_seconds: used.value as f64 / 1e9,
                memory_bytes: memory.working_set_bytes.map_or(0, |w| w.value),
                millis: cpu.timestamp / 1_000_000,
                started: created.get(&attributes.id).map(|&ns| ns as f64 / 1e9),
            },
        );
    }
    let node = node_sample().unwrap_or(Sample {
        cpu_seconds: 0.0,
        memory_bytes: 0,
        millis: now_millis(),
        started: None,
    });
    Ok(render(&node, &containers))
}

/// The families krust writes: (name, type, help, node's value or per container).
type Value = fn(&Sample) -> Option<f64>;
const FAMILIES: &[(&str, &str, &str, bool, Value)] = &[
    (
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        false,
        |s| Some(s.cpu_seconds),
    ),
    (
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        false,
        |s| Some(s.memory_bytes as f64),
    ),
    (
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        false,
        |s| s.started,
    ),
    (
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        true,
        |s| Some(s.cpu_seconds),
    ),
    (
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        true,
        |s| Some(s.memory_bytes as f64),
    ),
];

fn render(node: &Sample, containers: &BTreeMap<(String, String, String), Sample>) -> String {
    let mut text = String::new();
    for (name, kind, help, of_node, value) in FAMILIES {
        let _ = writeln!(text, "# HELP {name} [STABLE] {help}\n# TYPE {name} {kind}");
        if *of_node {
            if let Some(v) = value(node) {
                let _ = writeln!(text, "{name} {v} {}", node.millis);
            }
            continue;
        }
        for ((ns, pod, container), s) in containers {
            let Some(v) = value(s) else { continue };
            let _ = writeln!(
                text,
                "{name}{{container=\"{container}\",namespace=\"{ns}\",pod=\"{pod}\"}} {v} {}",
                s.millis
            );
        }
    }
    text.push_str("# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE resource_scrape_error gauge\nresource_scrape_error 0\n");
    text
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The node's busy CPU time (all but idle and iowait, in USER_HZ = 1/100 s) and its
/// memory in use (total less available).
fn node_sample() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let busy: u64 = ticks
        .iter()
        .enumerate()
        .filter(|(i, _)| !matches!(i, 3 | 4 | 8 | 9))
        .map(|(_, t)| t)
        .sum();
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some(Sample {
        cpu_seconds: busy as f64 / 100.0,
        memory_bytes: field("MemTotal:")?.saturating_sub(field("MemAvailable:")?),
        millis: now_millis(),
        started: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_render_with_upstreams_metric_names() {
        let node = Sample {
            cpu_seconds: 12.5,
            memory_bytes: 1024,
            millis: 1000,
            started: None,
        };
        let mut containers = BTreeMap::new();
        containers.insert(
            ("default".into(), "web".into(), "c".into()),
            Sample {
                cpu_seconds: 0.25,
                memory_bytes: 4096,
                millis: 900,
                started: Some(1.5),
            },
        );
        let text = render(&node, &containers);
        assert!(text.contains(
            "container_cpu_usage_seconds_total{container=\"c\",namespace=\"default\",pod=\"web\"} 0.25 900"
        ));
        assert!(text.contains(
            "container_memory_working_set_bytes{container=\"c\",namespace=\"default\",pod=\"web\"} 4096 900"
        ));
        assert!(text.contains(
            "container_start_time_seconds{container=\"c\",namespace=\"default\",pod=\"web\"} 1.5 900"
        ));
        assert!(text.contains("node_cpu_usage_seconds_total 12.5 1000"));
        assert!(text.contains("node_memory_working_set_bytes 1024 1000"));
        assert!(node_sample().is_some_and(|s| s.memory_bytes > 0 && s.cpu_seconds > 0.0));
    }
}
