//! Strategy of scheduling.k8s.io: PriorityClass — defaults, checks and columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column};
use crate::validation::{immutable, set_default};

pub struct PriorityClass;
pub static PRIORITY_CLASS: PriorityClass = PriorityClass;
impl Strategy for PriorityClass {
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/preemptionPolicy", json!("PreemptLowerPriority"));
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        if name.starts_with("system-")
            && !["system-node-critical", "system-cluster-critical"].contains(&name)
        {
            errs.push(Cause::forbidden(
                "metadata.name",
                "priority class names with 'system-' prefix are reserved for system use only",
            ));
        }
        if obj["value"].as_i64().is_some_and(|v| v > 1_000_000_000) && !name.starts_with("system-")
        {
            errs.push(Cause::forbidden(
                "value",
                "maximum allowed value of a user defined priority is 1000000000",
            ));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        immutable(new, old, "/value", "value", errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Value",
                ty: "integer",
                priority: 0,
                description: "value represents the integer value of this priority class.",
                cell: &|o| o["value"].clone(),
            },
            Column {
                name: "Global-Default",
                ty: "boolean",
                priority: 0,
                description: "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class.",
                cell: &|o| json!(o["globalDefault"].as_bool().unwrap_or(false)),
            },
            AGE,
            Column {
                name: "PreemptionPolicy",
                ty: "string",
                priority: 0,
                description: "preemptionPolicy is the Policy for preempting pods with lower priority.",
                cell: &|o| o["preemptionPolicy"].clone(),
            },
        ];
        C
    }
}
