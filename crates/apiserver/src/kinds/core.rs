//! Strategies of the simple core/v1 kinds: ConfigMap, Secret, ServiceAccount, Endpoints,
//! Namespace, Node and ResourceQuota.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column, int_at, str_or_none};
use crate::validation::{NameRule, immutable, set_default};

fn count_keys(v: &Value) -> usize {
    v.as_object().map_or(0, |m| m.len())
}

pub struct ConfigMap;
pub static CONFIG_MAP: ConfigMap = ConfigMap;
impl Strategy for ConfigMap {
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        immutable_data(new, old, errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Data",
                ty: "integer",
                priority: 0,
                description: "Data contains the configuration data.",
                cell: &|o| json!(count_keys(&o["data"]) + count_keys(&o["binaryData"])),
            },
            AGE,
        ];
        C
    }
}

/// `immutable: true` ConfigMaps and Secrets keep their data and stay immutable.
fn immutable_data(new: &Value, old: &Value, errs: &mut Vec<Cause>) {
    if old["immutable"] == json!(true) {
        if new["immutable"] != json!(true) {
            errs.push(Cause::forbidden(
                "immutable",
                "field is immutable when `immutable` is set",
            ));
        }
        if new["data"] != old["data"] || new["binaryData"] != old["binaryData"] {
            errs.push(Cause::forbidden(
                "data",
                "field is immutable when `immutable` is set",
            ));
        }
    }
}

pub struct Secret;
pub static SECRET: Secret = Secret;
impl Strategy for Secret {
    fn default(&self, obj: &mut Value) {
        set_default(obj, "/type", json!("Opaque"));
        // `stringData` is write-only, as upstream's conversion makes it: each of its
        // values replaces the key's in `data`, and it is never stored.
        let strings = obj.as_object_mut().and_then(|o| o.remove("stringData"));
        for (key, value) in strings
            .as_ref()
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if let Some(text) = value.as_str() {
                use base64::Engine;
                obj["data"][key] = json!(base64::engine::general_purpose::STANDARD.encode(text));
            }
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        immutable(new, old, "/type", "type", errs);
        immutable_data(new, old, errs);
    }
    fn fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![("type", obj["type"].as_str().unwrap_or_default().to_string())]
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Type",
                ty: "string",
                priority: 0,
                description: "Used to facilitate programmatic handling of secret data.",
                cell: &|o| o["type"].clone(),
            },
            Column {
                name: "Data",
                ty: "integer",
                priority: 0,
                description: "Data contains the secret data.",
                cell: &|o| json!(count_keys(&o["data"])),
            },
            AGE,
        ];
        C
    }
}

pub struct ServiceAccount;
pub static SERVICE_ACCOUNT: ServiceAccount = ServiceAccount;
impl Strategy for ServiceAccount {
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Secrets",
                ty: "string",
                priority: 0,
                description: "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use.",
                cell: &|o| json!(o["secrets"].as_array().map_or(0, Vec::len)),
            },
            AGE,
        ];
        C
    }
}

pub struct Endpoints;
pub static ENDPOINTS: Endpoints = Endpoints;
impl Strategy for Endpoints {
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Endpoints",
                ty: "string",
                priority: 0,
                description: "Endpoints of the service",
                cell: &endpoints_cell,
            },
            AGE,
        ];
        C
    }
}

