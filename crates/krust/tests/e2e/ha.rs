//! A highly available control plane as k3s builds one: a `--cluster-init` server, two
//! more joining with `--server` and the server token, one etcd cluster under all three
//! apiservers, one leading controller manager and scheduler, the leader's machine lost
//! (its etcd and its server killed with SIGKILL) under a write load without losing an
//! acknowledged write, the lost server back on its data, a server leaving and a fourth
//! joining; and an agent that keeps working when the server it joined is lost.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::agent::{EdgeDir, join_edge, stop_edge};
use crate::common::{Server, free_port, wait_for};
use crate::history::History;
use crate::managed_etcd::members;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

/// A server of the cluster with its etcd ports.
struct Member {
    server: Server,
    client_port: String,
    peer_port: String,
    node: &'static str,
}

/// A server with free etcd ports and `flags`.
fn start(node: &'static str, flags: &[&str]) -> Member {
    let (client_port, peer_port) = (free_port().to_string(), free_port().to_string());
    let mut all = vec![
        "--etcd-client-port",
        &client_port,
        "--etcd-peer-port",
        &peer_port,
        "--node-name",
        node,
    ];
    all.extend_from_slice(flags);
    let server = Server::start_with(&all);
    Member {
        server,
        client_port,
        peer_port,
        node,
    }
}

fn first(node: &'static str, flags: &[&str]) -> Member {
    let mut all = vec!["--cluster-init"];
    all.extend_from_slice(flags);
    start(node, &all)
}

fn join(to: &Member, node: &'static str, flags: &[&str]) -> Member {
    let token = std::fs::read_to_string(to.server.data_dir().join("server/token"))
        .expect("the server token");
    let url = format!("https://127.0.0.1:{}", to.server.port);
    let mut all = vec!["--server", &url, "--token", token.trim()];
    all.extend_from_slice(flags);
    start(node, &all)
}

/// The machine of `m` lost: its etcd member and its server killed with SIGKILL.
fn lose(m: &mut Member) {
    Command::new("kill")
        .args(["-9", &member_pid(m).to_string()])
        .status()
        .expect("kill");
    m.server.kill();
}

