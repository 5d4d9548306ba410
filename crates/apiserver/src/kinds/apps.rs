//! apps/v1 workloads: Deployment, ReplicaSet, StatefulSet, DaemonSet and
//! ControllerRevision — defaults (replicas, strategies, history limits), selector checks
//! (required, matching the template, immutable) and their `kubectl get` columns — and
//! their core/v1 forerunner, the ReplicationController (a plain label-map selector).

use krust_api::selector::LabelSelector;
use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use super::core::ready_of;
use super::pod::{default_pod_spec, validate_pod_spec};
use crate::table::{AGE, Column, containers, images, int_at, map, selector};
use crate::validation::{immutable, non_negative, set_default};

/// Checks shared by every workload with `spec.selector` and `spec.template`.
fn validate_workload(obj: &Value, errs: &mut Vec<Cause>) {
    let spec = &obj["spec"];
    non_negative(obj, "/spec/replicas", "spec.replicas", errs);
    let sel = &spec["selector"];
    let empty = sel["matchLabels"].as_object().is_none_or(|m| m.is_empty())
        && sel["matchExpressions"].as_array().is_none_or(Vec::is_empty);
    if empty {
        errs.push(Cause::required("spec.selector"));
    } else {
        match LabelSelector::from_label_selector_json(sel) {
            Ok(parsed) => {
                let labels = spec["template"]["metadata"]["labels"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                if !parsed.matches(&labels) {
                    errs.push(Cause::invalid(
                        "spec.template.metadata.labels",
                        &spec["template"]["metadata"]["labels"],
                        "`selector` does not match template `labels`",
                    ));
                }
            }
            Err(e) => errs.push(Cause::invalid("spec.selector", sel, e.to_string())),
        }
    }
    match spec["volumeClaimTemplates"].as_array() {
        // A StatefulSet's claim templates become volumes of its pods.
        Some(claims) if !claims.is_empty() => {
            let mut pod_spec = spec["template"]["spec"].clone();
            let volumes = &mut pod_spec["volumes"];
            if !volumes.is_array() {
                *volumes = json!([]);
            }
            let list = volumes.as_array_mut().expect("made an array above");
            for claim in claims {
                let name = &claim["metadata"]["name"];
                list.retain(|v| &v["name"] != name);
                list.push(json!({"name": name, "persistentVolumeClaim": {"claimName": name}}));
            }
            validate_pod_spec(&pod_spec, "spec.template.spec", errs);
        }
        _ => validate_pod_spec(&spec["template"]["spec"], "spec.template.spec", errs),
    }
}

fn validate_workload_update(new: &Value, old: &Value, errs: &mut Vec<Cause>) {
    immutable(new, old, "/spec/selector", "spec.selector", errs);
}

fn clear_status(obj: &mut Value) {
    if let Some(m) = obj.as_object_mut() {
        m.remove("status");
    }
}

pub struct Deployment;
pub static DEPLOYMENT: Deployment = Deployment;
impl Strategy for Deployment {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        let spec = &mut obj["spec"];
        set_default(spec, "/replicas", json!(1));
        set_default(spec, "/strategy/type", json!("RollingUpdate"));
        if spec["strategy"]["type"] == "RollingUpdate" {
            set_default(spec, "/strategy/rollingUpdate/maxUnavailable", json!("25%"));
            set_default(spec, "/strategy/rollingUpdate/maxSurge", json!("25%"));
        }
        set_default(spec, "/revisionHistoryLimit", json!(10));
        set_default(spec, "/progressDeadlineSeconds", json!(600));
        default_pod_spec(&mut spec["template"]["spec"]);
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        clear_status(obj);
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        validate_workload(obj, errs);
        let strategy = &obj["spec"]["strategy"];
        match strategy["type"].as_str() {
            Some("Recreate") if strategy.get("rollingUpdate").is_some() => {
                errs.push(Cause::forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
            Some("Recreate" | "RollingUpdate") | None => {}
            Some(_) => errs.push(Cause::not_supported(
                "spec.strategy.type",
                &strategy["type"],
                &["Recreate", "RollingUpdate"],
            )),
        }
        let ru = &strategy["rollingUpdate"];
        if is_zero(&ru["maxSurge"]) && is_zero(&ru["maxUnavailable"]) && ru.is_object() {
            errs.push(Cause::invalid(
                "spec.strategy.rollingUpdate.maxUnavailable",
                &ru["maxUnavailable"],
                "may not be 0 when `maxSurge` is 0",
            ));
        }
        non_negative(
            obj,
            "/spec/revisionHistoryLimit",
            "spec.revisionHistoryLimit",
            errs,
        );
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        validate_workload_update(new, old, errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Ready",
                ty: "string",
                priority: 0,
                description: "Number of the pod with ready state",
                cell: &|o| ready_of(o, "/status/readyReplicas", "/spec/replicas"),
            },
            Column {
                name: "Up-to-date",
                ty: "integer",
                priority: 0,
                description: "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                cell: &|o| json!(int_at(o, "/status/updatedReplicas")),
            },
            Column {
                name: "Available",
                ty: "integer",
                priority: 0,
                description: "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                cell: &|o| json!(int_at(o, "/status/availableReplicas")),
            },
            AGE,
            Column {
                name: "Containers",
                ty: "string",
                priority: 1,
                description: "Names of each container in the template.",
                cell: &|o| containers(o, "/spec/template/spec/containers"),
            },
            Column {
                name: "Images",
                ty: "string",
                priority: 1,
                description: "Images referenced by each container in the template.",
                cell: &|o| images(o, "/spec/template/spec/containers"),
            },
            Column {
                name: "Selector",
                ty: "string",
                priority: 1,
                description: "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
                cell: &|o| selector(&o["spec"]["selector"]),
            },
        ];
        C
    }
}

fn is_zero(v: &Value) -> bool {
    v == &json!(0) || v == &json!("0%") || v == &json!("0")
}

pub struct ReplicaSet;
pub static REPLICA_SET: ReplicaSet = ReplicaSet;
impl Strategy for ReplicaSet {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/spec/replicas", json!(1));
        default_pod_spec(&mut obj["spec"]["template"]["spec"]);
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        clear_status(obj);
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        validate_workload(obj, errs);
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        validate_workload_update(new, old, errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Desired",
                ty: "integer",
                priority: 0,
                description: "Replicas is the number of desired pods.",
                cell: &|o| json!(int_at(o, "/spec/replicas")),
            },
            Column {
                name: "Current",
                ty: "integer",
                priority: 0,
                description: "Replicas is the most recently observed number of replicas.",
                cell: &|o| json!(int_at(o, "/status/replicas")),
            },
            Column {
                name: "Ready",
                ty: "integer",
                priority: 0,
                description: "The number of ready replicas for this replica set.",
                cell: &|o| json!(int_at(o, "/status/readyReplicas")),
            },
            AGE,
            Column {
                name: "Containers",
                ty: "string",
                priority: 1,
                description: "Names of each container in the template.",
                cell: &|o| containers(o, "/spec/template/spec/containers"),
            },
            Column {
                name: "Images",
                ty: "string",
                priority: 1,
                description: "Images referenced by each container in the template.",
                cell: &|o| images(o, "/spec/template/spec/containers"),
            },
            Column {
                name: "Selector",
                ty: "string",
                priority: 1,
                description: "Selector is a label query over pods that should match the replica count.",
                cell: &|o| selector(&o["spec"]["selector"]),
            },
        ];
        C
    }
}

