//! Strategy of policy: PodDisruptionBudget — checks and columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column};

pub struct Pdb;
pub static PDB: Pdb = Pdb;
impl Strategy for Pdb {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        if !obj["spec"]["minAvailable"].is_null() && !obj["spec"]["maxUnavailable"].is_null() {
            errs.push(Cause::invalid(
                "spec",
                &json!("{}"),
                "minAvailable and maxUnavailable cannot be both set",
            ));
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Min Available",
                ty: "string",
                priority: 0,
                description: "The minimum number of pods that must be available.",
                cell: &|o| na(&o["spec"]["minAvailable"]),
            },
            Column {
                name: "Max Unavailable",
                ty: "string",
                priority: 0,
                description: "The maximum number of pods that may be unavailable.",
                cell: &|o| na(&o["spec"]["maxUnavailable"]),
            },
            Column {
                name: "Allowed Disruptions",
                ty: "integer",
                priority: 0,
                description: "Calculated number of pods that may be disrupted at this time.",
                cell: &|o| json!(o["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
            },
            AGE,
        ];
        C
    }
}

fn na(v: &Value) -> Value {
    match v {
        Value::Null => json!("N/A"),
        Value::String(s) => json!(s),
        other => json!(other.to_string()),
    }
}
