//! autoscaling: HorizontalPodAutoscaler in v2 (the storage version) and v1 (converted:
//! `targetCPUUtilizationPercentage` is v2's CPU Utilization metric) — defaults, checks and
//! the `kubectl get hpa` columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column, int_at};
use crate::validation::set_default;

/// Upstream's CPU target when an HPA names no metric.
const DEFAULT_CPU_UTILIZATION: i64 = 80;

fn validate_common(obj: &Value, errs: &mut Vec<Cause>) {
    let spec = &obj["spec"];
    for field in ["kind", "name"] {
        if spec["scaleTargetRef"][field]
            .as_str()
            .is_none_or(str::is_empty)
        {
            errs.push(Cause::required(format!("spec.scaleTargetRef.{field}")));
        }
    }
    let min = spec["minReplicas"].as_i64().unwrap_or(1);
    if min < 1 {
        errs.push(Cause::invalid(
            "spec.minReplicas",
            &spec["minReplicas"],
            "must be greater than or equal to 1",
        ));
    }
    let max = spec["maxReplicas"].as_i64().unwrap_or(0);
    if max < 1 {
        errs.push(Cause::invalid(
            "spec.maxReplicas",
            &spec["maxReplicas"],
            "must be greater than 0",
        ));
    } else if max < min {
        errs.push(Cause::invalid(
            "spec.maxReplicas",
            &spec["maxReplicas"],
            "must be greater than or equal to `minReplicas`",
        ));
    }
}

pub struct HpaV2;
pub static HPA_V2: HpaV2 = HpaV2;
impl Strategy for HpaV2 {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/spec/minReplicas", json!(1));
        if obj["spec"]["metrics"].as_array().is_none_or(Vec::is_empty) {
            obj["spec"]["metrics"] = json!([{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}}]);
        }
        // Given a behavior, its unset parts get upstream's rules.
        if obj["spec"]["behavior"].is_object() {
            let b = &mut obj["spec"]["behavior"];
            set_default(b, "/scaleUp/stabilizationWindowSeconds", json!(0));
            set_default(b, "/scaleUp/selectPolicy", json!("Max"));
            set_default(
                b,
                "/scaleUp/policies",
                json!([{"type": "Pods", "value": 4, "periodSeconds": 15},
                       {"type": "Percent", "value": 100, "periodSeconds": 15}]),
            );
            set_default(b, "/scaleDown/stabilizationWindowSeconds", json!(300));
            set_default(b, "/scaleDown/selectPolicy", json!("Max"));
            set_default(
                b,
                "/scaleDown/policies",
                json!([{"type": "Percent", "value": 100, "periodSeconds": 15}]),
            );
        }
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        validate_common(obj, errs);
    }
    fn columns(&self) -> &'static [Column] {
        COLUMNS
    }
}

pub struct HpaV1;
pub static HPA_V1: HpaV1 = HpaV1;
impl Strategy for HpaV1 {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/spec/minReplicas", json!(1));
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        HPA_V2.prepare_for_create(obj);
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        validate_common(obj, errs);
    }
    fn columns(&self) -> &'static [Column] {
        COLUMNS
    }
    fn to_storage(&self, mut obj: Value) -> Value {
        obj["apiVersion"] = json!("autoscaling/v2");
        let mut kept = take_kept(&mut obj);
        let spec = &mut obj["spec"];
        let mut metrics = match kept.remove(METRICS) {
            Some(Value::Array(others)) => others,
            _ => Vec::new(),
        };
        if let Some(pct) = spec
            .as_object_mut()
            .and_then(|s| s.remove("targetCPUUtilizationPercentage"))
        {
            metrics.push(json!({"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": pct}}}));
        }
        if !metrics.is_empty() {
            spec["metrics"] = Value::Array(metrics);
        }
        if let Some(behavior) = kept.remove(BEHAVIOR) {
            spec["behavior"] = behavior;
        }
        let mut current = match kept.remove(CURRENT_METRICS) {
            Some(Value::Array(others)) => others,
            _ => Vec::new(),
        };
        let conditions = kept.remove(CONDITIONS);
        if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
            if let Some(pct) = status.remove("currentCPUUtilizationPercentage") {
                current.push(json!({"type": "Resource", "resource": {"name": "cpu",
                    "current": {"averageUtilization": pct}}}));
            }
            if !current.is_empty() {
                status.insert("currentMetrics".into(), Value::Array(current));
            }
            if let Some(conditions) = conditions {
                status.insert("conditions".into(), conditions);
            }
        }
        obj
    }
    fn to_served(&self, mut obj: Value) -> Value {
        obj["apiVersion"] = json!("autoscaling/v1");
        let mut kept = serde_json::Map::new();
        if let Some(spec) = obj["spec"].as_object_mut() {
            let (cpu, others) = split_cpu(spec.remove("metrics"), "target");
            if let Some(t) = cpu {
                spec.insert("targetCPUUtilizationPercentage".into(), t);
            }
            if !others.is_empty() {
                kept.insert(METRICS.into(), Value::Array(others));
            }
            if let Some(behavior) = spec.remove("behavior") {
                kept.insert(BEHAVIOR.into(), behavior);
            }
        }
        if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
            let (cpu, others) = split_cpu(status.remove("currentMetrics"), "current");
            if let Some(c) = cpu {
                status.insert("currentCPUUtilizationPercentage".into(), c);
            }
            if !others.is_empty() {
                kept.insert(CURRENT_METRICS.into(), Value::Array(others));
            }
            if let Some(conditions) = status.remove("conditions") {
                kept.insert(CONDITIONS.into(), conditions);
            }
        }
        for (key, value) in kept {
            obj["metadata"]["annotations"][key] = json!(value.to_string());
        }
        obj
    }
}

