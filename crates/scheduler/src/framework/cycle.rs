//! One scheduling cycle: PreFilter, Filter over (a share of) the nodes,
//! PostFilter when nothing fits, then PreScore, Score, NormalizeScore, the
//! weighted sum and host selection.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Pod;

use super::{
    Code, CycleState, Diagnosis, FilterPlugin, FitError, Framework, MAX_NODE_SCORE, MIN_NODE_SCORE,
    NodeInfo, PodInfo, PostFilterResult, PreFilterResult, Snapshot, Status,
};

/// Below this many nodes every node is searched.
const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// The adaptive percentage never drops below this.
const MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: usize = 5;

/// How many feasible nodes to find before the search stops.
///
/// Scoring every node of a large cluster buys little placement quality for a lot
/// of time, so kube-scheduler stops once it has found `percentage` of the nodes
/// feasible (but at least 100). With no configured percentage (or 0) it adapts:
/// 50% for small clusters, minus 1% per 125 nodes, floored at 5% — e.g. 10% of
/// 5,000 nodes.
pub fn num_feasible_nodes_to_find(percentage: Option<i32>, num_all_nodes: usize) -> usize {
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND {
        return num_all_nodes;
    }
    let percentage = match percentage {
        Some(p) if p > 0 => p as usize,
        _ => 50usize
            .saturating_sub(num_all_nodes / 125)
            .max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND),
    };
    (num_all_nodes * percentage / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// The pod has a node.
#[derive(Debug)]
pub struct ScheduleResult {
    pub suggested_host: String,
    /// Nodes that were run through Filter (feasible or not).
    pub evaluated_nodes: usize,
    pub feasible_nodes: usize,
    /// The cycle's state, for the binding-cycle plugins.
    pub state: CycleState,
    pub pod_info: Arc<PodInfo>,
}

/// The pod could not be placed in this cycle.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("no nodes available to schedule pods")]
    NoNodesAvailable,
    /// No node fits. `preemption` is set when the PostFilter found victims whose
    /// eviction should make room; the caller deletes them and records the
    /// nominated node, then retries the pod later.
    #[error("{fit_error}")]
    Unschedulable {
        fit_error: Box<FitError>,
        preemption: Option<PostFilterResult>,
    },
    /// A plugin failed; the pod should be retried with backoff.
    #[error("{0}")]
    Internal(Status),
}

impl Framework {
    /// Runs one scheduling cycle for `pod` against `snapshot`.
    pub fn schedule_pod(
        &self,
        snapshot: &Snapshot,
        pod: Arc<Pod>,
    ) -> Result<ScheduleResult, ScheduleError> {
        if snapshot.num_nodes() == 0 {
            return Err(ScheduleError::NoNodesAvailable);
        }
        let pod_info = Arc::new(PodInfo::new(pod));
        let mut state = CycleState::default();
        let (feasible, diagnosis) = self
            .find_nodes_that_fit(&mut state, &pod_info, snapshot)
            .map_err(ScheduleError::Internal)?;

        if feasible.is_empty() {
            let mut fit_error = Box::new(FitError {
                num_all_nodes: snapshot.num_nodes(),
                diagnosis,
            });
            let preemption =
                self.run_post_filter(&state, &pod_info, snapshot, &mut fit_error.diagnosis);
            return Err(ScheduleError::Unschedulable {
                fit_error,
                preemption,
            });
        }

        let evaluated_nodes = feasible.len() + diagnosis.node_to_status.len();
        if feasible.len() == 1 {
            return Ok(ScheduleResult {
                suggested_host: feasible[0].name().to_string(),
                evaluated_nodes: 1 + diagnosis.node_to_status.len(),
                feasible_nodes: 1,
                state,
                pod_info,
            });
        }
        let scores = self
            .prioritize_nodes(&mut state, &pod_info, snapshot, &feasible)
            .map_err(ScheduleError::Internal)?;
        let host = self.select_host(&feasible, &scores);
        tracing::debug!(pod = ?pod_info.pod.metadata.name, node = host, evaluated_nodes, "selected node");
        Ok(ScheduleResult {
            suggested_host: host.to_string(),
            evaluated_nodes,
            feasible_nodes: feasible.len(),
            state,
            pod_info,
        })
    }

