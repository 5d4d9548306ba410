//! From a pod spec to what CRI runs: the sandbox config (hostname, DNS, port mappings,
//! cgroup parent by QoS class, host network) and each container's config (image,
//! command and args with `$(VAR)` expansion, its environment and volume mounts, working
//! dir, resources, security settings ([`super::security`]), the per-pod /etc/hosts,
//! log path).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use krust_cri::api::{
    ContainerConfig, ContainerMetadata, DnsConfig, ImageSpec, KeyValue, LinuxContainerConfig,
    LinuxContainerResources, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PortMapping, Protocol,
};
use kube::ResourceExt;

use crate::Config;

/// Labels on sandboxes and containers, as upstream's kubelet sets them (they let a
/// restarted kubelet find what belongs to which pod).
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// CFS period the CPU limit is expressed in (upstream's 100 ms).
const CPU_PERIOD: i64 = 100_000;

/// The pod's QoS class, as upstream computes it.
/// A pod's ephemeral containers as containers (the same fields; `targetContainerName`
/// aside), so they start like any other.
pub fn ephemeral_containers(pod: &Pod) -> Vec<Container> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .filter_map(|e| serde_json::from_value(serde_json::to_value(e).ok()?).ok())
        .collect()
}

/// The container whose processes an ephemeral container `name` joins
/// (`targetContainerName`, `kubectl debug --target`).
pub fn ephemeral_target(pod: &Pod, name: &str) -> Option<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .find(|e| e.name == name)?
        .target_container_name
        .clone()
}

/// Puts a container in the process namespace of the container `target_id` (CRI's
/// TARGET mode), network and IPC staying the pod's.
pub fn share_processes_with(config: &mut ContainerConfig, pod: &Pod, target_id: &str) {
    if let Some(security) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        security.namespace_options = Some(NamespaceOption {
            network: if host_network(pod) {
                NamespaceMode::Node as i32
            } else {
                NamespaceMode::Pod as i32
            },
            pid: NamespaceMode::Target as i32,
            ipc: NamespaceMode::Pod as i32,
            target_id: target_id.to_string(),
            ..NamespaceOption::default()
        });
    }
}

pub fn qos_class(pod: &Pod) -> &'static str {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let res = c.resources.as_ref();
        let requests = res.and_then(|r| r.requests.as_ref());
        let limits = res.and_then(|r| r.limits.as_ref());
        any |= requests.is_some_and(|r| !r.is_empty()) || limits.is_some_and(|l| !l.is_empty());
        for name in ["cpu", "memory"] {
            let limit = limits.and_then(|l| l.get(name));
            // A missing request defaults to the limit.
            let request = requests.and_then(|r| r.get(name)).or(limit);
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// The pod's cgroup under cgroupfs (`/kubepods[/burstable|/besteffort]/pod<uid>`).
pub fn cgroup_parent(pod: &Pod) -> String {
    let uid = pod.uid().unwrap_or_default();
    match qos_class(pod) {
        "Guaranteed" => format!("/kubepods/pod{uid}"),
        "Burstable" => format!("/kubepods/burstable/pod{uid}"),
        _ => format!("/kubepods/besteffort/pod{uid}"),
    }
}

pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Where a pod's files live: logs, its /etc/hosts.
pub fn pod_dir(config: &Config, pod: &Pod) -> PathBuf {
    pod_dir_of(config, &pod.uid().unwrap_or_default())
}

/// The directory of the pod with UID `uid`.
pub fn pod_dir_of(config: &Config, uid: &str) -> PathBuf {
    config.data_dir.join("pods").join(uid)
}

pub fn labels(pod: &Pod) -> HashMap<String, String> {
    HashMap::from([
        (POD_UID.to_string(), pod.uid().unwrap_or_default()),
        (POD_NAME.to_string(), pod.name_any()),
        (
            POD_NAMESPACE.to_string(),
            pod.namespace().unwrap_or_default(),
        ),
    ])
}

fn hostname(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| pod.name_any())
}

