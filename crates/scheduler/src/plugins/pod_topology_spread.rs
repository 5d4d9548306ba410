//! PodTopologySpread: keeps matching pods evenly spread across topology domains.
//!
//! For each `DoNotSchedule` constraint, placing the pod in a domain must keep
//! `matching pods there + 1 (if the pod itself matches) - global minimum` within
//! `maxSkew`; the minimum counts as 0 while fewer than `minDomains` domains
//! exist. `ScheduleAnyway` constraints only score: fewer matching pods in the
//! node's domain is better, weighted by `ln(number of domains + 2)`.
//!
//! Which nodes count as domains follows `nodeAffinityPolicy` (default Honor:
//! only nodes matching the pod's nodeSelector/required affinity) and
//! `nodeTaintsPolicy` (default Ignore).
//!
//! Pods without constraints of their own get the system defaults (hostname
//! maxSkew 3, zone maxSkew 5, both ScheduleAnyway) when they belong to a
//! workload. Upstream builds the selector from the Services, ReplicaSets,
//! ReplicationControllers and StatefulSets that select the pod; this crate has
//! no such informers, so for a pod whose controller owner is a ReplicaSet,
//! ReplicationController or StatefulSet it selects by the pod's own labels (its
//! siblings share them). Pods selected only by a Service get no default spreading.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use serde::Deserialize;

use super::node_affinity::RequiredNodeAffinity;
use crate::framework::{
    CycleState, FilterPlugin, MAX_NODE_SCORE, NodeInfo, Plugin, PodInfo, PreFilterPlugin,
    PreFilterResult, PreScorePlugin, ScorePlugin, Snapshot, Status,
};
use crate::selector::{Requirement, Selector, find_untolerated_taint, is_do_not_schedule_taint};

pub const NAME: &str = "PodTopologySpread";
pub const ERR_REASON_CONSTRAINTS_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints";
pub const ERR_REASON_NODE_LABEL_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";

const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
const DO_NOT_SCHEDULE: &str = "DoNotSchedule";
const SCHEDULE_ANYWAY: &str = "ScheduleAnyway";
/// Owner kinds whose pods get the system default constraints.
const SPREAD_OWNER_KINDS: &[&str] = &["ReplicaSet", "ReplicationController", "StatefulSet"];

/// `PodTopologySpreadArgs`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodTopologySpreadArgs {
    #[serde(default)]
    pub default_constraints: Vec<TopologySpreadConstraint>,
    /// `System` (default) or `List` (use `defaultConstraints`).
    #[serde(default)]
    pub defaulting_type: Option<String>,
}

pub struct PodTopologySpread {
    default_constraints: Vec<TopologySpreadConstraint>,
    system_defaulted: bool,
}

fn system_default_constraints() -> Vec<TopologySpreadConstraint> {
    [(LABEL_HOSTNAME, 3), (LABEL_ZONE, 5)]
        .into_iter()
        .map(|(key, max_skew)| TopologySpreadConstraint {
            max_skew,
            topology_key: key.into(),
            when_unsatisfiable: SCHEDULE_ANYWAY.into(),
            ..Default::default()
        })
        .collect()
}

impl PodTopologySpread {
    pub fn new(args: PodTopologySpreadArgs) -> Result<Self, String> {
        match args.defaulting_type.as_deref().unwrap_or("System") {
            "System" if args.default_constraints.is_empty() => Ok(PodTopologySpread {
                default_constraints: system_default_constraints(),
                system_defaulted: true,
            }),
            "System" => {
                Err("defaultConstraints must be empty when defaultingType is System".into())
            }
            "List" => {
                for c in &args.default_constraints {
                    if c.label_selector.is_some() {
                        return Err("defaultConstraints must not set labelSelector".into());
                    }
                    if c.max_skew <= 0 {
                        return Err(format!(
                            "defaultConstraints maxSkew {} must be positive",
                            c.max_skew
                        ));
                    }
                    if c.when_unsatisfiable != DO_NOT_SCHEDULE
                        && c.when_unsatisfiable != SCHEDULE_ANYWAY
                    {
                        return Err(format!(
                            "unknown whenUnsatisfiable {:?}",
                            c.when_unsatisfiable
                        ));
                    }
                }
                Ok(PodTopologySpread {
                    default_constraints: args.default_constraints,
                    system_defaulted: false,
                })
            }
            other => Err(format!("unknown defaultingType {other:?}")),
        }
    }