pub struct ReplicationController;
pub static REPLICATION_CONTROLLER: ReplicationController = ReplicationController;
impl Strategy for ReplicationController {
    fn tracks_generation(&self) -> bool {
        true
    }
    /// Upstream's defaults: the selector and the object's labels default to the
    /// template's labels.
    fn default(&self, obj: &mut Value) {
        let labels = obj["spec"]["template"]["metadata"]["labels"].clone();
        if labels.as_object().is_some_and(|m| !m.is_empty()) {
            if obj["spec"]["selector"]
                .as_object()
                .is_none_or(|m| m.is_empty())
            {
                obj["spec"]["selector"] = labels.clone();
            }
            if obj["metadata"]["labels"]
                .as_object()
                .is_none_or(|m| m.is_empty())
            {
                obj["metadata"]["labels"] = labels;
            }
        }
        set_default(obj, "/spec/replicas", json!(1));
        if obj["spec"]["template"].is_object() {
            default_pod_spec(&mut obj["spec"]["template"]["spec"]);
        }
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        clear_status(obj);
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        non_negative(obj, "/spec/replicas", "spec.replicas", errs);
        non_negative(obj, "/spec/minReadySeconds", "spec.minReadySeconds", errs);
        let selector = spec["selector"].as_object().filter(|m| !m.is_empty());
        if selector.is_none() {
            errs.push(Cause::required("spec.selector"));
        }
        if !spec["template"].is_object() {
            errs.push(Cause::required("spec.template"));
            return;
        }
        let labels = &spec["template"]["metadata"]["labels"];
        if let Some(selector) = selector
            && !selector.iter().all(|(k, v)| &labels[k] == v)
        {
            errs.push(Cause::invalid(
                "spec.template.metadata.labels",
                labels,
                "`selector` does not match template `labels`",
            ));
        }
        validate_pod_spec(&spec["template"]["spec"], "spec.template.spec", errs);
    }
    fn columns(&self) -> &'static [Column] {
        REPLICA_SET.columns()
    }
}

