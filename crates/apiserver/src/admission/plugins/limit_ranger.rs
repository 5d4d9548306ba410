//! LimitRanger admission: the LimitRanges of a namespace give a new pod's containers
//! their default requests and limits (recorded in the `kubernetes.io/limit-ranger`
//! annotation) and bound what containers and pods may ask for — upstream's plugin, with
//! its messages (`minimum cpu usage per Container is 100m, but
//! request is 50m`).

use krust_api::quantity::scaled_value;
use krust_api::status::ApiError;
use serde_json::{Map, Value, json};

use super::pod_create;
use crate::admission::{Attributes, Plugin};
use crate::rest::Call;

pub struct LimitRanger;

#[async_trait::async_trait]
impl Plugin for LimitRanger {
    fn name(&self) -> &'static str {
        "LimitRanger"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        pod_create(a)
    }

    /// Defaults from the namespace's LimitRanges (the pod's QoS class follows them).
    async fn admit(&self, a: &Attributes<'_>, pod: Option<&mut Value>) -> Result<(), ApiError> {
        let Some(pod) = pod else { return Ok(()) };
        if let Some(note) = apply_defaults(pod, &limit_ranges(a.call)) {
            pod["metadata"]["annotations"]["kubernetes.io/limit-ranger"] = json!(note);
            pod["status"]["qosClass"] = json!(crate::kinds::pod::qos_class(&pod["spec"]));
        }
        Ok(())
    }

    /// The LimitRanges' bounds, on the pod as the mutating webhooks left it.
    async fn validate(&self, a: &Attributes<'_>, pod: Option<&Value>) -> Result<(), ApiError> {
        let Some(pod) = pod else { return Ok(()) };
        match validate_pod(pod, &limit_ranges(a.call)) {
            None => Ok(()),
            Some(why) => {
                Err(a.forbidden(pod["metadata"]["name"].as_str().unwrap_or_default(), &why))
            }
        }
    }
}

/// The LimitRanges of the call's namespace (none outside one).
fn limit_ranges(call: &Call<'_>) -> Vec<Value> {
    let (Some(namespace), Some(cache)) = (
        call.namespace(),
        call.scope.cache.cache("/registry/limitranges/"),
    ) else {
        return Vec::new();
    };
    cache
        .list(&format!("/registry/limitranges/{namespace}/"))
        .0
        .iter()
        .map(|r| r.value())
        .collect()
}

/// Quantities are compared in thousandths, which is exact for every suffix but `n` and
/// `u` (rounded up, as the scheduler counts them).
fn amount(q: &Value) -> Option<i64> {
    scaled_value(q.as_str()?, 3).ok()
}

fn items<'a>(ranges: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    ranges
        .iter()
        .flat_map(|r| r["spec"]["limits"].as_array().into_iter().flatten())
        .filter(move |item| item["type"] == kind)
}

fn entries(v: &Value) -> impl Iterator<Item = (&String, &Value)> {
    v.as_object().into_iter().flatten()
}

/// Fills missing container requests and limits from the `Container` items' defaults;
/// returns the annotation value describing what was set, if anything.
fn apply_defaults(pod: &mut Value, ranges: &[Value]) -> Option<String> {
    let mut limits = Map::new();
    let mut requests = Map::new();
    for item in items(ranges, "Container") {
        for (k, v) in entries(&item["default"]) {
            limits.insert(k.clone(), v.clone());
        }
        for (k, v) in entries(&item["defaultRequest"]) {
            requests.insert(k.clone(), v.clone());
        }
    }
    if limits.is_empty() && requests.is_empty() {
        return None;
    }
    let mut notes = Vec::new();
    for (list, what) in [
        ("initContainers", "init container"),
        ("containers", "container"),
    ] {
        // `get_mut`: indexing would add the missing list as `null`.
        let containers = pod["spec"].get_mut(list).and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            let name = c["name"].as_str().unwrap_or_default().to_string();
            for (field, defaults, noun) in [
                ("requests", &requests, "request"),
                ("limits", &limits, "limit"),
            ] {
                let mut set = Vec::new();
                for (k, v) in defaults {
                    if c["resources"][field].get(k).is_none() {
                        c["resources"][field][k] = v.clone();
                        set.push(k.clone());
                    }
                }
                if !set.is_empty() {
                    set.sort();
                    notes.push(format!("{} {noun} for {what} {name}", set.join(", ")));
                }
            }
        }
    }
    (!notes.is_empty()).then(|| format!("LimitRanger plugin set: {}", notes.join("; ")))
}

