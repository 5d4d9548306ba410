//! PodSecurity admission: the Pod Security Standards (privileged, baseline, restricted)
//! a namespace asks for with its `pod-security.kubernetes.io/enforce|audit|warn` labels.
//! `enforce` refuses pods that violate the level (403, upstream's message); `warn` lets
//! them in with a warning; workload objects (Deployments, Jobs, ...) only get `warn`'s
//! warnings for their pod templates, never a refusal, as upstream. The `audit` label is
//! not evaluated yet (there is no audit log to write to), and there are no exemptions.
//!
//! The checks and their wording are upstream's, in its order: baseline checks, then
//! restricted ones, each sorted by check name, a restricted check replacing its baseline
//! counterpart. Not checked yet: AppArmor, SELinux options and Windows host processes.

use serde_json::Value;

use crate::json::strings;

const PREFIX: &str = "pod-security.kubernetes.io/";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    fn parse(s: &str) -> Option<Level> {
        match s {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// A namespace's policy for one mode: the level and the version it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub level: Level,
    pub version: String,
}

impl Policy {
    /// The policy a namespace's labels set for `mode` (`enforce`, `audit`, `warn`).
    pub fn of(namespace: &Value, mode: &str) -> Option<Policy> {
        let labels = &namespace["metadata"]["labels"];
        let level = Level::parse(labels[format!("{PREFIX}{mode}")].as_str()?)?;
        let version = labels[format!("{PREFIX}{mode}-version")]
            .as_str()
            .unwrap_or("latest")
            .to_string();
        Some(Policy { level, version })
    }

    /// `restricted:latest`, as messages name a policy.
    pub fn describe(&self) -> String {
        format!("{}:{}", self.level.name(), self.version)
    }
}

/// The namespace label values that are not valid, as (label, value, allowed) triples.
pub fn invalid_labels(labels: &Value) -> Vec<(String, String, &'static str)> {
    let mut out = Vec::new();
    for mode in ["enforce", "audit", "warn"] {
        let key = format!("{PREFIX}{mode}");
        if let Some(v) = labels[&key].as_str()
            && Level::parse(v).is_none()
        {
            out.push((key, v.to_string(), "privileged, baseline, restricted"));
        }
        let key = format!("{PREFIX}{mode}-version");
        if let Some(v) = labels[&key].as_str()
            && !(v == "latest" || is_version(v))
        {
            out.push((key, v.to_string(), "latest or v1.N"));
        }
    }
    out
}

fn is_version(v: &str) -> bool {
    v.strip_prefix("v1.")
        .is_some_and(|minor| !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()))
}

/// `container "a"` or `containers "a", "b"`.
fn names(kind: &str, items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    if items.len() == 1 {
        format!("{kind} {}", quoted[0])
    } else {
        format!("{kind}s {}", quoted.join(", "))
    }
}

/// A container of the pod spec with the list it comes from.
struct Container<'a> {
    name: String,
    sc: &'a Value,
    value: &'a Value,
}

fn containers(spec: &Value) -> Vec<Container<'_>> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|list| spec[*list].as_array().into_iter().flatten())
        .map(|c| Container {
            name: c["name"].as_str().unwrap_or_default().to_string(),
            sc: &c["securityContext"],
            value: c,
        })
        .collect()
}

/// The capabilities baseline allows a container to add.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The sysctls baseline allows.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// The volume sources restricted allows.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// A pod spec as the checks read it.
struct Pod<'a> {
    spec: &'a Value,
    /// The pod's security context.
    sc: &'a Value,
    containers: Vec<Container<'a>>,
    volumes: &'a [Value],
}

impl<'a> Pod<'a> {
    fn new(spec: &'a Value) -> Self {
        Pod {
            spec,
            sc: &spec["securityContext"],
            containers: containers(spec),
            volumes: spec["volumes"].as_array().map_or(&[], Vec::as_slice),
        }
    }

    /// The names of the containers for which `f` holds.
    fn failing(&self, f: impl Fn(&Container) -> bool) -> Vec<String> {
        self.containers
            .iter()
            .filter(|c| f(c))
            .map(|c| c.name.clone())
            .collect()
    }

    /// Each value `f` gives for any container, once, in order of appearance.
    fn distinct(&self, f: impl Fn(&Container) -> Vec<String>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for value in self.containers.iter().flat_map(f) {
            if !out.contains(&value) {
                out.push(value);
            }
        }
        out
    }
}

/// One violation as upstream words it: `reason (detail)`.
fn found(reason: &str, detail: String) -> Option<String> {
    Some(format!("{reason} ({detail})"))
}

