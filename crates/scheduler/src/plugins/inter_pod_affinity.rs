//! InterPodAffinity: places pods relative to other pods by topology domain.
//!
//! Filter enforces three rules: the incoming pod's required affinity (some pod
//! matching *all* its terms must run in the node's domain — unless no such pod
//! exists anywhere and the pod matches its own terms, so the first replica of a
//! self-affine group can start), its required anti-affinity (no matching pod in
//! the domain), and the required anti-affinity of pods already running (they
//! must not select the incoming pod within their domain).
//!
//! All three are precomputed in PreFilter as counts per (topology key, value),
//! so Filter is a few hash lookups per node. Preferred terms (both the incoming
//! pod's and existing pods', plus existing pods' required affinity at
//! `hardPodAffinityWeight`) become per-domain scores in PreScore.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use crate::framework::{
    AffinityTerm, CycleState, FilterPlugin, MAX_NODE_SCORE, NodeInfo, Plugin, PodInfo,
    PreFilterPlugin, PreFilterResult, PreScorePlugin, ScorePlugin, Snapshot, Status,
    WeightedAffinityTerm,
};
use crate::selector::Selector;

pub const NAME: &str = "InterPodAffinity";
pub const ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";
pub const ERR_REASON_AFFINITY_RULES_NOT_MATCH: &str = "node(s) didn't match pod affinity rules";
pub const ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH: &str =
    "node(s) didn't match pod anti-affinity rules";

/// `InterPodAffinityArgs`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterPodAffinityArgs {
    /// Score credit for existing pods' *required* affinity matching the incoming pod.
    #[serde(default = "default_hard_weight")]
    pub hard_pod_affinity_weight: i32,
    /// Skip scoring entirely for pods without preferred terms of their own
    /// (existing pods' preferences are then not considered).
    #[serde(default)]
    pub ignore_preferred_terms_of_existing_pods: bool,
}

fn default_hard_weight() -> i32 {
    1
}

impl Default for InterPodAffinityArgs {
    fn default() -> Self {
        InterPodAffinityArgs {
            hard_pod_affinity_weight: default_hard_weight(),
            ignore_preferred_terms_of_existing_pods: false,
        }
    }
}

pub struct InterPodAffinity {
    args: InterPodAffinityArgs,
}

impl InterPodAffinity {
    pub fn new(args: InterPodAffinityArgs) -> Result<Self, String> {
        if !(0..=100).contains(&args.hard_pod_affinity_weight) {
            return Err(format!(
                "hardPodAffinityWeight {} is not within [0, 100]",
                args.hard_pod_affinity_weight
            ));
        }
        Ok(InterPodAffinity { args })
    }
}

/// Counts (or scores) per topology key, then per value. Nested so lookups by a
/// node's `&str` labels need no allocation; zero entries are removed so
/// emptiness means "nothing counted".
#[derive(Clone, Debug, Default)]
struct TopologyCounts(HashMap<String, HashMap<String, i64>>);

impl TopologyCounts {
    fn add(&mut self, key: &str, value: &str, delta: i64) {
        // Look up by &str first: allocating owned keys only for new entries.
        let values = match self.0.get_mut(key) {
            Some(values) => values,
            None => self.0.entry(key.to_string()).or_default(),
        };
        let count = match values.get_mut(value) {
            Some(count) => count,
            None => values.entry(value.to_string()).or_insert(0),
        };
        *count += delta;
        if *count == 0 {
            values.remove(value);
            if values.is_empty() {
                self.0.remove(key);
            }
        }
    }

    fn get(&self, key: &str, value: &str) -> i64 {
        self.0
            .get(key)
            .and_then(|v| v.get(value))
            .copied()
            .unwrap_or(0)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `delta` to the node's domain of every term that selects `pod`.
    fn add_matching_terms<'t>(
        &mut self,
        terms: impl IntoIterator<Item = &'t AffinityTerm>,
        pod: &PodInfo,
        namespace_labels: &BTreeMap<String, String>,
        node: &NodeInfo,
        delta: i64,
    ) {
        for term in terms {
            if let Some(value) = node.labels().get(&term.topology_key)
                && term.matches(&pod.pod, namespace_labels)
            {
                self.add(&term.topology_key, value, delta);
            }
        }
    }

