//! ResourceQuota accounting, shared by the apiserver's admission step (which charges a
//! new object to its namespace's quotas) and the quota controller (which recounts
//! `status.used` from what is stored): what an object uses, as upstream's quota
//! evaluators count it; which quotas it falls under (their scopes); and upstream's
//! check and messages.
//!
//! Tracked resource names, as upstream:
//! - pods: `pods` (pods not yet Succeeded or Failed), `count/pods` (every pod), `cpu`,
//!   `memory`, `ephemeral-storage` and `requests.<name>` (the pod's requests, init
//!   containers and sidecars included as the scheduler counts them), `limits.cpu`,
//!   `limits.memory`, `limits.ephemeral-storage`;
//! - services: `services`, `services.nodeports`, `services.loadbalancers`;
//! - persistentvolumeclaims: `persistentvolumeclaims`, `requests.storage`, and per
//!   storage class `<class>.storageclass.storage.k8s.io/{persistentvolumeclaims,
//!   requests.storage}`;
//! - `configmaps`, `secrets`, `replicationcontrollers`, `resourcequotas`, and
//!   `count/<resource>[.<group>]` for any resource.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

use crate::quantity::scaled_value;

/// An amount of one resource: its value in thousandths, and whether it is written in
/// binary units (`Mi`) or decimal ones, which upstream keeps through sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Amount {
    pub milli: i128,
    pub binary: bool,
}

impl Amount {
    /// Reads a quantity; an unreadable one counts as nothing (validation refuses them
    /// where they are written).
    pub fn parse(quantity: &str) -> Amount {
        Amount {
            milli: scaled_value(quantity, 3).unwrap_or(0) as i128,
            binary: quantity.trim_end().ends_with('i'),
        }
    }

    pub fn count(n: i64) -> Amount {
        Amount {
            milli: i128::from(n) * 1000,
            binary: false,
        }
    }

    /// The sum, in the notation of the first non-zero term (upstream's `Quantity.Add`).
    pub fn plus(self, other: Amount) -> Amount {
        Amount {
            milli: self.milli + other.milli,
            binary: if self.milli == 0 {
                other.binary
            } else {
                self.binary
            },
        }
    }
}

/// Upstream's canonical text of a quantity: `500m`, `2`, `1500`, `2k`, `128Mi`.
impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.milli;
        if m == 0 {
            return f.write_str("0");
        }
        if self.binary && m % 1000 == 0 {
            let mut value = m / 1000;
            let mut suffix = 0;
            const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
            while suffix < 6 && value % 1024 == 0 {
                value /= 1024;
                suffix += 1;
            }
            return write!(f, "{value}{}", SUFFIXES[suffix]);
        }
        const SUFFIXES: [&str; 8] = ["m", "", "k", "M", "G", "T", "P", "E"];
        let mut value = m;
        let mut suffix = 0;
        while suffix < 7 && value % 1000 == 0 {
            value /= 1000;
            suffix += 1;
        }
        write!(f, "{value}{}", SUFFIXES[suffix])
    }
}

/// Amounts by resource name.
pub type Usage = BTreeMap<String, Amount>;

/// Reads a `ResourceList` (`{"pods": "3", "requests.cpu": "500m"}`).
pub fn read_list(list: &Value) -> Usage {
    list.as_object()
        .into_iter()
        .flatten()
        .map(|(name, q)| (name.clone(), Amount::parse(q.as_str().unwrap_or_default())))
        .collect()
}

/// Writes a `ResourceList`.
pub fn write_list(usage: &Usage) -> Value {
    Value::Object(
        usage
            .iter()
            .map(|(name, amount)| (name.clone(), Value::String(amount.to_string())))
            .collect(),
    )
}

fn add_to(total: &mut Usage, name: &str, amount: Amount) {
    let entry = total.entry(name.to_string()).or_default();
    *entry = entry.plus(amount);
}

/// Adds `more` to `total`, key by key.
pub fn add(total: &mut Usage, more: &Usage) {
    for (name, amount) in more {
        add_to(total, name, *amount);
    }
}

