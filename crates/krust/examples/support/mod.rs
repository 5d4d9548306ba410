//! What the benchmarks share: a release `krust` on a temp dir, components as child
//! processes, their CPU time and RSS, and polling.

#![allow(dead_code)] // each benchmark uses a different part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

#[path = "../../tests/e2e/common/reap.rs"]
mod reap;

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T = (), E = Error> = std::result::Result<T, E>;

/// A child process, killed when dropped.
pub struct Process(pub Child);

impl Process {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `target/<profile>/krust`, beside `target/<profile>/examples/<bench>`.
pub fn krust_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .map(|d| d.join("krust"))
        .expect("target dir")
}

/// CPU seconds (user + system) and RSS in MB of a process.
pub fn proc_stat(pid: u32) -> (f64, f64) {
    let rss_kib: u64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    // utime and stime, fields 14 and 15 of /proc/<pid>/stat, in clock ticks (100/s).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let cpu = (ticks(11) + ticks(12)) as f64 / 100.0;
    (cpu, rss_kib as f64 / 1024.0)
}

/// A process's resident memory split into its own pages (heap, stacks) and the pages of
/// files it maps (mostly the krust binary's code), in MB, from /proc/<pid>/status.
pub fn rss_split(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0) as f64
            / 1024.0
    };
    (kib("RssAnon:"), kib("RssFile:") + kib("RssShmem:"))
}

/// CPU seconds the whole machine has spent busy (all cores), from /proc/stat.
pub fn machine_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let busy: u64 = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .enumerate()
        // user nice system (idle iowait) irq softirq steal
        .filter(|(i, _)| ![3, 4].contains(i))
        .take(6)
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum();
    busy as f64 / 100.0
}

/// The nearest-rank percentile `p` (0..=1) of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Polls `f` every 5 ms until it holds.
pub async fn wait(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// A `krust server` with the given flags on a temp dir, and a client for it.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub server: Process,
}

impl Cluster {
    /// `krust server --disable-agent <flags>`: a control plane without a node.
    pub async fn start(flags: &[&str]) -> Result<Cluster> {
        let mut all = vec!["--disable-agent"];
        all.extend_from_slice(flags);
        Self::start_server(&all).await
    }

    /// `krust server <flags>`: with its node agent (containerd, kubelet).
    pub async fn start_server(flags: &[&str]) -> Result<Cluster> {
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig.yaml");
        let server = Process(
            Command::new(krust_binary())
                .arg("server")
                // The control-plane benches leave out the cluster DNS and the Ingress
                // controller (their own watches and ports) unless given their ports.
                .args(
                    (!flags.iter().any(|f| f.starts_with("--dns-port=")))
                        .then_some("--disable-dns"),
                )
                .args(
                    if !flags.iter().any(|f| f.starts_with("--ingress-http-port=")) {
                        Some("--disable-ingress".to_string())
                    } else if !flags.iter().any(|f| f.starts_with("--ingress-https-port=")) {
                        Some(format!("--ingress-https-port={}", free_port()))
                    } else {
                        None
                    },
                )
                .args(flags)
                .args([
                    "--bind-address",
                    "127.0.0.1",
                    "--advertise-address",
                    "127.0.0.1",
                ])
                .arg("--https-listen-port")
                .arg(free_port().to_string())
                .arg("--data-dir")
                .arg(dir.path().join("data"))
                .arg("--write-kubeconfig")
                .arg(&kubeconfig)
                .stderr(Stdio::null())
                .spawn()?,
        );
        wait("the server", Duration::from_secs(20), || {
            kubeconfig.exists()
        })
        .await?;
        Ok(Cluster {
            dir,
            kubeconfig,
            server,
        })
    }

    /// Stops the server and ends what its node left running (see the `Drop`).
    pub fn stop(self) {
        drop(self);
    }

    /// `krust <command> --kubeconfig <admin> <args>` as a child process.
    pub fn component(&self, command: &str, args: &[&str]) -> Result<Process> {
        Ok(Process(
            Command::new(krust_binary())
                .arg(command)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args)
                .stderr(Stdio::null())
                .spawn()?,
        ))
    }

    /// The name of the server's own node, once it has registered (within a minute).
    pub async fn node(client: &kube::Client) -> Result<String> {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
        for _ in 0..600 {
            let listed = nodes.list(&Default::default()).await?.items;
            if let Some(name) = listed.into_iter().next().and_then(|n| n.metadata.name) {
                return Ok(name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("no node registered".into())
    }

    pub async fn client(&self) -> Result<kube::Client> {
        let yaml = std::fs::read_to_string(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(
            Kubeconfig::from_yaml(&yaml)?,
            &KubeConfigOptions::default(),
        )
        .await?;
        // krust's own connector: TCP_NODELAY, as Go clients have (kube's default
        // connector leaves Nagle on, which adds ~40 ms to a create).
        Ok(krust_client::connect::client(config)?)
    }
}

impl Drop for Cluster {
    /// Stops the server with SIGTERM (so it stops the containerd it started), waits, and
    /// ends whatever its node left running — containers outlive their server, as with
    /// k3s — also when a benchmark ends early on an error.
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe {
            libc::kill(self.server.pid() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.server.0.wait();
        reap::reap_node(&self.dir.path().join("data"));
    }
}
