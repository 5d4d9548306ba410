//! NodeResourcesBalancedAllocation: prefers nodes where, after placing the pod,
//! the used fractions of cpu and memory (or the configured resources) are close
//! to each other, so neither runs out while the other sits idle.

use serde::Deserialize;

use super::{AllocationCounter, ResourceSpec, default_resources};
use crate::framework::{
    CycleState, MAX_NODE_SCORE, NodeInfo, Plugin, PodInfo, PreScorePlugin, ScorePlugin, Snapshot,
    Status,
};

pub const NAME: &str = "NodeResourcesBalancedAllocation";

/// `NodeResourcesBalancedAllocationArgs`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BalancedAllocationArgs {
    #[serde(default)]
    pub resources: Vec<ResourceSpec>,
}

pub struct BalancedAllocation {
    counter: AllocationCounter,
}

#[derive(Clone)]
struct PreScoreState {
    pod_requests: Vec<i64>,
}

impl BalancedAllocation {
    pub fn new(args: BalancedAllocationArgs) -> Self {
        let resources = if args.resources.is_empty() {
            default_resources()
        } else {
            args.resources
        };
        BalancedAllocation {
            counter: AllocationCounter {
                resources,
                use_requested: true,
            },
        }
    }
}

impl Plugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreScorePlugin for BalancedAllocation {
    /// Best-effort pods request nothing, so every node would look equally
    /// balanced after placing them and the first nodes would attract them all;
    /// upstream skips scoring them here.
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _snapshot: &Snapshot,
        _nodes: &[&NodeInfo],
    ) -> Status {
        let pod_requests = self.counter.pod_requests(pod);
        if pod_requests.iter().all(|r| *r == 0) {
            return Status::skip();
        }
        state.write(PreScoreState { pod_requests });
        Status::success()
    }
}

impl ScorePlugin for BalancedAllocation {
    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let s = state.read::<PreScoreState>().ok_or_else(|| {
            Status::error("NodeResourcesBalancedAllocation PreScore state missing")
        })?;
        let fractions: Vec<f64> = self
            .counter
            .node_amounts(node, &s.pod_requests)
            .into_iter()
            .filter(|(_, capacity)| *capacity != 0)
            .map(|(requested, capacity)| (requested as f64 / capacity as f64).min(1.0))
            .collect();
        // Two resources: |a-b|/2 is their standard deviation; more: the usual formula.
        let std = match fractions.as_slice() {
            [a, b] => ((a - b) / 2.0).abs(),
            f if f.len() > 2 => {
                let mean = f.iter().sum::<f64>() / f.len() as f64;
                (f.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / f.len() as f64).sqrt()
            }
            _ => 0.0,
        };
        Ok(((1.0 - std) * MAX_NODE_SCORE as f64) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{container, node, node_with, normalized_scores, pod, snapshot};

    #[test]
    fn balanced_nodes_score_higher() {
        let snap = snapshot(vec![
            // After placing 1 cpu / 2Gi: cpu 2/4 = 0.5, mem 4/8 = 0.5 → 100.
            node_with(
                node("even").capacity("4", "8Gi"),
                vec![pod("a").req("1", "2Gi")],
            ),
            // cpu 4/4 = 1.0, mem 2/8 = 0.25 → 1 - 0.375 = 62.
            node_with(
                node("cpu-heavy").capacity("4", "8Gi"),
                vec![pod("a").req("3", "0")],
            ),
        ]);
        let plugin = BalancedAllocation::new(BalancedAllocationArgs::default());
        let scores = normalized_scores(Some(&plugin), &plugin, pod("p").req("1", "2Gi"), &snap);
        assert_eq!(scores, vec![100, 62]);
    }

    #[test]
    fn best_effort_pods_skip_scoring() {
        let snap = snapshot(vec![node_with(node("n").capacity("4", "8Gi"), vec![])]);
        let plugin = BalancedAllocation::new(BalancedAllocationArgs::default());
        let info = pod("p").container(container("c")).info();
        let mut state = CycleState::default();
        let nodes: Vec<&NodeInfo> = snap.nodes().iter().map(|n| &**n).collect();
        assert!(plugin.pre_score(&mut state, &info, &snap, &nodes).is_skip());
    }
}
