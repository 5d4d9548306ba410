//! Strategy of node.k8s.io: RuntimeClass — checks and columns, as upstream's
//! `ValidateRuntimeClass`.

use krust_api::status::Cause;
use serde_json::Value;

use super::Strategy;
use crate::table::{AGE, Column};
use crate::validation::{NameRule, check_labels, check_name, immutable};

pub struct RuntimeClass;
pub static RUNTIME_CLASS: RuntimeClass = RuntimeClass;
impl Strategy for RuntimeClass {
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        // The handler names a CRI runtime handler: a DNS label.
        let handler = obj["handler"].as_str().unwrap_or_default();
        check_name(NameRule::Label, "handler", handler, errs);
        // Upstream checks the overhead as a container's limits, and names it so.
        if let Some(fixed) = obj["overhead"]["podFixed"].as_object() {
            for (resource, quantity) in fixed {
                let negative = quantity
                    .as_str()
                    .and_then(|q| krust_api::quantity::scaled_value(q, 3).ok())
                    .is_some_and(|milli| milli < 0);
                if negative {
                    errs.push(Cause::invalid(
                        format!("overhead.limits[{resource}]"),
                        quantity,
                        "must be greater than or equal to 0",
                    ));
                }
            }
        }
        check_labels(
            "scheduling.nodeSelector",
            &obj["scheduling"]["nodeSelector"],
            errs,
        );
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        immutable(new, old, "/handler", "handler", errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Handler",
                ty: "string",
                priority: 0,
                description: "handler specifies the underlying runtime and configuration that the CRI implementation will use to handle pods of this class. The possible values are specific to the node & CRI configuration.  It is assumed that all handlers are available on every node, and handlers of the same name are equivalent on every node. For example, a handler called \"runc\" might specify that the runc OCI runtime (using native Linux containers) will be used to run the containers in a pod. The Handler must be lowercase, conform to the DNS Label (RFC 1123) requirements, and is immutable.",
                cell: &|o| o["handler"].clone(),
            },
            AGE,
        ];
        C
    }
}
