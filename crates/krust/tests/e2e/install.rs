//! Operating krust as a service, as k3s: `scripts/install.sh` puts the binary, a systemd
//! unit that systemd itself accepts, and the killall and uninstall scripts in place (and
//! starts nothing where systemd is not PID 1, as on the test machines);
//! `krust-killall.sh` ends a node's krust, containers, shims, network namespaces,
//! mounts, bridge and nftables tables; `krust-uninstall.sh` removes all of it.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::{Server, container_pid, wait_ended, wait_for};

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts");

fn script(name: &str, env: &[(&str, &Path)], extra: &[(&str, &str)]) -> Output {
    let mut command = Command::new(Path::new(SCRIPTS).join(name));
    for (key, value) in env {
        command.env(key, value);
    }
    for (key, value) in extra {
        command.env(key, value);
    }
    command.output().expect("running the script")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_install_script_writes_a_unit_systemd_accepts_and_the_scripts_beside_the_binary() {
    let root = tempfile::tempdir().expect("temp dir");
    let bin_dir = root.path().join("bin");
    let systemd = root.path().join("systemd");
    let env = [
        ("INSTALL_KRUST_BIN_DIR", bin_dir.as_path()),
        ("INSTALL_KRUST_SYSTEMD_DIR", systemd.as_path()),
        ("INSTALL_KRUST_BIN", Path::new(env!("CARGO_BIN_EXE_krust"))),
    ];
    // An agent: the join settings go to a file only root reads.
    let said = ok(&script(
        "install.sh",
        &env,
        &[
            ("KRUST_URL", "https://10.0.0.1:6443"),
            ("KRUST_TOKEN", "K10abc::server:secret"),
        ],
    ));
    assert!(said.contains("systemd is not running here"), "{said}");
    let unit = std::fs::read_to_string(systemd.join("krust-agent.service")).expect("the unit");
    for line in [
        "KillMode=process",
        "Delegate=yes",
        "Restart=always",
        &format!("ExecStart={}/krust agent", bin_dir.display()),
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} in\n{unit}");
    }
    let env_file = systemd.join("krust-agent.service.env");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&env_file)
        .expect("env file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let kept = std::fs::read_to_string(&env_file).expect("env file");
    assert!(kept.contains("KRUST_TOKEN=K10abc::server:secret"), "{kept}");
    // A server with its flags, checked by systemd's own verifier (install.sh runs it;
    // here again, so a unit that only looks right fails).
    ok(&script(
        "install.sh",
        &env,
        &[("INSTALL_KRUST_EXEC", "server --cluster-init")],
    ));
    let server_unit = systemd.join("krust.service");
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&server_unit)
        .output()
        .expect("systemd-analyze");
    assert!(
        verified.status.success() && verified.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    let version = Command::new(bin_dir.join("krust"))
        .arg("--version")
        .output()
        .expect("the installed binary");
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("krust "));
    for name in ["krust-killall.sh", "krust-uninstall.sh"] {
        assert!(bin_dir.join(name).exists(), "{name}");
    }
    // Refused: an agent without a server.
    let refused = script("install.sh", &env, &[("INSTALL_KRUST_EXEC", "agent")]);
    assert!(!refused.status.success());

    // The uninstall script removes what the install wrote, and the data dir.
    let data = root.path().join("data");
    std::fs::create_dir_all(data.join("server")).expect("data dir");
    let config = root.path().join("etc");
    std::fs::create_dir_all(&config).expect("config dir");
    let uninstall = bin_dir.join("krust-uninstall.sh");
    let out = Command::new(&uninstall)
        .env("INSTALL_KRUST_BIN_DIR", &bin_dir)
        .env("INSTALL_KRUST_SYSTEMD_DIR", &systemd)
        .env("KRUST_DATA_DIR", &data)
        .env("KRUST_CONFIG_DIR", &config)
        // Not the host's `krust` table, should a cluster run here.
        .env("KRUST_NFT_TABLE", "krust-test-uninstall")
        .output()
        .expect("uninstall");
    ok(&out);
    for gone in [
        bin_dir.join("krust"),
        bin_dir.join("krust-killall.sh"),
        uninstall,
        server_unit,
        systemd.join("krust-agent.service"),
        env_file,
        data,
        config,
    ] {
        assert!(!gone.exists(), "{} remains", gone.display());
    }
}

