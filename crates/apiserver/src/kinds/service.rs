//! Services: defaulting (type, ports, session affinity, traffic policies), validation
//! (ports, type-specific fields, immutable clusterIP) and the `kubectl get svc` columns.
//! ClusterIP and NodePort allocation is its REST storage's (`service_allocation`).

use std::collections::HashSet;

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column, map};
use crate::validation::{NameRule, each_mut, set_default};

pub struct Service;
pub static SERVICE: Service = Service;

const TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];

impl Strategy for Service {
    fn name_rule(&self) -> NameRule {
        NameRule::Label
    }
    /// Upstream's service storage answers a DELETE with the Service (the official
    /// clients decode the answer of `delete_namespaced_service` as one).
    fn returns_deleted_object(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        let spec = &mut obj["spec"];
        set_default(spec, "/type", json!("ClusterIP"));
        set_default(spec, "/sessionAffinity", json!("None"));
        let ty = spec["type"].as_str().unwrap_or_default().to_string();
        if ty != "ExternalName" {
            set_default(spec, "/internalTrafficPolicy", json!("Cluster"));
        }
        if ty == "NodePort" || ty == "LoadBalancer" {
            set_default(spec, "/externalTrafficPolicy", json!("Cluster"));
        }
        for p in each_mut(spec, "/ports") {
            set_default(p, "/protocol", json!("TCP"));
            if let Some(port) = p.get("port").cloned() {
                set_default(p, "/targetPort", port);
            }
        }
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        obj["status"] = json!({"loadBalancer": {}});
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let spec = &obj["spec"];
        let ty = spec["type"].as_str().unwrap_or_default();
        if !TYPES.contains(&ty) {
            errs.push(Cause::not_supported("spec.type", &spec["type"], TYPES));
        }
        let ports = spec["ports"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let headless = spec["clusterIP"] == json!("None");
        if ty == "ExternalName" {
            if spec["externalName"].as_str().is_none_or(str::is_empty) {
                errs.push(Cause::required("spec.externalName"));
            }
        } else if ports.is_empty() && !headless {
            errs.push(Cause::required("spec.ports"));
        }
        let mut names = HashSet::new();
        let mut seen = HashSet::new();
        for (i, p) in ports.iter().enumerate() {
            let port = p["port"].as_i64().unwrap_or(0);
            if !(1..=65535).contains(&port) {
                errs.push(Cause::invalid(
                    format!("spec.ports[{i}].port"),
                    &p["port"],
                    "must be between 1 and 65535, inclusive",
                ));
            }
            let name = p["name"].as_str().unwrap_or_default();
            if ports.len() > 1 && name.is_empty() {
                errs.push(Cause::required(format!("spec.ports[{i}].name")));
            }
            if !name.is_empty() && !names.insert(name.to_string()) {
                errs.push(Cause::duplicate(
                    format!("spec.ports[{i}].name"),
                    &p["name"],
                ));
            }
            let proto = p["protocol"].as_str().unwrap_or("TCP");
            if !["TCP", "UDP", "SCTP"].contains(&proto) {
                errs.push(Cause::not_supported(
                    format!("spec.ports[{i}].protocol"),
                    &p["protocol"],
                    &["SCTP", "TCP", "UDP"],
                ));
            }
            if !seen.insert((port, proto.to_string())) {
                errs.push(Cause::duplicate(
                    format!("spec.ports[{i}]"),
                    &json!({"port": port, "protocol": proto}),
                ));
            }
            if p.get("nodePort").is_some() && ty == "ClusterIP" {
                errs.push(Cause::forbidden(
                    format!("spec.ports[{i}].nodePort"),
                    "may not be used when `type` is 'ClusterIP'",
                ));
            }
        }
        for field in ["externalTrafficPolicy", "internalTrafficPolicy"] {
            let policy = &spec[field];
            if !policy.is_null() && !["Cluster", "Local"].contains(&policy.as_str().unwrap_or("")) {
                errs.push(Cause::not_supported(
                    format!("spec.{field}"),
                    policy,
                    &["Cluster", "Local"],
                ));
            }
        }
        let affinity = &spec["sessionAffinity"];
        if let Some(a) = affinity.as_str()
            && !["ClientIP", "None"].contains(&a)
        {
            errs.push(Cause::not_supported(
                "spec.sessionAffinity",
                affinity,
                &["ClientIP", "None"],
            ));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        let (n, o) = (&new["spec"]["clusterIP"], &old["spec"]["clusterIP"]);
        let changing_type = new["spec"]["type"] == json!("ExternalName")
            || old["spec"]["type"] == json!("ExternalName");
        if !changing_type && o.as_str().is_some_and(|s| !s.is_empty()) && n != o {
            errs.push(Cause::invalid(
                "spec.clusterIPs[0]",
                n,
                "may not change once set",
            ));
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Type",
                ty: "string",
                priority: 0,
                description: "type determines how the Service is exposed.",
                cell: &|o| o["spec"]["type"].clone(),
            },
            Column {
                name: "Cluster-IP",
                ty: "string",
                priority: 0,
                description: "clusterIP is the IP address of the service and is usually assigned randomly.",
                cell: &|o| {
                    o["spec"]["clusterIP"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .map_or(json!("<none>"), |s| json!(s))
                },
            },
            Column {
                name: "External-IP",
                ty: "string",
                priority: 0,
                description: "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.",
                cell: &external_ip,
            },
            Column {
                name: "Port(s)",
                ty: "string",
                priority: 0,
                description: "The list of ports that are exposed by this service.",
                cell: &ports_cell,
            },
            AGE,
            Column {
                name: "Selector",
                ty: "string",
                priority: 1,
                description: "Route service traffic to pods with label keys and values matching this selector.",
                cell: &|o| map(&o["spec"]["selector"]),
            },
        ];
        C
    }
}

fn external_ip(o: &Value) -> Value {
    let spec = &o["spec"];
    let external: Vec<&str> = spec["externalIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    match spec["type"].as_str().unwrap_or_default() {
        "ExternalName" => spec["externalName"].clone(),
        "LoadBalancer" => {
            let mut ips: Vec<&str> = o["status"]["loadBalancer"]["ingress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
                .collect();
            ips.extend(external);
            if ips.is_empty() {
                json!("<pending>")
            } else {
                json!(ips.join(","))
            }
        }
        _ if !external.is_empty() => json!(external.join(",")),
        _ => json!("<none>"),
    }
}

fn ports_cell(o: &Value) -> Value {
    let parts: Vec<String> = o["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let proto = p["protocol"].as_str().unwrap_or("TCP");
            match p["nodePort"].as_i64() {
                Some(np) => format!("{}:{np}/{proto}", p["port"]),
                None => format!("{}/{proto}", p["port"]),
            }
        })
        .collect();
    if parts.is_empty() {
        json!("<none>")
    } else {
        json!(parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let mut svc = json!({"spec": {"ports": [{"port": 80}, {"port": 443, "name": "https"}]}});
        SERVICE.default(&mut svc);
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(svc["spec"]["ports"][1]["protocol"], "TCP");
        let mut errs = vec![];
        SERVICE.validate(&svc, &mut errs);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.ports[0].name");
        assert_eq!(ports_cell(&svc), json!("80/TCP,443/TCP"));
    }

    #[test]
    fn traffic_policies_are_cluster_or_local() {
        let mut svc = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}],
                                      "internalTrafficPolicy": "Local"}});
        SERVICE.default(&mut svc);
        assert_eq!(svc["spec"]["externalTrafficPolicy"], "Cluster");
        assert_eq!(svc["spec"]["internalTrafficPolicy"], "Local");
        let mut errs = vec![];
        SERVICE.validate(&svc, &mut errs);
        assert!(errs.is_empty());
        svc["spec"]["externalTrafficPolicy"] = json!("Nearby");
        SERVICE.validate(&svc, &mut errs);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.externalTrafficPolicy");
        assert_eq!(
            errs[0].message,
            r#"Unsupported value: "Nearby": supported values: "Cluster", "Local""#
        );
    }
}
