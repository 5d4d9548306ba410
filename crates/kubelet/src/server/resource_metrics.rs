//! `/metrics/resource` (see [`krust_api::resource_metrics`]): the node's and its
//! containers' CPU and memory. Containers' figures come from the runtime
//! (CRI `ListContainerStats`: cumulative CPU time, working set; `ListContainers`: when
//! each was created, which upstream's CRI stats report as its start time); the node's
//! from `/proc/stat` and `/proc/meminfo`.

use std::collections::BTreeMap;

use krust_api::resource_metrics::{Sample, now_millis, render};
use krust_api::status::ApiError;
use krust_cri::Runtime;
use krust_cri::api::{ContainerStatsFilter, ListContainerStatsRequest, ListContainersRequest};

use crate::pods::spec::{CONTAINER_NAME, POD_NAME, POD_NAMESPACE};

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
    #[test]
    fn the_node_sample_reads_proc() {
        assert!(super::node_sample().is_some_and(|s| s.memory_bytes > 0 && s.cpu_seconds > 0.0));
    }
}
