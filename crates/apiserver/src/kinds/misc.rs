//! Strategies of the remaining kinds: Lease, EndpointSlice, Ingress, IngressClass,
//! NetworkPolicy, PodDisruptionBudget, RoleBinding/ClusterRoleBinding, PriorityClass and
//! StorageClass — mostly their columns and a few defaults and checks.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use super::table::{AGE, Column, selector, str_or_none};
use super::validation::{NameRule, each_mut, immutable, set_default};

pub struct Lease;
pub static LEASE: Lease = Lease;
impl Strategy for Lease {
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Holder",
                ty: "string",
                priority: 0,
                description: "The holder of the lease",
                cell: |o| {
                    o["spec"]["holderIdentity"]
                        .as_str()
                        .map_or(json!(""), |s| json!(s))
                },
            },
            AGE,
        ];
        C
    }
}

pub struct EndpointSlice;
pub static ENDPOINT_SLICE: EndpointSlice = EndpointSlice;
impl Strategy for EndpointSlice {
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let at = &obj["addressType"];
        match at.as_str() {
            Some("IPv4" | "IPv6" | "FQDN") => {}
            None => errs.push(Cause::required("addressType")),
            Some(_) => errs.push(Cause::not_supported(
                "addressType",
                at,
                &["FQDN", "IPv4", "IPv6"],
            )),
        }
        if obj["endpoints"].as_array().is_some_and(|e| e.len() > 1000) {
            errs.push(Cause {
                reason: "FieldValueTooMany",
                message: "Too many: must have at most 1000 items".into(),
                field: "endpoints".into(),
            });
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        immutable(new, old, "/addressType", "addressType", errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "AddressType",
                ty: "string",
                priority: 0,
                description: "The IP protocol for this slice",
                cell: |o| o["addressType"].clone(),
            },
            Column {
                name: "Ports",
                ty: "string",
                priority: 0,
                description: "Enumerated ports on this slice",
                cell: slice_ports,
            },
            Column {
                name: "Endpoints",
                ty: "string",
                priority: 0,
                description: "Endpoints on this slice",
                cell: slice_endpoints,
            },
            AGE,
        ];
        C
    }
}