    fn find_nodes_that_fit<'s>(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &'s Snapshot,
    ) -> Result<(Vec<&'s NodeInfo>, Diagnosis), Status> {
        let mut diagnosis = Diagnosis::default();
        let (pre_result, status, plugins_with_nodes) = self.run_pre_filter(state, pod, snapshot);
        if !status.is_success() {
            if !status.is_rejected() {
                return Err(status);
            }
            diagnosis.pre_filter_msg = Some(status.message());
            diagnosis.unschedulable_plugins.extend(status.plugin());
            diagnosis.node_to_status.set_absent(status);
            return Ok((Vec::new(), diagnosis));
        }

        // A nominated node (from an earlier preemption) is likely the only
        // place the pod fits, so try it alone first.
        let nominated = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref());
        if let Some(node) = nominated
            .filter(|n| !n.is_empty())
            .and_then(|n| snapshot.get(n))
        {
            let status = self.run_filter_plugins(state, pod, node);
            if status.is_success() {
                return Ok((vec![&**node], diagnosis));
            }
        }

        let nodes: Vec<&NodeInfo> = match pre_result {
            None => snapshot.nodes().iter().map(|n| &**n).collect(),
            Some(result) => {
                let plugins: Vec<&str> = plugins_with_nodes.into_iter().collect();
                diagnosis
                    .node_to_status
                    .set_absent(Status::unresolvable(format!(
                        "node(s) didn't satisfy plugin(s) [{}]",
                        plugins.join(" ")
                    )));
                result
                    .node_names
                    .iter()
                    .filter_map(|n| snapshot.get(n).map(|n| &**n))
                    .collect()
            }
        };
        let feasible = self.find_nodes_that_pass_filters(state, pod, &mut diagnosis, &nodes);
        // Advance even on error so that every node gets its turn to be searched first.
        let processed = feasible.as_ref().map_or(0, Vec::len) + diagnosis.node_to_status.len();
        let start = self.next_start_node_index.load(Ordering::Relaxed);
        self.next_start_node_index.store(
            (start + processed) % snapshot.num_nodes(),
            Ordering::Relaxed,
        );
        Ok((feasible?, diagnosis))
    }

    /// Runs PreFilter plugins. Returns the intersection of the node sets they
    /// narrowed to (if any did), the combined status and the narrowing plugins.
    fn run_pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status, BTreeSet<&'static str>) {
        let mut result: Option<PreFilterResult> = None;
        let mut plugins_with_nodes = BTreeSet::new();
        let mut rejected = None;
        for plugin in &self.pre_filter {
            let name = plugin.name();
            let (narrowed, status) = plugin.pre_filter(state, pod, snapshot);
            match status.code() {
                Code::Skip => {
                    state.skip_filter(name);
                    continue;
                }
                Code::Success => {}
                // No point in running the rest: preemption cannot help either.
                Code::UnschedulableAndUnresolvable => {
                    return (None, status.with_plugin(name), plugins_with_nodes);
                }
                // Keep going: preemption needs every plugin's state.
                Code::Unschedulable => {
                    rejected = Some(status.with_plugin(name));
                    continue;
                }
                Code::Error => {
                    let status = Status::error(format!(
                        "running PreFilter plugin {name:?}: {}",
                        status.message()
                    ))
                    .with_plugin(name);
                    return (None, status, plugins_with_nodes);
                }
            }
            let Some(narrowed) = narrowed else { continue };
            plugins_with_nodes.insert(name);
            let merged = match result {
                None => narrowed.node_names,
                Some(prev) => prev
                    .node_names
                    .intersection(&narrowed.node_names)
                    .cloned()
                    .collect(),
            };
            if merged.is_empty() {
                let list: Vec<&str> = plugins_with_nodes.iter().copied().collect();
                let msg = if let [only] = list.as_slice() {
                    format!("node(s) didn't satisfy plugin {only}")
                } else {
                    format!(
                        "node(s) didn't satisfy plugin(s) [{}] simultaneously",
                        list.join(" ")
                    )
                };
                let status = Status::unresolvable(msg);
                return (
                    Some(PreFilterResult { node_names: merged }),
                    status,
                    plugins_with_nodes,
                );
            }
            result = Some(PreFilterResult { node_names: merged });
        }
        (
            result,
            rejected.unwrap_or_else(Status::success),
            plugins_with_nodes,
        )
    }

    fn active_filters(&self, state: &CycleState) -> Vec<&dyn FilterPlugin> {
        self.filter
            .iter()
            .filter(|p| !state.is_filter_skipped(p.name()))
            .map(|p| &**p)
            .collect()
    }

    /// Runs the Filter plugins (minus those skipped by PreFilter) for one node,
    /// stopping at the first rejection.
    pub fn run_filter_plugins(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        run_filters(&self.active_filters(state), state, pod, node)
    }

    fn find_nodes_that_pass_filters<'s>(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        diagnosis: &mut Diagnosis,
        nodes: &[&'s NodeInfo],
    ) -> Result<Vec<&'s NodeInfo>, Status> {
        let n = nodes.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        // Without scoring, the first feasible node is as good as any.
        let to_find = if self.score.is_empty() {
            1
        } else {
            num_feasible_nodes_to_find(self.percentage_of_nodes_to_score, n)
        };
        let start = self.next_start_node_index.load(Ordering::Relaxed);
        let filters = self.active_filters(state);
        if filters.is_empty() {
            return Ok((0..to_find).map(|i| nodes[(start + i) % n]).collect());
        }
        let mut feasible = Vec::with_capacity(to_find);
        for i in 0..n {
            let node = nodes[(start + i) % n];
            let status = run_filters(&filters, state, pod, node);
            match status.code() {
                Code::Success => {
                    feasible.push(node);
                    if feasible.len() >= to_find {
                        break;
                    }
                }
                Code::Error => return Err(status),
                _ => {
                    diagnosis.unschedulable_plugins.extend(status.plugin());
                    diagnosis.node_to_status.set(node.name(), status);
                }
            }
        }
        Ok(feasible)
    }

    /// Runs PostFilter plugins until one succeeds, is unresolvable or fails,
    /// recording its message in the diagnosis (it becomes part of the FitError).
    fn run_post_filter(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        diagnosis: &mut Diagnosis,
    ) -> Option<PostFilterResult> {
        let mut reasons = Vec::new();
        let mut result = None;
        let mut final_status = None;
        for plugin in &self.post_filter {
            let (r, status) =
                plugin.post_filter(state, pod, snapshot, &diagnosis.node_to_status, self);
            match status.code() {
                Code::Unschedulable => {
                    reasons.extend(status.reasons().iter().cloned());
                    result = r.or(result);
                }
                _ => {
                    result = r;
                    final_status = Some(status.with_plugin(plugin.name()));
                    break;
                }
            }
        }
        let status = final_status.unwrap_or_else(|| Status::new(Code::Unschedulable, reasons));
        if status.code() == Code::Error {
            tracing::error!(pod = ?pod.pod.metadata.name, %status, "PostFilter failed");
        }
        let msg = status.message();
        if !msg.is_empty() {
            diagnosis.post_filter_msg = Some(msg);
        }
        result
    }

    /// Runs PreScore and Score plugins and returns each node's weighted total.
    fn prioritize_nodes(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        nodes: &[&NodeInfo],
    ) -> Result<Vec<i64>, Status> {
        if self.score.is_empty() {
            return Ok(vec![1; nodes.len()]);
        }
        for plugin in &self.pre_score {
            let status = plugin.pre_score(state, pod, snapshot, nodes);
            match status.code() {
                Code::Success => {}
                Code::Skip => state.skip_score(plugin.name()),
                _ => {
                    return Err(Status::error(format!(
                        "running PreScore plugin {:?}: {}",
                        plugin.name(),
                        status.message()
                    ))
                    .with_plugin(plugin.name()));
                }
            }
        }
        let mut totals = vec![0i64; nodes.len()];
        let mut scores = Vec::with_capacity(nodes.len());
        for weighted in self
            .score
            .iter()
            .filter(|s| !state.is_score_skipped(s.plugin.name()))
        {
            let plugin = &weighted.plugin;
            let name = plugin.name();
            scores.clear();
            for node in nodes {
                let score = plugin.score(state, pod, node).map_err(|status| {
                    Status::error(format!(
                        "running Score plugin {name:?}: {}",
                        status.message()
                    ))
                    .with_plugin(name)
                })?;
                scores.push(score);
            }
            let status = plugin.normalize_scores(state, pod, nodes, &mut scores);
            if !status.is_success() {
                return Err(Status::error(format!(
                    "running Normalize on Score plugin {name:?}: {}",
                    status.message()
                ))
                .with_plugin(name));
            }
            for (total, score) in totals.iter_mut().zip(&scores) {
                if !(MIN_NODE_SCORE..=MAX_NODE_SCORE).contains(score) {
                    return Err(Status::error(format!(
                        "plugin {name:?} returns an invalid score {score}, it should in the range of \
                         [{MIN_NODE_SCORE}, {MAX_NODE_SCORE}] after normalizing"
                    ))
                    .with_plugin(name));
                }
                *total += score * weighted.weight;
            }
        }
        Ok(totals)
    }

    /// The highest-scoring node; ties are broken uniformly at random (reservoir
    /// sampling, as upstream) so equal nodes share the load instead of the first
    /// one in snapshot order taking every pod.
    fn select_host<'n>(&self, nodes: &[&'n NodeInfo], scores: &[i64]) -> &'n str {
        let mut best = 0;
        let mut ties = 1;
        for i in 1..nodes.len() {
            if scores[i] > scores[best] {
                best = i;
                ties = 1;
            } else if scores[i] == scores[best] {
                ties += 1;
                if self.random_below(ties) == 0 {
                    best = i;
                }
            }
        }
        nodes[best].name()
    }

    /// Replays adding `added` to `node` into every PreFilter plugin's state.
    pub fn run_pre_filter_extension_add_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        added: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        for plugin in &self.pre_filter {
            if state.is_filter_skipped(plugin.name()) {
                continue;
            }
            let status = plugin.add_pod(state, pod, added, node);
            if !status.is_success() {
                return Status::error(format!(
                    "running AddPod on PreFilter plugin {:?}: {}",
                    plugin.name(),
                    status.message()
                ));
            }
        }
        Status::success()
    }

    /// Replays removing `removed` from `node` into every PreFilter plugin's state.
    pub fn run_pre_filter_extension_remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        removed: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        for plugin in &self.pre_filter {
            if state.is_filter_skipped(plugin.name()) {
                continue;
            }
            let status = plugin.remove_pod(state, pod, removed, node);
            if !status.is_success() {
                return Status::error(format!(
                    "running RemovePod on PreFilter plugin {:?}: {}",
                    plugin.name(),
                    status.message()
                ));
            }
        }
        Status::success()
    }

    /// Reserve plugins, in order; on failure the caller must run [`Self::run_unreserve`].
    pub fn run_reserve(&self, state: &mut CycleState, pod: &PodInfo, node_name: &str) -> Status {
        for plugin in &self.binding.reserve {
            let status = plugin.reserve(state, pod, node_name);
            if !status.is_success() {
                return status.with_plugin(plugin.name());
            }
        }
        Status::success()
    }

    /// Unreserve, in reverse order, after a failure anywhere in the binding cycle.
    pub fn run_unreserve(&self, state: &mut CycleState, pod: &PodInfo, node_name: &str) {
        for plugin in self.binding.reserve.iter().rev() {
            plugin.unreserve(state, pod, node_name);
        }
    }

    pub fn run_permit(&self, state: &mut CycleState, pod: &PodInfo, node_name: &str) -> Status {
        for plugin in &self.binding.permit {
            let status = plugin.permit(state, pod, node_name);
            if !status.is_success() {
                return status.with_plugin(plugin.name());
            }
        }
        Status::success()
    }

    pub fn run_pre_bind(&self, state: &mut CycleState, pod: &PodInfo, node_name: &str) -> Status {
        for plugin in &self.binding.pre_bind {
            let status = plugin.pre_bind(state, pod, node_name);
            if !status.is_success() {
                return status.with_plugin(plugin.name());
            }
        }
        Status::success()
    }

    /// The first Bind plugin that does not Skip decides; Skip means nobody bound.
    pub fn run_bind(&self, state: &mut CycleState, pod: &PodInfo, node_name: &str) -> Status {
        for plugin in &self.binding.bind {
            let status = plugin.bind(state, pod, node_name);
            if !status.is_skip() {
                return status.with_plugin(plugin.name());
            }
        }
        Status::skip()
    }
}

