//! An etcd member as the server's supervised child (`krust server --cluster-init`, as
//! k3s runs its embedded etcd): client and peer ports on TLS with client certificates
//! required, its data in the server's data dir, started again whenever it exits, and
//! ended with the server — also when the server is killed, through the parent-death
//! signal, so a crashed server never leaves a member holding its ports and data.
//!
//! Timing is etcd's default (100 ms heartbeat, 1 s election timeout), not k3s's 500 ms
//! and 5 s: a leader's loss is noticed in about a second, which the fail-over window
//! needs, and a one-member cluster elects itself in one to two seconds at start rather
//! than five to ten. No automatic compaction: the apiserver compacts.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::error::EtcdError;
use super::{EtcdStore, EtcdTls};

/// How long a member may take to serve after it is started (a member rejoining a
/// cluster catches up first).
const STARTUP: Duration = Duration::from_secs(60);
/// How long after the member exits it is started again (doubling while that fails).
const RESTART_DELAY: Duration = Duration::from_millis(500);
const RESTART_DELAY_MAX: Duration = Duration::from_secs(30);
/// Starts tried when the member exits at once.
const START_ATTEMPTS: u32 = 5;

/// The TLS files of a member (PEM), all issued by the cluster's etcd CA.
#[derive(Debug, Clone)]
pub struct MemberTls {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub peer_cert: PathBuf,
    pub peer_key: PathBuf,
    /// What the server connects with; also how readiness is checked.
    pub client: EtcdTls,
}

/// How the member takes part in its cluster at its first start (later starts read the
/// membership from the data dir and ignore this).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// The first member of a new cluster.
    New,
    /// A member added to a running cluster: `name=peerURL,...` of every member
    /// including this one, as `member add` answered.
    Existing { initial_cluster: String },
    /// Once: the data dir's member alone, its peers forgotten (`--force-new-cluster`).
    ForceNewCluster,
}

/// One member's configuration.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    pub name: String,
    pub data_dir: PathBuf,
    /// The address peers and other servers reach this member at.
    pub advertise: IpAddr,
    pub client_port: u16,
    pub peer_port: u16,
    pub tls: MemberTls,
    pub bootstrap: Bootstrap,
    /// Where the member's output goes.
    pub log: PathBuf,
}

impl MemberSpec {
    /// The URL this member's clients use on this machine.
    pub fn local_client_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.client_port)
    }

    /// The client URL other machines use.
    pub fn client_url(&self) -> String {
        url(self.advertise, self.client_port)
    }

    pub fn peer_url(&self) -> String {
        url(self.advertise, self.peer_port)
    }

    fn command(&self) -> Command {
        let mut listen_clients = vec![self.local_client_url()];
        if !self.advertise.is_loopback() {
            listen_clients.push(self.client_url());
        }
        let initial_cluster = match &self.bootstrap {
            Bootstrap::Existing { initial_cluster } => initial_cluster.clone(),
            Bootstrap::New | Bootstrap::ForceNewCluster => {
                format!("{}={}", self.name, self.peer_url())
            }
        };
        let mut command = Command::new("etcd");
        command
            // etcd also reads its flags from ETCD_* variables; the server's own do not
            // apply to it.
            .env_clear()
            .arg(format!("--name={}", self.name))
            .arg(format!("--data-dir={}", self.data_dir.display()))
            .arg(format!("--listen-client-urls={}", listen_clients.join(",")))
            .arg(format!("--advertise-client-urls={}", self.client_url()))
            .arg(format!("--listen-peer-urls={}", self.peer_url()))
            .arg(format!("--initial-advertise-peer-urls={}", self.peer_url()))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .arg(format!(
                "--initial-cluster-state={}",
                match self.bootstrap {
                    Bootstrap::Existing { .. } => "existing",
                    _ => "new",
                }
            ))
            .arg(format!("--cert-file={}", self.tls.server_cert.display()))
            .arg(format!("--key-file={}", self.tls.server_key.display()))
            .arg(format!("--trusted-ca-file={}", self.tls.ca.display()))
            .arg("--client-cert-auth")
            .arg(format!("--peer-cert-file={}", self.tls.peer_cert.display()))
            .arg(format!("--peer-key-file={}", self.tls.peer_key.display()))
            .arg(format!("--peer-trusted-ca-file={}", self.tls.ca.display()))
            .arg("--peer-client-cert-auth")
            .args(["--logger=zap", "--log-level=warn"]);
        if self.bootstrap == Bootstrap::ForceNewCluster {
            command.arg("--force-new-cluster");
        }
        command
    }
}

fn url(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(ip) => format!("https://{ip}:{port}"),
        IpAddr::V6(ip) => format!("https://[{ip}]:{port}"),
    }
}

/// A running member, ended when the server stops or dies.
pub struct ManagedEtcd {
    spec: MemberSpec,
    child: Child,
}