/// The resource (group, plural) whose objects a quota's resource name counts, or `None`
/// for a name no evaluator knows.
pub fn counted_kind(name: &str) -> Option<(&str, &str)> {
    const POD_NAMES: [&str; 4] = ["pods", "cpu", "memory", "ephemeral-storage"];
    if let Some(resource) = name.strip_prefix("count/") {
        return Some(match resource.split_once('.') {
            Some((plural, group)) => (group, plural),
            None => ("", resource),
        });
    }
    if POD_NAMES.contains(&name) || name.starts_with("hugepages-") {
        return Some(("", "pods"));
    }
    if name == "requests.storage" || name.contains(".storageclass.storage.k8s.io/") {
        return Some(("", "persistentvolumeclaims"));
    }
    if name.starts_with("requests.") || name.starts_with("limits.") {
        return Some(("", "pods"));
    }
    match name {
        "services" | "services.nodeports" | "services.loadbalancers" => Some(("", "services")),
        "persistentvolumeclaims"
        | "configmaps"
        | "secrets"
        | "replicationcontrollers"
        | "resourcequotas" => Some(("", name)),
        _ => None,
    }
}

/// What one object of `group`/`plural` uses, by every resource name that counts it.
pub fn usage(group: &str, plural: &str, obj: &Value) -> Usage {
    let mut usage = Usage::new();
    let count_name = if group.is_empty() {
        format!("count/{plural}")
    } else {
        format!("count/{plural}.{group}")
    };
    usage.insert(count_name, Amount::count(1));
    if !group.is_empty() {
        return usage;
    }
    match plural {
        "pods" => pod_usage(obj, &mut usage),
        "services" => {
            usage.insert("services".into(), Amount::count(1));
            let spec = &obj["spec"];
            let ty = spec["type"].as_str().unwrap_or("ClusterIP");
            let ports = spec["ports"].as_array().map_or(0, Vec::len) as i64;
            let node_ports = match ty {
                "NodePort" => ports,
                "LoadBalancer" if spec["allocateLoadBalancerNodePorts"] != false => ports,
                _ => 0,
            };
            usage.insert("services.nodeports".into(), Amount::count(node_ports));
            usage.insert(
                "services.loadbalancers".into(),
                Amount::count(i64::from(ty == "LoadBalancer")),
            );
        }
        "persistentvolumeclaims" => {
            usage.insert("persistentvolumeclaims".into(), Amount::count(1));
            let requested = Amount::parse(
                obj["spec"]["resources"]["requests"]["storage"]
                    .as_str()
                    .unwrap_or("0"),
            );
            // An expansion in progress counts at its larger size, as upstream.
            let allocated = Amount::parse(
                obj["status"]["allocatedResources"]["storage"]
                    .as_str()
                    .unwrap_or("0"),
            );
            let storage = if allocated.milli > requested.milli {
                allocated
            } else {
                requested
            };
            usage.insert("requests.storage".into(), storage);
            let class =
                obj["spec"]["storageClassName"].as_str().or(
                    obj["metadata"]["annotations"]["volume.beta.kubernetes.io/storage-class"]
                        .as_str(),
                );
            if let Some(class) = class.filter(|c| !c.is_empty()) {
                let prefix = format!("{class}.storageclass.storage.k8s.io/");
                usage.insert(format!("{prefix}persistentvolumeclaims"), Amount::count(1));
                usage.insert(format!("{prefix}requests.storage"), storage);
            }
        }
        "configmaps" | "secrets" | "replicationcontrollers" | "resourcequotas" => {
            usage.insert(plural.to_string(), Amount::count(1));
        }
        _ => {}
    }
    usage
}