/// `10.42.0.5:80,10.42.0.6:80 + 3 more...` as kubectl prints endpoints.
fn endpoints_cell(o: &Value) -> Value {
    let mut all = Vec::new();
    for subset in o["subsets"].as_array().into_iter().flatten() {
        let ports: Vec<i64> = subset["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["port"].as_i64())
            .collect();
        for addr in subset["addresses"].as_array().into_iter().flatten() {
            let ip = addr["ip"].as_str().unwrap_or_default();
            if ports.is_empty() {
                all.push(ip.to_string());
            }
            for p in &ports {
                all.push(format!("{ip}:{p}"));
            }
        }
    }
    if all.is_empty() {
        return json!("<none>");
    }
    let shown = all.len().min(3);
    let mut s = all[..shown].join(",");
    if all.len() > shown {
        s.push_str(&format!(" + {} more...", all.len() - shown));
    }
    json!(s)
}

/// Upstream's defaulting of a LimitRange's Container items: a missing default limit is
/// the max, a missing default request the default limit, else the min.
fn default_limit_range(range: &mut Value) {
    let items = range
        .pointer_mut("/spec/limits")
        .and_then(Value::as_array_mut);
    for item in items.into_iter().flatten() {
        if item["type"] != "Container" {
            continue;
        }
        for (from, to) in [
            ("max", "default"),
            ("default", "defaultRequest"),
            ("min", "defaultRequest"),
        ] {
            let source: Vec<(String, Value)> = item[from]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (k, v) in source {
                if item[to].get(&k).is_none() {
                    item[to][k] = v;
                }
            }
        }
    }
}

pub struct LimitRange;
pub static LIMIT_RANGE: LimitRange = LimitRange;
impl Strategy for LimitRange {
    fn default(&self, obj: &mut Value) {
        default_limit_range(obj);
    }
}

pub struct Namespace;
pub static NAMESPACE: Namespace = Namespace;
impl Strategy for Namespace {
    fn prepare_for_delete(&self, obj: &mut Value) {
        obj["status"]["phase"] = json!("Terminating");
    }
    fn holds_deletion(&self, obj: &Value) -> bool {
        obj["spec"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
    }
    fn name_rule(&self) -> NameRule {
        NameRule::Label
    }
    fn default(&self, obj: &mut Value) {
        let name = obj["metadata"]["name"].clone();
        if name.is_string() {
            // Upstream sets this label on every namespace so selectors can pick by name.
            if !obj["metadata"]["labels"].is_object() {
                obj["metadata"]["labels"] = json!({});
            }
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
        }
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        obj["status"] = json!({"phase": "Active"});
        let finalizers = obj["spec"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !finalizers.contains(&json!("kubernetes")) {
            let mut f = finalizers;
            f.push(json!("kubernetes"));
            obj["spec"]["finalizers"] = Value::Array(f);
        }
    }
    fn fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![(
            "status.phase",
            obj["status"]["phase"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )]
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Status",
                ty: "string",
                priority: 0,
                description: "The status of the namespace",
                cell: &|o| o["status"]["phase"].clone(),
            },
            AGE,
        ];
        C
    }
}

pub struct Node;
pub static NODE: Node = Node;
impl Strategy for Node {
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        // podCIDR may be set once, never changed.
        if !old["spec"]["podCIDR"].is_null() {
            immutable(new, old, "/spec/podCIDR", "spec.podCIDR", errs);
        }
    }
    fn fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![(
            "spec.unschedulable",
            obj["spec"]["unschedulable"]
                .as_bool()
                .unwrap_or(false)
                .to_string(),
        )]
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Status",
                ty: "string",
                priority: 0,
                description: "The status of the node",
                cell: &node_status,
            },
            Column {
                name: "Roles",
                ty: "string",
                priority: 0,
                description: "The roles of the node",
                cell: &node_roles,
            },
            AGE,
            Column {
                name: "Version",
                ty: "string",
                priority: 0,
                description: "Kubelet Version reported by the node.",
                cell: &|o| o["status"]["nodeInfo"]["kubeletVersion"].clone(),
            },
            Column {
                name: "Loopback-IP",
                ty: "string",
                priority: 1,
                description: "List of internal IPs.",
                cell: &|o| node_address(o, "InternalIP"),
            },
            Column {
                name: "External-IP",
                ty: "string",
                priority: 1,
                description: "List of external IPs.",
                cell: &|o| node_address(o, "ExternalIP"),
            },
            Column {
                name: "OS-Image",
                ty: "string",
                priority: 1,
                description: "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
                cell: &|o| str_or_none(o, "/status/nodeInfo/osImage"),
            },
            Column {
                name: "Kernel-Version",
                ty: "string",
                priority: 1,
                description: "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
                cell: &|o| str_or_none(o, "/status/nodeInfo/kernelVersion"),
            },
            Column {
                name: "Container-Runtime",
                ty: "string",
                priority: 1,
                description: "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
                cell: &|o| str_or_none(o, "/status/nodeInfo/containerRuntimeVersion"),
            },
        ];
        C
    }
}

