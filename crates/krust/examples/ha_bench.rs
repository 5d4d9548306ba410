//! How long writes fail when the etcd leader's machine is lost (issue 35: ≤ 5 s, p99
//! over several kills), and that no acknowledged write is lost: three `krust server`s on
//! loopback (`--cluster-init`, then two joining), a steady open-loop load of creates (one
//! every 10 ms, spread over the three apiservers, each with a 30 s timeout), and ROUNDS
//! times: the server whose member leads killed with SIGKILL — in `server` mode the server
//! alone (its member then ends through the parent-death signal, as when the server
//! crashes), in `machine` mode its member first (as when the machine dies) — ten seconds
//! of load, the server started again on its data, and its member caught up.
//!
//! Per kill it reports the window in which newly issued writes failed (from the kill to
//! the start of the last write that failed or took over a second) and the longest a
//! write in flight at the kill or issued within that window waited for its answer.
//!
//! ```text
//! cargo build --release -p krust --bins --example ha_bench
//! ./target/release/examples/ha_bench [rounds=5] [server|machine]
//! ```

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

mod support;

use support::{Process, Result, free_port, krust_binary, percentile};

/// One server: its process, ports and data.
struct Server {
    dir: std::path::PathBuf,
    port: u16,
    client_port: u16,
    peer_port: u16,
    flags: Vec<String>,
    process: Option<Process>,
}

impl Server {
    fn new(root: &std::path::Path, n: usize, flags: Vec<String>) -> Server {
        Server {
            dir: root.join(format!("s{n}")),
            port: free_port(),
            client_port: free_port(),
            peer_port: free_port(),
            flags,
            process: None,
        }
    }

    fn kubeconfig(&self) -> std::path::PathBuf {
        self.dir.join("kubeconfig.yaml")
    }

    async fn start(&mut self) -> Result {
        let _ = std::fs::remove_file(self.kubeconfig());
        let child = Command::new(krust_binary())
            .arg("server")
            .args(["--disable-agent", "--disable-dns", "--disable-ingress"])
            .args([
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
            ])
            .args([
                "--controller-manager-metrics-address=0",
                "--scheduler-metrics-address=0",
            ])
            .arg(format!("--https-listen-port={}", self.port))
            .arg(format!("--etcd-client-port={}", self.client_port))
            .arg(format!("--etcd-peer-port={}", self.peer_port))
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!(
                "--write-kubeconfig={}",
                self.kubeconfig().display()
            ))
            .args(&self.flags)
            .stderr(Stdio::null())
            .spawn()?;
        self.process = Some(Process(child));
        support::wait("a server", Duration::from_secs(60), || {
            self.kubeconfig().exists()
        })
        .await
    }

    async fn client(&self) -> Result<kube::Client> {
        let yaml = std::fs::read_to_string(self.kubeconfig())?;
        Ok(krust_client::connect::from_kubeconfig(&yaml).await?.0)
    }

    /// `etcdctl -w json ARGS` against this server's member.
    fn etcdctl(&self, args: &[&str]) -> Value {
        let tls = self.dir.join("data/server/tls/etcd");
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!(
                "--endpoints=https://127.0.0.1:{}",
                self.client_port
            ))
            .arg(format!("--cacert={}", tls.join("ca.crt").display()))
            .arg(format!("--cert={}", tls.join("client.crt").display()))
            .arg(format!("--key={}", tls.join("client.key").display()))
            .args(["--command-timeout=3s", "-w", "json"])
            .args(args)
            .output();
        out.ok()
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or(Value::Null)
    }

    /// Whether this server's member leads.
    fn leads(&self) -> bool {
        let status = self.etcdctl(&["endpoint", "status"]);
        let status = &status[0]["Status"];
        status["leader"].is_u64() && status["leader"] == status["header"]["member_id"]
    }

    /// The PID of this server's etcd member.
    fn member_pid(&self) -> Option<u32> {
        let wanted = format!(
            "--data-dir={}",
            self.dir.join("data/server/db/etcd").display()
        );
        std::fs::read_dir("/proc")
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmdline.split(|b| *b == 0).any(|a| a == wanted.as_bytes())
            })
    }
}

