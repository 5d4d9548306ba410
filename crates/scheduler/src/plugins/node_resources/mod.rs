//! Resource-based plugins: NodeResourcesFit (does the pod fit, and how full
//! would the node be) and NodeResourcesBalancedAllocation (would cpu and memory
//! stay evenly used). Both score from the same (requested, allocatable) pairs.

pub mod balanced_allocation;
pub mod fit;

use serde::Deserialize;

use crate::framework::{NodeInfo, PodInfo};
use crate::resource::{CPU, EPHEMERAL_STORAGE, MEMORY, is_scalar_resource_name};

/// A resource taken into account by a scoring strategy, and its weight.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    pub name: String,
    #[serde(default)]
    pub weight: i64,
}

/// cpu and memory, weight 1 each: the upstream default for both plugins.
pub fn default_resources() -> Vec<ResourceSpec> {
    [CPU, MEMORY]
        .into_iter()
        .map(|name| ResourceSpec {
            name: name.into(),
            weight: 1,
        })
        .collect()
}

/// Turns a pod and a node into `(requested_after_placement, allocatable)` per
/// configured resource.
#[derive(Clone, Debug)]
struct AllocationCounter {
    resources: Vec<ResourceSpec>,
    /// Count actual requests (BalancedAllocation) instead of requests with the
    /// non-zero cpu/memory defaults (NodeResourcesFit scoring).
    use_requested: bool,
}

impl AllocationCounter {
    fn pod_requests(&self, pod: &PodInfo) -> Vec<i64> {
        let r = &pod.requests;
        self.resources
            .iter()
            .map(|spec| match spec.name.as_str() {
                CPU if !self.use_requested => r.non_zero_milli_cpu,
                MEMORY if !self.use_requested => r.non_zero_memory,
                name => r.requests.get(name),
            })
            .collect()
    }

    /// Pairs of `(requested, allocatable)`; `(0, 0)` marks a resource to leave
    /// out (the node lacks it, or it is an extended resource the pod does not use).
    fn node_amounts(&self, node: &NodeInfo, pod_requests: &[i64]) -> Vec<(i64, i64)> {
        let alloc = node.allocatable();
        let requested = node.requested();
        let non_zero = node.non_zero_requested();
        self.resources
            .iter()
            .zip(pod_requests)
            .map(|(spec, pod)| {
                let name = spec.name.as_str();
                if *pod == 0 && is_scalar_resource_name(name) {
                    return (0, 0);
                }
                let (used, capacity) = match name {
                    CPU if self.use_requested => (requested.milli_cpu, alloc.milli_cpu),
                    CPU => (non_zero.milli_cpu, alloc.milli_cpu),
                    MEMORY if self.use_requested => (requested.memory, alloc.memory),
                    MEMORY => (non_zero.memory, alloc.memory),
                    EPHEMERAL_STORAGE => (requested.ephemeral_storage, alloc.ephemeral_storage),
                    other => match alloc.scalar.get(other) {
                        Some(cap) => (requested.get(other), *cap),
                        None => return (0, 0),
                    },
                };
                if capacity == 0 {
                    (0, 0)
                } else {
                    (used + pod, capacity)
                }
            })
            .collect()
    }
}