/// DNS for the sandbox: the cluster DNS for `ClusterFirst` (the default), the host's
/// resolver for `Default`, and `dnsConfig` appended (or alone, for `None`).
fn dns_config(config: &Config, pod: &Pod) -> DnsConfig {
    let spec = pod.spec.as_ref();
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let ns = pod.namespace().unwrap_or_default();
    let domain = &config.cluster_domain;
    let mut dns = match policy {
        "Default" => host_resolver(),
        "None" => DnsConfig::default(),
        // ClusterFirstWithHostNet and ClusterFirst; a host-network pod with plain
        // ClusterFirst uses the host's resolver, as upstream.
        _ if policy == "ClusterFirst" && host_network(pod) => host_resolver(),
        _ => DnsConfig {
            servers: vec![config.cluster_dns.to_string()],
            searches: vec![
                format!("{ns}.svc.{domain}"),
                format!("svc.{domain}"),
                domain.clone(),
            ],
            options: vec!["ndots:5".into()],
        },
    };
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        dns.servers
            .extend(extra.nameservers.iter().flatten().cloned());
        dns.searches
            .extend(extra.searches.iter().flatten().cloned());
        dns.options
            .extend(extra.options.iter().flatten().map(|o| match &o.value {
                Some(v) => format!("{}:{v}", o.name.as_deref().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            }));
    }
    dns
}

fn host_resolver() -> DnsConfig {
    let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let mut dns = DnsConfig::default();
    for line in conf.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
            Some("search") => dns.searches.extend(words.map(str::to_string)),
            Some("options") => dns.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    dns
}

pub fn sandbox_config(config: &Config, pod: &Pod, attempt: u32) -> PodSandboxConfig {
    let host_net = host_network(pod);
    let port_mappings = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => Protocol::Udp as i32,
                Some("SCTP") => Protocol::Sctp as i32,
                _ => Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or_default(),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            namespace: pod.namespace().unwrap_or_default(),
            attempt,
        }),
        // A host-network pod has the node's hostname.
        hostname: if host_net {
            String::new()
        } else {
            hostname(pod)
        },
        log_directory: pod_dir(config, pod).join("logs").display().to_string(),
        dns_config: Some(dns_config(config, pod)),
        port_mappings,
        labels: labels(pod),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent(pod),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: if host_net {
                        NamespaceMode::Node as i32
                    } else {
                        NamespaceMode::Pod as i32
                    },
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..NamespaceOption::default()
                }),
                // containerd runs privileged containers only in a privileged sandbox.
                privileged: pod
                    .spec
                    .iter()
                    .flat_map(|s| {
                        s.containers
                            .iter()
                            .chain(s.init_containers.iter().flatten())
                    })
                    .any(super::security::privileged),
                ..LinuxSandboxSecurityContext::default()
            }),
            ..LinuxPodSandboxConfig::default()
        }),
        ..PodSandboxConfig::default()
    }
}

/// Writes the pod's /etc/hosts: localhost, and its own name on its IP.
pub fn write_hosts(config: &Config, pod: &Pod, ip: &str) -> std::io::Result<PathBuf> {
    let dir = pod_dir(config, pod);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("etc-hosts");
    let mut hosts = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    if !ip.is_empty() {
        hosts.push_str(&format!("{ip}\t{}\n", hostname(pod)));
    }
    std::fs::write(&path, hosts)?;
    Ok(path)
}

/// `$(VAR)` references replaced from `env`; `$$` stands for a literal `$`, and unknown
/// references stay as written (upstream's expansion).
pub fn expand(s: &str, env: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&rest[i..i + 2 + end + 1]),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

pub(crate) fn quantity_millis(q: &Quantity) -> Option<i64> {
    let s = q.0.as_str();
    if let Some(m) = s.strip_suffix('m') {
        return m.parse().ok();
    }
    s.parse::<f64>().ok().map(|v| (v * 1000.0).ceil() as i64)
}

pub(crate) fn quantity_bytes(q: &Quantity) -> Option<i64> {
    let s = q.0.as_str();
    let units: [(&str, i64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<f64>().ok().map(|v| (v * mult as f64) as i64);
        }
    }
    s.parse::<f64>().ok().map(|v| v as i64)
}

