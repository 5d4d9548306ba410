//! Resource quantities and pod requests, counted the way kube-scheduler counts them.
//!
//! The scheduler never looks at usage, only at *requests*: the sum over regular
//! containers and restartable ("sidecar") init containers, raised to the largest
//! one-shot init container while it runs, plus the pod overhead. This module owns
//! that arithmetic so that `NodeInfo` aggregates and plugin checks agree.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
pub use krust_api::quantity::{QuantityError, scaled_value};

/// CPU, in millicores, assumed for a container that requests none, when scoring.
/// Without it, best-effort pods would all look free and pile onto one node.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// Memory, in bytes, assumed for a container that requests none, when scoring.
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
pub const PODS: &str = "pods";

/// Reads a quantity the apiserver already validated; a malformed one counts as
/// zero (logged) rather than failing every scheduling cycle that touches it.
fn quantity_or_zero(name: &str, q: &Quantity, scale: i32) -> i64 {
    scaled_value(&q.0, scale).unwrap_or_else(|e| {
        tracing::warn!(resource = name, error = %e, "ignoring unreadable quantity");
        0
    })
}

/// Whether a resource name is tracked in [`Resource::scalar`]: extended resources
/// (`example.com/gpu`), prefixed native ones, hugepages and attachable volumes.
pub fn is_scalar_resource_name(name: &str) -> bool {
    (name.contains('/') && !name.starts_with("requests."))
        || name.starts_with("hugepages-")
        || name.starts_with("attachable-volume-")
}

/// Whether a resource is an extended resource (outside the `kubernetes.io` domain).
pub fn is_extended_resource_name(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// An amount of each schedulable resource: what a node offers, or a pod asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resource {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    /// Only meaningful for node allocatable (the `pods` resource).
    pub allowed_pod_number: i64,
    pub scalar: BTreeMap<String, i64>,
}

impl Resource {
    /// Reads a resource list (requests, overhead or node allocatable).
    pub fn from_list(list: &BTreeMap<String, Quantity>) -> Self {
        let mut r = Resource::default();
        for (name, q) in list {
            match name.as_str() {
                CPU => r.milli_cpu = quantity_or_zero(name, q, 3),
                MEMORY => r.memory = quantity_or_zero(name, q, 0),
                EPHEMERAL_STORAGE => r.ephemeral_storage = quantity_or_zero(name, q, 0),
                PODS => r.allowed_pod_number = quantity_or_zero(name, q, 0),
                other if is_scalar_resource_name(other) => {
                    r.scalar
                        .insert(other.to_string(), quantity_or_zero(name, q, 0));
                }
                _ => {}
            }
        }
        r
    }

    /// The amount of one named resource (cpu in millicores, others in units).
    pub fn get(&self, name: &str) -> i64 {
        match name {
            CPU => self.milli_cpu,
            MEMORY => self.memory,
            EPHEMERAL_STORAGE => self.ephemeral_storage,
            PODS => self.allowed_pod_number,
            other => self.scalar.get(other).copied().unwrap_or(0),
        }
    }

    pub fn add(&mut self, other: &Resource) {
        self.combine(other, |a, b| a + b);
    }

    pub fn subtract(&mut self, other: &Resource) {
        self.combine(other, |a, b| a - b);
    }

    /// Raises each resource to at least the amount in `other`.
    pub fn set_max(&mut self, other: &Resource) {
        self.combine(other, i64::max);
    }

    fn combine(&mut self, other: &Resource, f: impl Fn(i64, i64) -> i64) {
        self.milli_cpu = f(self.milli_cpu, other.milli_cpu);
        self.memory = f(self.memory, other.memory);
        self.ephemeral_storage = f(self.ephemeral_storage, other.ephemeral_storage);
        self.allowed_pod_number = f(self.allowed_pod_number, other.allowed_pod_number);
        for (name, v) in &other.scalar {
            let entry = self.scalar.entry(name.clone()).or_insert(0);
            *entry = f(*entry, *v);
        }
    }

    /// True when the pod asks for nothing the scheduler accounts for.
    pub fn is_empty_request(&self) -> bool {
        self.milli_cpu == 0
            && self.memory == 0
            && self.ephemeral_storage == 0
            && self.scalar.values().all(|v| *v == 0)
    }
}

/// What a pod occupies on a node, computed once per pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRequests {
    /// Effective requests (used by filters and as the node's committed amount).
    pub requests: Resource,
    /// CPU with [`DEFAULT_MILLI_CPU_REQUEST`] substituted for containers that set none.
    pub non_zero_milli_cpu: i64,
    /// Memory with [`DEFAULT_MEMORY_REQUEST`] substituted for containers that set none.
    pub non_zero_memory: i64,
}