fn run_filters(
    filters: &[&dyn FilterPlugin],
    state: &CycleState,
    pod: &PodInfo,
    node: &NodeInfo,
) -> Status {
    for plugin in filters {
        let status = plugin.filter(state, pod, node);
        if !status.is_success() {
            let status = if status.is_rejected() {
                status
            } else {
                Status::error(format!(
                    "running {:?} filter plugin: {}",
                    plugin.name(),
                    status.message()
                ))
            };
            return status.with_plugin(plugin.name());
        }
    }
    Status::success()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::config::Profile;
    use crate::testing::{PodBuilder, field_term, node, node_with, pod, snapshot};

    fn framework(percentage: Option<i32>) -> Framework {
        Framework::new(&Profile::default_profile(), percentage).unwrap()
    }

    fn run(
        fw: &Framework,
        snap: &Snapshot,
        p: PodBuilder,
    ) -> Result<ScheduleResult, ScheduleError> {
        fw.schedule_pod(snap, Arc::new(p.build()))
    }

    #[test]
    fn adaptive_percentage_of_nodes_to_score() {
        assert_eq!(num_feasible_nodes_to_find(None, 50), 50);
        assert_eq!(num_feasible_nodes_to_find(None, 100), 100);
        assert_eq!(num_feasible_nodes_to_find(None, 1000), 420);
        assert_eq!(num_feasible_nodes_to_find(None, 5000), 500);
        assert_eq!(num_feasible_nodes_to_find(None, 6000), 300);
        assert_eq!(num_feasible_nodes_to_find(Some(0), 5000), 500);
        assert_eq!(num_feasible_nodes_to_find(Some(30), 1000), 300);
        assert_eq!(num_feasible_nodes_to_find(Some(1), 1000), 100);
        assert_eq!(num_feasible_nodes_to_find(Some(100), 1000), 1000);
    }

    #[test]
    fn search_stops_early_and_rotates_between_cycles() {
        let nodes = (0..200)
            .map(|i| node_with(node(&format!("n{i:03}")).capacity("4", "8Gi"), vec![]))
            .collect();
        let snap = snapshot(nodes);
        let fw = framework(Some(50));
        let index = |r: &ScheduleResult| r.suggested_host[1..].parse::<usize>().unwrap();
        let first = run(&fw, &snap, pod("a").req("1", "1Gi")).unwrap();
        assert_eq!((first.evaluated_nodes, first.feasible_nodes), (100, 100));
        assert!(index(&first) < 100);
        let second = run(&fw, &snap, pod("b").req("1", "1Gi")).unwrap();
        assert!(index(&second) >= 100, "{}", second.suggested_host);
    }

    #[test]
    fn scores_pick_the_least_allocated_node_and_ties_are_shared() {
        let snap = snapshot(vec![
            node_with(
                node("busy").capacity("4", "8Gi"),
                vec![pod("x").req("3", "6Gi")],
            ),
            node_with(node("idle").capacity("4", "8Gi"), vec![]),
        ]);
        let fw = framework(None);
        let r = run(&fw, &snap, pod("p").req("500m", "512Mi")).unwrap();
        assert_eq!(r.suggested_host, "idle");
        assert_eq!((r.evaluated_nodes, r.feasible_nodes), (2, 2));

        let twins = snapshot(vec![
            node_with(node("a").capacity("4", "8Gi"), vec![]),
            node_with(node("b").capacity("4", "8Gi"), vec![]),
            node_with(node("c").capacity("4", "8Gi"), vec![]),
        ]);
        let chosen: HashSet<String> = (0..60)
            .map(|_| {
                run(&fw, &twins, pod("p").req("1", "1Gi"))
                    .unwrap()
                    .suggested_host
            })
            .collect();
        assert_eq!(chosen.len(), 3);
    }

    #[test]
    fn nominated_node_is_tried_first() {
        let snap = snapshot(vec![
            node_with(
                node("busy").capacity("4", "8Gi"),
                vec![pod("x").req("3", "6Gi")],
            ),
            node_with(node("idle").capacity("4", "8Gi"), vec![]),
        ]);
        let r = run(
            &framework(None),
            &snap,
            pod("p").req("500m", "512Mi").nominated("busy"),
        )
        .unwrap();
        assert_eq!(r.suggested_host, "busy");
        assert_eq!(r.evaluated_nodes, 1);
    }

    #[test]
    fn fit_error_lists_every_node_and_prefilter_narrowing() {
        let snap = snapshot(vec![
            node_with(node("a").capacity("1", "1Gi"), vec![]),
            node_with(node("b").capacity("1", "1Gi").unschedulable(), vec![]),
            node_with(node("c").capacity("1", "1Gi"), vec![]),
        ]);
        let fw = framework(None);
        let Err(ScheduleError::Unschedulable {
            fit_error,
            preemption,
        }) = run(&fw, &snap, pod("p").req("2", "1Gi"))
        else {
            panic!("expected a FitError");
        };
        assert!(preemption.is_none());
        assert_eq!(
            fit_error.diagnosis.unschedulable_plugins,
            BTreeSet::from(["NodeResourcesFit", "NodeUnschedulable"])
        );
        assert_eq!(
            fit_error.to_string(),
            "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient cpu. \
             preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.."
        );

        // Pinned to node "a" by metadata.name: the others are never evaluated.
        let pinned = pod("p")
            .req("2", "1Gi")
            .required_node_terms(vec![field_term("In", &["a"])]);
        let Err(ScheduleError::Unschedulable { fit_error, .. }) = run(&fw, &snap, pinned) else {
            panic!("expected a FitError");
        };
        assert_eq!(fit_error.diagnosis.node_to_status.len(), 1);
        assert!(
            fit_error.to_string().starts_with(
                "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't satisfy plugin(s) [NodeAffinity]."
            ),
            "{fit_error}"
        );
    }

    #[test]
    fn no_nodes_and_prefilter_rejection() {
        let fw = framework(None);
        assert!(matches!(
            run(&fw, &Snapshot::default(), pod("p")),
            Err(ScheduleError::NoNodesAvailable)
        ));
        let snap = snapshot(vec![node_with(node("a"), vec![])]);
        let conflicting = pod("p").required_node_terms(vec![{
            let mut t = field_term("In", &["a"]);
            t.match_fields
                .as_mut()
                .unwrap()
                .extend(field_term("In", &["b"]).match_fields.unwrap());
            t
        }]);
        let Err(ScheduleError::Unschedulable { fit_error, .. }) = run(&fw, &snap, conflicting)
        else {
            panic!("expected a FitError");
        };
        assert_eq!(
            fit_error.to_string(),
            "0/1 nodes are available: pod affinity terms conflict. \
             preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.."
        );
    }
}