/// The levels a check runs at: a baseline check whose restricted version replaces it at
/// restricted runs at baseline only.
#[derive(PartialEq)]
enum Runs {
    BaselineOnly,
    Both,
    RestrictedOnly,
}

/// One check: the violation it finds in a pod, worded as upstream's.
type Check = fn(&Pod) -> Option<String>;

/// Upstream's checks in its order: baseline ones by check name, then restricted ones.
const CHECKS: &[(Runs, Check)] = &[
    (Runs::BaselineOnly, baseline_capabilities),
    (Runs::Both, host_namespaces),
    (Runs::BaselineOnly, host_path_volumes),
    (Runs::Both, host_ports),
    (Runs::Both, privileged),
    (Runs::Both, proc_mount),
    (Runs::BaselineOnly, baseline_seccomp),
    (Runs::Both, sysctls),
    (Runs::RestrictedOnly, privilege_escalation),
    (Runs::RestrictedOnly, restricted_capabilities),
    (Runs::RestrictedOnly, volume_types),
    (Runs::RestrictedOnly, run_as_non_root),
    (Runs::RestrictedOnly, run_as_user),
    (Runs::RestrictedOnly, restricted_seccomp),
];

/// The violations of `level` by a pod spec, each `reason (detail)`, in upstream's order.
pub fn violations(spec: &Value, level: Level) -> Vec<String> {
    let skipped = match level {
        Level::Privileged => return Vec::new(),
        Level::Baseline => Runs::RestrictedOnly,
        Level::Restricted => Runs::BaselineOnly,
    };
    let pod = Pod::new(spec);
    CHECKS
        .iter()
        .filter(|(runs, _)| *runs != skipped)
        .filter_map(|(_, check)| check(&pod))
        .collect()
}

fn baseline_capabilities(pod: &Pod) -> Option<String> {
    let beyond = |c: &Container| -> Vec<String> {
        strings(&c.sc["capabilities"]["add"])
            .into_iter()
            .filter(|cap| !BASELINE_CAPABILITIES.contains(&cap.as_str()))
            .collect()
    };
    let with = pod.failing(|c| !beyond(c).is_empty());
    if with.is_empty() {
        return None;
    }
    let caps: Vec<String> = pod
        .distinct(beyond)
        .iter()
        .map(|c| format!("{c:?}"))
        .collect();
    found(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            names("container", &with),
            caps.join(", ")
        ),
    )
}

fn host_namespaces(pod: &Pod) -> Option<String> {
    let hosts: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .iter()
        .filter(|k| pod.spec[**k] == true)
        .map(|k| format!("{k}=true"))
        .collect();
    if hosts.is_empty() {
        return None;
    }
    found("host namespaces", hosts.join(", "))
}

fn volume_name(v: &Value) -> String {
    v["name"].as_str().unwrap_or_default().to_string()
}

fn host_path_volumes(pod: &Pod) -> Option<String> {
    let host_paths: Vec<String> = pod
        .volumes
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .map(volume_name)
        .collect();
    if host_paths.is_empty() {
        return None;
    }
    found("hostPath volumes", names("volume", &host_paths))
}

fn host_ports(pod: &Pod) -> Option<String> {
    let ports_of = |c: &Container| -> Vec<String> {
        c.value["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["hostPort"].as_i64().filter(|h| *h != 0))
            .map(|h| h.to_string())
            .collect()
    };
    let with_ports = pod.failing(|c| !ports_of(c).is_empty());
    if with_ports.is_empty() {
        return None;
    }
    let ports: Vec<String> = pod.containers.iter().flat_map(ports_of).collect();
    let verb = if with_ports.len() == 1 { "uses" } else { "use" };
    let noun = if with_ports.len() == 1 && ports.len() == 1 {
        "hostPort"
    } else {
        "hostPorts"
    };
    found(
        "hostPort",
        format!(
            "{} {verb} {noun} {}",
            names("container", &with_ports),
            ports.join(", ")
        ),
    )
}

/// Containers for which `f` holds must not set what `must_not` says.
fn containers_must_not(
    pod: &Pod,
    reason: &str,
    must_not: &str,
    f: impl Fn(&Container) -> bool,
) -> Option<String> {
    let failing = pod.failing(f);
    if failing.is_empty() {
        return None;
    }
    found(
        reason,
        format!("{} must not set {must_not}", names("container", &failing)),
    )
}

fn privileged(pod: &Pod) -> Option<String> {
    containers_must_not(pod, "privileged", "securityContext.privileged=true", |c| {
        c.sc["privileged"] == true
    })
}

fn proc_mount(pod: &Pod) -> Option<String> {
    containers_must_not(
        pod,
        "procMount",
        "securityContext.procMount to \"Unmasked\"",
        |c| c.sc["procMount"].as_str().is_some_and(|m| m != "Default"),
    )
}

fn baseline_seccomp(pod: &Pod) -> Option<String> {
    let mut who = Vec::new();
    if pod.sc["seccompProfile"]["type"] == "Unconfined" {
        who.push("pod".to_string());
    }
    let unconfined = pod.failing(|c| c.sc["seccompProfile"]["type"] == "Unconfined");
    if !unconfined.is_empty() {
        who.push(names("container", &unconfined));
    }
    if who.is_empty() {
        return None;
    }
    found(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to \"Unconfined\"",
            who.join(" and ")
        ),
    )
}

