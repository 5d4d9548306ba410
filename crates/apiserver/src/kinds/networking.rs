//! Strategy of networking.k8s.io: IngressClass, Ingress and NetworkPolicy — defaults, checks and columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column, selector, str_or_none};
use crate::validation::{each_mut, set_default};

pub struct IngressClass;
pub static INGRESS_CLASS: IngressClass = IngressClass;
impl Strategy for IngressClass {
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Controller",
                ty: "string",
                priority: 0,
                description: "Controller that is responsible for handling this class",
                cell: &|o| o["spec"]["controller"].clone(),
            },
            Column {
                name: "Parameters",
                ty: "string",
                priority: 0,
                description: "A reference to a resource with additional parameters",
                cell: &|o| {
                    let p = &o["spec"]["parameters"];
                    if p.is_object() {
                        json!(format!(
                            "{}/{}",
                            p["kind"].as_str().unwrap_or_default(),
                            p["name"].as_str().unwrap_or_default()
                        ))
                    } else {
                        json!("<none>")
                    }
                },
            },
            AGE,
        ];
        C
    }
}

pub struct Ingress;
pub static INGRESS: Ingress = Ingress;
impl Strategy for Ingress {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        for rule in each_mut(obj, "/spec/rules") {
            for path in each_mut(rule, "/http/paths") {
                set_default(path, "/pathType", json!("ImplementationSpecific"));
            }
        }
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        if spec["defaultBackend"].is_null() && spec["rules"].as_array().is_none_or(Vec::is_empty) {
            errs.push(Cause::invalid(
                "spec",
                &json!("{}"),
                "either `defaultBackend` or `rules` must be specified",
            ));
        }
        for (i, rule) in spec["rules"].as_array().into_iter().flatten().enumerate() {
            for (j, path) in rule["http"]["paths"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let ty = &path["pathType"];
                if !["Exact", "Prefix", "ImplementationSpecific"]
                    .contains(&ty.as_str().unwrap_or_default())
                {
                    errs.push(Cause::not_supported(
                        format!("spec.rules[{i}].http.paths[{j}].pathType"),
                        ty,
                        &["Exact", "ImplementationSpecific", "Prefix"],
                    ));
                }
                let p = path["path"].as_str().unwrap_or_default();
                if ty != "ImplementationSpecific" && !p.starts_with('/') {
                    errs.push(Cause::invalid(
                        format!("spec.rules[{i}].http.paths[{j}].path"),
                        &path["path"],
                        "must be an absolute path",
                    ));
                }
            }
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Class",
                ty: "string",
                priority: 0,
                description: "The name of the IngressClass resource that should be used for additional configuration",
                cell: &|o| str_or_none(o, "/spec/ingressClassName"),
            },
            Column {
                name: "Hosts",
                ty: "string",
                priority: 0,
                description: "Hosts that incoming requests are matched against before the ingress rule",
                cell: &ingress_hosts,
            },
            Column {
                name: "Address",
                ty: "string",
                priority: 0,
                description: "Address is a list containing ingress points for the load-balancer",
                cell: &|o| {
                    let ips: Vec<&str> = o["status"]["loadBalancer"]["ingress"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
                        .collect();
                    json!(ips.join(","))
                },
            },
            Column {
                name: "Ports",
                ty: "string",
                priority: 0,
                description: "Ports of TLS configurations that open",
                cell: &|o| {
                    if o["spec"]["tls"].as_array().is_some_and(|t| !t.is_empty()) {
                        json!("80, 443")
                    } else {
                        json!("80")
                    }
                },
            },
            AGE,
        ];
        C
    }
}

fn ingress_hosts(o: &Value) -> Value {
    let hosts: Vec<&str> = o["spec"]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["host"].as_str())
        .collect();
    match hosts.len() {
        0 => json!("*"),
        n if n <= 4 => json!(hosts.join(",")),
        n => json!(format!("{} + {} more...", hosts[..4].join(","), n - 4)),
    }
}

pub struct NetworkPolicy;
pub static NETWORK_POLICY: NetworkPolicy = NetworkPolicy;
impl Strategy for NetworkPolicy {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        if obj["spec"]["policyTypes"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            // Upstream: Ingress always, Egress when egress rules are given.
            let mut types = vec![json!("Ingress")];
            if obj["spec"]["egress"]
                .as_array()
                .is_some_and(|e| !e.is_empty())
            {
                types.push(json!("Egress"));
            }
            obj["spec"]["policyTypes"] = Value::Array(types);
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Pod-Selector",
                ty: "string",
                priority: 0,
                description: "Selects the pods to which this NetworkPolicy object applies.",
                cell: &|o| {
                    let s = selector(&o["spec"]["podSelector"]);
                    if s == json!("<none>") {
                        json!("<none>")
                    } else {
                        s
                    }
                },
            },
            AGE,
        ];
        C
    }
}
