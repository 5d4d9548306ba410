//! Ending what a node left behind: a test's or a benchmark's node keeps its containers,
//! shims, mounts, bridge and nftables tables after its process stops (as k3s's do), so
//! whoever started it ends them. Shared by the end-to-end tests (`common`) and the
//! benchmarks (`examples/support` includes this file).

use std::path::Path;
use std::process::{Command, Stdio};

use krust_cri::runtimes::Handler;
use serde_json::Value;

/// The first node range of krust's default `--cluster-cidr`, which the tests that name
/// none share.
const DEFAULT_NODE_RANGE: &str = "10.42.0.0/24";

/// `nft delete table ip TABLE`, if there is one.
pub fn delete_nft_table(table: &str) {
    let _ = Command::new("nft")
        .args(["delete", "table", "ip", table])
        .stderr(Stdio::null())
        .status();
}

/// The pod range of the node under `data_dir`, from its CNI configuration.
fn node_range(data_dir: &Path) -> Option<krust_api::cidr::Ipv4Cidr> {
    let conflist = krust_cri::containerd::default_dir(data_dir)
        .join("net.d")
        .join(krust_net::CONFLIST);
    let conf: Value = serde_json::from_str(&std::fs::read_to_string(conflist).ok()?).ok()?;
    conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
        .as_str()?
        .parse()
        .ok()
}

/// Ends whatever a test node left running under `data_dir` (containers whose pods a
/// failed test never deleted, their shims, mounts), so that no test leaks processes
/// or keeps its temp dir from being removed.
pub fn reap_node(data_dir: &Path) {
    let containerd = data_dir.join("agent/containerd");
    // The pods' network namespaces, as their sandboxes' OCI specs name them:
    // containerd, killed with its containers, never removes their mounts.
    let namespaces =
        sandbox_namespaces(&containerd.join("state/io.containerd.runtime.v2.task/k8s.io"));
    // Every runtime handler keeps its containers' state under a root of its own
    // (`krust_cri::runtimes`): runc's, and crun's where the node offered it.
    for runtime in [Handler::Runc, Handler::Crun].map(Handler::name) {
        let root = containerd.join(runtime).join("k8s.io");
        if !root.exists() {
            continue;
        }
        let ids = Command::new(runtime)
            .arg("--root")
            .arg(&root)
            .args(["list", "-q"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for id in ids.lines().filter(|l| !l.is_empty()) {
            let _ = Command::new(runtime)
                .arg("--root")
                .arg(&root)
                .args(["delete", "--force", id])
                .status();
        }
    }
    remove_namespace_mounts(&namespaces);
    let _ = Command::new("pkill")
        .args(["-KILL", "-f"])
        .arg(containerd.display().to_string())
        .status();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let prefix = data_dir.display().to_string();
    let mut targets: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|t| t.starts_with(&prefix))
        .collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
    for t in targets {
        let _ = Command::new("umount").args(["-l", t]).status();
    }
    // The node's range keeps a bridge, an egress masquerade table and a network policy
    // table after the agent exits (as k3s's do). Pods reaped above never ran their CNI
    // teardown, and their addresses would collide with the next test on this range, so
    // those go. Tests on the default range run at once and share its bridge and egress
    // table, which therefore stay; its policy table goes (a running node loads it
    // again), lest a later pod with a reused address meet an earlier test's policy.
    if let Some(range) = node_range(data_dir) {
        delete_nft_table(&krust_net::policy::table(range));
        if range.to_string() != DEFAULT_NODE_RANGE {
            // A pod deleted just before its server stopped has no task left to name its
            // namespace, and its teardown never ran: its address says whose it is.
            remove_namespaces_in(range);
            let _ = Command::new("ip")
                .args(["link", "del", &krust_net::bridge_name(range)])
                .stderr(Stdio::null())
                .status();
            delete_nft_table(&krust_net::cluster::egress_table(range));
        }
    }
}

/// The network namespace files (under /run/netns) that the bundles in `tasks` join.
fn sandbox_namespaces(tasks: &Path) -> Vec<String> {
    let bundles = std::fs::read_dir(tasks).into_iter().flatten().flatten();
    bundles
        .filter_map(|b| std::fs::read(b.path().join("config.json")).ok())
        .filter_map(|spec| serde_json::from_slice::<Value>(&spec).ok())
        .flat_map(|spec| {
            spec["linux"]["namespaces"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|ns| ns["type"] == "network")
        .filter_map(|ns| {
            ns["path"]
                .as_str()
                .map(|p| p.replacen("/var/run/", "/run/", 1))
        })
        .filter(|p| p.starts_with("/run/netns/"))
        .collect()
}

/// Deletes the network namespaces under /run/netns that hold an address of `range`.
fn remove_namespaces_in(range: krust_api::cidr::Ipv4Cidr) {
    let names = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten();
    for name in names.map(|e| e.file_name().to_string_lossy().into_owned()) {
        let out = Command::new("ip")
            .args(["-n", &name, "-4", "-o", "addr", "show"])
            .stderr(Stdio::null())
            .output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        let ours = text.unwrap_or_default().split_whitespace().any(|word| {
            (word.split('/').next())
                .and_then(|a| a.parse().ok())
                .is_some_and(|ip| range.contains(ip))
        });
        if ours {
            let _ = Command::new("ip").args(["netns", "delete", &name]).status();
        }
    }
}

/// Unmounts and removes `files` (network namespaces under /run/netns).
fn remove_namespace_mounts(files: &[String]) {
    for file in files {
        let _ = Command::new("umount")
            .arg(file)
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_file(file);
    }
}