fn node_status(o: &Value) -> Value {
    let ready = o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .map(|c| c["status"].as_str().unwrap_or_default());
    let mut s = match ready {
        Some("True") => "Ready".to_string(),
        _ => "NotReady".to_string(),
    };
    if o["spec"]["unschedulable"] == json!(true) {
        s.push_str(",SchedulingDisabled");
    }
    json!(s)
}

fn node_roles(o: &Value) -> Value {
    let mut roles: Vec<String> = o["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                Some(role.to_string())
            } else if k == "kubernetes.io/role" {
                v.as_str().map(str::to_string)
            } else {
                None
            }
        })
        .filter(|r| !r.is_empty())
        .collect();
    roles.sort();
    if roles.is_empty() {
        json!("<none>")
    } else {
        json!(roles.join(","))
    }
}

fn node_address(o: &Value, ty: &str) -> Value {
    o["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == ty)
        .map_or(json!("<none>"), |a| a["address"].clone())
}

pub struct ResourceQuota;
pub static RESOURCE_QUOTA: ResourceQuota = ResourceQuota;
impl Strategy for ResourceQuota {
    fn prepare_for_create(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            AGE,
            Column {
                name: "Request",
                ty: "string",
                priority: 0,
                description: "Request represents a minimum amount of cpu/memory that a container may consume.",
                cell: &|o| quota_cell(o, false),
            },
            Column {
                name: "Limit",
                ty: "string",
                priority: 0,
                description: "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node.",
                cell: &|o| quota_cell(o, true),
            },
        ];
        C
    }
}

/// `pods: 1/10, requests.cpu: 0/2` as kubectl prints quota usage.
fn quota_cell(o: &Value, limits: bool) -> Value {
    let hard = o["spec"]["hard"].as_object().cloned().unwrap_or_default();
    let mut parts: Vec<String> = hard
        .iter()
        .filter(|(k, _)| k.starts_with("limits.") == limits)
        .map(|(k, v)| {
            let used = o["status"]["used"][k].as_str().unwrap_or("0");
            format!("{k}: {used}/{}", v.as_str().unwrap_or_default())
        })
        .collect();
    parts.sort();
    json!(parts.join(", "))
}

/// Pod counts in `status` printed as `ready/desired`.
pub fn ready_of(o: &Value, ready: &str, desired: &str) -> Value {
    json!(format!("{}/{}", int_at(o, ready), int_at(o, desired)))
}

/// ComponentStatus: served by [`crate::component_status`]; only its columns live here.
pub struct ComponentStatus;
pub static COMPONENT_STATUS: ComponentStatus = ComponentStatus;
impl Strategy for ComponentStatus {
    fn columns(&self) -> &'static [Column] {
        fn healthy(o: &Value) -> &Value {
            o["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Healthy"))
                .unwrap_or(&Value::Null)
        }
        static C: &[Column] = &[
            Column {
                name: "Status",
                ty: "string",
                priority: 0,
                description: "Status of the component conditions",
                cell: &|o| {
                    json!(match healthy(o)["status"].as_str() {
                        Some("True") => "Healthy",
                        Some(_) => "Unhealthy",
                        None => "Unknown",
                    })
                },
            },
            Column {
                name: "Message",
                ty: "string",
                priority: 0,
                description: "Message of the component conditions",
                cell: &|o| json!(healthy(o)["message"].as_str().unwrap_or_default()),
            },
            Column {
                name: "Error",
                ty: "string",
                priority: 0,
                description: "Error of the component conditions",
                cell: &|o| json!(healthy(o)["error"].as_str().unwrap_or_default()),
            },
        ];
        C
    }
}
