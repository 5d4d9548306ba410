//! The text a kubelet's `/metrics/resource` serves: the node's and its containers' CPU
//! and memory in the Prometheus text format, with the metric names of upstream's
//! kubelet, which is what a metrics server scrapes. The kubelet fills it from the
//! runtime, `krust sim` from its simulated usage.

use std::collections::BTreeMap;
use std::fmt::Write;

/// One reading of the node or of a container.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Cumulative CPU time, in core-seconds.
    pub cpu_seconds: f64,
    /// The working set.
    pub memory_bytes: u64,
    /// When it was read, in milliseconds since the epoch.
    pub millis: i64,
    /// When the container started, in seconds since the epoch (none for the node).
    pub started: Option<f64>,
}

/// A container: (namespace, pod, container name).
pub type ContainerKey = (String, String, String);

/// The families written: (name, type, help, node's value or per container).
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

/// The whole answer for `node` and `containers`.
pub fn render(node: &Sample, containers: &BTreeMap<ContainerKey, Sample>) -> String {
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

/// Now, in milliseconds since the epoch.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
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
    }
}
