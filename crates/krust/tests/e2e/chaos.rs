//! Crashes lose nothing: while a Deployment rolls out again and again and Jobs come and
//! go on a real node, and the history checker's writers and watchers run, the server,
//! the agent, the node's containerd and (on the etcd backend) an etcd member are killed
//! with SIGKILL at random moments and started again. Afterwards the history checks out
//! (every acknowledged write there, no failed one visible, watches ordered and without
//! gaps), the Deployment never had more Ready pods than replicas + maxSurge, the cluster
//! converges within a stated bound, and once everything is deleted no container and no
//! network namespace of the node is left.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::agent::{EdgeDir, containers, join_edge, network_namespaces_in, stop_edge};
use crate::common::{Component, Etcd, KUBECTL, Server, ready_pods};
use crate::history::History;

/// How long the chaos lasts, and how long the cluster then has to settle.
const CHAOS: Duration = Duration::from_secs(90);
const CONVERGE: Duration = Duration::from_secs(120);
const REPLICAS: usize = 3;
const MAX_SURGE: usize = 1;

const WORKLOAD: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: busybox
        command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
        readinessProbe: {exec: {command: ["true"]}, periodSeconds: 1}
"#;

/// kubectl against the server at `kubeconfig`, which may be down: its output, if any.
fn kubectl(kubeconfig: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(KUBECTL)
        .args(["--request-timeout=5s"])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last lines of the server's and the agent's logs (newest first), for a failure.
fn logs(s: &Server, agent: &Mutex<Option<Component>>) -> String {
    let tail = |log: String| log.lines().rev().take(80).collect::<Vec<_>>().join("\n");
    let agent_log = agent
        .lock()
        .unwrap()
        .as_ref()
        .map(|a| a.log())
        .unwrap_or_default();
    format!(
        "server (last lines first):\n{}\nagent:\n{}",
        tail(s.log()),
        tail(agent_log)
    )
}

/// A tiny deterministic generator, seeded from the clock and printed, so that a failing
/// schedule can be replayed with `KRUST_CHAOS_SEED`.
struct Rng(u64);

impl Rng {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

/// The history checker's writers: few, beside a real node's work on two cores.
const WRITERS: usize = 2;

#[test]
fn crashes_of_server_agent_and_containerd_lose_no_write_and_leak_nothing() {
    chaos("10.92.0.0/16", None);
}

#[test]
fn crashes_on_the_etcd_backend_and_of_its_members_lose_no_write_and_leak_nothing() {
    chaos("10.95.0.0/16", Some(Etcd::cluster(3)));
}

/// Runs the chaos against a server on `etcd` (three members), else on its embedded store.
fn chaos(cluster_cidr: &str, mut etcd: Option<Etcd>) {
    let cidr_flag = format!("--cluster-cidr={cluster_cidr}");
    let endpoint = etcd.as_ref().map(Etcd::endpoint);
    let mut flags = vec!["--allocate-node-cidrs=true", cidr_flag.as_str()];
    if let Some(endpoint) = &endpoint {
        flags.extend(["--datastore-endpoint", endpoint]);
    }
    let mut s = Server::start_with(&flags);
    let data = EdgeDir::new();
    let (agent, cidr) = join_edge(&s, data.path());
    // Namespaces left in this range by an earlier run that did not finish are not ours.
    let earlier = network_namespaces_in(&cidr);
    let agent = Arc::new(Mutex::new(Some(agent)));
    let kubeconfig = s.kubeconfig();
    let manifest = s.dir.path().join("web.yaml");
    std::fs::write(&manifest, WORKLOAD).unwrap();
    s.ok(&["apply", "-f", manifest.to_str().unwrap()]);
    s.ok(&["rollout", "status", "deploy/web", "--timeout=90s"]);

    let seed = std::env::var("KRUST_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("chaos seed {seed} (KRUST_CHAOS_SEED to replay)");
    let mut rng = Rng(seed);

    let stop = Arc::new(AtomicBool::new(false));
    let most_ready = Arc::new(AtomicUsize::new(0));
    let history = History::start(&s, WRITERS);
    let workers = vec![
        // Rollouts and Jobs.
        std::thread::spawn({
            let (stop, kubeconfig) = (stop.clone(), kubeconfig.clone());
            move || {
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let env = format!("ROUND={round}");
                    kubectl(&kubeconfig, &["set", "env", "deploy/web", &env]);
                    let job = format!("job-{round}");
                    kubectl(
                        &kubeconfig,
                        &["create", "job", &job, "--image=busybox", "--", "true"],
                    );
                    std::thread::sleep(Duration::from_secs(3));
                }
            }
        }),
        // The Deployment's Ready pods, as often as the API answers.
        std::thread::spawn({
            let (stop, most_ready, kubeconfig) =
                (stop.clone(), most_ready.clone(), kubeconfig.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(out) =
                        kubectl(&kubeconfig, &["get", "pods", "-l", "app=web", "-o", "json"])
                    {
                        let ready = serde_json::from_str::<Value>(&out)
                            .map_or(0, |pods| ready_pods(&pods).len());
                        most_ready.fetch_max(ready, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
        }),
    ];

    let started = Instant::now();
    let mut crashes = Vec::new();
    while started.elapsed() < CHAOS {
        std::thread::sleep(Duration::from_millis(3_000 + rng.next(7_000)));
        // An etcd member is a fourth target when there is one.
        let targets = if etcd.is_some() { 4 } else { 3 };
        match rng.next(targets) {
            0 => {
                crashes.push("server");
                s.restart();
            }
            1 => {
                crashes.push("agent");
                drop(agent.lock().unwrap().take());
                let (again, _) = join_edge(&s, data.path());
                *agent.lock().unwrap() = Some(again);
            }
            3 => {
                crashes.push("etcd member");
                let member = rng.next(3) as usize;
                etcd.as_mut().expect("an etcd cluster").restart(member);
            }
            _ => {
                crashes.push("containerd");
                let _ = Command::new("pkill")
                    .args(["-KILL", "-f"])
                    .arg(format!("{}/agent/containerd", data.path().display()))
                    .status();
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    eprintln!("crashed, in order: {crashes:?}");

    // Converged within the bound: the last rollout done, every Job finished.
    let settle = Instant::now();
    while kubectl(
        &kubeconfig,
        &["rollout", "status", "deploy/web", "--timeout=5s"],
    )
    .is_none()
    {
        if settle.elapsed() > CONVERGE {
            let state = kubectl(&kubeconfig, &["get", "deploy,rs,pods", "-o", "wide"]);
            let events = kubectl(&kubeconfig, &["get", "events", "--sort-by=.lastTimestamp"]);
            panic!(
                "the rollout did not finish {CONVERGE:?} after the chaos:\n{}\n{}\n{}",
                state.unwrap_or_default(),
                events.unwrap_or_default(),
                logs(&s, &agent)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Every Job finished: Complete, or Failed when crashes used up its back-off limit.
    let finished = |j: &Value| {
        j["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True"
            })
        })
    };
    loop {
        let jobs = kubectl(&kubeconfig, &["get", "jobs", "-o", "json"])
            .and_then(|out| serde_json::from_str::<Value>(&out).ok());
        let all_done = jobs.as_ref().and_then(|j| {
            j["items"]
                .as_array()
                .map(|items| items.iter().all(finished))
        });
        if all_done == Some(true) {
            break;
        }
        if settle.elapsed() > CONVERGE {
            let state = kubectl(&kubeconfig, &["get", "jobs,pods", "-o", "wide"]);
            panic!(
                "Jobs still running {CONVERGE:?} after the chaos:\n{}\n{}",
                state.unwrap_or_default(),
                logs(&s, &agent)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let jobs = s.get_json(&["jobs"]);
    let failed = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["status"]["failed"].as_u64().unwrap_or(0) > 0)
        .count();
    eprintln!(
        "converged {:?} after the chaos; {failed} of {} Jobs saw a pod fail",
        settle.elapsed(),
        jobs["items"].as_array().unwrap().len()
    );

    let (acknowledged, _) = history.check();
    eprintln!("the history checks out: {acknowledged} acknowledged writes");
    assert!(acknowledged > 20, "the writers got through: {acknowledged}");
    let most = most_ready.load(Ordering::Relaxed);
    assert!(most <= REPLICAS + MAX_SURGE, "{most} Ready pods at once");

    // Nothing of the workload is left on the node once it is deleted.
    s.ok(&["delete", "deploy/web", "--wait=true", "--timeout=90s"]);
    s.ok(&["delete", "jobs", "--all", "--wait=true", "--timeout=90s"]);
    let deadline = Instant::now() + CONVERGE;
    loop {
        let pods = s.get_json(&["pods"]);
        let left: Vec<String> = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "{} phase={} deleting={} finalizers={} conditions={}",
                    p["metadata"]["name"],
                    p["status"]["phase"],
                    p["metadata"]["deletionTimestamp"],
                    p["metadata"]["finalizers"],
                    p["status"]["conditions"]
                )
            })
            .collect();
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "pods left {CONVERGE:?} after their deletion:\n{}\n{}",
                left.join("\n"),
                logs(&s, &agent)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let left = || {
        let namespaces: Vec<_> = network_namespaces_in(&cidr)
            .into_iter()
            .filter(|n| !earlier.contains(n))
            .collect();
        (containers(data.path()), namespaces)
    };
    let deadline = Instant::now() + CONVERGE;
    loop {
        let (containers, namespaces) = left();
        if containers.is_empty() && namespaces.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: containers {containers:?}, network namespaces {namespaces:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let agent = agent.lock().unwrap().take().unwrap();
    stop_edge(agent, data.path());
}