#[cfg(test)]
mod binding_tests {
    use krust_api::sync::Unpoisoned;
    use std::sync::Mutex;

    use super::*;
    use crate::config::Profile;
    use crate::framework::{BindPlugin, BindingPlugins, Plugin, ReservePlugin};
    use crate::testing::pod;

    /// Records the calls it receives; fails reserve on node "bad".
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Plugin for Recorder {
        fn name(&self) -> &'static str {
            "Recorder"
        }
    }

    impl ReservePlugin for Recorder {
        fn reserve(&self, _state: &mut CycleState, _pod: &PodInfo, node_name: &str) -> Status {
            self.0.locked().push(format!("reserve {node_name}"));
            if node_name == "bad" {
                Status::error("no room")
            } else {
                Status::success()
            }
        }
        fn unreserve(&self, _state: &mut CycleState, _pod: &PodInfo, node_name: &str) {
            self.0.locked().push(format!("unreserve {node_name}"));
        }
    }

    impl BindPlugin for Recorder {
        fn bind(&self, _state: &mut CycleState, _pod: &PodInfo, node_name: &str) -> Status {
            self.0.locked().push(format!("bind {node_name}"));
            Status::success()
        }
    }

    #[test]
    fn binding_cycle_plugins_run_in_order() {
        let recorder = Arc::new(Recorder::default());
        let fw = Framework::new(&Profile::default_profile(), None)
            .unwrap()
            .with_binding_plugins(BindingPlugins {
                reserve: vec![recorder.clone()],
                bind: vec![recorder.clone()],
                ..Default::default()
            });
        let info = pod("p").info();
        let mut state = CycleState::default();
        assert!(fw.run_reserve(&mut state, &info, "good").is_success());
        assert!(fw.run_permit(&mut state, &info, "good").is_success());
        assert!(fw.run_pre_bind(&mut state, &info, "good").is_success());
        assert!(fw.run_bind(&mut state, &info, "good").is_success());
        let failed = fw.run_reserve(&mut state, &info, "bad");
        assert_eq!(
            (failed.code(), failed.plugin()),
            (Code::Error, Some("Recorder"))
        );
        fw.run_unreserve(&mut state, &info, "bad");
        assert_eq!(
            *recorder.0.locked(),
            ["reserve good", "bind good", "reserve bad", "unreserve bad"]
        );
        // Without bind plugins, nobody binds.
        let plain = Framework::new(&Profile::default_profile(), None).unwrap();
        assert!(plain.run_bind(&mut state, &info, "good").is_skip());
    }
}
