//! NodeResourcesFit: the pod's requests must fit in the node's allocatable minus
//! what the pods already there request, and the pod count must stay within the
//! node's `pods` allocatable. Scoring prefers emptier nodes (LeastAllocated, the
//! default), fuller nodes (MostAllocated, for bin-packing) or follows a
//! utilization→score curve (RequestedToCapacityRatio).

use std::collections::BTreeSet;

use serde::Deserialize;

use super::{AllocationCounter, ResourceSpec, default_resources};
use crate::framework::{
    CycleState, FilterPlugin, MAX_NODE_SCORE, NodeInfo, Plugin, PodInfo, PreScorePlugin,
    ScorePlugin, Snapshot, Status,
};
use crate::resource::is_extended_resource_name;

pub const NAME: &str = "NodeResourcesFit";

/// Utilization in percent at which RequestedToCapacityRatio shapes end.
const MAX_UTILIZATION: i64 = 100;
/// Shape scores are given in 0..=10 and scaled to the node score range.
const MAX_CUSTOM_PRIORITY_SCORE: i64 = 10;

/// `NodeResourcesFitArgs`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FitArgs {
    #[serde(default)]
    pub ignored_resources: Vec<String>,
    #[serde(default)]
    pub ignored_resource_groups: Vec<String>,
    #[serde(default)]
    pub scoring_strategy: Option<ScoringStrategyArgs>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScoringStrategyArgs {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub resources: Vec<ResourceSpec>,
    #[serde(default)]
    pub requested_to_capacity_ratio: Option<RequestedToCapacityRatioArgs>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedToCapacityRatioArgs {
    pub shape: Vec<UtilizationShapePoint>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UtilizationShapePoint {
    pub utilization: i32,
    pub score: i32,
}

/// How NodeResourcesFit turns utilization into a score.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScoringStrategy {
    LeastAllocated,
    MostAllocated,
    /// `(utilization %, score 0..=100)` points of a piecewise-linear function.
    RequestedToCapacityRatio(Vec<(i64, i64)>),
}

pub struct Fit {
    ignored_resources: BTreeSet<String>,
    ignored_groups: BTreeSet<String>,
    strategy: ScoringStrategy,
    counter: AllocationCounter,
}

#[derive(Clone)]
struct PreScoreState {
    pod_requests: Vec<i64>,
}

impl Fit {
    pub fn new(args: FitArgs) -> Result<Self, String> {
        let strategy_args = args.scoring_strategy.unwrap_or_default();
        let mut resources = if strategy_args.resources.is_empty() {
            default_resources()
        } else {
            strategy_args.resources
        };
        for r in &mut resources {
            if r.weight < 0 || r.weight > 100 {
                return Err(format!(
                    "resource {:?} weight {} is not within [1, 100]",
                    r.name, r.weight
                ));
            }
            r.weight = r.weight.max(1);
        }
        let strategy = match strategy_args.kind.as_deref().unwrap_or("LeastAllocated") {
            "LeastAllocated" => ScoringStrategy::LeastAllocated,
            "MostAllocated" => ScoringStrategy::MostAllocated,
            "RequestedToCapacityRatio" => {
                let shape = strategy_args
                    .requested_to_capacity_ratio
                    .ok_or("requestedToCapacityRatio.shape is required")?
                    .shape;
                ScoringStrategy::RequestedToCapacityRatio(validate_shape(&shape)?)
            }
            other => return Err(format!("unknown scoring strategy type {other:?}")),
        };
        Ok(Fit {
            ignored_resources: args.ignored_resources.into_iter().collect(),
            ignored_groups: args.ignored_resource_groups.into_iter().collect(),
            strategy,
            counter: AllocationCounter {
                resources,
                use_requested: false,
            },
        })
    }

    fn ignores(&self, resource: &str) -> bool {
        is_extended_resource_name(resource)
            && (self.ignored_resources.contains(resource)
                || resource
                    .split_once('/')
                    .is_some_and(|(group, _)| self.ignored_groups.contains(group)))
    }
}

fn validate_shape(shape: &[UtilizationShapePoint]) -> Result<Vec<(i64, i64)>, String> {
    if shape.is_empty() {
        return Err("requestedToCapacityRatio.shape must not be empty".into());
    }
    let mut previous = -1;
    shape
        .iter()
        .map(|p| {
            let utilization = i64::from(p.utilization);
            if !(0..=MAX_UTILIZATION).contains(&utilization) || utilization <= previous {
                return Err(format!(
                    "shape utilization {utilization} must increase within [0, 100]"
                ));
            }
            if !(0..=MAX_CUSTOM_PRIORITY_SCORE).contains(&i64::from(p.score)) {
                return Err(format!("shape score {} is not within [0, 10]", p.score));
            }
            previous = utilization;
            Ok((
                utilization,
                i64::from(p.score) * (MAX_NODE_SCORE / MAX_CUSTOM_PRIORITY_SCORE),
            ))
        })
        .collect()
}

impl Plugin for Fit {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for Fit {
    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let alloc = node.allocatable();
        let used = node.requested();
        let want = &pod.requests.requests;
        let mut reasons = Vec::new();
        // Preemption cannot help when the pod alone exceeds the node.
        let mut unresolvable = false;
        if node.pods().len() as i64 + 1 > alloc.allowed_pod_number {
            reasons.push("Too many pods".to_string());
        }
        if want.is_empty_request() {
            return reject(reasons, unresolvable);
        }
        let mut check = |name: &str, want: i64, capacity: i64, used: i64| {
            if want > 0 && want > capacity - used {
                reasons.push(format!("Insufficient {name}"));
                unresolvable |= want > capacity;
            }
        };
        check("cpu", want.milli_cpu, alloc.milli_cpu, used.milli_cpu);
        check("memory", want.memory, alloc.memory, used.memory);
        check(
            "ephemeral-storage",
            want.ephemeral_storage,
            alloc.ephemeral_storage,
            used.ephemeral_storage,
        );
        for (name, amount) in &want.scalar {
            if !self.ignores(name) {
                check(name, *amount, alloc.get(name), used.get(name));
            }
        }
        reject(reasons, unresolvable)
    }
}

fn reject(reasons: Vec<String>, unresolvable: bool) -> Status {
    match (reasons.is_empty(), unresolvable) {
        (true, _) => Status::success(),
        (false, true) => Status::new(
            crate::framework::Code::UnschedulableAndUnresolvable,
            reasons,
        ),
        (false, false) => Status::new(crate::framework::Code::Unschedulable, reasons),
    }
}

impl PreScorePlugin for Fit {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _snapshot: &Snapshot,
        _nodes: &[&NodeInfo],
    ) -> Status {
        state.write(PreScoreState {
            pod_requests: self.counter.pod_requests(pod),
        });
        Status::success()
    }
}