/// The shims and containerd of a node whose data dir is `data`.
fn node_processes(data: &Path) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-af", &data.join("agent/containerd").display().to_string()])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn nft_tables() -> String {
    let out = Command::new("nft").args(["list", "tables"]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

#[test]
fn killall_ends_the_node_and_everything_it_left_running() {
    const TABLE: &str = "krust-test-killall";
    let s = Server::with_agent(&[
        "--cluster-cidr=10.60.0.0/16",
        &format!("--nftables-table={TABLE}"),
    ]);
    s.ok(&["run", "web", "--image=busybox", "--", "sleep", "3600"]);
    // A second pod under crun, whose containers live under a root of their own.
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "crun"}, "handler": "crun"}"#,
    );
    s.ok(&[
        "run",
        "fast",
        "--image=busybox",
        "--overrides",
        r#"{"spec": {"runtimeClassName": "crun"}}"#,
        "--",
        "sleep",
        "3600",
    ]);
    s.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/web",
        "pod/fast",
        "--timeout=90s",
    ]);
    let data = s.data_dir();
    let container = |pod: &str| {
        s.get_json(&["pod", pod])["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .expect("a container ID")
            .trim_start_matches("containerd://")
            .to_owned()
    };
    let pids = [
        container_pid(&data, "runc", &container("web")),
        container_pid(&data, "crun", &container("fast")),
    ];
    let pod_ip = s.get_json(&["pod", "web"])["status"]["podIP"]
        .as_str()
        .expect("a pod IP")
        .to_owned();
    assert!(
        !node_processes(&data).is_empty(),
        "containerd and a shim run"
    );
    assert!(nft_tables().contains(TABLE));
    let netns_of_pod = || {
        std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .flatten()
            .any(|ns| {
                let name = ns.file_name().to_string_lossy().into_owned();
                let out = Command::new("ip")
                    .args(["-n", &name, "-4", "-o", "addr", "show"])
                    .output();
                out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&pod_ip))
            })
    };
    assert!(netns_of_pod(), "the pod's network namespace exists");
    let addresses = || {
        let out = Command::new("ip")
            .args(["-4", "-o", "addr", "show"])
            .output();
        String::from_utf8_lossy(&out.expect("ip").stdout).into_owned()
    };
    // The node's bridge holds its range's first address; its name tags its tables.
    let bridge = addresses()
        .lines()
        .find(|l| l.contains(" 10.60.0.1/"))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("the node's bridge")
        .to_owned();
    let tag = bridge
        .strip_prefix("krust")
        .expect("a krust bridge")
        .to_owned();
    assert!(nft_tables().contains(&format!("krust-egress-{tag}")));

    // With the server still running: the script ends it too.
    let out = script(
        "killall.sh",
        &[("KRUST_DATA_DIR", data.as_path())],
        &[("KRUST_NFT_TABLE", TABLE)],
    );
    ok(&out);
    wait_for(
        "the node's processes ended",
        Duration::from_secs(10),
        || node_processes(&data).is_empty().then_some(()),
    );
    // The containers themselves, under either runtime.
    pids.into_iter().for_each(wait_ended);
    assert!(!netns_of_pod(), "the pod's network namespace remains");
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    let prefix = format!("{}/", data.display());
    assert!(
        !mounts.lines().any(|l| l.contains(&prefix)),
        "mounts remain under {prefix}"
    );
    let tables = nft_tables();
    for table in [
        TABLE.to_owned(),
        format!("krust-egress-{tag}"),
        format!("krust-policy-{tag}"),
    ] {
        assert!(
            !tables.lines().any(|l| l.ends_with(&format!(" {table}"))),
            "{table} remains"
        );
    }
    assert!(
        !addresses().contains(" 10.60.0.1/"),
        "the bridge {bridge} remains"
    );
    // The server process itself ended.
    assert!(
        s.curl("GET", "/readyz", None, None).0 != 200,
        "the server still answers"
    );
}