/// A pod's compute usage. Pods that reached Succeeded or Failed count only in
/// `count/pods`. (Upstream also stops counting a pod whose deletion grace period has
/// passed twice over; here such a pod counts until it is gone, a few seconds later.)
fn pod_usage(pod: &Value, usage: &mut Usage) {
    if matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    ) {
        return;
    }
    usage.insert("pods".into(), Amount::count(1));
    for (name, amount) in pod_resources(&pod["spec"], "requests") {
        match name.as_str() {
            "cpu" | "memory" | "ephemeral-storage" => {
                add_to(usage, &name, amount);
                add_to(usage, &format!("requests.{name}"), amount);
            }
            _ => add_to(usage, &format!("requests.{name}"), amount),
        }
    }
    for (name, amount) in pod_resources(&pod["spec"], "limits") {
        if matches!(name.as_str(), "cpu" | "memory" | "ephemeral-storage") {
            add_to(usage, &format!("limits.{name}"), amount);
        }
    }
}

/// A pod's effective requests or limits, as the scheduler counts them: its containers
/// and sidecars together, or its largest init container (plus the sidecars started
/// before it) when that is more; plus the pod's overhead.
fn pod_resources(spec: &Value, which: &str) -> Usage {
    let of = |c: &Value| read_list(&c["resources"][which]);
    let mut total = Usage::new();
    for c in spec["containers"].as_array().into_iter().flatten() {
        add(&mut total, &of(c));
    }
    let mut sidecars = Usage::new();
    let mut init_peak = Usage::new();
    for c in spec["initContainers"].as_array().into_iter().flatten() {
        let own = of(c);
        let running = if c["restartPolicy"] == "Always" {
            add(&mut total, &own);
            add(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut with_sidecars = own;
            add(&mut with_sidecars, &sidecars);
            with_sidecars
        };
        keep_max(&mut init_peak, &running);
    }
    keep_max(&mut total, &init_peak);
    add(&mut total, &read_list(&spec["overhead"]));
    total
}

fn keep_max(into: &mut Usage, other: &Usage) {
    for (name, amount) in other {
        let entry = into.entry(name.clone()).or_default();
        if amount.milli > entry.milli {
            *entry = *amount;
        }
    }
}

/// A quota's scope selectors: `spec.scopes` (each as `Exists`) and
/// `spec.scopeSelector.matchExpressions`.
fn scope_selectors(quota: &Value) -> Vec<(String, String, Vec<String>)> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let mut selectors: Vec<_> = strings(&quota["spec"]["scopes"])
        .into_iter()
        .map(|scope| (scope, "Exists".to_string(), Vec::new()))
        .collect();
    for expr in quota["spec"]["scopeSelector"]["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        selectors.push((
            expr["scopeName"].as_str().unwrap_or_default().to_string(),
            expr["operator"].as_str().unwrap_or_default().to_string(),
            strings(&expr["values"]),
        ));
    }
    selectors
}

/// Whether a quota's scopes take in `obj`. Scopes speak only of pods: a scoped quota
/// counts no other kind, as upstream.
pub fn in_scope(quota: &Value, group: &str, plural: &str, obj: &Value) -> bool {
    let selectors = scope_selectors(quota);
    if selectors.is_empty() {
        return true;
    }
    if !group.is_empty() || plural != "pods" {
        return false;
    }
    selectors
        .iter()
        .all(|(scope, op, values)| pod_in_scope(&obj["spec"], scope, op, values))
}

fn pod_in_scope(spec: &Value, scope: &str, op: &str, values: &[String]) -> bool {
    let holds = match scope {
        "Terminating" => spec["activeDeadlineSeconds"]
            .as_i64()
            .is_some_and(|s| s >= 0),
        "NotTerminating" => spec["activeDeadlineSeconds"].as_i64().is_none_or(|s| s < 0),
        "BestEffort" => best_effort(spec),
        "NotBestEffort" => !best_effort(spec),
        "CrossNamespacePodAffinity" => cross_namespace_affinity(spec),
        "PriorityClass" => {
            let class = spec["priorityClassName"].as_str().unwrap_or_default();
            return match op {
                "In" => values.iter().any(|v| v == class),
                "NotIn" => !values.iter().any(|v| v == class),
                "Exists" => !class.is_empty(),
                "DoesNotExist" => class.is_empty(),
                _ => false,
            };
        }
        _ => return false,
    };
    if op == "DoesNotExist" { !holds } else { holds }
}

