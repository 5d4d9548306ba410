//! Strategy of apiregistration.k8s.io: APIService — upstream's checks and the SERVICE /
//! AVAILABLE columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column};
use crate::validation::NameRule;

pub struct ApiService;
pub static API_SERVICE: ApiService = ApiService;

impl Strategy for ApiService {
    /// Upstream checks only that the name is a path segment: the core group's is `v1.`.
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }

    fn prepare_for_create(&self, obj: &mut Value) {
        obj["status"] = json!({});
    }

    fn default(&self, obj: &mut Value) {
        let service = &mut obj["spec"]["service"];
        if service.is_object() && service["port"].is_null() {
            service["port"] = json!(443);
        }
    }

    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        let (group, version) = (
            spec["group"].as_str().unwrap_or_default(),
            spec["version"].as_str().unwrap_or_default(),
        );
        if version.is_empty() {
            errs.push(Cause::required("spec.version"));
        }
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        if name != format!("{version}.{group}") {
            errs.push(Cause::invalid(
                "metadata.name",
                &json!(name),
                "must be spec.version+\".\"+spec.group",
            ));
        }
        for (field, max) in [("groupPriorityMinimum", 20000), ("versionPriority", 1000)] {
            let v = spec[field].as_i64().unwrap_or(0);
            if v <= 0 || v > max {
                errs.push(Cause::invalid(
                    format!("spec.{field}"),
                    &json!(v),
                    format!("must be positive and less than {max}"),
                ));
            }
        }
        if spec["insecureSkipTLSVerify"] == json!(true)
            && spec["caBundle"].as_str().is_some_and(|b| !b.is_empty())
        {
            errs.push(Cause::invalid(
                "spec.insecureSkipTLSVerify",
                &json!(true),
                "may not be true if caBundle is present",
            ));
        }
    }

    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Service",
                ty: "string",
                priority: 0,
                description: "The reference to the service that hosts this API endpoint.",
                cell: &|o| {
                    let s = &o["spec"]["service"];
                    match (s["namespace"].as_str(), s["name"].as_str()) {
                        (Some(ns), Some(n)) => json!(format!("{ns}/{n}")),
                        _ => json!("Local"),
                    }
                },
            },
            Column {
                name: "Available",
                ty: "string",
                priority: 0,
                description: "Whether this service is available.",
                cell: &|o| {
                    let c = o["status"]["conditions"]
                        .as_array()
                        .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"));
                    match c {
                        Some(c) if c["status"] == "True" => json!("True"),
                        Some(c) => json!(format!(
                            "{} ({})",
                            c["status"].as_str().unwrap_or("Unknown"),
                            c["reason"].as_str().unwrap_or_default()
                        )),
                        None => json!("Unknown"),
                    }
                },
            },
            AGE,
        ];
        C
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_services_are_checked_as_upstream() {
        let mut obj = json!({
            "metadata": {"name": "v1alpha1.wardle.example.com"},
            "spec": {"group": "wardle.example.com", "version": "v1alpha1", "groupPriorityMinimum": 1000,
                     "versionPriority": 15, "service": {"namespace": "wardle", "name": "api"}}
        });
        API_SERVICE.default(&mut obj);
        assert_eq!(obj["spec"]["service"]["port"], 443);
        let mut errs = Vec::new();
        API_SERVICE.validate(&obj, &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        obj["metadata"]["name"] = json!("wardle");
        obj["spec"]["versionPriority"] = json!(0);
        API_SERVICE.validate(&obj, &mut errs);
        let got: Vec<String> = errs.iter().map(Cause::summary).collect();
        assert_eq!(
            got,
            [
                "metadata.name: Invalid value: \"wardle\": must be spec.version+\".\"+spec.group",
                "spec.versionPriority: Invalid value: 0: must be positive and less than 1000",
            ]
        );
    }
}
