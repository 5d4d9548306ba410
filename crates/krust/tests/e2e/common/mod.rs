//! The end-to-end harness: starts a real `krust server` in a temp dir on a free port,
//! drives it with the real kubectl and with curl (for raw HTTP checks), and kills it when
//! dropped, even when the test panics.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use krust_store::etcd::testing::EtcdCluster;
use serde_json::Value;

mod reap;
use reap::delete_nft_table;
pub use reap::reap_node;

pub const KUBECTL: &str = "/usr/bin/kubectl";
/// The longest any one kubectl command of a test may take (the longest `--timeout` the
/// tests pass is 120 s).
const KUBECTL_LIMIT: Duration = Duration::from_secs(180);
/// Eviction thresholds for test nodes: upstream's memory threshold and no disk signals.
/// These machines' disks are 95% full and CI's build fills them further, so any share of
/// the disk would put test nodes under DiskPressure (the disk-pressure test sets its own).
pub const TEST_EVICTION_HARD: &str = "memory.available<100Mi";
/// Image garbage collection off for test nodes, for the same reason (the image GC test
/// sets its own thresholds).
pub const TEST_IMAGE_GC: &str = "--image-gc-high-threshold=100";

/// A running `krust server`.
pub struct Server {
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// `server` or `apiserver`.
    command: &'static str,
    extra_args: Vec<String>,
    child: Option<Child>,
    /// Runs the node agent (containerd and kubelet) too.
    agent: bool,
}

/// A port nothing listens on now.
/// The flags that place each in-process component's `/metrics`.
const METRICS_FLAGS: [&str; 5] = [
    "--controller-manager-metrics-address",
    "--scheduler-metrics-address",
    "--proxy-metrics-address",
    "--dns-metrics-address",
    "--ingress-metrics-address",
];

/// A port nobody listens on now, and never handed out before in this test process: the
/// kernel may give a just-released port again, and a test that asks for several (one per
/// component) must get distinct ones.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

impl Server {
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    /// `krust apiserver` alone: no controllers writing objects of their own, for tests
    /// of the API itself that count or watch objects.
    pub fn apiserver(extra_args: &[&str]) -> Server {
        Self::start_command("apiserver", extra_args, None)
    }

    /// `krust server` with its node agent: real containerd, runc and CNI. Each such
    /// server needs its own `--cluster-cidr` (the pod networks share the host).
    pub fn with_agent(extra_args: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = Server {
            dir,
            command: "server",
            port: free_port(),
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            child: None,
            agent: true,
        };
        s.launch();
        s
    }

    /// Starts a server with extra `krust server` flags.
    pub fn start_with(extra_args: &[&str]) -> Server {
        Self::start_command("server", extra_args, None)
    }