/// One write of the load: when it started and ended, and whether it was acknowledged.
struct Write {
    name: String,
    started: Instant,
    took: Duration,
    ok: bool,
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(Ok(5), |a| a.parse())?;
    let machine = match args.next().as_deref() {
        None | Some("server") => false,
        Some("machine") => true,
        Some(other) => return Err(format!("mode {other:?}: server or machine").into()),
    };
    let root = tempfile::tempdir()?;
    let mut servers = vec![Server::new(root.path(), 1, vec!["--cluster-init".into()])];
    servers[0].start().await?;
    let token = std::fs::read_to_string(servers[0].dir.join("data/server/token"))?;
    let url = format!("https://127.0.0.1:{}", servers[0].port);
    for n in 2..=3 {
        let flags = vec![
            "--server".into(),
            url.clone(),
            "--token".into(),
            token.trim().into(),
        ];
        let mut server = Server::new(root.path(), n, flags);
        server.start().await?;
        servers.push(server);
    }
    // The apiservers the load goes to: a killed one is left out until it is back.
    let mut live = Vec::new();
    for s in &servers {
        live.push(Some(Api::<ConfigMap>::default_namespaced(
            s.client().await?,
        )));
    }
    let clients = Arc::new(Mutex::new(live));
    println!(
        "three servers up; {rounds} rounds, killing the leader's {}",
        if machine {
            "machine (member, then server)"
        } else {
            "server"
        }
    );

    let writes = Arc::new(Mutex::new(Vec::<Write>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (writes, stop, clients) = (writes.clone(), stop.clone(), clients.clone());
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_millis(10));
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                ticker.tick().await;
                let api = {
                    let live: Vec<_> = clients.lock().unwrap().iter().flatten().cloned().collect();
                    live[i % live.len()].clone()
                };
                let writes = writes.clone();
                let name = format!("load-{i}");
                i += 1;
                tokio::spawn(async move {
                    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}}))
                        .expect("a ConfigMap");
                    let started = Instant::now();
                    let params = PostParams::default();
                    let call = api.create(&params, &cm);
                    let ok = matches!(
                        tokio::time::timeout(Duration::from_secs(30), call).await,
                        Ok(Ok(_))
                    );
                    writes.lock().unwrap().push(Write {
                        name,
                        started,
                        took: started.elapsed(),
                        ok,
                    });
                });
            }
        })
    };

    let (mut windows, mut hangs) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let Some(leader) = servers.iter().position(Server::leads) else {
            return Err("no member leads".into());
        };
        let killed_at = Instant::now();
        if machine && let Some(pid) = servers[leader].member_pid() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        clients.lock().unwrap()[leader] = None;
        servers[leader].process = None;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let (window, hang) = {
            let writes = writes.lock().unwrap();
            let failed_after = writes
                .iter()
                .filter(|w| w.started >= killed_at && (!w.ok || w.took > Duration::from_secs(1)))
                .map(|w| w.started.duration_since(killed_at))
                .max()
                .unwrap_or_default();
            let hang = writes
                .iter()
                .filter(|w| w.started <= killed_at + failed_after && w.started + w.took > killed_at)
                .map(|w| w.took)
                .max()
                .unwrap_or_default();
            (failed_after, hang)
        };
        println!(
            "round {round}: server {} killed; new writes failed for {:.2} s, a write issued by then waited up to {:.2} s for its answer",
            leader + 1,
            window.as_secs_f64(),
            hang.as_secs_f64()
        );
        windows.push(window);
        hangs.push(hang);
        servers[leader].start().await?;
        let back = Api::default_namespaced(servers[leader].client().await?);
        clients.lock().unwrap()[leader] = Some(back);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.await?;
    tokio::time::sleep(Duration::from_secs(31)).await;

    let writes = std::mem::take(&mut *writes.lock().unwrap());
    let acked: BTreeSet<String> = writes
        .iter()
        .filter(|w| w.ok)
        .map(|w| w.name.clone())
        .collect();
    let any = clients.lock().unwrap()[0]
        .clone()
        .expect("every server is back");
    let stored: BTreeSet<String> = any
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect();
    let lost = acked.difference(&stored).count();
    windows.sort();
    hangs.sort();
    println!(
        "{} writes, {} acknowledged, {lost} acknowledged but lost",
        writes.len(),
        acked.len()
    );
    println!(
        "window of failing new writes: p50 {:.2} s, p99 {:.2} s; longest wait for an answer: p50 {:.2} s, p99 {:.2} s",
        percentile(&windows, 0.5).as_secs_f64(),
        percentile(&windows, 0.99).as_secs_f64(),
        percentile(&hangs, 0.5).as_secs_f64(),
        percentile(&hangs, 0.99).as_secs_f64(),
    );
    drop(servers);
    if lost > 0 {
        return Err(format!("{lost} acknowledged writes were lost").into());
    }
    Ok(())
}