fn slice_ports(o: &Value) -> Value {
    let ports: Vec<String> = o["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["port"].as_i64())
        .map(|p| p.to_string())
        .collect();
    if ports.is_empty() {
        json!("<unset>")
    } else {
        json!(ports.join(","))
    }
}

fn slice_endpoints(o: &Value) -> Value {
    let addrs: Vec<&str> = o["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    match addrs.len() {
        0 => json!("<unset>"),
        n if n <= 3 => json!(addrs.join(",")),
        n => json!(format!("{} + {} more...", addrs[..3].join(","), n - 3)),
    }
}

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
                cell: |o| o["spec"]["controller"].clone(),
            },
            Column {
                name: "Parameters",
                ty: "string",
                priority: 0,
                description: "A reference to a resource with additional parameters",
                cell: |o| {
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
                cell: |o| str_or_none(o, "/spec/ingressClassName"),
            },
            Column {
                name: "Hosts",
                ty: "string",
                priority: 0,
                description: "Hosts that incoming requests are matched against before the ingress rule",
                cell: ingress_hosts,
            },
            Column {
                name: "Address",
                ty: "string",
                priority: 0,
                description: "Address is a list containing ingress points for the load-balancer",
                cell: |o| {
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
                cell: |o| {
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
                cell: |o| {
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
                cell: |o| na(&o["spec"]["minAvailable"]),
            },
            Column {
                name: "Max Unavailable",
                ty: "string",
                priority: 0,
                description: "The maximum number of pods that may be unavailable.",
                cell: |o| na(&o["spec"]["maxUnavailable"]),
            },
            Column {
                name: "Allowed Disruptions",
                ty: "integer",
                priority: 0,
                description: "Calculated number of pods that may be disrupted at this time.",
                cell: |o| json!(o["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
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

pub struct RoleBinding;
pub static ROLE_BINDING: RoleBinding = RoleBinding;
impl Strategy for RoleBinding {
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let kind = &obj["roleRef"]["kind"];
        if !["Role", "ClusterRole"].contains(&kind.as_str().unwrap_or_default()) {
            errs.push(Cause::not_supported(
                "roleRef.kind",
                kind,
                &["Role", "ClusterRole"],
            ));
        }
        if obj["roleRef"]["name"].as_str().is_none_or(str::is_empty) {
            errs.push(Cause::required("roleRef.name"));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        if new["roleRef"] != old["roleRef"] {
            errs.push(Cause::invalid(
                "roleRef",
                &new["roleRef"],
                "cannot change roleRef",
            ));
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Role",
                ty: "string",
                priority: 0,
                description: "Role is the role that this binding refers to.",
                cell: |o| {
                    json!(format!(
                        "{}/{}",
                        o["roleRef"]["kind"].as_str().unwrap_or_default(),
                        o["roleRef"]["name"].as_str().unwrap_or_default()
                    ))
                },
            },
            AGE,
            Column {
                name: "Users",
                ty: "string",
                priority: 1,
                description: "Users in the binding.",
                cell: |o| subjects(o, "User"),
            },
            Column {
                name: "Groups",
                ty: "string",
                priority: 1,
                description: "Groups in the binding.",
                cell: |o| subjects(o, "Group"),
            },
            Column {
                name: "ServiceAccounts",
                ty: "string",
                priority: 1,
                description: "ServiceAccounts in the binding.",
                cell: |o| subjects(o, "ServiceAccount"),
            },
        ];
        C
    }
}

fn subjects(o: &Value, kind: &str) -> Value {
    let names: Vec<String> = o["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"] == kind)
        .map(|s| match s["namespace"].as_str() {
            Some(ns) if kind == "ServiceAccount" => {
                format!("{ns}/{}", s["name"].as_str().unwrap_or_default())
            }
            _ => s["name"].as_str().unwrap_or_default().to_string(),
        })
        .collect();
    json!(names.join(", "))
}

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
                cell: |o| o["value"].clone(),
            },
            Column {
                name: "Global-Default",
                ty: "boolean",
                priority: 0,
                description: "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class.",
                cell: |o| json!(o["globalDefault"].as_bool().unwrap_or(false)),
            },
            AGE,
            Column {
                name: "PreemptionPolicy",
                ty: "string",
                priority: 0,
                description: "preemptionPolicy is the Policy for preempting pods with lower priority.",
                cell: |o| o["preemptionPolicy"].clone(),
            },
        ];
        C
    }
}

pub struct StorageClass;
pub static STORAGE_CLASS: StorageClass = StorageClass;
impl Strategy for StorageClass {
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/reclaimPolicy", json!("Delete"));
        set_default(obj, "/volumeBindingMode", json!("Immediate"));
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        if obj["provisioner"].as_str().is_none_or(str::is_empty) {
            errs.push(Cause::required("provisioner"));
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        for (p, f) in [
            ("/provisioner", "provisioner"),
            ("/parameters", "parameters"),
            ("/reclaimPolicy", "reclaimPolicy"),
            ("/volumeBindingMode", "volumeBindingMode"),
        ] {
            immutable(new, old, p, f, errs);
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Provisioner",
                ty: "string",
                priority: 0,
                description: "provisioner indicates the type of the provisioner.",
                cell: |o| o["provisioner"].clone(),
            },
            Column {
                name: "ReclaimPolicy",
                ty: "string",
                priority: 0,
                description: "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class.",
                cell: |o| o["reclaimPolicy"].clone(),
            },
            Column {
                name: "VolumeBindingMode",
                ty: "string",
                priority: 0,
                description: "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.",
                cell: |o| o["volumeBindingMode"].clone(),
            },
            Column {
                name: "AllowVolumeExpansion",
                ty: "boolean",
                priority: 0,
                description: "allowVolumeExpansion shows whether the storage class allow volume expand.",
                cell: |o| json!(o["allowVolumeExpansion"].as_bool().unwrap_or(false)),
            },
            AGE,
        ];
        C
    }
}
