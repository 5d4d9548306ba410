//! NetworkPolicy benchmark: how long a policy change takes to be in force on a node.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/netpol_bench [pods=1000] [policies=100] [changes=20]
//! ```
//!
//! A release `krust server` without a node; a Node `bench-node` with its pod range;
//! `pods` pods bound to it in 10 namespaces, each with an address written into its
//! status (no kubelet runs them); `policies` policies spread over the namespaces, each
//! selecting a tenth of its namespace's pods and admitting pods of two other namespaces
//! on a port. The node's policy enforcement (`krust_net::policy::run`, as every agent
//! runs it) runs in this process. Prints the time to the first full table after start,
//! then for `changes` single-policy edits (a new port) the time from the API write to
//! the new rule in the kernel (found by polling `nft list chain`, whose own time is
//! printed too: it bounds the reading's error).

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::task::JoinSet;

mod support;

use support::{Cluster, Result, percentile};

const NAMESPACES: usize = 10;
/// Pods of a namespace a policy selects: one group of ten.
const GROUPS: usize = 10;
const NODE: &str = "bench-node";
const POD_CIDR: &str = "10.62.0.0/20";

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let pods: usize = args.next().map_or(Ok(1000), |a| a.parse())?;
    let policies: usize = args.next().map_or(Ok(100), |a| a.parse())?;
    let changes: usize = args.next().map_or(Ok(20), |a| a.parse())?;
    let cluster = Cluster::start(&["--disable-scheduler"]).await?;
    let client = cluster.client().await?;
    let table = krust_net::policy::table(POD_CIDR.parse()?);

    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NODE},
                "spec": {"podCIDR": POD_CIDR, "podCIDRs": [POD_CIDR]}}))?,
        )
        .await?;
    for n in 0..NAMESPACES {
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": format!("ns-{n}"), "labels": {"bench": format!("ns-{n}")}}}),
                )?,
            )
            .await?;
    }
    let started = Instant::now();
    let mut writes = JoinSet::new();
    for i in 0..pods {
        let ns = format!("ns-{}", i % NAMESPACES);
        let api = Api::<Pod>::namespaced(client.clone(), &ns);
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 62, 0, 2)) + i as u32);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("pod-{i}"),
                "labels": {"group": format!("g{}", (i / NAMESPACES) % GROUPS)}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox",
                "ports": [{"name": "http", "containerPort": 8080}]}]}}))?;
        writes.spawn(async move {
            let name = pod.metadata.name.clone().unwrap_or_default();
            api.create(&PostParams::default(), &pod).await?;
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"phase": "Running", "podIP": ip.to_string(),
                    "podIPs": [{"ip": ip.to_string()}]}}),
                ),
            )
            .await?;
            Ok::<_, kube::Error>(())
        });
        if writes.len() >= 32 {
            writes.join_next().await.expect("a write")??;
        }
    }
    while let Some(done) = writes.join_next().await {
        done??;
    }
    for p in 0..policies {
        let api =
            Api::<NetworkPolicy>::namespaced(client.clone(), &format!("ns-{}", p % NAMESPACES));
        api.create(&PostParams::default(), &policy(p, 80)?).await?;
    }
    println!(
        "netpol: {pods} pods on one node and {policies} policies written in {:.2?}",
        started.elapsed()
    );

    let started = Instant::now();
    let enforcer = tokio::spawn(krust_net::policy::run(
        client.clone(),
        krust_net::policy::Config {
            node_name: NODE.into(),
            resync: Duration::from_secs(30),
        },
    ));
    // Policy 0 selects group g0 of ns-0: pod-0 is in it.
    let watched = "pod-in/ns-0/pod-0";
    let (mut listing, mut latencies) = (Vec::new(), Vec::new());
    wait_for_rule(
        &table,
        watched,
        "dport 80 accept",
        Duration::from_secs(300),
        &mut listing,
    )?;
    println!(
        "netpol: first table in force {:.2?} after start ({} chains)",
        started.elapsed(),
        count_chains(&table)
    );
    let api = Api::<NetworkPolicy>::namespaced(client.clone(), "ns-0");
    for change in 0..changes {
        let port = 10_000 + change;
        let at = Instant::now();
        api.replace(
            "policy-0",
            &PostParams::default(),
            &policy_at(&api, port).await?,
        )
        .await?;
        let wanted = format!("dport {port} accept");
        wait_for_rule(
            &table,
            watched,
            &wanted,
            Duration::from_secs(30),
            &mut listing,
        )?;
        latencies.push(at.elapsed());
    }
    latencies.sort();
    listing.sort();
    println!(
        "netpol: one policy changed, API write to rule in the kernel ({changes} changes): p50 {:.1?}, p99 {:.1?}, max {:.1?} (one `nft list chain`: p50 {:.1?})",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
        percentile(&listing, 0.5),
    );
    enforcer.abort();
    krust_net::nft::delete_table(&table)?;
    cluster.stop();
    Ok(())
}

/// Policy `p` (in namespace `ns-<p % 10>`): selects group `g<p / 10 % 10>`, admits pods
/// of the next two namespaces on TCP `port`.
fn policy(p: usize, port: usize) -> Result<NetworkPolicy> {
    let group = format!("g{}", (p / NAMESPACES) % GROUPS);
    let peers: Vec<String> = (1..=2)
        .map(|d| format!("ns-{}", (p + d) % NAMESPACES))
        .collect();
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("policy-{p}")},
        "spec": {"podSelector": {"matchLabels": {"group": group}},
            "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
                {"key": "bench", "operator": "In", "values": peers}]}}],
                "ports": [{"port": port}]}]}}))?)
}

/// Policy 0 with `port`, at its current resourceVersion.
async fn policy_at(api: &Api<NetworkPolicy>, port: usize) -> Result<NetworkPolicy> {
    let mut updated = policy(0, port)?;
    updated.metadata.resource_version = api.get("policy-0").await?.metadata.resource_version;
    Ok(updated)
}

/// Polls `nft list chain` until `chain` holds a rule containing `wanted`; each listing's
/// time goes into `listing`.
fn wait_for_rule(
    table: &str,
    chain: &str,
    wanted: &str,
    timeout: Duration,
    listing: &mut Vec<Duration>,
) -> Result {
    let deadline = Instant::now() + timeout;
    loop {
        let at = Instant::now();
        let out = Command::new("nft")
            .args(["list", "chain", "ip", table, chain])
            .output()?;
        listing.push(at.elapsed());
        if String::from_utf8_lossy(&out.stdout).contains(wanted) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{chain} has no rule with {wanted:?} after {timeout:?}").into());
        }
        // Room for the enforcer on two cores.
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn count_chains(table: &str) -> usize {
    Command::new("nft")
        .args(["list", "chains", "ip"])
        .output()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let mut in_table = false;
            text.lines()
                .filter(|l| {
                    if l.starts_with("table ") {
                        in_table = l.contains(table);
                    }
                    in_table && l.trim_start().starts_with("chain ")
                })
                .count()
        })
        .unwrap_or(0)
}