    /// Adds `delta` to the node's domain of every term, if `pod` matches all terms.
    fn add_if_all_terms_match(
        &mut self,
        terms: &[AffinityTerm],
        pod: &PodInfo,
        node: &NodeInfo,
        delta: i64,
    ) {
        if !matches_all_terms(terms, pod) {
            return;
        }
        for term in terms {
            if let Some(value) = node.labels().get(&term.topology_key) {
                self.add(&term.topology_key, value, delta);
            }
        }
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Whether `pod` satisfies every (namespace-resolved) term; false for no terms.
fn matches_all_terms(terms: &[AffinityTerm], pod: &PodInfo) -> bool {
    !terms.is_empty() && terms.iter().all(|t| t.matches(&pod.pod, &NO_LABELS))
}

/// Turns the incoming pod's `namespaceSelector` into explicit namespaces (from
/// the snapshot's namespace labels), so matching existing pods needs no lookup.
/// An empty selector (all namespaces) is kept as is.
fn resolve_namespaces(term: &AffinityTerm, snapshot: &Snapshot) -> AffinityTerm {
    let mut term = term.clone();
    if !term.namespace_selector.is_everything() {
        term.namespaces.extend(
            snapshot
                .namespaces_matching(&term.namespace_selector)
                .map(str::to_string),
        );
        term.namespace_selector = Selector::Nothing;
    }
    term
}

fn resolve_weighted(
    terms: &[WeightedAffinityTerm],
    snapshot: &Snapshot,
) -> Vec<WeightedAffinityTerm> {
    terms
        .iter()
        .map(|w| WeightedAffinityTerm {
            term: resolve_namespaces(&w.term, snapshot),
            weight: w.weight,
        })
        .collect()
}

#[derive(Clone, Debug)]
struct PreFilterState {
    affinity_terms: Vec<AffinityTerm>,
    anti_affinity_terms: Vec<AffinityTerm>,
    namespace_labels: BTreeMap<String, String>,
    /// Domains where an existing pod's required anti-affinity selects the incoming pod.
    existing_anti_affinity: TopologyCounts,
    /// Domains with pods matching all of the incoming pod's affinity terms.
    affinity: TopologyCounts,
    /// Domains with pods matching the incoming pod's anti-affinity terms.
    anti_affinity: TopologyCounts,
}

impl super::PodCounts for PreFilterState {
    fn update_with_pod(
        &mut self,
        other: &PodInfo,
        incoming: &PodInfo,
        node: &NodeInfo,
        delta: i64,
    ) {
        self.existing_anti_affinity.add_matching_terms(
            &other.required_anti_affinity,
            incoming,
            &self.namespace_labels,
            node,
            delta,
        );
        self.affinity
            .add_if_all_terms_match(&self.affinity_terms, other, node, delta);
        self.anti_affinity.add_matching_terms(
            &self.anti_affinity_terms,
            other,
            &NO_LABELS,
            node,
            delta,
        );
    }
}

impl Plugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for InterPodAffinity {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        if let Some(e) = &pod.parse_error {
            return (None, Status::unresolvable(format!("parsing pod: {e}")));
        }
        let mut s = PreFilterState {
            affinity_terms: pod
                .required_affinity
                .iter()
                .map(|t| resolve_namespaces(t, snapshot))
                .collect(),
            anti_affinity_terms: pod
                .required_anti_affinity
                .iter()
                .map(|t| resolve_namespaces(t, snapshot))
                .collect(),
            namespace_labels: snapshot.namespace_labels(pod.namespace()).clone(),
            existing_anti_affinity: TopologyCounts::default(),
            affinity: TopologyCounts::default(),
            anti_affinity: TopologyCounts::default(),
        };
        for node in snapshot.nodes_with_required_anti_affinity_pods() {
            for existing in node.pods_with_required_anti_affinity() {
                s.existing_anti_affinity.add_matching_terms(
                    &existing.required_anti_affinity,
                    pod,
                    &s.namespace_labels,
                    node,
                    1,
                );
            }
        }
        if !s.affinity_terms.is_empty() || !s.anti_affinity_terms.is_empty() {
            // A pod matching all affinity terms carries every term's label pairs.
            let all_pairs: Vec<u64> = s
                .affinity_terms
                .iter()
                .flat_map(|t| t.label_pairs.iter().copied())
                .collect();
            if !s.affinity_terms.is_empty() {
                for node in snapshot.nodes_maybe_hosting(&all_pairs) {
                    for existing in node.pods() {
                        s.affinity
                            .add_if_all_terms_match(&s.affinity_terms, existing, node, 1);
                    }
                }
            }
            for term in &s.anti_affinity_terms {
                for node in snapshot.nodes_maybe_hosting(&term.label_pairs) {
                    for existing in node.pods() {
                        s.anti_affinity
                            .add_matching_terms([term], existing, &NO_LABELS, node, 1);
                    }
                }
            }
        } else if s.existing_anti_affinity.is_empty() {
            return (None, Status::skip());
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

impl FilterPlugin for InterPodAffinity {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>() else {
            return Status::error("InterPodAffinity PreFilter state missing");
        };
        if !satisfies_pod_affinity(s, pod, node) {
            return Status::unresolvable(ERR_REASON_AFFINITY_RULES_NOT_MATCH);
        }
        let labels = node.labels();
        let in_domain = |counts: &TopologyCounts, key: &str| {
            labels.get(key).is_some_and(|v| counts.get(key, v) > 0)
        };
        if s.anti_affinity_terms
            .iter()
            .any(|t| in_domain(&s.anti_affinity, &t.topology_key))
        {
            return Status::unschedulable(ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH);
        }
        if s.existing_anti_affinity
            .0
            .keys()
            .any(|key| in_domain(&s.existing_anti_affinity, key))
        {
            return Status::unschedulable(ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH);
        }
        Status::success()
    }
}

fn satisfies_pod_affinity(s: &PreFilterState, pod: &PodInfo, node: &NodeInfo) -> bool {
    let mut pods_exist = true;
    for term in &s.affinity_terms {
        // Every term's topology label must be on the node.
        let Some(value) = node.labels().get(&term.topology_key) else {
            return false;
        };
        if s.affinity.get(&term.topology_key, value) <= 0 {
            pods_exist = false;
        }
    }
    // The first pod of a group with affinity to itself has nobody to join.
    pods_exist || (s.affinity.is_empty() && matches_all_terms(&s.affinity_terms, pod))
}

#[derive(Clone, Debug)]
struct PreScoreState {
    topology_score: TopologyCounts,
}

/// Adds `weight` to the node's domain if `term` selects `target`.
fn credit_term(
    scores: &mut TopologyCounts,
    term: &AffinityTerm,
    weight: i64,
    target: &PodInfo,
    namespace_labels: &BTreeMap<String, String>,
    node: &NodeInfo,
) {
    if let Some(value) = node.labels().get(&term.topology_key)
        && weight != 0
        && term.matches(&target.pod, namespace_labels)
    {
        scores.add(&term.topology_key, value, weight);
    }
}

impl InterPodAffinity {
    /// What `existing`'s own terms (required affinity at `hardPodAffinityWeight`,
    /// preferred affinity and anti-affinity) say about the incoming pod.
    fn score_existing_pod_rules(
        &self,
        scores: &mut TopologyCounts,
        incoming: &PodInfo,
        namespace_labels: &BTreeMap<String, String>,
        existing: &PodInfo,
        node: &NodeInfo,
    ) {
        let hard_weight = i64::from(self.args.hard_pod_affinity_weight);
        for term in &existing.required_affinity {
            credit_term(scores, term, hard_weight, incoming, namespace_labels, node);
        }
        for w in &existing.preferred_affinity {
            credit_term(
                scores,
                &w.term,
                i64::from(w.weight),
                incoming,
                namespace_labels,
                node,
            );
        }
        for w in &existing.preferred_anti_affinity {
            credit_term(
                scores,
                &w.term,
                -i64::from(w.weight),
                incoming,
                namespace_labels,
                node,
            );
        }
    }
}

impl PreScorePlugin for InterPodAffinity {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        _nodes: &[&NodeInfo],
    ) -> Status {
        let has_constraints =
            !pod.preferred_affinity.is_empty() || !pod.preferred_anti_affinity.is_empty();
        if self.args.ignore_preferred_terms_of_existing_pods && !has_constraints {
            return Status::skip();
        }
        if let Some(e) = &pod.parse_error {
            return Status::error(format!("parsing pod: {e}"));
        }
        let preferred_affinity = resolve_weighted(&pod.preferred_affinity, snapshot);
        let preferred_anti_affinity = resolve_weighted(&pod.preferred_anti_affinity, snapshot);
        let namespace_labels = snapshot.namespace_labels(pod.namespace());
        let mut scores = TopologyCounts::default();
        // Existing pods' own rules about the incoming pod: only pods with affinity have any.
        for node in snapshot.nodes_with_affinity_pods() {
            for existing in node.pods_with_affinity() {
                self.score_existing_pod_rules(&mut scores, pod, namespace_labels, existing, node);
            }
        }
        // The incoming pod's preferences about existing pods, skipping nodes
        // where no pod can match a term.
        let weighted = preferred_affinity
            .iter()
            .map(|w| (w, 1))
            .chain(preferred_anti_affinity.iter().map(|w| (w, -1)));
        for (w, sign) in weighted {
            let weight = sign * i64::from(w.weight);
            for node in snapshot.nodes_maybe_hosting(&w.term.label_pairs) {
                for existing in node.pods() {
                    credit_term(&mut scores, &w.term, weight, existing, &NO_LABELS, node);
                }
            }
        }
        if scores.is_empty() {
            return Status::skip();
        }
        state.write(PreScoreState {
            topology_score: scores,
        });
        Status::success()
    }
}

impl ScorePlugin for InterPodAffinity {
    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let s = state
            .read::<PreScoreState>()
            .ok_or_else(|| Status::error("InterPodAffinity PreScore state missing"))?;
        let labels = node.labels();
        Ok(s.topology_score
            .0
            .iter()
            .filter_map(|(key, values)| values.get(labels.get(key)?))
            .sum())
    }

    /// Maps the raw (possibly negative) scores linearly onto 0..=100.
    fn normalize_scores(
        &self,
        _state: &CycleState,
        _pod: &PodInfo,
        _nodes: &[&NodeInfo],
        scores: &mut [i64],
    ) -> Status {
        let (Some(&min), Some(&max)) = (scores.iter().min(), scores.iter().max()) else {
            return Status::success();
        };
        for s in scores.iter_mut() {
            *s = if max > min {
                (MAX_NODE_SCORE as f64 * ((*s - min) as f64 / (max - min) as f64)) as i64
            } else {
                0
            };
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::PodAffinityTerm;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;
    use crate::framework::Code;
    use crate::testing::{
        PodBuilder, filter_statuses, node, node_with, normalized_scores, pod, snapshot,
    };

    const ZONE: &str = "topology.kubernetes.io/zone";

    fn plugin() -> InterPodAffinity {
        InterPodAffinity::new(InterPodAffinityArgs::default()).unwrap()
    }

    fn zones(pods_in_z1: Vec<PodBuilder>) -> Snapshot {
        snapshot(vec![
            node_with(node("a").label(ZONE, "z1"), pods_in_z1),
            node_with(node("b").label(ZONE, "z1"), vec![]),
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
    fn required_affinity_follows_matching_pods_by_zone() {
        let snap = zones(vec![pod("db").label("app", "db")]);
        let p = pod("web").pod_affinity_required("app", "db", ZONE);
        use Code::*;
        assert_eq!(
            codes(p, &snap),
            [
                Success,
                Success,
                UnschedulableAndUnresolvable,
                UnschedulableAndUnresolvable
            ]
        );
        let pl = plugin();
        let statuses = filter_statuses(
            Some(&pl),
            &pl,
            pod("web").pod_affinity_required("app", "db", ZONE),
            &snap,
        );
        assert_eq!(statuses[2].reasons(), [ERR_REASON_AFFINITY_RULES_NOT_MATCH]);
    }

    #[test]
    fn first_pod_of_a_self_affine_group_may_start_anywhere_labelled() {
        let snap = zones(vec![]);
        use Code::*;
        let self_affine = pod("p")
            .label("app", "cache")
            .pod_affinity_required("app", "cache", ZONE);
        assert_eq!(
            codes(self_affine, &snap),
            [Success, Success, Success, UnschedulableAndUnresolvable]
        );
        let other = pod("p")
            .label("app", "web")
            .pod_affinity_required("app", "cache", ZONE);
        assert!(
            codes(other, &snap)
                .iter()
                .all(|c| *c == UnschedulableAndUnresolvable)
        );
    }

    #[test]
    fn required_anti_affinity_both_directions() {
        use Code::*;
        let snap = zones(vec![pod("web-1").label("app", "web")]);
        let p = pod("web-2")
            .label("app", "web")
            .pod_anti_affinity_required("app", "web", ZONE);
        assert_eq!(
            codes(p, &snap),
            [Unschedulable, Unschedulable, Success, Success]
        );

        // An existing pod's anti-affinity keeps matching pods out of its zone.
        let snap = zones(vec![
            pod("loner").pod_anti_affinity_required("app", "web", ZONE),
        ]);
        let pl = plugin();
        let statuses = filter_statuses(Some(&pl), &pl, pod("web").label("app", "web"), &snap);
        assert_eq!(
            statuses[0].reasons(),
            [ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH]
        );
        assert_eq!(statuses[1].code(), Unschedulable);
        assert!(statuses[2].is_success() && statuses[3].is_success());
        // A pod it does not select is unaffected (and the plugin skips entirely).
        let mut state = CycleState::default();
        let unrelated = pod("x").label("app", "db").info();
        assert!(
            pl.pre_filter(&mut state, &unrelated, &zones(vec![]))
                .1
                .is_skip()
        );
    }

    #[test]
    fn namespaces_and_namespace_selectors() {
        use Code::*;
        let existing = pod("db").namespace("prod").label("app", "db");
        // Default: only the pod's own namespace is searched.
        let snap = zones(vec![existing]);
        let same_ns_only = pod("web").pod_affinity_required("app", "db", ZONE);
        assert_eq!(codes(same_ns_only, &snap)[0], UnschedulableAndUnresolvable);

        let by_selector = pod("web").pod_affinity_required_term(PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), "db".to_string())].into()),
                ..Default::default()
            }),
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("env".to_string(), "prod".to_string())].into()),
                ..Default::default()
            }),
            topology_key: ZONE.into(),
            ..Default::default()
        });
        let nodes = vec![node_with(
            node("a").label(ZONE, "z1"),
            vec![pod("db").namespace("prod").label("app", "db")],
        )];
        let namespaces = HashMap::from([(
            "prod".to_string(),
            [("env".to_string(), "prod".to_string())].into(),
        )]);
        let snap = Snapshot::new(nodes.into_iter().map(Arc::new).collect(), namespaces);
        assert_eq!(codes(by_selector, &snap), [Success]);
    }

    #[test]
    fn preferred_terms_score_domains() {
        let snap = snapshot(vec![
            node_with(
                node("a").label(ZONE, "z1"),
                vec![pod("db").label("app", "db")],
            ),
            node_with(node("b").label(ZONE, "z1"), vec![]),
            node_with(
                node("c").label(ZONE, "z2"),
                vec![pod("web").label("app", "web")],
            ),
        ]);
        let pl = plugin();
        let p = pod("p")
            .pod_affinity_preferred(10, "app", "db", ZONE)
            .pod_anti_affinity_preferred(5, "app", "web", ZONE);
        // Raw: z1 = +10, z2 = -5 → normalized 100, 100, 0.
        assert_eq!(
            normalized_scores(Some(&pl), &pl, p, &snap),
            vec![100, 100, 0]
        );

        // An existing pod's preferred anti-affinity pushes matching pods away.
        let snap = snapshot(vec![
            node_with(
                node("a").label(ZONE, "z1"),
                vec![pod("x").pod_anti_affinity_preferred(50, "app", "web", ZONE)],
            ),
            node_with(node("b").label(ZONE, "z2"), vec![]),
        ]);
        let scores = normalized_scores(Some(&pl), &pl, pod("w").label("app", "web"), &snap);
        assert_eq!(scores, vec![0, 100]);
    }

    #[test]
    fn prefilter_extensions_track_victims() {
        let snap = zones(vec![pod("web-1").label("app", "web")]);
        let pl = plugin();
        let incoming = pod("web-2")
            .label("app", "web")
            .pod_anti_affinity_required("app", "web", ZONE)
            .info();
        let mut state = CycleState::default();
        assert!(pl.pre_filter(&mut state, &incoming, &snap).1.is_success());
        let a = &snap.nodes()[0];
        assert_eq!(pl.filter(&state, &incoming, a).code(), Code::Unschedulable);
        let victim = a.pods()[0].clone();
        let mut without = (**a).clone();
        without.remove_pod(&victim.pod);
        pl.remove_pod(&mut state, &incoming, &victim, &without);
        assert!(pl.filter(&state, &incoming, &without).is_success());
        pl.add_pod(&mut state, &incoming, &victim, a);
        assert_eq!(pl.filter(&state, &incoming, a).code(), Code::Unschedulable);
    }
}