    /// The pod's constraints with the given `whenUnsatisfiable`, or the default
    /// ones when the pod declares none.
    fn constraints(&self, pod: &PodInfo, action: &str) -> Result<Vec<Constraint>, Status> {
        let declared = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_deref())
            .unwrap_or_default();
        if !declared.is_empty() {
            return declared
                .iter()
                .filter(|c| c.when_unsatisfiable == action)
                .map(|c| Constraint::from_spec(c, pod))
                .collect();
        }
        let Some(selector) = default_selector(pod) else {
            return Ok(Vec::new());
        };
        Ok(self
            .default_constraints
            .iter()
            .filter(|c| c.when_unsatisfiable == action)
            .map(|c| Constraint::new(c, selector.clone()))
            .collect())
    }
}

/// See the module docs: the pod's labels, for pods owned by a workload controller.
fn default_selector(pod: &PodInfo) -> Option<Selector> {
    let owned = pod
        .pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && SPREAD_OWNER_KINDS.contains(&o.kind.as_str()));
    if !owned || pod.labels().is_empty() {
        return None;
    }
    Some(Selector::All(
        pod.labels()
            .iter()
            .map(|(k, v)| Requirement::equals(k, v))
            .collect(),
    ))
}

#[derive(Clone, Debug)]
struct Constraint {
    max_skew: i64,
    min_domains: i64,
    topology_key: String,
    selector: Selector,
    /// The selector's required label pairs, to skip nodes without candidates.
    label_pairs: Vec<u64>,
    honor_node_affinity: bool,
    honor_node_taints: bool,
}

impl Constraint {
    fn new(c: &TopologySpreadConstraint, selector: Selector) -> Self {
        Constraint {
            max_skew: i64::from(c.max_skew),
            min_domains: i64::from(c.min_domains.unwrap_or(1)),
            topology_key: c.topology_key.clone(),
            label_pairs: selector.required_label_pairs(),
            selector,
            honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_node_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        }
    }

    /// Parses the selector and merges `matchLabelKeys` (the pod's values for
    /// those keys) into it, so e.g. `pod-template-hash` limits spreading to one
    /// revision of a Deployment.
    fn from_spec(c: &TopologySpreadConstraint, pod: &PodInfo) -> Result<Self, Status> {
        let mut selector = Selector::parse(c.label_selector.as_ref())
            .map_err(|e| Status::error(format!("parsing topology spread selector: {e}")))?;
        for key in c.match_label_keys.iter().flatten() {
            if let Some(value) = pod.labels().get(key) {
                selector = selector.and(Requirement::equals(key, value));
            }
        }
        Ok(Constraint::new(c, selector))
    }

    /// Whether `node` counts as (part of) a domain for this constraint.
    fn includes_node(
        &self,
        pod: &PodInfo,
        node: &NodeInfo,
        required: &RequiredNodeAffinity,
    ) -> bool {
        if self.honor_node_affinity && !required.matches(node) {
            return false;
        }
        if self.honor_node_taints {
            let tolerations = pod
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.tolerations.as_deref())
                .unwrap_or_default();
            if find_untolerated_taint(node.taints(), tolerations, is_do_not_schedule_taint)
                .is_some()
            {
                return false;
            }
        }
        true
    }
}

fn has_all_topology_keys(node: &NodeInfo, constraints: &[Constraint]) -> bool {
    constraints
        .iter()
        .all(|c| node.labels().contains_key(&c.topology_key))
}