fn sysctls(pod: &Pod) -> Option<String> {
    let forbidden: Vec<String> = pod.sc["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .filter(|n| !SAFE_SYSCTLS.contains(n))
        .map(str::to_string)
        .collect();
    if forbidden.is_empty() {
        return None;
    }
    found("forbidden sysctls", forbidden.join(", "))
}

fn privilege_escalation(pod: &Pod) -> Option<String> {
    let escalating = pod.failing(|c| c.sc["allowPrivilegeEscalation"] != false);
    if escalating.is_empty() {
        return None;
    }
    found(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            names("container", &escalating)
        ),
    )
}

fn restricted_capabilities(pod: &Pod) -> Option<String> {
    let added = |c: &Container| -> Vec<String> {
        strings(&c.sc["capabilities"]["add"])
            .into_iter()
            .filter(|a| a != "NET_BIND_SERVICE")
            .collect()
    };
    let not_dropping = pod.failing(|c| {
        !strings(&c.sc["capabilities"]["drop"])
            .iter()
            .any(|d| d == "ALL")
    });
    let adding = pod.failing(|c| !added(c).is_empty());
    let mut caps = Vec::new();
    if !not_dropping.is_empty() {
        caps.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            names("container", &not_dropping)
        ));
    }
    if !adding.is_empty() {
        let added: Vec<String> = pod
            .distinct(added)
            .iter()
            .map(|a| format!("{a:?}"))
            .collect();
        caps.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            names("container", &adding),
            added.join(", ")
        ));
    }
    if caps.is_empty() {
        return None;
    }
    found("unrestricted capabilities", caps.join("; "))
}

fn volume_types(pod: &Pod) -> Option<String> {
    let mut by_type: Vec<(String, Vec<String>)> = Vec::new();
    for v in pod.volumes {
        let Some(kind) = v
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .find(|k| *k != "name")
        else {
            continue;
        };
        if RESTRICTED_VOLUMES.contains(&kind) {
            continue;
        }
        match by_type.iter_mut().find(|(t, _)| t == kind) {
            Some((_, vols)) => vols.push(volume_name(v)),
            None => by_type.push((kind.to_string(), vec![volume_name(v)])),
        }
    }
    let parts: Vec<String> = by_type
        .iter()
        .map(|(kind, vols)| {
            let verb = if vols.len() == 1 { "uses" } else { "use" };
            format!(
                "{} {verb} restricted volume type {kind:?}",
                names("volume", vols)
            )
        })
        .collect();
    if parts.is_empty() {
        return None;
    }
    found("restricted volume types", parts.join(", "))
}

fn run_as_non_root(pod: &Pod) -> Option<String> {
    let pod_non_root = &pod.sc["runAsNonRoot"];
    let explicit_root = pod.failing(|c| c.sc["runAsNonRoot"] == false);
    let unset = pod.failing(|c| c.sc["runAsNonRoot"].is_null());
    let mut non_root = Vec::new();
    if *pod_non_root == false {
        non_root.push("pod must not set securityContext.runAsNonRoot=false".to_string());
    }
    if !explicit_root.is_empty() {
        non_root.push(format!(
            "{} must not set securityContext.runAsNonRoot=false",
            names("container", &explicit_root)
        ));
    }
    if *pod_non_root != true && !unset.is_empty() {
        non_root.push(format!(
            "pod or {} must set securityContext.runAsNonRoot=true",
            names("container", &unset)
        ));
    }
    if non_root.is_empty() {
        return None;
    }
    found("runAsNonRoot != true", non_root.join("; "))
}

