//! TaintToleration: a pod must tolerate a node's `NoSchedule` and `NoExecute`
//! taints to land there, and is steered away from `PreferNoSchedule` taints it
//! does not tolerate (fewer untolerated ones score higher).

use k8s_openapi::api::core::v1::Toleration;

use crate::framework::{
    CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, PreScorePlugin, ScorePlugin, Snapshot,
    Status,
};
use crate::plugins::default_normalize_score;
use crate::selector::{find_untolerated_taint, is_do_not_schedule_taint, tolerates};

pub const NAME: &str = "TaintToleration";

pub struct TaintToleration;

/// The pod's tolerations that can tolerate `PreferNoSchedule` taints.
#[derive(Clone)]
struct PreScoreState {
    tolerations: Vec<Toleration>,
}

fn tolerations(pod: &PodInfo) -> &[Toleration] {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

impl Plugin for TaintToleration {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for TaintToleration {
    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        match find_untolerated_taint(node.taints(), tolerations(pod), is_do_not_schedule_taint) {
            None => Status::success(),
            Some(taint) => Status::unresolvable(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                taint.key,
                taint.value.as_deref().unwrap_or("")
            )),
        }
    }
}

impl PreScorePlugin for TaintToleration {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _snapshot: &Snapshot,
        _nodes: &[&NodeInfo],
    ) -> Status {
        let tolerations = tolerations(pod)
            .iter()
            .filter(|t| {
                matches!(
                    t.effect.as_deref(),
                    None | Some("") | Some("PreferNoSchedule")
                )
            })
            .cloned()
            .collect();
        state.write(PreScoreState { tolerations });
        Status::success()
    }
}

impl ScorePlugin for TaintToleration {
    /// Raw score: the number of untolerated `PreferNoSchedule` taints (reversed
    /// by normalization, so fewer is better).
    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let s = state
            .read::<PreScoreState>()
            .ok_or_else(|| Status::error("TaintToleration PreScore state missing"))?;
        Ok(node
            .taints()
            .iter()
            .filter(|taint| taint.effect == "PreferNoSchedule")
            .filter(|taint| !s.tolerations.iter().any(|t| tolerates(t, taint)))
            .count() as i64)
    }

    fn normalize_scores(
        &self,
        _state: &CycleState,
        _pod: &PodInfo,
        _nodes: &[&NodeInfo],
        scores: &mut [i64],
    ) -> Status {
        default_normalize_score(true, scores);
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::testing::{filter_statuses, node, node_with, normalized_scores, pod, snapshot};

    #[test]
    fn untolerated_hard_taints_reject_with_upstream_reason() {
        let snap = snapshot(vec![
            node_with(node("master").taint("node-role", "x", "NoSchedule"), vec![]),
            node_with(node("draining").taint("drain", "", "NoExecute"), vec![]),
            node_with(node("soft").taint("soft", "", "PreferNoSchedule"), vec![]),
        ]);
        let statuses = filter_statuses(None, &TaintToleration, pod("p"), &snap);
        assert_eq!(statuses[0].code(), Code::UnschedulableAndUnresolvable);
        assert_eq!(
            statuses[0].reasons(),
            ["node(s) had untolerated taint {node-role: x}"]
        );
        assert_eq!(
            statuses[1].reasons(),
            ["node(s) had untolerated taint {drain: }"]
        );
        assert!(statuses[2].is_success());

        let tolerant = pod("p")
            .toleration("node-role", "Equal", "x", "NoSchedule")
            .toleration("drain", "Exists", "", "");
        let statuses = filter_statuses(None, &TaintToleration, tolerant, &snap);
        assert!(statuses.iter().all(Status::is_success));
    }

    #[test]
    fn prefer_no_schedule_taints_lower_the_score() {
        let snap = snapshot(vec![
            node_with(node("clean"), vec![]),
            node_with(node("one").taint("a", "", "PreferNoSchedule"), vec![]),
            node_with(
                node("two")
                    .taint("a", "", "PreferNoSchedule")
                    .taint("b", "", "PreferNoSchedule")
                    .taint("c", "", "NoSchedule"),
                vec![],
            ),
        ]);
        let scores = normalized_scores(Some(&TaintToleration), &TaintToleration, pod("p"), &snap);
        assert_eq!(scores, vec![100, 50, 0]);
        // Tolerating `a` (any effect) leaves only `b` counted.
        let tolerant = pod("p").toleration("a", "Exists", "", "");
        let scores = normalized_scores(Some(&TaintToleration), &TaintToleration, tolerant, &snap);
        assert_eq!(scores, vec![100, 100, 0]);
    }
}
