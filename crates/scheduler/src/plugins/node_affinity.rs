//! NodeAffinity: `spec.nodeSelector` and required node affinity must match the
//! node; preferred node affinity terms add their weights to the node's score.
//!
//! PreFilter narrows the search when every required term pins the pod to named
//! nodes (`matchFields: metadata.name In [...]`), as DaemonSet pods do, so the
//! framework evaluates just those nodes instead of the whole cluster.

use std::collections::BTreeSet;

use crate::framework::{
    CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, PreFilterPlugin, PreFilterResult,
    PreScorePlugin, ScorePlugin, Snapshot, Status,
};
use crate::plugins::default_normalize_score;
use crate::selector::{NodeSelectorMatcher, NodeSelectorTermMatcher, Requirement};

pub const NAME: &str = "NodeAffinity";
pub const ERR_REASON_POD: &str = "node(s) didn't match Pod's node affinity/selector";
pub const ERR_REASON_CONFLICT: &str = "pod affinity terms conflict";

pub struct NodeAffinity;

/// The pod's hard node constraints: nodeSelector labels AND required affinity.
#[derive(Clone, Debug)]
pub struct RequiredNodeAffinity {
    node_selector: Vec<Requirement>,
    affinity: Option<NodeSelectorMatcher>,
}

impl RequiredNodeAffinity {
    pub fn of(pod: &PodInfo) -> Self {
        let spec = pod.pod.spec.as_ref();
        let node_selector = spec
            .and_then(|s| s.node_selector.as_ref())
            .into_iter()
            .flatten()
            .map(|(k, v)| Requirement::equals(k, v))
            .collect();
        let affinity = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(NodeSelectorMatcher::parse);
        RequiredNodeAffinity {
            node_selector,
            affinity,
        }
    }

    pub fn matches(&self, node: &NodeInfo) -> bool {
        self.node_selector.iter().all(|r| r.matches(node.labels()))
            && self
                .affinity
                .as_ref()
                .is_none_or(|a| a.matches(node.node()))
    }

    fn is_empty(&self) -> bool {
        self.node_selector.is_empty() && self.affinity.is_none()
    }
}

#[derive(Clone)]
struct PreferredTerms(Vec<(i64, NodeSelectorTermMatcher)>);

impl Plugin for NodeAffinity {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for NodeAffinity {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let required = RequiredNodeAffinity::of(pod);
        if required.is_empty() {
            return (None, Status::skip());
        }
        let pinned = required
            .affinity
            .as_ref()
            .and_then(|a| pinned_node_names(a.terms()));
        state.write(required);
        match pinned {
            Some(names) if names.is_empty() => (None, Status::unresolvable(ERR_REASON_CONFLICT)),
            Some(node_names) => (Some(PreFilterResult { node_names }), Status::success()),
            None => (None, Status::success()),
        }
    }
}

/// The union over terms of the nodes each term pins to, or `None` if any term
/// leaves the node name open (terms are ORed, so then every node is a candidate).
fn pinned_node_names(terms: &[NodeSelectorTermMatcher]) -> Option<BTreeSet<String>> {
    if terms.is_empty() {
        return None;
    }
    let mut union = BTreeSet::new();
    for term in terms {
        union.extend(term.pinned_node_names()?.into_iter().map(str::to_string));
    }
    Some(union)
}

impl FilterPlugin for NodeAffinity {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let matches = match state.read::<RequiredNodeAffinity>() {
            Some(required) => required.matches(node),
            None => RequiredNodeAffinity::of(pod).matches(node),
        };
        if matches {
            Status::success()
        } else {
            Status::unresolvable(ERR_REASON_POD)
        }
    }
}

impl PreScorePlugin for NodeAffinity {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _snapshot: &Snapshot,
        _nodes: &[&NodeInfo],
    ) -> Status {
        let preferred = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            });
        let terms: Vec<_> = preferred
            .into_iter()
            .flatten()
            .filter(|t| t.weight != 0)
            .filter_map(|t| match NodeSelectorTermMatcher::parse(&t.preference) {
                Ok(Some(m)) => Some((i64::from(t.weight), m)),
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!(error = %e, "dropping invalid preferred node affinity term");
                    None
                }
            })
            .collect();
        if terms.is_empty() {
            return Status::skip();
        }
        state.write(PreferredTerms(terms));
        Status::success()
    }
}