/// Adds `delta` to a domain's count, allocating the key only for a new domain.
fn add_to_domain(counts: &mut HashMap<String, i64>, domain: &str, delta: i64) {
    match counts.get_mut(domain) {
        Some(count) => *count += delta,
        None => {
            counts.insert(domain.to_string(), delta);
        }
    }
}

/// Pods on a node matching the constraint: same namespace, not terminating. An
/// empty selector counts nothing (as upstream).
fn count_matching(node: &NodeInfo, c: &Constraint, namespace: &str) -> i64 {
    if c.selector.is_everything() || !node.may_have_pods_with(&c.label_pairs) {
        return 0;
    }
    node.pods()
        .iter()
        .filter(|p| p.pod.metadata.deletion_timestamp.is_none() && p.namespace() == namespace)
        .filter(|p| c.selector.matches(p.labels()))
        .count() as i64
}

#[derive(Clone, Debug)]
struct PreFilterState {
    constraints: Vec<Constraint>,
    /// Per constraint: domain value → matching pods.
    counts: Vec<HashMap<String, i64>>,
    /// Per constraint: the smallest count over its domains.
    min_counts: Vec<i64>,
    required: RequiredNodeAffinity,
}

impl PreFilterState {
    fn refresh_min(&mut self, i: usize) {
        self.min_counts[i] = self.counts[i]
            .values()
            .copied()
            .min()
            .unwrap_or(i64::from(i32::MAX));
    }
}

impl super::PodCounts for PreFilterState {
    fn update_with_pod(
        &mut self,
        other: &PodInfo,
        incoming: &PodInfo,
        node: &NodeInfo,
        delta: i64,
    ) {
        if other.namespace() != incoming.namespace()
            || !has_all_topology_keys(node, &self.constraints)
        {
            return;
        }
        for i in 0..self.constraints.len() {
            let c = &self.constraints[i];
            if !c.selector.matches(other.labels())
                || !c.includes_node(incoming, node, &self.required)
            {
                continue;
            }
            add_to_domain(&mut self.counts[i], &node.labels()[&c.topology_key], delta);
            self.refresh_min(i);
        }
    }
}

impl Plugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for PodTopologySpread {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let constraints = match self.constraints(pod, DO_NOT_SCHEDULE) {
            Ok(c) if c.is_empty() => return (None, Status::skip()),
            Ok(c) => c,
            Err(status) => return (None, status),
        };
        let required = RequiredNodeAffinity::of(pod);
        let mut counts = vec![HashMap::new(); constraints.len()];
        for node in snapshot.nodes() {
            if !has_all_topology_keys(node, &constraints) {
                continue;
            }
            for (c, counts) in constraints.iter().zip(&mut counts) {
                if c.includes_node(pod, node, &required) {
                    let matching = count_matching(node, c, pod.namespace());
                    add_to_domain(counts, &node.labels()[&c.topology_key], matching);
                }
            }
        }
        let mut s = PreFilterState {
            min_counts: vec![0; constraints.len()],
            constraints,
            counts,
            required,
        };
        for i in 0..s.constraints.len() {
            s.refresh_min(i);
        }
        state.write(s);
        (None, Status::success())
    }

    fn add_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        added: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        super::count_pod::<PreFilterState>(state, pod, added, node, 1)
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        removed: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        super::count_pod::<PreFilterState>(state, pod, removed, node, -1)
    }
}

impl FilterPlugin for PodTopologySpread {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>() else {
            return Status::error("PodTopologySpread PreFilter state missing");
        };
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = node.labels().get(&c.topology_key) else {
                return Status::unresolvable(ERR_REASON_NODE_LABEL_NOT_MATCH);
            };
            let min = if (s.counts[i].len() as i64) < c.min_domains {
                0
            } else {
                s.min_counts[i]
            };
            let self_match = i64::from(c.selector.matches(pod.labels()));
            let matching = s.counts[i].get(value).copied().unwrap_or(0);
            if matching + self_match - min > c.max_skew {
                return Status::unschedulable(ERR_REASON_CONSTRAINTS_NOT_MATCH);
            }
        }
        Status::success()
    }
}