/// The bounds an item sets on one object's requests and limits (`kind` names it in
/// messages); problems are appended to `errs`.
fn check(item: &Value, kind: &str, requests: &Value, limits: &Value, errs: &mut Vec<String>) {
    // One error per bound at most, the first upstream's minConstraint and
    // maxConstraint find.
    let shown = |q: &Value| q.as_str().unwrap_or_default().to_string();
    for (res, min) in entries(&item["min"]) {
        let m = shown(min);
        let error = match (requests.get(res), limits.get(res)) {
            (None, _) => Some(format!(
                "minimum {res} usage per {kind} is {m}.  No request is specified"
            )),
            (Some(r), _) if amount(r) < amount(min) => Some(format!(
                "minimum {res} usage per {kind} is {m}, but request is {}",
                shown(r)
            )),
            (_, Some(l)) if amount(l) < amount(min) => Some(format!(
                "minimum {res} usage per {kind} is {m}, but limit is {}",
                shown(l)
            )),
            _ => None,
        };
        errs.extend(error);
    }
    for (res, max) in entries(&item["max"]) {
        let m = shown(max);
        let error = match (limits.get(res), requests.get(res)) {
            (None, _) => Some(format!(
                "maximum {res} usage per {kind} is {m}.  No limit is specified"
            )),
            (Some(l), _) if amount(l) > amount(max) => Some(format!(
                "maximum {res} usage per {kind} is {m}, but limit is {}",
                shown(l)
            )),
            (_, Some(r)) if amount(r) > amount(max) => Some(format!(
                "maximum {res} usage per {kind} is {m}, but request is {}",
                shown(r)
            )),
            _ => None,
        };
        errs.extend(error);
    }
    for (res, ratio) in entries(&item["maxLimitRequestRatio"]) {
        let r = ratio.as_str().unwrap_or_default();
        let (Some(limit), Some(request)) = (
            limits.get(res).and_then(amount),
            requests.get(res).and_then(amount).filter(|r| *r > 0),
        ) else {
            errs.push(format!(
                "{res} max limit to request ratio per {kind} is {r}, but no request is specified or request is 0"
            ));
            continue;
        };
        let provided = limit as f64 / request as f64;
        if amount(ratio).is_some_and(|max| provided > max as f64 / 1000.0) {
            errs.push(format!(
                "{res} max limit to request ratio per {kind} is {r}, but provided ratio is {provided:.6}"
            ));
        }
    }
}

/// Sums the requests (or limits) of a pod's containers per resource, in thousandths,
/// back as quantity strings for messages and checks.
fn pod_total(pod: &Value, field: &str) -> Value {
    let mut total: Map<String, Value> = Map::new();
    let mut sums: Vec<(String, i64)> = Vec::new();
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for (k, v) in entries(&c["resources"][field]) {
            let n = amount(v).unwrap_or(0);
            match sums.iter_mut().find(|(name, _)| name == k) {
                Some((_, sum)) => *sum = sum.saturating_add(n),
                None => sums.push((k.clone(), n)),
            }
        }
    }
    for (k, milli) in sums {
        total.insert(k, json!(format!("{milli}m")));
    }
    Value::Object(total)
}

/// The bounds the namespace's LimitRanges set on a pod: every container, then the pod's
/// total; `None` when it is within them, else upstream's aggregate message.
fn validate_pod(pod: &Value, ranges: &[Value]) -> Option<String> {
    let mut errs = Vec::new();
    for item in items(ranges, "Container") {
        for list in ["initContainers", "containers"] {
            for c in pod["spec"][list].as_array().into_iter().flatten() {
                let r = &c["resources"];
                check(item, "Container", &r["requests"], &r["limits"], &mut errs);
            }
        }
    }
    for item in items(ranges, "Pod") {
        let (requests, limits) = (pod_total(pod, "requests"), pod_total(pod, "limits"));
        check(item, "Pod", &requests, &limits, &mut errs);
    }
    aggregate(errs)
}

/// Upstream's `NewAggregate`: one message alone, several as `[a, b]`.
fn aggregate(errs: Vec<String>) -> Option<String> {
    match errs.len() {
        0 => None,
        1 => errs.into_iter().next(),
        _ => Some(format!("[{}]", errs.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LimitRange of one item, defaulted as the apiserver stores it.
    fn range(item: Value) -> Vec<Value> {
        let mut r = json!({"spec": {"limits": [item]}});
        let kind = crate::kinds::find("", "v1", "limitranges").expect("the LimitRange kind");
        kind.strategy.default(&mut r);
        vec![r]
    }

    #[test]
    fn defaults_fill_what_containers_leave_out_and_are_recorded() {
        let ranges =
            range(json!({"type": "Container", "default": {"cpu": "500m", "memory": "256Mi"}}));
        assert_eq!(
            ranges[0]["spec"]["limits"][0]["defaultRequest"]["cpu"],
            "500m"
        );
        let mut pod = json!({"spec": {"containers": [
            {"name": "app", "resources": {"limits": {"cpu": "1"}}}]}});
        let note = apply_defaults(&mut pod, &ranges).unwrap();
        let r = &pod["spec"]["containers"][0]["resources"];
        assert_eq!(r["limits"], json!({"cpu": "1", "memory": "256Mi"}));
        assert_eq!(r["requests"], json!({"cpu": "500m", "memory": "256Mi"}));
        assert_eq!(
            note,
            "LimitRanger plugin set: cpu, memory request for container app; memory limit for container app"
        );
    }

    #[test]
    fn bounds_are_checked_with_upstreams_messages() {
        let ranges = range(
            json!({"type": "Container", "min": {"cpu": "100m"}, "max": {"memory": "1Gi"},
            "maxLimitRequestRatio": {"cpu": "2"}}),
        );
        let pod = |cpu_req: &str, cpu_lim: &str, mem: &str| {
            json!({"spec": {"containers": [{"name": "a", "resources": {
                "requests": {"cpu": cpu_req, "memory": mem}, "limits": {"cpu": cpu_lim, "memory": mem}}}]}})
        };
        assert_eq!(validate_pod(&pod("100m", "200m", "1Gi"), &ranges), None);
        assert_eq!(
            validate_pod(&pod("50m", "100m", "1Gi"), &ranges).unwrap(),
            "minimum cpu usage per Container is 100m, but request is 50m"
        );
        assert_eq!(
            validate_pod(&pod("100m", "300m", "2Gi"), &ranges).unwrap(),
            "[maximum memory usage per Container is 1Gi, but limit is 2Gi, cpu max limit to request ratio per Container is 2, but provided ratio is 3.000000]",
            "one error per bound: the request over the max too goes unsaid"
        );
    }
}