impl ScorePlugin for Fit {
    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let s = state
            .read::<PreScoreState>()
            .ok_or_else(|| Status::error("NodeResourcesFit PreScore state missing"))?;
        let amounts = self.counter.node_amounts(node, &s.pod_requests);
        let weights = self.counter.resources.iter().map(|r| r.weight);
        Ok(match &self.strategy {
            ScoringStrategy::LeastAllocated => weighted_mean(&amounts, weights, least_allocated),
            ScoringStrategy::MostAllocated => weighted_mean(&amounts, weights, most_allocated),
            ScoringStrategy::RequestedToCapacityRatio(shape) => {
                requested_to_capacity_ratio(&amounts, weights, shape)
            }
        })
    }
}

/// Weighted integer mean of per-resource scores over the resources the node has.
fn weighted_mean(
    amounts: &[(i64, i64)],
    weights: impl Iterator<Item = i64>,
    score: fn(i64, i64) -> i64,
) -> i64 {
    let (mut total, mut weight_sum) = (0, 0);
    for (&(requested, capacity), weight) in amounts.iter().zip(weights) {
        if capacity == 0 {
            continue;
        }
        total += score(requested, capacity) * weight;
        weight_sum += weight;
    }
    if weight_sum == 0 {
        0
    } else {
        total / weight_sum
    }
}