/// No container asks for or is limited to any cpu or memory.
fn best_effort(spec: &Value) -> bool {
    ["initContainers", "containers"].iter().all(|list| {
        spec[list].as_array().into_iter().flatten().all(|c| {
            ["requests", "limits"].iter().all(|which| {
                let list = &c["resources"][which];
                list["cpu"].is_null() && list["memory"].is_null()
            })
        })
    })
}

/// The pod has an affinity or anti-affinity term naming other namespaces.
fn cross_namespace_affinity(spec: &Value) -> bool {
    ["podAffinity", "podAntiAffinity"].iter().any(|kind| {
        let affinity = &spec["affinity"][kind];
        let required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
            .into_iter()
            .flatten();
        let preferred = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| &w["podAffinityTerm"]);
        required.chain(preferred).any(|term| {
            term["namespaces"].as_array().is_some_and(|n| !n.is_empty())
                || !term["namespaceSelector"].is_null()
        })
    })
}

/// Upstream's rule that cpu and memory quotas need every container to state them:
/// `must specify limits.cpu for: app; requests.memory for: app,sidecar`.
fn missing_compute(spec: &Value, restricted: &BTreeSet<&str>) -> Option<String> {
    const VALIDATED: [&str; 6] = [
        "cpu",
        "memory",
        "requests.cpu",
        "requests.memory",
        "limits.cpu",
        "limits.memory",
    ];
    let required: Vec<&str> = VALIDATED
        .into_iter()
        .filter(|r| restricted.contains(r))
        .collect();
    let mut missing: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            for resource in &required {
                let (which, base) = match resource.split_once('.') {
                    Some(("limits", base)) => ("limits", base),
                    Some((_, base)) => ("requests", base),
                    None => ("requests", *resource),
                };
                if c["resources"][which][base].is_null() {
                    let name = c["name"].as_str().unwrap_or_default();
                    missing.entry(resource).or_default().insert(name);
                }
            }
        }
    }
    if missing.is_empty() {
        return None;
    }
    let parts: Vec<String> = missing
        .iter()
        .map(|(resource, names)| {
            let names: Vec<&str> = names.iter().copied().collect();
            format!("{resource} for: {}", names.join(","))
        })
        .collect();
    Some(format!("must specify {}", parts.join("; ")))
}

/// Upstream's rendering of a resource list in messages: `pods=1,requests.cpu=500m`.
fn pretty(usage: &Usage) -> String {
    let parts: Vec<String> = usage.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join(",")
}

