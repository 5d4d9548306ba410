//! The extension points a plugin can implement, in the order a cycle runs them.
//!
//! Scheduling cycle: PreFilter → Filter (per node) → PostFilter (only when no
//! node fits) → PreScore → Score (per node) → NormalizeScore. Binding cycle,
//! driven by the caller once a node is chosen: Reserve → Permit → PreBind → Bind.
//! The binding-cycle traits default to doing nothing so a plugin implements only
//! the hooks it needs.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::{CycleState, Framework, NodeInfo, NodeToStatus, PodInfo, Snapshot, Status};

/// Every plugin has a stable name (used in configuration and statuses).
pub trait Plugin: Send + Sync {
    fn name(&self) -> &'static str;
}

/// PreFilter may narrow the candidate nodes to a known set (e.g. a pod pinned by
/// `metadata.name` node affinity) so Filter does not visit the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreFilterResult {
    pub node_names: BTreeSet<String>,
}

/// Runs once per cycle before filtering; typically precomputes state about the
/// incoming pod. Returning Skip disables the plugin's Filter for this cycle.
pub trait PreFilterPlugin: Plugin {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status);

    /// Updates the PreFilter state as if `added` were running on `node`
    /// (preemption uses this to replay "what if" changes without re-running PreFilter).
    fn add_pod(
        &self,
        _state: &mut CycleState,
        _pod: &PodInfo,
        _added: &PodInfo,
        _node: &NodeInfo,
    ) -> Status {
        Status::success()
    }

    /// Updates the PreFilter state as if `removed` were gone from `node`.
    fn remove_pod(
        &self,
        _state: &mut CycleState,
        _pod: &PodInfo,
        _removed: &PodInfo,
        _node: &NodeInfo,
    ) -> Status {
        Status::success()
    }
}

/// Decides whether the pod can run on one node. Called for many nodes per cycle,
/// so it must be cheap and must not mutate anything.
pub trait FilterPlugin: Plugin {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status;
}

/// What a PostFilter proposes: the node to nominate and the pods to evict there.
#[derive(Clone, Debug, PartialEq)]
pub struct PostFilterResult {
    pub nominated_node_name: String,
    /// Pods to delete, most important first.
    pub victims: Vec<Arc<Pod>>,
}

/// Runs when no node passed Filter; preemption lives here.
pub trait PostFilterPlugin: Plugin {
    fn post_filter(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        statuses: &NodeToStatus,
        framework: &Framework,
    ) -> (Option<PostFilterResult>, Status);
}

/// Runs once per cycle before scoring, with the feasible nodes.
/// Returning Skip disables the plugin's Score for this cycle.
pub trait PreScorePlugin: Plugin {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        nodes: &[&NodeInfo],
    ) -> Status;
}

/// Ranks a feasible node; higher is better.
pub trait ScorePlugin: Plugin {
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status>;

    /// Rescales all raw scores into `0..=MAX_NODE_SCORE`; `scores[i]` belongs to
    /// `nodes[i]`. The default keeps the scores as they are.
    fn normalize_scores(
        &self,
        _state: &CycleState,
        _pod: &PodInfo,
        _nodes: &[&NodeInfo],
        _scores: &mut [i64],
    ) -> Status {
        Status::success()
    }
}

/// Claims resources for the pod on the chosen node before binding, and releases
/// them if a later step fails.
pub trait ReservePlugin: Plugin {
    fn reserve(&self, _state: &mut CycleState, _pod: &PodInfo, _node_name: &str) -> Status {
        Status::success()
    }
    fn unreserve(&self, _state: &mut CycleState, _pod: &PodInfo, _node_name: &str) {}
}

/// Last chance to veto (or hold) a placement before binding.
pub trait PermitPlugin: Plugin {
    fn permit(&self, _state: &mut CycleState, _pod: &PodInfo, _node_name: &str) -> Status {
        Status::success()
    }
}

/// Work that must succeed before the binding is written (e.g. volume provisioning).
pub trait PreBindPlugin: Plugin {
    fn pre_bind(&self, _state: &mut CycleState, _pod: &PodInfo, _node_name: &str) -> Status {
        Status::success()
    }
}

/// Writes the binding. Returning Skip passes the pod to the next Bind plugin.
pub trait BindPlugin: Plugin {
    fn bind(&self, _state: &mut CycleState, _pod: &PodInfo, _node_name: &str) -> Status {
        Status::skip()
    }
}