impl ScorePlugin for NodeAffinity {
    /// Raw score: the sum of the weights of matching preferred terms.
    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let terms = state
            .read::<PreferredTerms>()
            .ok_or_else(|| Status::error("NodeAffinity PreScore state missing"))?;
        Ok(terms
            .0
            .iter()
            .filter(|(_, t)| t.matches(node.node()))
            .map(|(w, _)| w)
            .sum())
    }

    fn normalize_scores(
        &self,
        _state: &CycleState,
        _pod: &PodInfo,
        _nodes: &[&NodeInfo],
        scores: &mut [i64],
    ) -> Status {
        default_normalize_score(false, scores);
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::testing::{
        field_term, filter_statuses, node, node_with, normalized_scores, pod, snapshot, term,
    };

    fn cluster() -> Snapshot {
        snapshot(vec![
            node_with(node("a").label("zone", "z1").label("cores", "4"), vec![]),
            node_with(node("b").label("zone", "z2").label("cores", "16"), vec![]),
            node_with(node("c"), vec![]),
        ])
    }

    fn fits(pod: crate::testing::PodBuilder) -> Vec<bool> {
        filter_statuses(Some(&NodeAffinity), &NodeAffinity, pod, &cluster())
            .iter()
            .map(Status::is_success)
            .collect()
    }

    #[test]
    fn node_selector_and_required_terms() {
        assert_eq!(
            fits(pod("p").node_selector("zone", "z1")),
            [true, false, false]
        );
        assert_eq!(fits(pod("p")), [true, true, true]);
        assert_eq!(
            fits(pod("p").required_node_terms(vec![term(&[("cores", "Gt", &["8"])])])),
            [false, true, false]
        );
        assert_eq!(
            fits(pod("p").required_node_terms(vec![term(&[("cores", "Lt", &["8"])])])),
            [true, false, false]
        );
        assert_eq!(
            fits(pod("p").required_node_terms(vec![term(&[("zone", "DoesNotExist", &[])])])),
            [false, false, true]
        );
        assert_eq!(
            fits(pod("p").required_node_terms(vec![term(&[("zone", "NotIn", &["z1"])])])),
            [false, true, true]
        );
        // Terms are ORed; requirements inside a term are ANDed; nodeSelector is ANDed with all.
        let ored = pod("p").required_node_terms(vec![
            term(&[("zone", "In", &["z1"]), ("cores", "Exists", &[])]),
            term(&[("zone", "In", &["z2"]), ("cores", "Gt", &["32"])]),
        ]);
        assert_eq!(fits(ored), [true, false, false]);
        let both = pod("p")
            .node_selector("zone", "z2")
            .required_node_terms(vec![term(&[("zone", "Exists", &[])])]);
        assert_eq!(fits(both), [false, true, false]);
        let statuses = filter_statuses(
            Some(&NodeAffinity),
            &NodeAffinity,
            pod("p").node_selector("x", "y"),
            &cluster(),
        );
        assert_eq!(statuses[0].code(), Code::UnschedulableAndUnresolvable);
        assert_eq!(statuses[0].reasons(), [ERR_REASON_POD]);
    }

    #[test]
    fn match_fields_pin_nodes_in_prefilter() {
        let snap = cluster();
        let info = pod("p")
            .required_node_terms(vec![field_term("In", &["b"]), field_term("In", &["c"])])
            .info();
        let mut state = CycleState::default();
        let (result, status) = NodeAffinity.pre_filter(&mut state, &info, &snap);
        assert!(status.is_success());
        assert_eq!(
            result.unwrap().node_names,
            BTreeSet::from(["b".to_string(), "c".to_string()])
        );
        assert_eq!(
            fits(pod("p").required_node_terms(vec![field_term("NotIn", &["a"])])),
            [false, true, true]
        );

        let mut conflicting = field_term("In", &["a"]);
        conflicting
            .match_fields
            .as_mut()
            .unwrap()
            .extend(field_term("In", &["b"]).match_fields.unwrap());
        let info = pod("p").required_node_terms(vec![conflicting]).info();
        let (_, status) = NodeAffinity.pre_filter(&mut CycleState::default(), &info, &snap);
        assert_eq!(status.reasons(), [ERR_REASON_CONFLICT]);
    }

    #[test]
    fn preferred_terms_score_by_weight() {
        let p = pod("p")
            .preferred_node_term(10, term(&[("zone", "In", &["z1"])]))
            .preferred_node_term(30, term(&[("cores", "Gt", &["8"])]));
        let scores = normalized_scores(Some(&NodeAffinity), &NodeAffinity, p, &cluster());
        assert_eq!(scores, vec![33, 100, 0]);
        let scores = normalized_scores(Some(&NodeAffinity), &NodeAffinity, pod("p"), &cluster());
        assert_eq!(scores, vec![0, 0, 0]);
    }
}