pub struct StatefulSet;
pub static STATEFUL_SET: StatefulSet = StatefulSet;
impl Strategy for StatefulSet {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        let spec = &mut obj["spec"];
        set_default(spec, "/replicas", json!(1));
        set_default(spec, "/podManagementPolicy", json!("OrderedReady"));
        set_default(spec, "/updateStrategy/type", json!("RollingUpdate"));
        if spec["updateStrategy"]["type"] == "RollingUpdate" {
            set_default(spec, "/updateStrategy/rollingUpdate/partition", json!(0));
        }
        set_default(spec, "/revisionHistoryLimit", json!(10));
        set_default(
            spec,
            "/persistentVolumeClaimRetentionPolicy",
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
        );
        default_pod_spec(&mut spec["template"]["spec"]);
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        clear_status(obj);
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        validate_workload(obj, errs);
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        validate_workload_update(new, old, errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Ready",
                ty: "string",
                priority: 0,
                description: "Number of the pod with ready state",
                cell: &|o| ready_of(o, "/status/readyReplicas", "/spec/replicas"),
            },
            AGE,
            Column {
                name: "Containers",
                ty: "string",
                priority: 1,
                description: "Names of each container in the template.",
                cell: &|o| containers(o, "/spec/template/spec/containers"),
            },
            Column {
                name: "Images",
                ty: "string",
                priority: 1,
                description: "Images referenced by each container in the template.",
                cell: &|o| images(o, "/spec/template/spec/containers"),
            },
        ];
        C
    }
}

pub struct DaemonSet;
pub static DAEMON_SET: DaemonSet = DaemonSet;
impl Strategy for DaemonSet {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        let spec = &mut obj["spec"];
        set_default(spec, "/updateStrategy/type", json!("RollingUpdate"));
        if spec["updateStrategy"]["type"] == "RollingUpdate" {
            set_default(
                spec,
                "/updateStrategy/rollingUpdate/maxUnavailable",
                json!(1),
            );
            set_default(spec, "/updateStrategy/rollingUpdate/maxSurge", json!(0));
        }
        set_default(spec, "/revisionHistoryLimit", json!(10));
        default_pod_spec(&mut spec["template"]["spec"]);
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        clear_status(obj);
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        validate_workload(obj, errs);
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        validate_workload_update(new, old, errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Desired",
                ty: "integer",
                priority: 0,
                description: "The total number of nodes that should be running the daemon pod.",
                cell: &|o| json!(int_at(o, "/status/desiredNumberScheduled")),
            },
            Column {
                name: "Current",
                ty: "integer",
                priority: 0,
                description: "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
                cell: &|o| json!(int_at(o, "/status/currentNumberScheduled")),
            },
            Column {
                name: "Ready",
                ty: "integer",
                priority: 0,
                description: "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
                cell: &|o| json!(int_at(o, "/status/numberReady")),
            },
            Column {
                name: "Up-to-date",
                ty: "integer",
                priority: 0,
                description: "The total number of nodes that are running updated daemon pod",
                cell: &|o| json!(int_at(o, "/status/updatedNumberScheduled")),
            },
            Column {
                name: "Available",
                ty: "integer",
                priority: 0,
                description: "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
                cell: &|o| json!(int_at(o, "/status/numberAvailable")),
            },
            Column {
                name: "Node Selector",
                ty: "string",
                priority: 0,
                description: "NodeSelector is a selector which must be true for the pod to fit on a node.",
                cell: &|o| map(&o["spec"]["template"]["spec"]["nodeSelector"]),
            },
            AGE,
            Column {
                name: "Containers",
                ty: "string",
                priority: 1,
                description: "Names of each container in the template.",
                cell: &|o| containers(o, "/spec/template/spec/containers"),
            },
            Column {
                name: "Images",
                ty: "string",
                priority: 1,
                description: "Images referenced by each container in the template.",
                cell: &|o| images(o, "/spec/template/spec/containers"),
            },
            Column {
                name: "Selector",
                ty: "string",
                priority: 1,
                description: "A label query over pods that are managed by the daemon set.",
                cell: &|o| selector(&o["spec"]["selector"]),
            },
        ];
        C
    }
}

pub struct ControllerRevision;
pub static CONTROLLER_REVISION: ControllerRevision = ControllerRevision;
impl Strategy for ControllerRevision {
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        immutable(new, old, "/data", "data", errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Controller",
                ty: "string",
                priority: 0,
                description: "Controller of the object.",
                cell: &controller_cell,
            },
            Column {
                name: "Revision",
                ty: "integer",
                priority: 0,
                description: "Revision indicates the revision of the state represented by Data.",
                cell: &|o| o["revision"].clone(),
            },
            AGE,
        ];
        C
    }
}

/// `deployment.apps/web` for the controlling owner, `<none>` without one.
fn controller_cell(o: &Value) -> Value {
    o["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["controller"] == json!(true))
        .map_or(json!("<none>"), |r| {
            let group = r["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .split('/')
                .rev()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            let kind = r["kind"].as_str().unwrap_or_default().to_lowercase();
            let name = r["name"].as_str().unwrap_or_default();
            if group.is_empty() {
                json!(format!("{kind}/{name}"))
            } else {
                json!(format!("{kind}.{group}/{name}"))
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_defaults_and_selector_checks() {
        let mut d = json!({"spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "other"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}});
        DEPLOYMENT.default(&mut d);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(d["spec"]["progressDeadlineSeconds"], 600);
        let mut errs = vec![];
        DEPLOYMENT.validate(&d, &mut errs);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.template.metadata.labels");
        let mut changed = d.clone();
        changed["spec"]["selector"]["matchLabels"]["app"] = json!("x");
        let mut errs = vec![];
        DEPLOYMENT.validate_update(&changed, &d, &mut errs);
        assert_eq!(errs[0].field, "spec.selector");
    }
}