impl ManagedEtcd {
    /// Starts the member and returns once it serves linearizable reads (a new cluster
    /// has elected it; a joining member has caught up). A member that exits at once is
    /// started again a few times: the member of a server that was just killed may still
    /// hold the ports and the data dir's lock while it ends.
    pub async fn start(spec: MemberSpec) -> crate::Result<ManagedEtcd> {
        let started = Instant::now();
        let mut attempt = 1;
        let member = loop {
            let mut member = ManagedEtcd::spawn_unready(spec.clone())?;
            match member.wait_ready().await {
                Ok(()) => break member,
                Err(EtcdError::MemberExited { .. }) if attempt < START_ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(RESTART_DELAY * 2).await;
                }
                Err(err) => return Err(err.into()),
            }
        };
        tracing::info!(
            name = %spec.name,
            client = %spec.client_url(),
            peer = %spec.peer_url(),
            ms = started.elapsed().as_millis() as u64,
            attempt,
            "etcd member started"
        );
        Ok(member)
    }

    pub fn spec(&self) -> &MemberSpec {
        &self.spec
    }

    /// Starts the process without waiting for it (a joining learner cannot answer the
    /// reads [`ManagedEtcd::start`] waits for).
    pub(super) fn spawn_unready(spec: MemberSpec) -> Result<ManagedEtcd, EtcdError> {
        std::fs::create_dir_all(&spec.data_dir).map_err(|source| EtcdError::Member {
            action: "creating its data dir",
            source,
        })?;
        set_private(&spec.data_dir)?;
        Ok(ManagedEtcd {
            child: spawn(&spec)?,
            spec,
        })
    }

    /// Fails when the process has exited.
    pub(super) fn check_running(&mut self) -> Result<(), EtcdError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(EtcdError::MemberExited {
                status: status.to_string(),
                log: log_tail(&self.spec.log),
            }),
            _ => Ok(()),
        }
    }

    /// Waits until the member serves linearizable reads.
    pub(super) async fn wait_ready(&mut self) -> Result<(), EtcdError> {
        let started = Instant::now();
        let endpoints = [self.spec.local_client_url()];
        loop {
            self.check_running()?;
            let attempt = EtcdStore::connect(&endpoints, "", Some(self.spec.tls.client.clone()));
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), attempt).await {
                return Ok(());
            }
            if started.elapsed() > STARTUP {
                return Err(EtcdError::MemberNotReady {
                    seconds: STARTUP.as_secs(),
                    log: log_tail(&self.spec.log),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts the member again whenever it exits, as containerd is kept running.
    /// Never returns.
    pub async fn keep_running(&mut self) {
        let mut delay = RESTART_DELAY;
        loop {
            let status = self.child.wait().await;
            tracing::warn!(?status, log = %log_tail(&self.spec.log), "etcd exited; starting it again");
            loop {
                tokio::time::sleep(delay).await;
                match spawn(&self.spec) {
                    Ok(child) => {
                        self.child = child;
                        match self.wait_ready().await {
                            Ok(()) => {
                                tracing::info!("etcd member running again");
                                delay = RESTART_DELAY;
                            }
                            Err(err) => tracing::error!(error = %err, "etcd did not come back"),
                        }
                        break;
                    }
                    Err(err) => {
                        tracing::error!(error = %err, "starting etcd again failed");
                        delay = (delay * 2).min(RESTART_DELAY_MAX);
                    }
                }
            }
        }
    }

    /// Stops the member with SIGTERM (etcd then closes its database cleanly).
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on a pid this process spawned and has not reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// etcd refuses a data dir others may read.
fn set_private(dir: &Path) -> Result<(), EtcdError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|source| {
        EtcdError::Member {
            action: "making its data dir private",
            source,
        }
    })
}

fn spawn(spec: &MemberSpec) -> Result<Child, EtcdError> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)
        .map_err(|source| EtcdError::Member {
            action: "opening its log",
            source,
        })?;
    let log2 = log.try_clone().map_err(|source| EtcdError::Member {
        action: "opening its log",
        source,
    })?;
    let mut command = spec.command();
    command
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Its own process group: a Ctrl-C meant for krust does not reach it first.
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: prctl(2) and getppid(2) are async-signal-safe; nothing is allocated.
    unsafe {
        command.pre_exec(|| {
            // The member ends with the thread that started it: tokio's worker threads
            // live as long as the server's runtime.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The server may have died between fork and prctl.
            if libc::getppid() == 1 {
                return Err(std::io::Error::other("the server exited"));
            }
            Ok(())
        });
    }
    command.spawn().map_err(|source| EtcdError::Member {
        action: "starting it (is etcd installed? Debian: etcd-server)",
        source,
    })
}

/// The last lines of the member's log, for errors.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}
