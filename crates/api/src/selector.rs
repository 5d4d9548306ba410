//! Label and field selectors, parsed from the `labelSelector` and `fieldSelector` query
//! parameters with upstream syntax and matched against an object's labels or fields.
//!
//! Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, joined
//! by commas (all must hold). Field selectors: `f=v`, `f==v`, `f!=v`, joined by commas.

use std::collections::BTreeMap;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl LabelRequirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            LabelRequirement::Equals(k, v) => labels.get(k) == Some(v),
            LabelRequirement::NotEquals(k, v) => labels.get(k) != Some(v),
            LabelRequirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            LabelRequirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            LabelRequirement::Exists(k) => labels.contains_key(k),
            LabelRequirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelRequirement>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub struct SelectorError(pub String);

/// An object's `metadata.labels` (none when it has none), as selectors match them.
pub fn object_labels(obj: &serde_json::Value) -> BTreeMap<String, String> {
    obj["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(parse_label_term(term)?);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }

    /// Builds the selector a `metav1.LabelSelector` (matchLabels + matchExpressions) means.
    pub fn from_label_selector_json(sel: &serde_json::Value) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if let Some(map) = sel.get("matchLabels").and_then(|m| m.as_object()) {
            for (k, v) in map {
                let v = v.as_str().ok_or_else(|| SelectorError(k.clone()))?;
                reqs.push(LabelRequirement::Equals(k.clone(), v.to_string()));
            }
        }
        for expr in sel
            .get("matchExpressions")
            .and_then(|m| m.as_array())
            .into_iter()
            .flatten()
        {
            let key = expr["key"].as_str().unwrap_or_default().to_string();
            let values: Vec<String> = expr["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            reqs.push(match expr["operator"].as_str() {
                Some("In") => LabelRequirement::In(key, values),
                Some("NotIn") => LabelRequirement::NotIn(key, values),
                Some("Exists") => LabelRequirement::Exists(key),
                Some("DoesNotExist") => LabelRequirement::DoesNotExist(key),
                other => {
                    return Err(SelectorError(format!(
                        "{other:?} is not a valid label selector operator"
                    )));
                }
            });
        }
        Ok(LabelSelector(reqs))
    }
}

/// Splits on commas that are not inside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_label_term(term: &str) -> Result<LabelRequirement, SelectorError> {
    let err = || SelectorError(term.to_string());
    if let Some(key) = term.strip_prefix('!') {
        return Ok(LabelRequirement::DoesNotExist(valid_key(key.trim(), term)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(LabelRequirement::NotEquals(
            valid_key(k.trim(), term)?,
            v.trim().to_string(),
        ));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(LabelRequirement::Equals(
            valid_key(k.trim(), term)?,
            v.trim().to_string(),
        ));
    }
    for (op, notin) in [(" notin ", true), (" in ", false)] {
        if let Some((k, rest)) = term.split_once(op) {
            let rest = rest.trim();
            let inner = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(err)?;
            // As upstream's parser: an empty value (`()`, `(,a)`, `(a,)`) is "".
            let values = inner.split(',').map(|v| v.trim().to_string()).collect();
            let key = valid_key(k.trim(), term)?;
            return Ok(if notin {
                LabelRequirement::NotIn(key, values)
            } else {
                LabelRequirement::In(key, values)
            });
        }
    }
    Ok(LabelRequirement::Exists(valid_key(term, term)?))
}

fn valid_key(key: &str, term: &str) -> Result<String, SelectorError> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(SelectorError(term.to_string()))
    }
}

/// One requirement of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub value: String,
    pub negated: bool,
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldRequirement>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, v, false)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                )));
            };
            reqs.push(FieldRequirement {
                field: field.trim().to_string(),
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(FieldSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Matches with a lookup of field values (`None`: the object has no such field, which
    /// compares as the empty string, as upstream's field sets do).
    pub fn matches(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|r| {
            let v = lookup(&r.field).unwrap_or_default();
            (v == r.value) != r.negated
        })
    }

    /// The value an equality requirement pins a field to, if any (used to narrow a list to
    /// one namespace or one name).
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.field == field && !r.negated)
            .map(|r| r.value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn empty_set_values_are_the_empty_string_as_upstream() {
        let empty = BTreeMap::from([("a".to_string(), String::new())]);
        for text in ["a in ()", "a in (,)", "a in (x,)"] {
            let sel = LabelSelector::parse(text).unwrap();
            assert!(sel.matches(&empty), "{text}");
        }
        assert!(
            !LabelSelector::parse("a notin (x,)")
                .unwrap()
                .matches(&empty)
        );
    }

    #[test]
    fn label_selector_syntax() {
        let sel =
            LabelSelector::parse("app=web,tier!=db,env in (prod, staging),!canary,zone").unwrap();
        assert_eq!(sel.0.len(), 5);
        assert!(sel.matches(&labels(&[("app", "web"), ("env", "prod"), ("zone", "a")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("env", "dev"), ("zone", "a")])));
        assert!(!sel.matches(&labels(&[
            ("app", "web"),
            ("env", "prod"),
            ("zone", "a"),
            ("canary", "")
        ])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("env", "prod")])));
        let notin = LabelSelector::parse("env notin (prod)").unwrap();
        assert!(notin.matches(&labels(&[])));
        assert!(!notin.matches(&labels(&[("env", "prod")])));
        assert!(LabelSelector::parse("").unwrap().matches(&labels(&[])));
        assert!(LabelSelector::parse("a b=c").is_err());
        assert!(LabelSelector::parse("env in prod").is_err());
    }

    #[test]
    fn label_selector_from_metav1() {
        let sel = LabelSelector::from_label_selector_json(&serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]
        }))
        .unwrap();
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "fe")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "db")])));
    }

    #[test]
    fn field_selector_syntax() {
        let sel = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed").unwrap();
        let fields = |f: &str| match f {
            "spec.nodeName" => Some("n1".to_string()),
            "status.phase" => Some("Running".to_string()),
            _ => None,
        };
        assert!(sel.matches(fields));
        assert_eq!(sel.exact("spec.nodeName"), Some("n1"));
        let unscheduled = FieldSelector::parse("spec.nodeName=").unwrap();
        assert!(unscheduled.matches(|_| None));
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