/// The share left free: an empty node scores 100, a full (or overcommitted) one 0.
fn least_allocated(requested: i64, capacity: i64) -> i64 {
    if requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

/// The share used: a full node scores 100 (overcommit counts as full).
fn most_allocated(requested: i64, capacity: i64) -> i64 {
    requested.min(capacity) * MAX_NODE_SCORE / capacity
}

/// Evaluates the piecewise-linear shape at `utilization` (clamped to its ends).
fn broken_linear(shape: &[(i64, i64)], utilization: i64) -> i64 {
    for (i, &(u, s)) in shape.iter().enumerate() {
        if utilization <= u {
            if i == 0 {
                return s;
            }
            let (pu, ps) = shape[i - 1];
            return ps + (s - ps) * (utilization - pu) / (u - pu);
        }
    }
    shape.last().map_or(0, |p| p.1)
}

/// Weighted mean of the shape's score at each resource's utilization; resources
/// scoring 0 are left out of the mean (as upstream does), and the mean is rounded.
fn requested_to_capacity_ratio(
    amounts: &[(i64, i64)],
    weights: impl Iterator<Item = i64>,
    shape: &[(i64, i64)],
) -> i64 {
    let (mut total, mut weight_sum) = (0i64, 0i64);
    for (&(requested, capacity), weight) in amounts.iter().zip(weights) {
        if capacity == 0 {
            continue;
        }
        let utilization = if requested > capacity {
            MAX_UTILIZATION
        } else {
            requested * MAX_UTILIZATION / capacity
        };
        let score = broken_linear(shape, utilization);
        if score > 0 {
            total += score * weight;
            weight_sum += weight;
        }
    }
    if weight_sum == 0 {
        0
    } else {
        (total as f64 / weight_sum as f64).round() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::testing::{
        container, filter_statuses, node, node_with, normalized_scores, pod, snapshot,
    };

    fn fit(args: serde_json::Value) -> Fit {
        Fit::new(serde_json::from_value(args).unwrap()).unwrap()
    }

    #[test]
    fn insufficient_resources_are_all_reported() {
        let snap = snapshot(vec![
            node_with(
                node("full").capacity("2", "4Gi"),
                vec![pod("a").req("1500m", "3Gi")],
            ),
            node_with(node("small").capacity("1", "1Gi"), vec![]),
            node_with(
                node("roomy").capacity("8", "16Gi"),
                vec![pod("a").req("1", "1Gi")],
            ),
        ]);
        let plugin = fit(serde_json::json!({}));
        let statuses = filter_statuses(None, &plugin, pod("p").req("1", "2Gi"), &snap);
        assert_eq!(statuses[0].code(), Code::Unschedulable);
        assert_eq!(
            statuses[0].reasons(),
            ["Insufficient cpu", "Insufficient memory"]
        );
        // The pod alone is bigger than the node: preemption would not help.
        assert_eq!(statuses[1].code(), Code::UnschedulableAndUnresolvable);
        assert_eq!(statuses[1].reasons(), ["Insufficient memory"]);
        assert!(statuses[2].is_success());
    }

    #[test]
    fn pod_count_extended_resources_and_ignored_groups() {
        let snap = snapshot(vec![
            node_with(node("one-slot").alloc("pods", "1"), vec![pod("a")]),
            node_with(node("gpu").alloc("example.com/gpu", "2"), vec![]),
        ]);
        let plugin = fit(serde_json::json!({}));
        let statuses = filter_statuses(None, &plugin, pod("p").container(container("c")), &snap);
        assert_eq!(statuses[0].reasons(), ["Too many pods"]);
        assert!(statuses[1].is_success());

        let gpu_pod = || pod("p").container(container("c").req("example.com/gpu", "3"));
        let statuses = filter_statuses(None, &plugin, gpu_pod(), &snap);
        assert_eq!(statuses[1].reasons(), ["Insufficient example.com/gpu"]);
        assert_eq!(statuses[1].code(), Code::UnschedulableAndUnresolvable);
        let ignoring = fit(serde_json::json!({"ignoredResourceGroups": ["example.com"]}));
        assert!(filter_statuses(None, &ignoring, gpu_pod(), &snap)[1].is_success());
    }

    #[test]
    fn least_allocated_uses_non_zero_defaults() {
        // 4 cpu / 8Gi nodes; "busy" already has 2 cpu / 4Gi requested.
        let snap = snapshot(vec![
            node_with(node("idle").capacity("4", "8Gi"), vec![]),
            node_with(
                node("busy").capacity("4", "8Gi"),
                vec![pod("a").req("2", "4Gi")],
            ),
        ]);
        let plugin = fit(serde_json::json!({}));
        let scores = normalized_scores(Some(&plugin), &plugin, pod("p").req("1", "2Gi"), &snap);
        // idle: cpu (4-1)/4 = 75, mem 75 → 75; busy: cpu (4-3)/4 = 25, mem 25 → 25.
        assert_eq!(scores, vec![75, 25]);
        // No requests: 100m / 200Mi are assumed.
        let scores = normalized_scores(
            Some(&plugin),
            &plugin,
            pod("p").container(container("c")),
            &snap,
        );
        // idle: cpu (4000-100)*100/4000 = 97, mem (8192-200)*100/8192 = 97.
        assert_eq!(scores, vec![97, 47]);
    }

    #[test]
    fn most_allocated_and_requested_to_capacity_ratio() {
        let snap = snapshot(vec![
            node_with(node("idle").capacity("4", "8Gi"), vec![]),
            node_with(
                node("busy").capacity("4", "8Gi"),
                vec![pod("a").req("2", "4Gi")],
            ),
        ]);
        let most = fit(
            serde_json::json!({"scoringStrategy": {"type": "MostAllocated",
            "resources": [{"name": "cpu", "weight": 3}, {"name": "memory", "weight": 1}]}}),
        );
        let scores = normalized_scores(Some(&most), &most, pod("p").req("1", "1Gi"), &snap);
        // idle: cpu 25, mem 12 → (75+12)/4 = 21; busy: cpu 75, mem 62 → (225+62)/4 = 71.
        assert_eq!(scores, vec![21, 71]);

        let ratio = fit(
            serde_json::json!({"scoringStrategy": {"type": "RequestedToCapacityRatio",
            "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]}}}),
        );
        let scores = normalized_scores(Some(&ratio), &ratio, pod("p").req("1", "2Gi"), &snap);
        assert_eq!(scores, vec![25, 75]);
        assert!(Fit::new(serde_json::from_value(serde_json::json!({"scoringStrategy": {"type": "RequestedToCapacityRatio",
            "requestedToCapacityRatio": {"shape": [{"utilization": 50, "score": 1}, {"utilization": 10, "score": 2}]}}})).unwrap()).is_err());
    }

    #[test]
    fn broken_linear_interpolates_and_clamps() {
        let shape = [(10, 0), (50, 100), (90, 20)];
        assert_eq!(broken_linear(&shape, 0), 0);
        assert_eq!(broken_linear(&shape, 30), 50);
        assert_eq!(broken_linear(&shape, 70), 60);
        assert_eq!(broken_linear(&shape, 100), 20);
    }
}