/// cgroup settings from requests and limits: CPU shares from the CPU request (2 at
/// least), CFS quota from the CPU limit, the memory limit.
fn resources(container: &Container) -> LinuxContainerResources {
    let res = container.resources.as_ref();
    let limit = |n: &str| res.and_then(|r| r.limits.as_ref()).and_then(|l| l.get(n));
    let request = |n: &str| {
        res.and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(n))
            .or(limit(n))
    };
    let cpu_request = request("cpu").and_then(quantity_millis).unwrap_or(0);
    let mut out = LinuxContainerResources {
        cpu_shares: (cpu_request * 1024 / 1000).max(2),
        ..LinuxContainerResources::default()
    };
    if let Some(cpu) = limit("cpu").and_then(quantity_millis) {
        out.cpu_period = CPU_PERIOD;
        out.cpu_quota = (cpu * CPU_PERIOD / 1000).max(1000);
    }
    if let Some(mem) = limit("memory").and_then(quantity_bytes) {
        out.memory_limit_in_bytes = mem;
    }
    out
}

/// The CRI config of one container, given its resolved environment and the mounts of
/// its volumes.
pub fn container_config(
    pod: &Pod,
    container: &Container,
    attempt: u32,
    env: Vec<(String, String)>,
    mut mounts: Vec<Mount>,
    hosts_file: &Path,
) -> ContainerConfig {
    let known: HashMap<String, String> = env.iter().cloned().collect();
    let expand_all = |v: &Option<Vec<String>>| -> Vec<String> {
        v.iter().flatten().map(|a| expand(a, &known)).collect()
    };
    let mut labels = labels(pod);
    labels.insert(CONTAINER_NAME.into(), container.name.clone());
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: container.name.clone(),
            attempt,
        }),
        image: Some(ImageSpec {
            image: container.image.clone().unwrap_or_default(),
            ..ImageSpec::default()
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: env
            .into_iter()
            .map(|(key, value)| KeyValue { key, value })
            .collect(),
        mounts: {
            if !host_network(pod) {
                mounts.push(Mount {
                    container_path: "/etc/hosts".into(),
                    host_path: hosts_file.display().to_string(),
                    ..Mount::default()
                });
            }
            mounts
        },
        log_path: format!("{}/{attempt}.log", container.name),
        // `kubectl run -i` / `attach` need the container's stdin kept open.
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        labels,
        linux: Some(LinuxContainerConfig {
            resources: Some(resources(container)),
            security_context: Some(super::security::linux(pod, container)),
        }),
        ..ContainerConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::json;

    fn pod(spec: k8s_openapi::serde_json::Value) -> Pod {
        k8s_openapi::serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn variables_expand_as_upstream() {
        let env = HashMap::from([("A".to_string(), "1".to_string())]);
        assert_eq!(expand("x$(A)y", &env), "x1y");
        assert_eq!(expand("$(B)", &env), "$(B)");
        assert_eq!(expand("$$(A)", &env), "$(A)");
        assert_eq!(expand("cost $5", &env), "cost $5");
    }

    #[test]
    fn qos_classes_and_cgroups() {
        let best = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(qos_class(&best), "BestEffort");
        assert_eq!(cgroup_parent(&best), "/kubepods/besteffort/podu1");
        let burst =
            pod(json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}));
        assert_eq!(qos_class(&burst), "Burstable");
        let guaranteed = pod(json!({"containers": [{"name": "c",
            "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}]}));
        assert_eq!(qos_class(&guaranteed), "Guaranteed");
        assert_eq!(cgroup_parent(&guaranteed), "/kubepods/podu1");
        let c = &guaranteed.spec.as_ref().unwrap().containers[0];
        let r = resources(c);
        assert_eq!(
            (r.cpu_quota, r.cpu_period, r.cpu_shares),
            (50_000, 100_000, 512)
        );
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
    }

    #[test]
    fn command_and_args_see_the_environment() {
        let p = pod(json!({"containers": [{"name": "c", "image": "busybox",
            "command": ["sh", "-c", "echo $(GREETING)"],
            "env": [{"name": "WHO", "value": "world"}, {"name": "GREETING", "value": "hello $(WHO)"}]}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let env = vec![
            ("WHO".to_string(), "world".to_string()),
            ("GREETING".to_string(), "hello world".to_string()),
        ];
        let cfg = container_config(&p, c, 2, env, Vec::new(), Path::new("/x/hosts"));
        assert_eq!(cfg.command, vec!["sh", "-c", "echo hello world"]);
        assert_eq!(cfg.log_path, "c/2.log");
        assert_eq!(cfg.labels[CONTAINER_NAME], "c");
        assert_eq!(cfg.mounts[0].container_path, "/etc/hosts");
    }
}
