//! One etcd process: its command line, its ports and data directory, and its lifetime.
//!
//! The process is killed with SIGKILL (its PID, nothing else) by [`Member::kill`] and when the
//! member is dropped, including while a failing test unwinds.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Names the etcd binary to use instead of the one on `PATH`.
pub const ETCD_BIN_ENV: &str = "KRUST_ETCD_BIN";

/// The etcd server binary. Panics with a clear message if there is none: a test that needs
/// etcd must fail where it is missing, never pass by skipping.
pub fn etcd_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(ETCD_BIN_ENV) {
        return PathBuf::from(path);
    }
    crate::etcd::restore::on_path("etcd").unwrap_or_else(|| {
        panic!(
            "etcd is not installed: these tests run a real etcd server. Install it \
             (Debian: `apt-get install etcd-server`) or point {ETCD_BIN_ENV} at an etcd binary."
        )
    })
}

/// A free loopback port. It is released before etcd binds it, so another process may take it
/// in between; etcd then exits at once and the caller retries with new ports.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("binding a free loopback port")
        .port()
}

/// TLS files for etcd's client port (the peer port stays plain: it is loopback-only).
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// One etcd member of a cluster.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    tls: Option<ServerTls>,
    process: Option<Child>,
}

impl Member {
    pub fn new(name: String, dir: &Path, tls: Option<ServerTls>) -> Self {
        Member {
            client_port: free_port(),
            peer_port: free_port(),
            data_dir: dir.join(format!("{name}.etcd")),
            log: dir.join(format!("{name}.log")),
            name,
            tls,
            process: None,
        }
    }

    pub fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// Starts the process (again, after a kill: the data directory is kept, and etcd then
    /// ignores the `--initial-*` flags and rejoins with its stored membership).
    pub fn spawn(&mut self, initial_cluster: &str, token: &str) {
        assert!(self.process.is_none(), "{} is already running", self.name);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("opening the etcd log");
        let mut command = Command::new(etcd_binary());
        command
            // etcd also reads its flags from ETCD_* variables; none of the caller's apply.
            .env_clear()
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(self.client_url())
            .arg("--advertise-client-urls")
            .arg(self.client_url())
            .arg("--listen-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(self.peer_url())
            .arg("--initial-cluster")
            .arg(initial_cluster)
            .arg("--initial-cluster-token")
            .arg(token)
            .arg("--initial-cluster-state")
            .arg("new")
            .args(["--log-level", "warn"]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let process = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("duplicating the log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("starting etcd ({}): {err}", etcd_binary().display()));
        self.process = Some(process);
    }

    /// Kills the process with SIGKILL and reaps it. Nothing happens if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            // Fails only if it already exited, which is what we want anyway.
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// Why the process is no longer running, if it exited on its own.
    pub fn exited(&mut self) -> Option<String> {
        let process = self.process.as_mut()?;
        let status = process.try_wait().expect("polling etcd")?;
        Some(format!(
            "etcd member {} exited ({status}); its log ends with:\n{}",
            self.name,
            self.log_tail()
        ))
    }

    /// The last lines of the member's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}