#[derive(Clone, Debug)]
struct PreScoreState {
    constraints: Vec<Constraint>,
    /// Per constraint (except hostname, counted per node in Score): domain → matching pods.
    counts: Vec<HashMap<String, i64>>,
    weights: Vec<f64>,
    /// Feasible nodes lacking a topology key; they score 0.
    ignored: std::collections::HashSet<String>,
}

impl PreScorePlugin for PodTopologySpread {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        nodes: &[&NodeInfo],
    ) -> Status {
        if nodes.is_empty() || snapshot.num_nodes() == 0 {
            return Status::skip();
        }
        let constraints = match self.constraints(pod, SCHEDULE_ANYWAY) {
            Ok(c) if c.is_empty() => return Status::skip(),
            Ok(c) => c,
            Err(status) => return status,
        };
        // System defaults tolerate nodes without a zone label (hostname spreading still applies).
        let declared = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_ref())
            .is_some_and(|c| !c.is_empty());
        let require_all_keys = declared || !self.system_defaulted;
        let mut ignored = std::collections::HashSet::new();
        let mut counts = vec![HashMap::new(); constraints.len()];
        for node in nodes {
            if require_all_keys && !has_all_topology_keys(node, &constraints) {
                ignored.insert(node.name().to_string());
                continue;
            }
            for (c, counts) in constraints.iter().zip(&mut counts) {
                if c.topology_key == LABEL_HOSTNAME {
                    continue;
                }
                if let Some(value) = node.labels().get(&c.topology_key) {
                    add_to_domain(counts, value, 0);
                }
            }
        }
        let weights = constraints
            .iter()
            .zip(&counts)
            .map(|(c, counts)| {
                let domains = if c.topology_key == LABEL_HOSTNAME {
                    nodes.len() - ignored.len()
                } else {
                    counts.len()
                };
                ((domains + 2) as f64).ln()
            })
            .collect();
        let required = RequiredNodeAffinity::of(pod);
        for (c, counts) in constraints.iter().zip(&mut counts) {
            // Hostname domains are counted per node in Score; an empty selector counts nothing.
            if c.topology_key == LABEL_HOSTNAME || c.selector.is_everything() {
                continue;
            }
            for node in snapshot.nodes_maybe_hosting(&c.label_pairs) {
                if require_all_keys && !has_all_topology_keys(node, &constraints) {
                    continue;
                }
                if !c.includes_node(pod, node, &required) {
                    continue;
                }
                let value = node
                    .labels()
                    .get(&c.topology_key)
                    .map(String::as_str)
                    .unwrap_or("");
                if let Some(count) = counts.get_mut(value) {
                    *count += count_matching(node, c, pod.namespace());
                }
            }
        }
        state.write(PreScoreState {
            constraints,
            counts,
            weights,
            ignored,
        });
        Status::success()
    }
}

