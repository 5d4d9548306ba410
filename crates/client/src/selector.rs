//! Label selectors, node selector terms and toleration matching, as the scheduler and the
//! DaemonSet controller evaluate them (upstream's `component-helpers/scheduling`).
//!
//! These are parsed once (when a pod enters the cache or a cycle starts) into
//! matchers that evaluate without allocating, since filters run them against
//! thousands of nodes per pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The only field a node selector term may match on.
pub const NODE_NAME_FIELD: &str = "metadata.name";

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// The labels of an object, or an empty map when it has none.
pub fn labels_or_empty(labels: &Option<BTreeMap<String, String>>) -> &BTreeMap<String, String> {
    labels.as_ref().unwrap_or(&NO_LABELS)
}

/// A stable 64-bit FNV-1a hash of a label `key=value` pair. Collisions only
/// make an index lookup answer "maybe", never "no", so they are harmless.
pub fn label_pair_hash(key: &str, value: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key
        .bytes()
        .chain(std::iter::once(0xff))
        .chain(value.bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// A selector that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid requirement on {key:?}: {reason}")]
pub struct SelectorError {
    pub key: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

/// One `key <op> values` clause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    op: Operator,
    values: Vec<String>,
}

impl Requirement {
    pub fn new(key: &str, operator: &str, values: &[String]) -> Result<Self, SelectorError> {
        let err = |reason| SelectorError {
            key: key.to_string(),
            reason,
        };
        let integer = || -> Result<i64, SelectorError> {
            match values {
                [v] => v.parse().map_err(|_| err("value must be an integer")),
                _ => Err(err("exactly one value is required")),
            }
        };
        let op = match operator {
            "In" | "NotIn" if values.is_empty() => return Err(err("values must be non-empty")),
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(err("values must be empty"));
            }
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt(integer()?),
            "Lt" => Operator::Lt(integer()?),
            _ => return Err(err("unknown operator")),
        };
        Ok(Requirement {
            key: key.to_string(),
            op,
            values: values.to_vec(),
        })
    }

    /// `key == value`, as produced by `matchLabels` or `nodeSelector`.
    pub fn equals(key: &str, value: &str) -> Self {
        Requirement {
            key: key.to_string(),
            op: Operator::In,
            values: vec![value.to_string()],
        }
    }

    /// Evaluates against the value the object has for `key`, if any.
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        let contains = |v: &str| self.values.iter().any(|x| x == v);
        match (&self.op, value) {
            (Operator::In, Some(v)) => contains(v),
            (Operator::In, None) => false,
            (Operator::NotIn, Some(v)) => !contains(v),
            (Operator::NotIn, None) => true,
            (Operator::Exists, v) => v.is_some(),
            (Operator::DoesNotExist, v) => v.is_none(),
            (Operator::Gt(bound), Some(v)) => v.parse::<i64>().is_ok_and(|n| n > *bound),
            (Operator::Lt(bound), Some(v)) => v.parse::<i64>().is_ok_and(|n| n < *bound),
            (Operator::Gt(_) | Operator::Lt(_), None) => false,
        }
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_value(labels.get(&self.key).map(String::as_str))
    }
}

/// A parsed `metav1.LabelSelector`.
///
/// A missing selector selects nothing; an empty one (`{}`) selects everything,
/// exactly as `metav1.LabelSelectorAsSelector` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Nothing,
    /// All requirements must hold; an empty list selects everything.
    All(Vec<Requirement>),
}

impl Selector {
    pub fn everything() -> Self {
        Selector::All(Vec::new())
    }