fn run_as_user(pod: &Pod) -> Option<String> {
    let mut root = Vec::new();
    if pod.sc["runAsUser"] == 0 {
        root.push("pod".to_string());
    }
    let root_containers = pod.failing(|c| c.sc["runAsUser"] == 0);
    if !root_containers.is_empty() {
        root.push(names("container", &root_containers));
    }
    if root.is_empty() {
        return None;
    }
    found(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", root.join(" and ")),
    )
}

fn restricted_seccomp(pod: &Pod) -> Option<String> {
    let allowed = |v: &Value| matches!(v["type"].as_str(), Some("RuntimeDefault" | "Localhost"));
    let pod_seccomp = &pod.sc["seccompProfile"];
    let mut seccomp = Vec::new();
    if !pod_seccomp.is_null() && !allowed(pod_seccomp) {
        seccomp.push(format!(
            "pod must not set securityContext.seccompProfile.type to {:?}",
            pod_seccomp["type"].as_str().unwrap_or_default()
        ));
    }
    let bad =
        pod.failing(|c| !c.sc["seccompProfile"].is_null() && !allowed(&c.sc["seccompProfile"]));
    if !bad.is_empty() {
        seccomp.push(format!(
            "{} must not set securityContext.seccompProfile.type to \"Unconfined\"",
            names("container", &bad)
        ));
    }
    let unset = pod.failing(|c| c.sc["seccompProfile"].is_null());
    if pod_seccomp.is_null() && !unset.is_empty() {
        seccomp.push(format!(
            "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
            names("container", &unset)
        ));
    }
    if seccomp.is_empty() {
        return None;
    }
    found("seccompProfile", seccomp.join("; "))
}

/// The pod spec inside an object admission sees: a pod's own, or a workload's template
/// (CronJobs nest a Job template).
pub fn pod_spec<'a>(kind: &str, obj: &'a Value) -> Option<&'a Value> {
    match kind {
        "Pod" => Some(&obj["spec"]),
        "PodTemplate" => Some(&obj["template"]["spec"]),
        "CronJob" => Some(&obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]),
        "Deployment"
        | "ReplicaSet"
        | "StatefulSet"
        | "DaemonSet"
        | "Job"
        | "ReplicationController" => Some(&obj["spec"]["template"]["spec"]),
        _ => None,
    }
    .filter(|s| s.is_object())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_bare_pod_violates_restricted_as_upstream_words_it() {
        let spec = json!({"containers": [{"name": "app", "image": "x", "securityContext": {"privileged": true}}]});
        assert_eq!(
            violations(&spec, Level::Restricted).join(", "),
            r#"privileged (container "app" must not set securityContext.privileged=true), allowPrivilegeEscalation != false (container "app" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "app" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container "app" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "app" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#
        );
        assert_eq!(
            violations(&spec, Level::Baseline),
            [r#"privileged (container "app" must not set securityContext.privileged=true)"#]
        );
        assert!(violations(&spec, Level::Privileged).is_empty());
    }

    #[test]
    fn host_namespaces_ports_and_volumes() {
        let spec = json!({"hostNetwork": true, "hostPID": true,
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}, {"name": "cfg", "configMap": {"name": "c"}}],
            "containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 80}]}]});
        assert_eq!(
            violations(&spec, Level::Baseline).join(", "),
            r#"host namespaces (hostNetwork=true, hostPID=true), hostPath volumes (volume "root"), hostPort (container "a" uses hostPort 80)"#
        );
        assert!(
            violations(&spec, Level::Restricted)
                .contains(&r#"restricted volume types (volume "root" uses restricted volume type "hostPath")"#.to_string())
        );
    }

    #[test]
    fn a_compliant_pod_passes_restricted() {
        let spec = json!({"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "a", "securityContext": {"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]});
        assert!(violations(&spec, Level::Restricted).is_empty());
    }

    #[test]
    fn namespace_labels_choose_the_policy() {
        let ns = json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/warn": "baseline", "pod-security.kubernetes.io/warn-version": "v1.33"}}});
        assert_eq!(
            Policy::of(&ns, "enforce").unwrap().describe(),
            "restricted:latest"
        );
        assert_eq!(
            Policy::of(&ns, "warn").unwrap().describe(),
            "baseline:v1.33"
        );
        assert!(Policy::of(&ns, "audit").is_none());
        let bad = json!({"pod-security.kubernetes.io/enforce": "strict", "pod-security.kubernetes.io/warn-version": "1.2"});
        assert_eq!(invalid_labels(&bad).len(), 2);
    }
}