    /// Starts `krust <command>` with extra flags; `pki` seeds the data dir with another
    /// server's certificates (apiservers of one cluster share a CA).
    pub fn start_command(command: &'static str, extra_args: &[&str], pki: Option<&Path>) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        if let Some(from) = pki {
            let to = dir.path().join("data/server/tls");
            std::fs::create_dir_all(&to).expect("tls dir");
            for entry in std::fs::read_dir(from).expect("reading pki") {
                let entry = entry.expect("pki entry");
                std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copying pki");
            }
        }
        let mut s = Server {
            dir,
            command,
            port: free_port(),
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            child: None,
            agent: false,
        };
        s.launch();
        s
    }

    /// `--disable-ingress` for a server whose test names no Ingress HTTP port, a free
    /// `--ingress-https-port` for one that names only that.
    fn ingress_flag(&self) -> Option<String> {
        let named = |flag: &str| self.extra_args.iter().any(|a| a.starts_with(flag));
        if self.command != "server" {
            None
        } else if !named("--ingress-http-port=") {
            Some("--disable-ingress".into())
        } else if !named("--ingress-https-port=") {
            Some(format!("--ingress-https-port={}", free_port()))
        } else {
            None
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig.yaml")
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_krust"))
            .arg(self.command)
            .args([
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
            ])
            // Only `krust server` has a node agent to turn off.
            // Node agents of tests running at once each need their own kubelet port.
            .args(if self.command == "server" && !self.agent {
                &["--disable-agent"][..]
            } else if self.agent {
                &["--kubelet-port", "0"][..]
            } else {
                &[]
            })
            .args(
                (self.agent
                    && !self
                        .extra_args
                        .iter()
                        .any(|a| a.starts_with("--eviction-hard")))
                .then_some(["--eviction-hard", TEST_EVICTION_HARD])
                .into_iter()
                .flatten(),
            )
            .args(
                (self.agent
                    && !self
                        .extra_args
                        .iter()
                        .any(|a| a.starts_with("--image-gc-high-threshold")))
                .then_some(TEST_IMAGE_GC),
            )
            // Service proxies of tests running at once would share one nftables table
            // and overlapping cluster IPs: a node runs one only when its test names a
            // table of its own.
            .args((self.agent && self.nftables_table().is_none()).then_some("--disable-kube-proxy"))
            // A cluster DNS binds a port on the node's address: a server runs one only
            // when its test names the port.
            .args(
                (self.command == "server"
                    && !self.extra_args.iter().any(|a| a.starts_with("--dns-port=")))
                .then_some("--disable-dns"),
            )
            // Likewise the Ingress controller's HTTP port; one that serves gets a free
            // HTTPS port unless the test names it.
            .args(self.ingress_flag())
            // Every component's metrics port is fixed by default (upstream's): a test
            // that reads them names its own.
            .args(
                METRICS_FLAGS
                    .iter()
                    .filter(|flag| {
                        self.command == "server"
                            && !self.extra_args.iter().any(|a| a.starts_with(*flag))
                    })
                    .map(|flag| format!("{flag}=0")),
            )
            .arg("--https-listen-port")
            .arg(self.port.to_string())
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--write-kubeconfig")
            .arg(self.kubeconfig())
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting krust");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.kubeconfig().exists() && self.curl("GET", "/readyz", None, None).0 == 200 {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("krust exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "krust did not become ready: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The `--nftables-table=` the test gave its node's Service proxy, if any.
    fn nftables_table(&self) -> Option<&str> {
        self.extra_args
            .iter()
            .find_map(|a| a.strip_prefix("--nftables-table="))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The server process's resident memory, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let pid = self.child.as_ref().expect("server running").id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("server running");
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        c.wait().expect("waiting for krust")
    }

    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Runs kubectl against this server.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with(KUBECTL, args, None)
    }

    pub fn kubectl_with(&self, binary: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("running kubectl");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(input.as_bytes())
                .expect("writing stdin");
        }
        // Some kubectl commands wait without end by default (`delete` waits up to a week
        // for the object to go): a hang must fail this test, not stall the whole run.
        let pid = child.id().to_string();
        let (finished, watchdog) = std::sync::mpsc::channel::<()>();
        let guard = std::thread::spawn(move || {
            let hung = matches!(
                watchdog.recv_timeout(KUBECTL_LIMIT),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            );
            if hung {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
            hung
        });
        let out = child.wait_with_output().expect("kubectl output");
        let _ = finished.send(());
        let hung = guard.join().expect("kubectl watchdog");
        assert!(
            !hung,
            "kubectl {args:?} did not finish within {KUBECTL_LIMIT:?}: {}\n--- server log tail ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            last_lines(&self.log(), 40)
        );
        out
    }

    /// kubectl that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            self.diagnostics()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Deletes every pod of the default namespace at once and waits until they are gone
    /// (their containers ended), so that the test leaves nothing running.
    pub fn delete_all_pods(&self) {
        self.ok(&[
            "delete",
            "pods",
            "--all",
            "--grace-period=0",
            "--timeout=60s",
        ]);
    }

    /// kubectl with a manifest on stdin (`-f -`) that must succeed.
    pub fn ok_stdin(&self, args: &[&str], manifest: &str) -> String {
        let out = self.kubectl_with(KUBECTL, args, Some(manifest));
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// kubectl that must fail; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Runs kubectl with `stdin`, expecting failure; returns stderr.
    pub fn fails_stdin(&self, args: &[&str], stdin: &str) -> String {
        let out = self.kubectl_with(KUBECTL, args, Some(stdin));
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// `kubectl get -o json` of one object.
    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).expect("kubectl JSON")
    }

    /// The messages of the events of `reason` about the object `name`.
    pub fn event_messages(&self, name: &str, reason: &str) -> Vec<String> {
        let list = self.get_json(&[
            "events",
            "--field-selector",
            &format!("involvedObject.name={name},reason={reason}"),
        ]);
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// What a failed step needs to be understood from CI output alone: the pods, the
    /// nodes' conditions and the latest events, then the end of the server log.
    pub fn diagnostics(&self) -> String {
        let state = |args: &[&str]| {
            let out = self.kubectl(args);
            String::from_utf8_lossy(if out.status.success() {
                &out.stdout
            } else {
                &out.stderr
            })
            .into_owned()
        };
        format!(
            "\n--- pods ---\n{}--- node conditions ---\n{}\n--- events ---\n{}--- server log tail ---\n{}",
            state(&["get", "pods", "-A", "-o", "wide"]),
            state(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}: {range .status.conditions[?(@.status==\"True\")]}{.type} {end}{.spec.taints}{\"\\n\"}{end}",
            ]),
            last_lines(
                &state(&["get", "events", "-A", "--sort-by=.lastTimestamp"]),
                15
            ),
            last_lines(&self.log(), 20),
        )
    }

    pub fn tls(&self) -> PathBuf {
        self.data_dir().join("server").join("tls")
    }

    /// A raw HTTPS request with the admin certificate; returns (status, body).
    pub fn curl(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&[u8]>,
    ) -> (u16, Value) {
        self.curl_as(
            true,
            method,
            path,
            &[content_type
                .map(|c| format!("Content-Type: {c}"))
                .unwrap_or_default()],
            body,
        )
    }

    /// A GET with the admin certificate and these headers; returns (status, content
    /// type, body bytes), for answers that are not JSON.
    pub fn curl_bytes(&self, path: &str, headers: &[&str]) -> (u16, String, Vec<u8>) {
        let tls = self.tls();
        let body = self.dir.path().join("curl-body");
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-w", "%{http_code} %{content_type}", "-o"])
            .arg(&body)
            .arg("--cacert")
            .arg(tls.join("ca.crt"))
            .arg("--cert")
            .arg(tls.join("admin.crt"))
            .arg("--key")
            .arg(tls.join("admin.key"));
        for h in headers {
            cmd.arg("-H").arg(h);
        }
        let out = cmd
            .arg(format!("https://127.0.0.1:{}{}", self.port, path))
            .output()
            .expect("curl runs");
        let written = String::from_utf8_lossy(&out.stdout).to_string();
        let (code, content_type) = written.split_once(' ').unwrap_or((&written, ""));
        let bytes = std::fs::read(&body).unwrap_or_default();
        (code.parse().unwrap_or(0), content_type.to_string(), bytes)
    }

    /// A raw HTTPS request, authenticated with the admin certificate or anonymous, with
    /// extra headers.
    pub fn curl_as(
        &self,
        admin: bool,
        method: &str,
        path: &str,
        headers: &[String],
        body: Option<&[u8]>,
    ) -> (u16, Value) {
        let tls = self.tls();
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-o", "-", "-w", "\n%{http_code}", "-X", method])
            .arg("--cacert")
            .arg(tls.join("ca.crt"));
        if admin {
            cmd.arg("--cert")
                .arg(tls.join("admin.crt"))
                .arg("--key")
                .arg(tls.join("admin.key"));
        }
        for h in headers.iter().filter(|h| !h.is_empty()) {
            cmd.arg("-H").arg(h);
        }
        if body.is_some() {
            cmd.args(["--data-binary", "@-"]);
        }
        cmd.arg(format!("https://127.0.0.1:{}{}", self.port, path));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let Ok(mut child) = cmd.spawn() else {
            return (0, Value::Null);
        };
        if let Some(b) = body {
            let _ = child.stdin.take().map(|mut s| s.write_all(b));
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("curl output");
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        let value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string()));
        (code.trim().parse().unwrap_or(0), value)
    }
}

/// A krust component (`krust controller-manager`, `krust sim`, ...) run against a
/// server with its admin kubeconfig; killed when dropped.
pub struct Component {
    child: Child,
    log: PathBuf,
}

impl Component {
    /// `krust <command> --kubeconfig <admin> <args>`, logging to `<log_name>.log`.
    pub fn start(s: &Server, command: &str, log_name: &str, args: &[&str]) -> Component {
        let kubeconfig = s.kubeconfig();
        let mut all = vec!["--kubeconfig", kubeconfig.to_str().expect("utf-8 path")];
        all.extend(args);
        Self::spawn(s, command, log_name, &all)
    }

    /// `krust <command> <args>` (no credentials given), logging to `<log_name>.log`.
    pub fn spawn(s: &Server, command: &str, log_name: &str, args: &[&str]) -> Component {
        let log = s.dir.path().join(format!("{log_name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_krust"))
            .arg(command)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting krust {command}: {e}"));
        Component { child, log }
    }

    /// A controller-manager with short leader-election timings.
    pub fn controller_manager(s: &Server, n: usize) -> Component {
        Self::start(
            s,
            "controller-manager",
            &format!("cm{n}"),
            &[
                "--leader-elect-lease-duration=3s",
                "--leader-elect-renew-deadline=2s",
                "--leader-elect-retry-period=250ms",
            ],
        )
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A leader-elected component holds its lease.
    pub fn leads(&self) -> bool {
        self.log().contains("acquired leader lease")
    }

    /// Stops the component with SIGTERM (a clean stop) and waits for it.
    pub fn terminate(&mut self) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real etcd cluster on free loopback ports, killed on drop: the store's launcher
/// (`krust_store::etcd::testing`), driven from these blocking tests.
pub struct Etcd {
    cluster: EtcdCluster,
    runtime: tokio::runtime::Runtime,
}

impl Etcd {
    pub fn start() -> Etcd {
        Self::cluster(1)
    }

    pub fn cluster(size: usize) -> Etcd {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the etcd launcher");
        let cluster = runtime.block_on(EtcdCluster::start(size));
        Etcd { cluster, runtime }
    }

    /// Starts a killed member again on its data dir and waits until it serves.
    pub fn restart(&mut self, i: usize) {
        self.cluster.kill(i);
        self.runtime.block_on(self.cluster.restart(i));
    }

    /// `--datastore-endpoint` naming every member.
    pub fn endpoint(&self) -> String {
        self.cluster.datastore_endpoint()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.agent && self.child.is_some() {
            // A clean stop, so that krust stops the containerd it started.
            self.stop();
        } else {
            self.kill();
        }
        if self.agent {
            reap_node(&self.data_dir());
            // The proxy leaves its rules behind on exit, as kube-proxy does.
            if let Some(table) = self.nftables_table() {
                delete_nft_table(table);
            }
        }
    }
}

/// The host pid of a running container, as its runtime (`runc`, `crun`) on the node
/// under `data_dir` reports it; `id` as in `containerID`, without `containerd://`.
pub fn container_pid(data_dir: &Path, runtime: &str, id: &str) -> u32 {
    let root = data_dir
        .join("agent/containerd")
        .join(runtime)
        .join("k8s.io");
    let out = Command::new(runtime)
        .arg("--root")
        .arg(&root)
        .args(["state", id])
        .output()
        .expect("the runtime runs");
    let state: Value = serde_json::from_slice(&out.stdout).expect("the container's state");
    state["pid"].as_u64().expect("a running container's pid") as u32
}

/// Waits until process `pid` is gone.
pub fn wait_ended(pid: u32) {
    wait_for(
        &format!("process {pid} ended"),
        Duration::from_secs(60),
        || (!Path::new(&format!("/proc/{pid}")).exists()).then_some(()),
    );
}

/// `krust images import --data-dir DATA TARBALL`: the command's output.
pub fn import_image(data_dir: &Path, tarball: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_krust"))
        .args(["images", "import", "--data-dir"])
        .arg(data_dir)
        .arg(tarball)
        .output()
        .expect("running krust images import")
}

/// Polls `f` until it returns `Some`, or panics after `timeout`.
/// The pods of a pod list that are Ready and not terminating (those Services send new
/// connections to).
pub fn ready_pods(list: &Value) -> Vec<&Value> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .collect()
}

pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes a manifest into the server's temp dir and returns its path.
pub fn manifest(server: &Server, name: &str, contents: &str) -> String {
    let path: &Path = server.dir.path();
    let p = path.join(name);
    std::fs::write(&p, contents).expect("writing manifest");
    p.to_string_lossy().into_owned()
}

/// The last `n` lines of `text`, each ending in a newline.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect()
}

/// An audit log of every request at Metadata level, for servers started with
/// [`AuditLog::flags`].
pub struct AuditLog {
    dir: tempfile::TempDir,
}

impl AuditLog {
    pub fn new() -> AuditLog {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            dir.path().join("policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Metadata}]\n",
        )
        .expect("writing the audit policy");
        AuditLog { dir }
    }

    pub fn flags(&self) -> [String; 2] {
        [
            format!(
                "--audit-policy-file={}",
                self.dir.path().join("policy.yaml").display()
            ),
            format!(
                "--audit-log-path={}",
                self.dir.path().join("audit.log").display()
            ),
        ]
    }

    /// Waits for the ResponseComplete event of a `verb` request on the object `name`.
    pub fn completed(&self, verb: &str, name: &str) -> Value {
        let path = self.dir.path().join("audit.log");
        wait_for("the request's audit event", Duration::from_secs(10), || {
            std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|e| {
                    e["verb"] == verb
                        && e["objectRef"]["name"] == name
                        && e["stage"] == "ResponseComplete"
                })
        })
    }
}
