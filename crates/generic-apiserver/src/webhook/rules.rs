//! Which webhooks a request is for: rules (operations, groups, versions, resources with
//! subresources, scope), namespaceSelector and objectSelector, as upstream matches them.

use std::collections::BTreeMap;

use krust_api::selector::{LabelSelector, object_labels};
use serde_json::Value;

/// What a request is, for matching.
pub struct Attributes<'a> {
    pub operation: &'static str,
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    /// The object's name (empty when the request names none).
    pub name: &'a str,
    pub namespaced: bool,
    /// The namespace's labels (for a namespaced request) or the Namespace object's own
    /// (for a request about a namespace).
    pub namespace_labels: Option<BTreeMap<String, String>>,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
}

fn listed(list: &Value, value: &str) -> bool {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|v| v == "*" || v == value)
}

/// Whether a `resources` entry (`pods`, `pods/status`, `*`, `*/*`, `*/scale`) covers the
/// request's resource and subresource.
fn resource_matches(entry: &str, resource: &str, subresource: Option<&str>) -> bool {
    let (r, s) = match entry.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (entry, None),
    };
    let resource_ok = r == "*" || r == resource;
    let sub_ok = match (s, subresource) {
        (None, None) => true,
        (None, Some(_)) | (Some(_), None) => false,
        (Some(s), Some(sub)) => s == "*" || s == sub,
    };
    resource_ok && sub_ok
}

/// Whether one of a webhook's `rules` covers the request.
pub fn rule_matches(rule: &Value, a: &Attributes<'_>) -> bool {
    let operations_ok = listed(&rule["operations"], a.operation);
    let resources_ok = rule["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|e| resource_matches(e, a.resource, a.subresource));
    let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
        "Cluster" => !a.namespaced,
        "Namespaced" => a.namespaced,
        _ => true,
    };
    // An admission policy's rules may name objects (none named: every object).
    let names_ok = rule["resourceNames"]
        .as_array()
        .is_none_or(|names| names.is_empty() || names.iter().any(|n| n == a.name));
    operations_ok
        && listed(&rule["apiGroups"], a.group)
        && listed(&rule["apiVersions"], a.version)
        && resources_ok
        && scope_ok
        && names_ok
}

/// Whether a selector (absent: everything) matches; an unparsable one matches nothing.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    if selector.is_null() {
        return true;
    }
    LabelSelector::from_label_selector_json(selector).is_ok_and(|s| s.matches(labels))
}

/// Whether a webhook is called for the request.
pub fn applies(webhook: &Value, a: &Attributes<'_>) -> bool {
    let rules_ok = webhook["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| rule_matches(r, a));
    rules_ok && selected(webhook, a)
}

/// Whether a webhook's namespaceSelector and objectSelector select the request.
pub fn selected(webhook: &Value, a: &Attributes<'_>) -> bool {
    // Cluster-scoped objects other than namespaces are not filtered by namespace.
    let namespace_ok = match &a.namespace_labels {
        Some(ns) => selects(&webhook["namespaceSelector"], ns),
        None => true,
    };
    let object_selector = &webhook["objectSelector"];
    let object_ok = selects(
        object_selector,
        &a.object.map(object_labels).unwrap_or_default(),
    ) || (a.old_object.is_some()
        && selects(
            object_selector,
            &a.old_object.map(object_labels).unwrap_or_default(),
        ));
    namespace_ok && object_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs<'a>(
        op: &'static str,
        resource: &'a str,
        sub: Option<&'a str>,
        obj: &'a Value,
    ) -> Attributes<'a> {
        Attributes {
            operation: op,
            group: "",
            version: "v1",
            resource,
            subresource: sub,
            name: obj["metadata"]["name"].as_str().unwrap_or_default(),
            namespaced: true,
            namespace_labels: Some(BTreeMap::from([("team".to_string(), "a".to_string())])),
            object: Some(obj),
            old_object: None,
        }
    }

    #[test]
    fn rules_and_selectors_match_as_upstream() {
        let hook = json!({
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "configmaps/*"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"team": "a"}},
            "objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}
        });
        let pod = json!({"metadata": {"labels": {"app": "x"}}});
        assert!(applies(&hook, &attrs("CREATE", "pods", None, &pod)));
        assert!(!applies(&hook, &attrs("UPDATE", "pods", None, &pod)));
        assert!(!applies(
            &hook,
            &attrs("CREATE", "pods", Some("status"), &pod)
        ));
        assert!(applies(
            &hook,
            &attrs("CREATE", "configmaps", Some("status"), &pod)
        ));
        assert!(!applies(&hook, &attrs("CREATE", "configmaps", None, &pod)));
        let skipped = json!({"metadata": {"labels": {"skip": "yes"}}});
        assert!(!applies(&hook, &attrs("CREATE", "pods", None, &skipped)));
        let mut other_ns = attrs("CREATE", "pods", None, &pod);
        other_ns.namespace_labels = Some(BTreeMap::new());
        assert!(!applies(&hook, &other_ns));
        assert!(resource_matches("*/*", "pods", Some("status")));
        assert!(resource_matches("*", "pods", None));
        assert!(!resource_matches("*", "pods", Some("status")));
        // A policy's rule naming objects covers only those.
        let named = json!({"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"],
            "resources": ["pods"], "resourceNames": ["web"]});
        let web = json!({"metadata": {"name": "web"}});
        assert!(rule_matches(&named, &attrs("CREATE", "pods", None, &web)));
        assert!(!rule_matches(&named, &attrs("CREATE", "pods", None, &pod)));
    }
}