/// `etcdctl -w json ARGS` against `via`'s member, with its certificates.
fn etcdctl(via: &Member, args: &[&str]) -> Value {
    let tls = via.server.data_dir().join("server/tls/etcd");
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=https://127.0.0.1:{}", via.client_port))
        .arg(format!("--cacert={}", tls.join("ca.crt").display()))
        .arg(format!("--cert={}", tls.join("client.crt").display()))
        .arg(format!("--key={}", tls.join("client.key").display()))
        .args(["--command-timeout=5s", "-w", "json"])
        .args(args)
        .output()
        .expect("running etcdctl");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// The names of the cluster's members and whether each is a learner.
fn member_list(via: &Member) -> Vec<(String, bool)> {
    let listed = etcdctl(via, &["member", "list"]);
    let mut members: Vec<(String, bool)> = listed["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_owned(),
                m["isLearner"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    members.sort();
    members
}

/// The client port of the member that leads now.
fn leader_port(via: &Member) -> String {
    let statuses = etcdctl(via, &["endpoint", "status", "--cluster"]);
    statuses
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["Status"]["leader"] == s["Status"]["header"]["member_id"])
        .and_then(|s| s["Endpoint"].as_str())
        .and_then(|e| e.rsplit(':').next())
        .expect("a leader")
        .to_owned()
}

/// The process of a server's etcd member.
fn member_pid(m: &Member) -> u32 {
    let pids = members(&m.server.data_dir().join("server/db/etcd"));
    *pids.first().expect("the member's process")
}

/// Waits until `via` lists every one of `members`' apiservers in the `kubernetes`
/// endpoints.
fn all_published(via: &Member, members: &[&Member]) {
    wait_for(
        "every apiserver in the endpoints",
        Duration::from_secs(30),
        || {
            let eps = via
                .server
                .get_json(&["endpoints", "kubernetes"])
                .to_string();
            members
                .iter()
                .all(|m| eps.contains(&format!("\"port\":{}", m.server.port)))
                .then_some(())
        },
    );
}

fn create(s: &Server, name: &str) -> bool {
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
    let body = serde_json::to_vec(&body).expect("JSON");
    s.curl("POST", CMS, Some("application/json"), Some(&body)).0 == 201
}

#[test]
fn three_servers_share_one_etcd_survive_losing_the_leader_and_one_leaves() {
    let a = first("ha-a", &[]);
    let b = join(&a, "ha-b", &[]);
    // Any server admits new ones.
    let c = join(&b, "ha-c", &[]);
    let members = member_list(&a);
    assert_eq!(
        members
            .iter()
            .map(|(_, learner)| *learner)
            .collect::<Vec<_>>(),
        [false, false, false],
        "three voting members: {members:?}"
    );
    for m in [&a, &b, &c] {
        assert!(
            members.iter().any(|(name, _)| name.starts_with(m.node)),
            "{} in {members:?}",
            m.node
        );
    }

    // One store: what one apiserver writes, every other serves.
    a.server
        .ok(&["create", "configmap", "shared", "--from-literal=k=v"]);
    assert_eq!(
        c.server.get_json(&["configmap", "shared"])["data"]["k"],
        "v"
    );
    // Every apiserver is published in the `kubernetes` endpoints.
    all_published(&c, &[&a, &b, &c]);
    // One controller manager and one scheduler lead, through their Leases.
    for lease in ["kube-controller-manager", "kube-scheduler"] {
        let held = a.server.get_json(&["lease", "-n", "kube-system", lease]);
        assert!(held["spec"]["holderIdentity"].is_string(), "{held}");
    }

    // The leader's machine is lost under a write load through the other servers.
    let mut servers = vec![a, b, c];
    let leader = leader_port(&servers[0]);
    let lost = servers
        .iter()
        .position(|m| m.client_port == leader)
        .expect("the leader is one of ours");
    let mut lost = servers.remove(lost);
    let survivors = Arc::new(servers);
    // Beside the creates, the history checker's writers (creates, conditional updates,
    // deletes) and watchers through a survivor: every acknowledged write must stay, no
    // failed one appear, and the watches see every acknowledged write in order.
    let history = History::start(&survivors[0].server, 3);
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let last_ack = Arc::new(Mutex::new((Instant::now(), Duration::ZERO)));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (survivors, acked, last_ack, stop) = (
                survivors.clone(),
                acked.clone(),
                last_ack.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("w{w}-{i}");
                    if create(&survivors[w % 2].server, &name) {
                        acked.lock().unwrap().insert(name);
                        let mut last = last_ack.lock().unwrap();
                        let gap = last.0.elapsed();
                        *last = (Instant::now(), last.1.max(gap));
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    last_ack.lock().unwrap().1 = Duration::ZERO;
    lose(&mut lost);
    std::thread::sleep(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().expect("writer");
    }
    let longest_gap = last_ack.lock().unwrap().1;
    eprintln!("longest time without an acknowledged write: {longest_gap:?}");
    let (checked, _) = history.check();
    assert!(
        checked > 10,
        "the history's writers kept writing: {checked}"
    );
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 20,
        "the survivors kept writing: {}",
        acked.len()
    );
    let listed = survivors[0].server.curl("GET", CMS, None, None).1;
    let stored: BTreeSet<String> = listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|cm| cm["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let lost_writes: Vec<&String> = acked.difference(&stored).collect();
    assert!(
        lost_writes.is_empty(),
        "acknowledged but lost: {lost_writes:?}"
    );

    // The lost server comes back on its data and its member catches up.
    lost.server.restart();
    wait_for(
        "the returned server serves the new objects",
        Duration::from_secs(30),
        || {
            let name = acked.iter().next_back()?;
            lost.server
                .kubectl(&["get", "configmap", name])
                .status
                .success()
                .then_some(())
        },
    );

    // A server leaves: stopped, then its member removed from the cluster.
    let mut survivors = Arc::try_unwrap(survivors).ok().expect("writers done");
    let leaving = survivors.last_mut().expect("two survivors");
    assert!(leaving.server.stop().success());

    let data_dir = leaving.server.data_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_krust"))
        .args(["server", "--leave", "--advertise-address", "127.0.0.1"])
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--etcd-client-port", &leaving.client_port])
        .args(["--etcd-peer-port", &leaving.peer_port])
        .args(["--node-name", leaving.node])
        .output()
        .expect("krust server --leave");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let members = member_list(&lost);
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(
        !members
            .iter()
            .any(|(name, _)| name.starts_with(leaving.node)),
        "{members:?}"
    );
    lost.server.ok(&["create", "configmap", "after-leave"]);

    // A fourth server joins the cluster as it is now, and serves what it holds.
    let d = join(&lost, "ha-d", &[]);
    let members = member_list(&d);
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(members.iter().all(|(_, learner)| !learner), "{members:?}");
    d.server.ok(&["get", "configmap", "after-leave"]);
}

#[test]
fn an_agent_keeps_working_through_another_server_when_the_one_it_joined_dies() {
    let cluster = ["--allocate-node-cidrs=true", "--cluster-cidr=10.56.0.0/16"];
    let mut a = first("lb-a", &cluster);
    let b = join(&a, "lb-b", &cluster);
    let c = join(&a, "lb-c", &cluster);
    let data = EdgeDir::new();
    let (agent, _) = join_edge(&a.server, data.path());
    all_published(&b, &[&a, &b, &c]);
    // The agent learns the servers from those endpoints.
    std::thread::sleep(Duration::from_secs(2));
    lose(&mut a);
    let lost_at = jiff::Timestamp::now();

    // The node keeps reporting through the others, and runs what is scheduled to it.
    wait_for(
        "the node's lease renewed after the loss",
        Duration::from_secs(60),
        || {
            let lease = b
                .server
                .get_json(&["lease", "-n", "kube-node-lease", "edge"]);
            let renewed: jiff::Timestamp = lease["spec"]["renewTime"].as_str()?.parse().ok()?;
            (renewed > lost_at).then_some(())
        },
    );
    b.server
        .ok(&["run", "web", "--image=busybox", "--", "sleep", "3600"]);
    b.server
        .ok(&["wait", "--for=condition=Ready", "pod/web", "--timeout=90s"]);
    assert_eq!(
        c.server.get_json(&["pod", "web"])["spec"]["nodeName"],
        "edge"
    );
    b.server.ok(&["delete", "pod", "web", "--timeout=60s"]);
    stop_edge(agent, data.path());
}