    pub fn parse(selector: Option<&LabelSelector>) -> Result<Self, SelectorError> {
        let Some(selector) = selector else {
            return Ok(Selector::Nothing);
        };
        let mut requirements: Vec<Requirement> = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::equals(k, v))
            .collect();
        for expr in selector.match_expressions.iter().flatten() {
            let values = expr.values.as_deref().unwrap_or_default();
            let requirement = Requirement::new(&expr.key, &expr.operator, values)?;
            if matches!(requirement.op, Operator::Gt(_) | Operator::Lt(_)) {
                return Err(SelectorError {
                    key: expr.key.clone(),
                    reason: "label selectors only support In, NotIn, Exists and DoesNotExist",
                });
            }
            requirements.push(requirement);
        }
        Ok(Selector::All(requirements))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Selector::Nothing => false,
            Selector::All(reqs) => reqs.iter().all(|r| r.matches(labels)),
        }
    }

    /// True for the selector that matches every object.
    pub fn is_everything(&self) -> bool {
        matches!(self, Selector::All(reqs) if reqs.is_empty())
    }

    /// Hashes of the `key=value` pairs every selected object must carry (from
    /// single-value `In` requirements). A node whose pod label index lacks one of
    /// them cannot host a matching pod, which lets counting skip most nodes.
    pub fn required_label_pairs(&self) -> Vec<u64> {
        match self {
            Selector::Nothing => Vec::new(),
            Selector::All(reqs) => reqs
                .iter()
                .filter(|r| r.op == Operator::In)
                .filter_map(|r| match r.values.as_slice() {
                    [value] => Some(label_pair_hash(&r.key, value)),
                    _ => None,
                })
                .collect(),
        }
    }

    /// Adds a requirement (used to merge `matchLabelKeys` into a selector).
    pub fn and(self, requirement: Requirement) -> Self {
        match self {
            Selector::Nothing => Selector::Nothing,
            Selector::All(mut reqs) => {
                reqs.push(requirement);
                Selector::All(reqs)
            }
        }
    }
}

/// One parsed node selector term: label and field requirements, all of which must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelectorTermMatcher {
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

impl NodeSelectorTermMatcher {
    /// Parses a term; an empty term is `None` because it selects no node.
    pub fn parse(term: &NodeSelectorTerm) -> Result<Option<Self>, SelectorError> {
        let parse_all = |reqs: &Option<Vec<NodeSelectorRequirement>>, fields: bool| {
            reqs.iter()
                .flatten()
                .map(|r| {
                    if fields && r.key != NODE_NAME_FIELD {
                        return Err(SelectorError {
                            key: r.key.clone(),
                            reason: "only metadata.name is supported as a node field",
                        });
                    }
                    if fields && !matches!(r.operator.as_str(), "In" | "NotIn") {
                        return Err(SelectorError {
                            key: r.key.clone(),
                            reason: "node fields support only In and NotIn",
                        });
                    }
                    Requirement::new(&r.key, &r.operator, r.values.as_deref().unwrap_or_default())
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let labels = parse_all(&term.match_expressions, false)?;
        let fields = parse_all(&term.match_fields, true)?;
        if labels.is_empty() && fields.is_empty() {
            return Ok(None);
        }
        Ok(Some(NodeSelectorTermMatcher { labels, fields }))
    }

    pub fn matches(&self, node: &Node) -> bool {
        let labels = labels_or_empty(&node.metadata.labels);
        let name = node.metadata.name.as_deref();
        self.labels.iter().all(|r| r.matches(labels))
            && self.fields.iter().all(|r| r.matches_value(name))
    }

    /// Node names this term pins the pod to through `metadata.name In [...]`.
    pub fn pinned_node_names(&self) -> Option<Vec<&str>> {
        let mut pinned: Option<Vec<&str>> = None;
        for r in self.fields.iter().filter(|r| r.op == Operator::In) {
            let names: Vec<&str> = r.values.iter().map(String::as_str).collect();
            pinned = Some(match pinned {
                None => names,
                Some(prev) => prev.into_iter().filter(|n| names.contains(n)).collect(),
            });
        }
        pinned
    }
}

/// A parsed `requiredDuringScheduling…` node selector: the terms are ORed.
///
/// Terms that fail to parse are dropped (and logged): they can never match, which
/// is what kube-scheduler does when it "ignores parsing errors for backwards
/// compatibility".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelectorMatcher {
    terms: Vec<NodeSelectorTermMatcher>,
}

impl NodeSelectorMatcher {
    pub fn parse(selector: &NodeSelector) -> Self {
        let terms = selector
            .node_selector_terms
            .iter()
            .filter_map(|t| {
                NodeSelectorTermMatcher::parse(t).unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "dropping invalid node selector term");
                    None
                })
            })
            .collect();
        NodeSelectorMatcher { terms }
    }

    pub fn matches(&self, node: &Node) -> bool {
        self.terms.iter().any(|t| t.matches(node))
    }

    pub fn terms(&self) -> &[NodeSelectorTermMatcher] {
        &self.terms
    }
}