impl PodRequests {
    pub fn of(spec: &PodSpec) -> Self {
        let read = |c: &Container| {
            let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
            let actual = requests.map(Resource::from_list).unwrap_or_default();
            let mut defaulted = actual.clone();
            if !requests.is_some_and(|r| r.contains_key(CPU)) {
                defaulted.milli_cpu = DEFAULT_MILLI_CPU_REQUEST;
            }
            if !requests.is_some_and(|r| r.contains_key(MEMORY)) {
                defaulted.memory = DEFAULT_MEMORY_REQUEST;
            }
            (actual, defaulted)
        };
        let init: Vec<_> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| (read(c), c.restart_policy.as_deref() == Some("Always")))
            .collect();
        let regular: Vec<_> = spec.containers.iter().map(read).collect();
        let overhead = spec
            .overhead
            .as_ref()
            .map(Resource::from_list)
            .unwrap_or_default();
        let total = |pick: fn(&(Resource, Resource)) -> &Resource| {
            let init: Vec<_> = init
                .iter()
                .map(|(r, sidecar)| (pick(r), *sidecar))
                .collect();
            let regular: Vec<_> = regular.iter().map(pick).collect();
            combine_containers(&init, &regular, &overhead)
        };
        let requests = total(|(actual, _)| actual);
        let non_zero = total(|(_, defaulted)| defaulted);
        PodRequests {
            requests,
            non_zero_milli_cpu: non_zero.milli_cpu,
            non_zero_memory: non_zero.memory,
        }
    }
}

/// Applies the pod-level request rule: regular containers and sidecars run
/// together, and each one-shot init container runs alongside the sidecars started
/// before it, so the pod needs the larger of the two peaks, plus overhead.
fn combine_containers(
    init: &[(&Resource, bool)],
    regular: &[&Resource],
    overhead: &Resource,
) -> Resource {
    let mut sum = Resource::default();
    for r in regular {
        sum.add(r);
    }
    let mut sidecars = Resource::default();
    let mut init_peak = Resource::default();
    for (r, is_sidecar) in init {
        if *is_sidecar {
            sum.add(r);
            sidecars.add(r);
            init_peak.set_max(&sidecars);
        } else {
            let mut running = (*r).clone();
            running.add(&sidecars);
            init_peak.set_max(&running);
        }
    }
    sum.set_max(&init_peak);
    sum.add(overhead);
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{container, pod};

    #[test]
    fn scalar_names() {
        assert!(is_scalar_resource_name("example.com/gpu"));
        assert!(is_scalar_resource_name("hugepages-2Mi"));
        assert!(!is_scalar_resource_name("cpu"));
        assert!(!is_scalar_resource_name("requests.example.com/gpu"));
        assert!(is_extended_resource_name("example.com/gpu"));
        assert!(!is_extended_resource_name("kubernetes.io/foo"));
    }

    #[test]
    fn init_containers_take_the_max_and_sidecars_add() {
        let mut p = pod("p")
            .container(container("a").req("cpu", "1").req("memory", "1Gi"))
            .container(container("b").req("cpu", "500m"))
            .init_container(container("init").req("cpu", "2").req("memory", "512Mi"))
            .build();
        let r = PodRequests::of(p.spec.as_ref().unwrap());
        assert_eq!(r.requests.milli_cpu, 2000);
        assert_eq!(r.requests.memory, 1024 * 1024 * 1024);
        // b has no memory request: the non-zero default applies to it alone.
        assert_eq!(
            r.non_zero_memory,
            1024 * 1024 * 1024 + DEFAULT_MEMORY_REQUEST
        );

        // A sidecar started before the init container runs beside it and stays.
        let spec = p.spec.as_mut().unwrap();
        let mut sidecar = container("side").req("cpu", "300m").build();
        sidecar.restart_policy = Some("Always".into());
        spec.init_containers.as_mut().unwrap().insert(0, sidecar);
        spec.overhead = Some([("cpu".to_string(), Quantity("50m".into()))].into());
        let r = PodRequests::of(spec);
        // max(1500 + 300, 2000 + 300) + 50 overhead
        assert_eq!(r.requests.milli_cpu, 2350);
    }

    #[test]
    fn missing_requests_get_non_zero_defaults_but_explicit_zero_stays() {
        let p = pod("p")
            .container(container("a"))
            .container(container("b").req("cpu", "0"))
            .build();
        let r = PodRequests::of(p.spec.as_ref().unwrap());
        assert_eq!(r.requests.milli_cpu, 0);
        assert_eq!(r.non_zero_milli_cpu, DEFAULT_MILLI_CPU_REQUEST);
        assert_eq!(r.non_zero_memory, 2 * DEFAULT_MEMORY_REQUEST);
    }
}