fn mask(usage: &Usage, names: &BTreeSet<String>) -> Usage {
    usage
        .iter()
        .filter(|(k, _)| names.contains(*k))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// Checks a write of `obj` (replacing `old` on update) in the namespace of `quotas`
/// against their `status.hard`, as upstream's admission does. `Ok` holds the new
/// `status.used` of every quota the write is charged to (by index); `Err` the reason
/// for refusing it (upstream's text, which the apiserver wraps in a Forbidden).
pub fn charge(
    quotas: &[Value],
    group: &str,
    plural: &str,
    obj: &Value,
    old: Option<&Value>,
) -> Result<Vec<(usize, Usage)>, String> {
    let mut charged = Vec::new();
    for (i, quota) in quotas.iter().enumerate() {
        let hard = read_list(&quota["status"]["hard"]);
        let restricted: BTreeSet<&str> = hard
            .keys()
            .map(String::as_str)
            .filter(|name| counted_kind(name) == Some((group, plural)))
            .collect();
        if restricted.is_empty() || !in_scope(quota, group, plural, obj) {
            continue;
        }
        let name = quota["metadata"]["name"].as_str().unwrap_or_default();
        if group.is_empty()
            && plural == "pods"
            && let Some(why) = missing_compute(&obj["spec"], &restricted)
        {
            return Err(format!("failed quota: {name}: {why}"));
        }
        let used = &quota["status"]["used"];
        if restricted.iter().any(|r| used[*r].is_null()) {
            let names: Vec<&str> = restricted.iter().copied().collect();
            return Err(format!(
                "status unknown for quota: {name}, resources: {}",
                names.join(",")
            ));
        }
        charged.push(i);
    }
    if charged.is_empty() {
        return Ok(Vec::new());
    }
    let mut delta = usage(group, plural, obj);
    let negative: Vec<&str> = delta
        .iter()
        .filter(|(_, a)| a.milli < 0)
        .map(|(k, _)| k.as_str())
        .collect();
    if !negative.is_empty() {
        return Err(format!(
            "quota usage is negative for resource(s): {}",
            negative.join(",")
        ));
    }
    if let Some(old) = old {
        let before = usage(group, plural, old);
        for (name, amount) in delta.iter_mut() {
            let prior = before.get(name).map_or(0, |a| a.milli);
            amount.milli = (amount.milli - prior).max(0);
        }
    }
    delta.retain(|_, a| a.milli != 0);
    if delta.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for i in charged {
        let quota = &quotas[i];
        let hard = read_list(&quota["status"]["hard"]);
        let used = read_list(&quota["status"]["used"]);
        let requested = mask(&delta, &hard.keys().cloned().collect());
        let mut new_used = used.clone();
        add(&mut new_used, &requested);
        let exceeded: BTreeSet<String> = requested
            .keys()
            .filter(|name| new_used[*name].milli > hard[*name].milli)
            .cloned()
            .collect();
        if !exceeded.is_empty() {
            return Err(format!(
                "exceeded quota: {}, requested: {}, used: {}, limited: {}",
                quota["metadata"]["name"].as_str().unwrap_or_default(),
                pretty(&mask(&requested, &exceeded)),
                pretty(&mask(&used, &exceeded)),
                pretty(&mask(&hard, &exceeded)),
            ));
        }
        out.push((i, new_used));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(hard: Value, used: Value) -> Value {
        json!({"metadata": {"name": "q"}, "spec": {"hard": hard},
            "status": {"hard": hard, "used": used}})
    }

    fn pod(resources: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "app", "resources": resources}]}})
    }

    #[test]
    fn amounts_print_as_upstream_canonicalizes_them() {
        for (input, canonical) in [
            ("500m", "500m"),
            ("1", "1"),
            ("1000", "1k"),
            ("1500", "1500"),
            ("0.5", "500m"),
            ("128Mi", "128Mi"),
            ("1536Mi", "1536Mi"),
            ("2048Mi", "2Gi"),
            ("1G", "1G"),
            ("0", "0"),
        ] {
            assert_eq!(Amount::parse(input).to_string(), canonical, "{input}");
        }
        let sum = Amount::default().plus(Amount::parse("64Mi"));
        assert_eq!(sum.plus(Amount::parse("64Mi")).to_string(), "128Mi");
    }

    #[test]
    fn pods_count_requests_limits_and_the_largest_init_container() {
        let pod = json!({"spec": {
            "initContainers": [
                {"name": "init", "resources": {"requests": {"cpu": "2"}}},
                {"name": "sidecar", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                    "limits": {"cpu": "500m", "memory": "128Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m"}}}]}});
        let used = usage("", "pods", &pod);
        assert_eq!(used["pods"], Amount::count(1));
        assert_eq!(used["count/pods"], Amount::count(1));
        assert_eq!(used["requests.cpu"].to_string(), "2");
        assert_eq!(used["cpu"].to_string(), "2");
        assert_eq!(used["requests.memory"].to_string(), "128Mi");
        assert_eq!(used["limits.cpu"].to_string(), "500m");
        let mut done = pod.clone();
        done["status"]["phase"] = json!("Succeeded");
        assert_eq!(
            usage("", "pods", &done).keys().collect::<Vec<_>>(),
            ["count/pods"]
        );
    }

    #[test]
    fn the_fourth_pod_exceeds_a_quota_of_three() {
        let quotas = [quota(json!({"pods": "3"}), json!({"pods": "3"}))];
        assert_eq!(
            charge(&quotas, "", "pods", &pod(json!({})), None).unwrap_err(),
            "exceeded quota: q, requested: pods=1, used: pods=3, limited: pods=3"
        );
        let quotas = [quota(json!({"pods": "3"}), json!({"pods": "2"}))];
        let charged = charge(&quotas, "", "pods", &pod(json!({})), None).unwrap();
        assert_eq!(write_list(&charged[0].1), json!({"pods": "3"}));
    }

    #[test]
    fn compute_quotas_need_every_container_to_state_them() {
        let quotas = [quota(
            json!({"requests.cpu": "1", "limits.memory": "1Gi"}),
            json!({"requests.cpu": "0", "limits.memory": "0"}),
        )];
        assert_eq!(
            charge(&quotas, "", "pods", &pod(json!({})), None).unwrap_err(),
            "failed quota: q: must specify limits.memory for: app; requests.cpu for: app"
        );
        let big = pod(json!({"requests": {"cpu": "2"}, "limits": {"memory": "512Mi"}}));
        assert_eq!(
            charge(&quotas, "", "pods", &big, None).unwrap_err(),
            "exceeded quota: q, requested: requests.cpu=2, used: requests.cpu=0, limited: requests.cpu=1"
        );
    }

    #[test]
    fn a_quota_without_usage_yet_refuses_until_counted() {
        let quotas = [quota(json!({"services": "2"}), json!({}))];
        let svc = json!({"metadata": {"name": "s"}, "spec": {}});
        assert_eq!(
            charge(&quotas, "", "services", &svc, None).unwrap_err(),
            "status unknown for quota: q, resources: services"
        );
        // Objects the quota does not track are not affected by it.
        assert!(
            charge(&quotas, "", "configmaps", &svc, None)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn scopes_select_pods_only() {
        let mut scoped = quota(json!({"pods": "1"}), json!({"pods": "1"}));
        scoped["spec"]["scopes"] = json!(["BestEffort"]);
        let limited = pod(json!({"limits": {"cpu": "1"}}));
        assert!(
            charge(&[scoped.clone()], "", "pods", &limited, None)
                .unwrap()
                .is_empty()
        );
        assert!(charge(&[scoped.clone()], "", "pods", &pod(json!({})), None).is_err());
        let mut by_class = quota(json!({"pods": "1"}), json!({"pods": "1"}));
        by_class["spec"]["scopeSelector"] = json!({"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]});
        let mut high = pod(json!({}));
        high["spec"]["priorityClassName"] = json!("high");
        assert!(charge(&[by_class.clone()], "", "pods", &high, None).is_err());
        assert!(in_scope(&by_class, "", "pods", &high));
        assert!(!in_scope(&by_class, "", "pods", &pod(json!({}))));
        assert!(!in_scope(&by_class, "", "services", &high));
    }

    #[test]
    fn updates_are_charged_only_what_they_add() {
        let quotas = [quota(
            json!({"services.nodeports": "2"}),
            json!({"services.nodeports": "1"}),
        )];
        let old = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        let new = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}, {"port": 81}]}});
        let charged = charge(&quotas, "", "services", &new, Some(&old)).unwrap();
        assert_eq!(
            write_list(&charged[0].1),
            json!({"services.nodeports": "2"})
        );
        assert!(
            charge(&quotas, "", "services", &old, Some(&old))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn resource_names_map_to_the_kinds_they_count() {
        assert_eq!(counted_kind("requests.cpu"), Some(("", "pods")));
        assert_eq!(
            counted_kind("requests.storage"),
            Some(("", "persistentvolumeclaims"))
        );
        assert_eq!(
            counted_kind("gold.storageclass.storage.k8s.io/requests.storage"),
            Some(("", "persistentvolumeclaims"))
        );
        assert_eq!(
            counted_kind("count/deployments.apps"),
            Some(("apps", "deployments"))
        );
        assert_eq!(counted_kind("count/secrets"), Some(("", "secrets")));
        assert_eq!(counted_kind("services.nodeports"), Some(("", "services")));
        assert_eq!(counted_kind("widgets"), None);
    }
}