impl ScorePlugin for PodTopologySpread {
    /// Raw score: for each constraint, `matching pods in the domain × weight +
    /// (maxSkew - 1)`; lower is better (normalization inverts it).
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let s = state
            .read::<PreScoreState>()
            .ok_or_else(|| Status::error("PodTopologySpread PreScore state missing"))?;
        if s.ignored.contains(node.name()) {
            return Ok(0);
        }
        let mut score = 0.0;
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = node.labels().get(&c.topology_key) else {
                continue;
            };
            let count = if c.topology_key == LABEL_HOSTNAME {
                count_matching(node, c, pod.namespace())
            } else {
                s.counts[i].get(value).copied().unwrap_or(0)
            };
            score += count as f64 * s.weights[i] + (c.max_skew - 1) as f64;
        }
        Ok(score.round() as i64)
    }

    /// Inverts and scales: the least crowded node gets 100; ignored nodes get 0.
    fn normalize_scores(
        &self,
        state: &CycleState,
        _pod: &PodInfo,
        nodes: &[&NodeInfo],
        scores: &mut [i64],
    ) -> Status {
        let Some(s) = state.read::<PreScoreState>() else {
            return Status::success();
        };
        let counted = |i: usize| !s.ignored.contains(nodes[i].name());
        let min = (0..scores.len())
            .filter(|i| counted(*i))
            .map(|i| scores[i])
            .min()
            .unwrap_or(0);
        let max = (0..scores.len())
            .filter(|i| counted(*i))
            .map(|i| scores[i])
            .max()
            .unwrap_or(0);
        for (i, score) in scores.iter_mut().enumerate() {
            *score = if !counted(i) {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - *score) / max
            };
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::testing::{
        PodBuilder, filter_statuses, node, node_with, normalized_scores, pod, snapshot, term,
    };

    const ZONE: &str = LABEL_ZONE;

    fn plugin() -> PodTopologySpread {
        PodTopologySpread::new(PodTopologySpreadArgs::default()).unwrap()
    }

    fn web(name: &str) -> PodBuilder {
        pod(name).label("app", "web")
    }

    /// z1: a (2 web pods), b (1); z2: c (0); plus an unlabelled node.
    fn cluster() -> Snapshot {
        snapshot(vec![
            node_with(node("a").label(ZONE, "z1"), vec![web("w1"), web("w2")]),
            node_with(node("b").label(ZONE, "z1"), vec![web("w3")]),
            node_with(node("c").label(ZONE, "z2"), vec![]),
            node_with(node("d"), vec![]),
        ])
    }

    fn codes(p: PodBuilder, snap: &Snapshot) -> Vec<Code> {
        let pl = plugin();
        filter_statuses(Some(&pl), &pl, p, snap)
            .iter()
            .map(Status::code)
            .collect()
    }

    #[test]
    fn max_skew_by_zone() {
        use Code::*;
        // z1 has 3, z2 has 0: adding to z1 gives skew 4 > 1.
        let p = web("new").spread(1, ZONE, DO_NOT_SCHEDULE, "app", "web");
        assert_eq!(
            codes(p, &cluster()),
            [
                Unschedulable,
                Unschedulable,
                Success,
                UnschedulableAndUnresolvable
            ]
        );
        let pl = plugin();
        let statuses = filter_statuses(
            Some(&pl),
            &pl,
            web("new").spread(1, ZONE, DO_NOT_SCHEDULE, "app", "web"),
            &cluster(),
        );
        assert_eq!(statuses[0].reasons(), [ERR_REASON_CONSTRAINTS_NOT_MATCH]);
        assert_eq!(statuses[3].reasons(), [ERR_REASON_NODE_LABEL_NOT_MATCH]);
        // maxSkew 4 tolerates it; a pod not matching its own selector adds no self-match.
        assert_eq!(
            codes(
                web("new").spread(4, ZONE, DO_NOT_SCHEDULE, "app", "web"),
                &cluster()
            )[0],
            Success
        );
        let outsider = pod("db").spread(3, ZONE, DO_NOT_SCHEDULE, "app", "web");
        assert_eq!(codes(outsider, &cluster())[0], Success);
    }

    #[test]
    fn hostname_spreading_and_min_domains() {
        use Code::*;
        let p = web("new").spread(1, LABEL_HOSTNAME, DO_NOT_SCHEDULE, "app", "web");
        // Per node: a=2, b=1, c=0, d=0 → min 0.
        assert_eq!(
            codes(p, &cluster()),
            [Unschedulable, Unschedulable, Success, Success]
        );

        // Only two zones exist; with minDomains 3 the global minimum counts as 0.
        let snap = snapshot(vec![
            node_with(node("a").label(ZONE, "z1"), vec![web("w1")]),
            node_with(node("c").label(ZONE, "z2"), vec![web("w2")]),
        ]);
        let constraint = |min_domains| TopologySpreadConstraint {
            max_skew: 1,
            min_domains,
            topology_key: ZONE.into(),
            when_unsatisfiable: DO_NOT_SCHEDULE.into(),
            label_selector: Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: Some([("app".to_string(), "web".to_string())].into()),
                    ..Default::default()
                },
            ),
            ..Default::default()
        };
        assert_eq!(
            codes(web("new").spread_constraint(constraint(None)), &snap),
            [Success, Success]
        );
        assert_eq!(
            codes(web("new").spread_constraint(constraint(Some(3))), &snap),
            [Unschedulable, Unschedulable]
        );
    }

    #[test]
    fn node_affinity_policy_limits_domains() {
        use Code::*;
        // Honor (default): z2 is excluded by the nodeSelector, so the minimum
        // comes from z1 alone and z1 stays schedulable.
        let p = web("new")
            .required_node_terms(vec![term(&[(ZONE, "In", &["z1"])])])
            .spread(1, ZONE, DO_NOT_SCHEDULE, "app", "web");
        assert_eq!(codes(p, &cluster())[..2], [Success, Success]);
    }

    #[test]
    fn score_prefers_emptier_domains() {
        let pl = plugin();
        let p = web("new").spread(1, ZONE, SCHEDULE_ANYWAY, "app", "web");
        // Filter does not apply ScheduleAnyway constraints.
        assert!(codes(p, &cluster()).iter().all(|c| *c == Code::Success));
        let p = web("new").spread(1, ZONE, SCHEDULE_ANYWAY, "app", "web");
        // Two zones → weight ln 4; raw z1 = round(3 × 1.386) = 4, z2 = 0; node d lacks the key.
        // normalized: 100 × (4 + 0 - s) / 4.
        assert_eq!(
            normalized_scores(Some(&pl), &pl, p, &cluster()),
            vec![0, 0, 100, 0]
        );
    }

    #[test]
    fn system_defaults_apply_to_workload_pods() {
        let pl = plugin();
        // Not owned by a workload: nothing to spread.
        let scores = normalized_scores(Some(&pl), &pl, web("bare"), &cluster());
        assert_eq!(scores, vec![0, 0, 0, 0]);
        // Owned by a ReplicaSet: hostname (maxSkew 3) and zone (maxSkew 5) apply,
        // and node d (no zone label) still takes part through hostname spreading.
        let scores =
            normalized_scores(Some(&pl), &pl, web("owned").owner("ReplicaSet"), &cluster());
        assert_eq!(scores.len(), 4);
        assert!(scores[2] > scores[0] && scores[3] > scores[0], "{scores:?}");
        assert!(scores[0] < scores[1], "{scores:?}");
    }

    #[test]
    fn match_label_keys_narrow_the_selector() {
        use Code::*;
        let snap = snapshot(vec![
            node_with(
                node("a").label(ZONE, "z1"),
                vec![web("old").label("rev", "1"), web("old2").label("rev", "1")],
            ),
            node_with(node("c").label(ZONE, "z2"), vec![]),
        ]);
        let mut c = TopologySpreadConstraint {
            max_skew: 1,
            topology_key: ZONE.into(),
            when_unsatisfiable: DO_NOT_SCHEDULE.into(),
            label_selector: Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: Some([("app".to_string(), "web".to_string())].into()),
                    ..Default::default()
                },
            ),
            ..Default::default()
        };
        assert_eq!(
            codes(
                web("new").label("rev", "2").spread_constraint(c.clone()),
                &snap
            ),
            [Unschedulable, Success]
        );
        c.match_label_keys = Some(vec!["rev".into()]);
        assert_eq!(
            codes(web("new").label("rev", "2").spread_constraint(c), &snap),
            [Success, Success]
        );
    }
}