/// Whether a toleration tolerates a taint: same effect (or any), same key (or
/// any), and `Equal` values or `Exists`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    if let Some(key) = toleration.key.as_deref().filter(|k| !k.is_empty())
        && key != taint.key
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        "Exists" => true,
        _ => false,
    }
}

/// The first taint selected by `relevant` that no toleration tolerates.
pub fn find_untolerated_taint<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    relevant: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| relevant(t))
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

/// Taints that keep new pods off a node: `NoSchedule` and `NoExecute`.
pub fn is_do_not_schedule_taint(taint: &Taint) -> bool {
    taint.effect == "NoSchedule" || taint.effect == "NoExecute"
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn values(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn requirement_operators() {
        let l = labels(&[("zone", "a"), ("cores", "8")]);
        assert!(
            Requirement::new("zone", "In", &values(&["a", "b"]))
                .unwrap()
                .matches(&l)
        );
        assert!(
            !Requirement::new("zone", "NotIn", &values(&["a"]))
                .unwrap()
                .matches(&l)
        );
        assert!(
            Requirement::new("missing", "NotIn", &values(&["a"]))
                .unwrap()
                .matches(&l)
        );
        assert!(Requirement::new("zone", "Exists", &[]).unwrap().matches(&l));
        assert!(
            Requirement::new("missing", "DoesNotExist", &[])
                .unwrap()
                .matches(&l)
        );
        assert!(
            Requirement::new("cores", "Gt", &values(&["4"]))
                .unwrap()
                .matches(&l)
        );
        assert!(
            !Requirement::new("cores", "Lt", &values(&["8"]))
                .unwrap()
                .matches(&l)
        );
        assert!(
            !Requirement::new("zone", "Gt", &values(&["1"]))
                .unwrap()
                .matches(&l)
        );
        assert!(Requirement::new("cores", "Gt", &values(&["x"])).is_err());
        assert!(Requirement::new("zone", "In", &[]).is_err());
        assert!(Requirement::new("zone", "Exists", &values(&["a"])).is_err());
    }

    #[test]
    fn nil_selector_matches_nothing_and_empty_matches_everything() {
        let l = labels(&[("app", "web")]);
        assert!(!Selector::parse(None).unwrap().matches(&l));
        let empty = Selector::parse(Some(&LabelSelector::default())).unwrap();
        assert!(empty.is_everything() && empty.matches(&l));
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "DoesNotExist".into(),
                values: None,
            }]),
        };
        assert!(Selector::parse(Some(&sel)).unwrap().matches(&l));
    }

    #[test]
    fn toleration_matching() {
        let taint = Taint {
            key: "k".into(),
            value: Some("v".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        };
        let tol = |key: Option<&str>,
                   op: Option<&str>,
                   value: Option<&str>,
                   effect: Option<&str>| Toleration {
            key: key.map(Into::into),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        };
        assert!(tolerates(&tol(Some("k"), None, Some("v"), None), &taint));
        assert!(!tolerates(&tol(Some("k"), None, Some("w"), None), &taint));
        assert!(tolerates(
            &tol(Some("k"), Some("Exists"), None, Some("NoSchedule")),
            &taint
        ));
        assert!(!tolerates(
            &tol(Some("k"), Some("Exists"), None, Some("NoExecute")),
            &taint
        ));
        assert!(tolerates(&tol(None, Some("Exists"), None, None), &taint));
    }
}