/// What autoscaling/v1 has no field for is kept in annotations, under upstream's names,
/// so that a v1 client's update loses none of it (their values are the v2 JSON).
const METRICS: &str = "autoscaling.alpha.kubernetes.io/metrics";
const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";
const CURRENT_METRICS: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";

/// Takes the kept v2 fields out of a v1 object's annotations (dropping the map if that
/// empties it); values that do not parse are dropped.
fn take_kept(obj: &mut Value) -> serde_json::Map<String, Value> {
    let mut kept = serde_json::Map::new();
    let Some(annotations) = obj["metadata"]
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    else {
        return kept;
    };
    for key in [METRICS, BEHAVIOR, CURRENT_METRICS, CONDITIONS] {
        if let Some(Value::String(text)) = annotations.remove(key)
            && let Ok(value) = serde_json::from_str(&text)
        {
            kept.insert(key.into(), value);
        }
    }
    if annotations.is_empty()
        && let Some(meta) = obj["metadata"].as_object_mut()
    {
        meta.remove("annotations");
    }
    kept
}

/// The first CPU utilization of a v2 metric list (its `field`: target or current), and
/// the other metrics.
fn split_cpu(metrics: Option<Value>, field: &str) -> (Option<Value>, Vec<Value>) {
    let mut cpu = None;
    let mut others = Vec::new();
    for metric in metrics
        .and_then(|m| m.as_array().cloned())
        .unwrap_or_default()
    {
        let utilization = &metric["resource"][field]["averageUtilization"];
        let is_cpu = metric["type"] == "Resource"
            && metric["resource"]["name"] == "cpu"
            && !utilization.is_null();
        if is_cpu && cpu.is_none() {
            cpu = Some(utilization.clone());
        } else {
            others.push(metric);
        }
    }
    (cpu, others)
}

static COLUMNS: &[Column] = &[
    Column {
        name: "Reference",
        ty: "string",
        priority: 0,
        description: "Reference to the target resource.",
        cell: &|o| {
            let r = &o["spec"]["scaleTargetRef"];
            json!(format!(
                "{}/{}",
                r["kind"].as_str().unwrap_or_default(),
                r["name"].as_str().unwrap_or_default()
            ))
        },
    },
    Column {
        name: "Targets",
        ty: "string",
        priority: 0,
        description: "The current and target values of the metrics.",
        cell: &targets,
    },
    Column {
        name: "MinPods",
        ty: "string",
        priority: 0,
        description: "Lower limit for the number of pods.",
        cell: &|o| json!(o["spec"]["minReplicas"].as_i64().unwrap_or(1).to_string()),
    },
    Column {
        name: "MaxPods",
        ty: "integer",
        priority: 0,
        description: "Upper limit for the number of pods.",
        cell: &|o| json!(int_at(o, "/spec/maxReplicas")),
    },
    Column {
        name: "Replicas",
        ty: "integer",
        priority: 0,
        description: "Current number of replicas of pods managed by this autoscaler.",
        cell: &|o| json!(int_at(o, "/status/currentReplicas")),
    },
    AGE,
];

