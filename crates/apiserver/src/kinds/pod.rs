//! Pods and PodTemplates: upstream's pod defaulting (restart and DNS policy, grace period,
//! image pull policy from the tag, termination message), validation of the pod spec, the
//! pod field selectors and the `kubectl get pods` columns.

use std::collections::HashSet;

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use crate::table::{AGE, Column, containers, images, map, str_or_none};
use crate::validation::{NameRule, check_name, each_mut, immutable, is_dns1123_label, set_default};

/// Defaults of a pod spec, shared by pods and every pod template.
pub fn default_pod_spec(spec: &mut Value) {
    set_default(spec, "/restartPolicy", json!("Always"));
    set_default(spec, "/dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "/terminationGracePeriodSeconds", json!(30));
    set_default(spec, "/schedulerName", json!("default-scheduler"));
    set_default(spec, "/securityContext", json!({}));
    set_default(spec, "/enableServiceLinks", json!(true));
    if let Some(sa) = spec
        .get("serviceAccountName")
        .filter(|v| v.is_string())
        .cloned()
    {
        set_default(spec, "/serviceAccount", sa);
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in each_mut(spec, &format!("/{list}")) {
            default_container(c);
        }
    }
    for v in each_mut(spec, "/volumes") {
        for (source, mode) in [
            ("configMap", 0o644),
            ("secret", 0o644),
            ("downwardAPI", 0o644),
            ("projected", 0o644),
        ] {
            if v.get(source).is_some_and(Value::is_object) {
                set_default(&mut v[source], "/defaultMode", json!(mode));
            }
        }
        each_mut(v, "/downwardAPI/items").for_each(default_field_ref);
        for source in each_mut(v, "/projected/sources") {
            each_mut(source, "/downwardAPI/items").for_each(default_field_ref);
        }
        if v.as_object().is_some_and(|m| m.len() == 1) {
            // A volume with only a name is an emptyDir, as upstream defaults it.
            v["emptyDir"] = json!({});
        }
    }
}

/// A `fieldRef` (an env var's `valueFrom`, a downward API item) selects a field of the
/// pod's v1 representation unless it says otherwise.
fn default_field_ref(holder: &mut Value) {
    if let Some(field_ref) = holder.get_mut("fieldRef").filter(|r| r.is_object()) {
        set_default(field_ref, "/apiVersion", json!("v1"));
    }
}

fn default_container(c: &mut Value) {
    let image = c["image"].as_str().unwrap_or_default();
    set_default(c, "/imagePullPolicy", json!(pull_policy_for(image)));
    set_default(c, "/terminationMessagePath", json!("/dev/termination-log"));
    set_default(c, "/terminationMessagePolicy", json!("File"));
    set_default(c, "/resources", json!({}));
    for p in each_mut(c, "/ports") {
        set_default(p, "/protocol", json!("TCP"));
    }
    for env in each_mut(c, "/env") {
        if let Some(from) = env.get_mut("valueFrom") {
            default_field_ref(from);
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if c[probe].is_object() {
            let p = &mut c[probe];
            set_default(p, "/timeoutSeconds", json!(1));
            set_default(p, "/periodSeconds", json!(10));
            set_default(p, "/successThreshold", json!(1));
            set_default(p, "/failureThreshold", json!(3));
            if p["httpGet"].is_object() {
                set_default(p, "/httpGet/path", json!("/"));
                set_default(p, "/httpGet/scheme", json!("HTTP"));
            }
        }
    }
}

/// `Always` for `:latest` or untagged images, `IfNotPresent` otherwise (digests included).
pub fn pull_policy_for(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// Validates a pod spec whose field path is `path` (`spec` or `spec.template.spec`).
pub fn validate_pod_spec(spec: &Value, path: &str, errs: &mut Vec<Cause>) {
    let containers = spec["containers"].as_array();
    if containers.is_none_or(Vec::is_empty) {
        errs.push(Cause::required(format!("{path}.containers")));
    }
    let mut names = HashSet::new();
    for list in ["initContainers", "containers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            let at = format!("{path}.{list}[{i}]");
            match c["name"].as_str() {
                None | Some("") => errs.push(Cause::required(format!("{at}.name"))),
                Some(n) if !is_dns1123_label(n) => {
                    check_name(NameRule::Label, &format!("{at}.name"), n, errs)
                }
                Some(n) if !names.insert(n.to_string()) => {
                    errs.push(Cause::duplicate(format!("{at}.name"), &c["name"]))
                }
                _ => {}
            }
            if c["image"].as_str().is_none_or(str::is_empty) {
                errs.push(Cause::required(format!("{at}.image")));
            }
            if let Some(p) = c["imagePullPolicy"].as_str()
                && !["Always", "IfNotPresent", "Never"].contains(&p)
            {
                errs.push(Cause::not_supported(
                    format!("{at}.imagePullPolicy"),
                    &c["imagePullPolicy"],
                    &["Always", "IfNotPresent", "Never"],
                ));
            }
            for (j, port) in c["ports"].as_array().into_iter().flatten().enumerate() {
                let n = port["containerPort"].as_i64().unwrap_or(0);
                if !(1..=65535).contains(&n) {
                    errs.push(Cause::invalid(
                        format!("{at}.ports[{j}].containerPort"),
                        &port["containerPort"],
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
    }
    let policy = &spec["restartPolicy"];
    if let Some(p) = policy.as_str()
        && !["Always", "OnFailure", "Never"].contains(&p)
    {
        errs.push(Cause::not_supported(
            format!("{path}.restartPolicy"),
            policy,
            &["Always", "OnFailure", "Never"],
        ));
    }
    let dns = &spec["dnsPolicy"];
    if let Some(p) = dns.as_str()
        && !["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"].contains(&p)
    {
        errs.push(Cause::not_supported(
            format!("{path}.dnsPolicy"),
            dns,
            &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
        ));
    }
    let mut volumes = HashSet::new();
    for (i, v) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        match v["name"].as_str() {
            Some(n) if !volumes.insert(n.to_string()) => errs.push(Cause::duplicate(
                format!("{path}.volumes[{i}].name"),
                &v["name"],
            )),
            None | Some("") => errs.push(Cause::required(format!("{path}.volumes[{i}].name"))),
            _ => {}
        }
    }
    for list in ["initContainers", "containers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            for (j, m) in c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let name = m["name"].as_str().unwrap_or_default();
                let field = format!("{path}.{list}[{i}].volumeMounts[{j}]");
                if !volumes.contains(name) {
                    errs.push(Cause {
                        reason: "FieldValueNotFound",
                        message: format!("Not found: \"{name}\""),
                        field: format!("{field}.name"),
                    });
                }
                // Upstream's validateMountPropagation.
                let propagation = &m["mountPropagation"];
                match propagation.as_str() {
                    None | Some("None" | "HostToContainer") => {}
                    Some("Bidirectional") if c["securityContext"]["privileged"] == true => {}
                    Some("Bidirectional") => errs.push(Cause::forbidden(
                        format!("{field}.mountPropagation"),
                        "Bidirectional mount propagation is available only to privileged containers",
                    )),
                    Some(_) => errs.push(Cause::not_supported(
                        format!("{field}.mountPropagation"),
                        propagation,
                        &["Bidirectional", "HostToContainer", "None"],
                    )),
                }
            }
        }
    }
    if let Some(g) = spec["terminationGracePeriodSeconds"].as_i64()
        && g < 0
    {
        errs.push(Cause::invalid(
            format!("{path}.terminationGracePeriodSeconds"),
            &spec["terminationGracePeriodSeconds"],
            "must be greater than or equal to 0",
        ));
    }
}

/// The fields an ephemeral container may not set (upstream's
/// `validateEphemeralContainers`): it is a debugging aid, never part of the pod's service.
const EPHEMERAL_FORBIDDEN: &[&str] = &[
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "resources",
    "resizePolicy",
    "restartPolicy",
];

/// Checks `spec.ephemeralContainers`: names unique among every container of the pod, an
/// image each, none of the fields only long-running containers have.
fn validate_ephemeral_containers(spec: &Value, errs: &mut Vec<Cause>) {
    let mut names: HashSet<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|list| spec[*list].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    let targets = names.clone();
    for (i, c) in spec["ephemeralContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("spec.ephemeralContainers[{i}]");
        match c["name"].as_str() {
            None | Some("") => errs.push(Cause::required(format!("{at}.name"))),
            Some(n) if !is_dns1123_label(n) => {
                check_name(NameRule::Label, &format!("{at}.name"), n, errs)
            }
            Some(n) if !names.insert(n) => {
                errs.push(Cause::duplicate(format!("{at}.name"), &c["name"]))
            }
            _ => {}
        }
        if c["image"].as_str().is_none_or(str::is_empty) {
            errs.push(Cause::required(format!("{at}.image")));
        }
        if let Some(target) = c["targetContainerName"].as_str()
            && !targets.contains(target)
        {
            errs.push(Cause {
                reason: "FieldValueNotFound",
                message: format!("Not found: {target:?}"),
                field: format!("{at}.targetContainerName"),
            });
        }
        for (j, m) in c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            for field in ["subPath", "subPathExpr"] {
                if m[field].as_str().is_some_and(|p| !p.is_empty()) {
                    errs.push(Cause::forbidden(
                        format!("{at}.volumeMounts[{j}].{field}"),
                        "cannot be set for an Ephemeral Container",
                    ));
                }
            }
        }
        for field in EPHEMERAL_FORBIDDEN {
            let set = match &c[*field] {
                Value::Null => false,
                Value::Object(m) => !m.is_empty(),
                Value::Array(a) => !a.is_empty(),
                _ => true,
            };
            if set {
                errs.push(Cause::forbidden(
                    format!("{at}.{field}"),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
    }
}

/// An update may add ephemeral containers, never remove or change one (upstream's
/// `ValidatePodEphemeralContainersUpdate`).
fn validate_ephemeral_update(new: &Value, old: &Value, errs: &mut Vec<Cause>) {
    let by_name = |spec: &Value| -> Vec<(String, Value)> {
        spec["ephemeralContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or_default().to_string(),
                    c.clone(),
                )
            })
            .collect()
    };
    let current = by_name(&new["spec"]);
    for (name, before) in by_name(&old["spec"]) {
        match current.iter().find(|(n, _)| *n == name) {
            None => errs.push(Cause::forbidden(
                "spec.ephemeralContainers",
                format!("existing ephemeral containers \"{name}\" may not be removed\n"),
            )),
            Some((_, now)) if *now != before => errs.push(Cause::forbidden(
                "spec.ephemeralContainers",
                format!("existing ephemeral containers \"{name}\" may not be changed\n"),
            )),
            Some(_) => {}
        }
    }
    validate_ephemeral_containers(&new["spec"], errs);
}

pub struct Pod;
pub static POD: Pod = Pod;
impl Strategy for Pod {
    fn returns_deleted_object(&self) -> bool {
        true
    }
    /// A pod bound to a node and still running terminates gracefully there first: its
    /// kubelet stops it and then deletes it with grace 0.
    fn deletion_grace(&self, pod: &Value, requested: Option<i64>) -> Option<i64> {
        let grace = requested.unwrap_or_else(|| {
            pod["spec"]["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(30)
        });
        let phase = pod["status"]["phase"].as_str().unwrap_or_default();
        let scheduled = pod["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        (grace > 0 && scheduled && phase != "Succeeded" && phase != "Failed").then_some(grace)
    }
    fn default(&self, obj: &mut Value) {
        default_pod_spec(&mut obj["spec"]);
        requests_from_limits(&mut obj["spec"]);
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        obj["status"] = json!({"phase": "Pending", "qosClass": qos_class(&obj["spec"])});
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        validate_pod_spec(&obj["spec"], "spec", errs);
    }
    fn validate_create(&self, obj: &Value, errs: &mut Vec<Cause>) {
        if obj["spec"]["ephemeralContainers"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            errs.push(Cause::forbidden(
                "spec.ephemeralContainers",
                "cannot be set on create",
            ));
        }
    }
    /// `/ephemeralcontainers` changes only `spec.ephemeralContainers` (the generic split
    /// took nothing else): only additions are allowed there.
    fn validate_update_of(
        &self,
        subresource: Option<&str>,
        new: &Value,
        old: &Value,
        errs: &mut Vec<Cause>,
    ) {
        if subresource == Some("ephemeralcontainers") {
            validate_ephemeral_update(new, old, errs);
        } else {
            self.validate_update(new, old, errs);
        }
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        // Only images, activeDeadlineSeconds, tolerations (additions) and scheduling gates
        // may change in a running pod's spec; ephemeral containers only through their
        // subresource.
        let mut n = new["spec"].clone();
        let mut o = old["spec"].clone();
        for list in ["containers", "initContainers"] {
            if let (Some(nc), Some(oc)) = (
                n.get_mut(list).and_then(Value::as_array_mut),
                o[list].as_array(),
            ) && nc.len() == oc.len()
            {
                for (a, b) in nc.iter_mut().zip(oc) {
                    a["image"] = b["image"].clone();
                }
            }
        }
        // Remove (rather than copy) the fields that may change: assigning a missing key
        // through `Value`'s IndexMut inserts `null`, which then differs from "absent".
        let mut mutable = vec!["activeDeadlineSeconds", "tolerations", "schedulingGates"];
        if n["nodeName"].is_null() || o["nodeName"].is_null() {
            mutable.push("nodeName");
        }
        for field in mutable {
            for spec in [&mut n, &mut o] {
                if let Some(m) = spec.as_object_mut() {
                    m.remove(field);
                }
            }
        }
        if n != o {
            errs.push(Cause::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
        if !old["spec"]["nodeName"].is_null() {
            immutable(new, old, "/spec/nodeName", "spec.nodeName", errs);
        }
    }
    fn fields(&self, o: &Value) -> Vec<(&'static str, String)> {
        let s = |p: &str| {
            o.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        vec![
            ("spec.nodeName", s("/spec/nodeName")),
            ("spec.restartPolicy", s("/spec/restartPolicy")),
            ("spec.schedulerName", s("/spec/schedulerName")),
            ("spec.serviceAccountName", s("/spec/serviceAccountName")),
            (
                "spec.hostNetwork",
                o["spec"]["hostNetwork"]
                    .as_bool()
                    .unwrap_or(false)
                    .to_string(),
            ),
            ("status.phase", s("/status/phase")),
            ("status.podIP", s("/status/podIP")),
            ("status.nominatedNodeName", s("/status/nominatedNodeName")),
        ]
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Ready",
                ty: "string",
                priority: 0,
                description: "The aggregate readiness state of this pod for accepting traffic.",
                cell: &pod_ready,
            },
            Column {
                name: "Status",
                ty: "string",
                priority: 0,
                description: "The aggregate status of the containers in this pod.",
                cell: &pod_status,
            },
            Column {
                name: "Restarts",
                ty: "string",
                priority: 0,
                description: "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                cell: &pod_restarts,
            },
            AGE,
            Column {
                name: "IP",
                ty: "string",
                priority: 1,
                description: "The IP address of the pod.",
                cell: &|o| str_or_none(o, "/status/podIP"),
            },
            Column {
                name: "Node",
                ty: "string",
                priority: 1,
                description: "The name of the node this pod is assigned to.",
                cell: &|o| str_or_none(o, "/spec/nodeName"),
            },
            Column {
                name: "Nominated Node",
                ty: "string",
                priority: 1,
                description: "The name of the node that is nominated for this pod.",
                cell: &|o| str_or_none(o, "/status/nominatedNodeName"),
            },
            Column {
                name: "Readiness Gates",
                ty: "string",
                priority: 1,
                description: "The readiness gates of the pod.",
                cell: &readiness_gates,
            },
        ];
        C
    }
}

/// A container's limit is its request where it names none (upstream's pod defaulting,
/// for pods only: templates keep what they say).
fn requests_from_limits(spec: &mut Value) {
    for list in ["initContainers", "containers"] {
        // `get_mut`: indexing would add the missing list as `null`.
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            let limits = c["resources"]["limits"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for (k, v) in limits {
                if c["resources"]["requests"].get(&k).is_none() {
                    c["resources"]["requests"][k] = v;
                }
            }
        }
    }
}

/// The pod's QoS class from its containers' requests and limits.
pub(crate) fn qos_class(spec: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            let req = c["resources"]["requests"].as_object();
            let lim = c["resources"]["limits"].as_object();
            if req.is_some_and(|m| !m.is_empty()) || lim.is_some_and(|m| !m.is_empty()) {
                any = true;
            }
            for res in ["cpu", "memory"] {
                let l = lim.and_then(|m| m.get(res));
                let r = req.and_then(|m| m.get(res)).or(l);
                if l.is_none() || r != l {
                    guaranteed = false;
                }
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

fn pod_ready(o: &Value) -> Value {
    let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = o["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["ready"] == json!(true))
        .count();
    json!(format!("{ready}/{total}"))
}

fn pod_restarts(o: &Value) -> Value {
    let restarts: i64 = o["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["restartCount"].as_i64())
        .sum();
    json!(restarts.to_string())
}

/// kubectl's pod STATUS: the reason of the first waiting or terminated container, init
/// progress, `Terminating` while deleting, or the phase.
fn pod_status(o: &Value) -> Value {
    let status = &o["status"];
    let mut reason = status["reason"]
        .as_str()
        .or(status["phase"].as_str())
        .unwrap_or("Unknown")
        .to_string();
    let inits = o["spec"]["initContainers"].as_array().map_or(0, Vec::len);
    let mut initializing = false;
    for (i, c) in status["initContainerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let term = &c["state"]["terminated"];
        if term["exitCode"] == json!(0) {
            continue;
        }
        initializing = true;
        reason = if term.is_object() {
            format!("Init:{}", term["reason"].as_str().unwrap_or("Error"))
        } else if let Some(r) = c["state"]["waiting"]["reason"]
            .as_str()
            .filter(|r| *r != "PodInitializing")
        {
            format!("Init:{r}")
        } else {
            format!("Init:{i}/{inits}")
        };
        break;
    }
    if !initializing {
        for c in status["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .rev()
        {
            if let Some(r) = c["state"]["waiting"]["reason"].as_str() {
                reason = r.to_string();
            } else if let Some(r) = c["state"]["terminated"]["reason"].as_str() {
                reason = r.to_string();
            } else if c["state"]["terminated"].is_object() {
                let t = &c["state"]["terminated"];
                reason = match t["signal"].as_i64() {
                    Some(sig) if sig != 0 => format!("Signal:{sig}"),
                    _ => format!("ExitCode:{}", t["exitCode"].as_i64().unwrap_or(0)),
                };
            }
        }
    }
    if o["metadata"]["deletionTimestamp"].is_string() {
        reason = if status["reason"] == json!("NodeLost") {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    json!(reason)
}

fn readiness_gates(o: &Value) -> Value {
    let gates = o["spec"]["readinessGates"].as_array().map_or(0, Vec::len);
    if gates == 0 {
        return json!("<none>");
    }
    let ready = o["spec"]["readinessGates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| {
            o["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == g["conditionType"] && c["status"] == "True")
        })
        .count();
    json!(format!("{ready}/{gates}"))
}

pub struct PodTemplate;
pub static POD_TEMPLATE: PodTemplate = PodTemplate;
impl Strategy for PodTemplate {
    fn default(&self, obj: &mut Value) {
        default_pod_spec(&mut obj["template"]["spec"]);
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        validate_pod_spec(&obj["template"]["spec"], "template.spec", errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Containers",
                ty: "string",
                priority: 0,
                description: "Names of each container in the template.",
                cell: &|o| containers(o, "/template/spec/containers"),
            },
            Column {
                name: "Images",
                ty: "string",
                priority: 0,
                description: "Images referenced by each container in the template.",
                cell: &|o| images(o, "/template/spec/containers"),
            },
            Column {
                name: "Pod Labels",
                ty: "string",
                priority: 0,
                description: "The labels for the pod template.",
                cell: &|o| map(&o["template"]["metadata"]["labels"]),
            },
        ];
        C
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_follows_the_tag() {
        assert_eq!(pull_policy_for("nginx"), "Always");
        assert_eq!(pull_policy_for("nginx:latest"), "Always");
        assert_eq!(pull_policy_for("nginx:1.27"), "IfNotPresent");
        assert_eq!(pull_policy_for("localhost:5000/app"), "Always");
        assert_eq!(pull_policy_for("registry:5000/app:v1"), "IfNotPresent");
        assert_eq!(pull_policy_for("app@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn pod_defaults_and_qos() {
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "busybox:1", "ports": [{"containerPort": 80}],
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}], "volumes": [{"name": "scratch"}]}});
        POD.default(&mut pod);
        POD.prepare_for_create(&mut pod);
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(pod["spec"]["restartPolicy"], "Always");
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(pod["spec"]["volumes"][0]["emptyDir"], json!({}));
        assert_eq!(pod["status"]["qosClass"], "Guaranteed");
        assert_eq!(
            qos_class(&json!({"containers": [{"name": "c"}]})),
            "BestEffort"
        );
    }

    #[test]
    fn pod_validation_reports_each_field() {
        let pod = json!({"spec": {"restartPolicy": "Sometimes", "containers": [{"name": "c"}, {"name": "c", "image": "x"}]}});
        let mut errs = vec![];
        POD.validate(&pod, &mut errs);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "spec.containers[0].image",
                "spec.containers[1].name",
                "spec.restartPolicy"
            ]
        );
    }

    #[test]
    fn bidirectional_propagation_is_for_privileged_containers_only() {
        let pod = |privileged: bool, propagation: &str| {
            json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}], "containers": [
                {"name": "c", "image": "x", "securityContext": {"privileged": privileged},
                 "volumeMounts": [{"name": "v", "mountPath": "/v", "mountPropagation": propagation}]}]}})
        };
        let causes = |pod: Value| {
            let mut errs = vec![];
            POD.validate(&pod, &mut errs);
            errs.into_iter()
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect::<Vec<_>>()
        };
        assert!(causes(pod(true, "Bidirectional")).is_empty());
        assert!(causes(pod(false, "HostToContainer")).is_empty());
        assert_eq!(
            causes(pod(false, "Bidirectional")),
            [
                "spec.containers[0].volumeMounts[0].mountPropagation: Forbidden: Bidirectional mount propagation is available only to privileged containers"
            ]
        );
        assert_eq!(
            causes(pod(true, "Sideways")),
            [
                "spec.containers[0].volumeMounts[0].mountPropagation: Unsupported value: \"Sideways\": supported values: \"Bidirectional\", \"HostToContainer\", \"None\""
            ]
        );
    }
}