/// `cpu: 50%/80%, memory: 10Mi/100Mi` as kubectl prints them (`<unknown>` before the
/// first measurement; v1 objects carry the CPU target alone).
fn targets(o: &Value) -> Value {
    let spec_metrics = match o["spec"]["targetCPUUtilizationPercentage"].as_i64() {
        Some(pct) => json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": pct}}}]),
        None => o["spec"]["metrics"].clone(),
    };
    let current = &o["status"]["currentMetrics"];
    let legacy_current = o["status"]["currentCPUUtilizationPercentage"].as_i64();
    let mut parts = Vec::new();
    for (i, m) in spec_metrics.as_array().into_iter().flatten().enumerate() {
        if m["type"] != "Resource" {
            parts.push(format!(
                "{}: <unknown>",
                m["type"].as_str().unwrap_or_default().to_lowercase()
            ));
            continue;
        }
        let name = m["resource"]["name"].as_str().unwrap_or_default();
        let target = &m["resource"]["target"];
        let now = current
            .as_array()
            .and_then(|c| c.get(i))
            .map(|c| &c["resource"]["current"]);
        let part = if target["type"] == "Utilization" {
            let cur = now
                .and_then(|c| c["averageUtilization"].as_i64())
                .or(legacy_current)
                .map_or("<unknown>".to_string(), |c| format!("{c}%"));
            format!(
                "{name}: {cur}/{}%",
                target["averageUtilization"].as_i64().unwrap_or(0)
            )
        } else {
            let cur = now
                .and_then(|c| c["averageValue"].as_str())
                .unwrap_or("<unknown>");
            format!(
                "{name}: {cur}/{}",
                target["averageValue"].as_str().unwrap_or_default()
            )
        };
        parts.push(part);
    }
    if parts.len() > 2 {
        let more = parts.len() - 2;
        parts.truncate(2);
        return json!(format!("{} + {more} more...", parts.join(", ")));
    }
    json!(if parts.is_empty() {
        "<none>".to_string()
    } else {
        parts.join(", ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_converts_to_v2_and_back() {
        let v1 = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "minReplicas": 1, "maxReplicas": 5, "targetCPUUtilizationPercentage": 50},
            "status": {"currentReplicas": 2, "desiredReplicas": 2, "currentCPUUtilizationPercentage": 70}});
        let v2 = HPA_V1.to_storage(v1.clone());
        assert_eq!(
            v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            50
        );
        assert_eq!(
            v2["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"],
            70
        );
        assert_eq!(targets(&v2), json!("cpu: 70%/50%"));
        assert_eq!(HPA_V1.to_served(v2), v1);
    }

    #[test]
    fn what_v1_cannot_say_survives_a_v1_round_trip_in_annotations() {
        let memory = json!({"type": "Resource", "resource": {"name": "memory",
            "target": {"type": "AverageValue", "averageValue": "100Mi"}}});
        let cpu = json!({"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 60}}});
        let v2 = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "annotations": {"team": "a"}},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "maxReplicas": 5, "metrics": [memory, cpu],
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}}},
            "status": {"currentReplicas": 2, "desiredReplicas": 2,
                       "conditions": [{"type": "AbleToScale", "status": "True"}]}});
        let v1 = HPA_V1.to_served(v2.clone());
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 60);
        assert!(v1["spec"]["metrics"].is_null() && v1["spec"]["behavior"].is_null());
        let kept = &v1["metadata"]["annotations"];
        assert_eq!(kept[METRICS], json!(json!([memory]).to_string()));
        assert!(kept[BEHAVIOR].is_string() && kept[CONDITIONS].is_string());
        assert_eq!(kept["team"], "a");
        // Back in v2: everything, the CPU metric after the others (as upstream).
        let back = HPA_V1.to_storage(v1);
        assert_eq!(back["spec"]["metrics"], json!([memory, cpu]));
        assert_eq!(back["spec"]["behavior"], v2["spec"]["behavior"]);
        assert_eq!(back["status"]["conditions"], v2["status"]["conditions"]);
        assert_eq!(back["metadata"], v2["metadata"]);
    }

    #[test]
    fn defaults_and_checks_are_upstreams() {
        let mut hpa = json!({"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"},
            "maxReplicas": 3, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 5}}}});
        HPA_V2.default(&mut hpa);
        assert_eq!(hpa["spec"]["minReplicas"], 1);
        assert_eq!(
            hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
        assert_eq!(
            hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            5
        );
        assert_eq!(
            hpa["spec"]["behavior"]["scaleUp"]["policies"][0]["value"],
            4
        );
        assert_eq!(targets(&hpa), json!("cpu: <unknown>/80%"));
        let mut errs = Vec::new();
        hpa["spec"]["minReplicas"] = json!(4);
        HPA_V2.validate(&hpa, &mut errs);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.maxReplicas");
    }
}
