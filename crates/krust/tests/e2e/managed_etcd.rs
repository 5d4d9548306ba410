//! `krust server --cluster-init`: the store in an etcd member the server runs, on TLS
//! with client certificates from the cluster's etcd CA, started again when it dies, and
//! ended with the server however the server ends.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::{Server, free_port, wait_for};

/// The PIDs of etcd processes whose data dir is `member_dir`.
pub fn members(member_dir: &Path) -> Vec<u32> {
    let wanted = format!("--data-dir={}", member_dir.display());
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == wanted.as_bytes())
        })
        .collect()
}

fn etcdctl(s: &Server, client_port: &str, with_cert: bool, args: &[&str]) -> std::process::Output {
    let tls = s.data_dir().join("server/tls/etcd");
    let mut command = Command::new("etcdctl");
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=https://127.0.0.1:{client_port}"))
        .arg(format!("--cacert={}", tls.join("ca.crt").display()))
        .arg("--command-timeout=3s");
    if with_cert {
        command
            .arg(format!("--cert={}", tls.join("client.crt").display()))
            .arg(format!("--key={}", tls.join("client.key").display()));
    }
    command.args(args).output().expect("running etcdctl")
}

#[test]
fn a_cluster_init_server_keeps_its_store_in_a_supervised_etcd_member() {
    let (client, peer) = (free_port().to_string(), free_port().to_string());
    let mut s = Server::start_with(&[
        "--cluster-init",
        "--etcd-client-port",
        &client,
        "--etcd-peer-port",
        &peer,
    ]);
    let member_dir = s.data_dir().join("server/db/etcd");
    s.ok(&["create", "configmap", "first", "--from-literal=a=1"]);

    // The objects are in the member, under upstream's keys; only the etcd CA's
    // certificates open it.
    let keys = etcdctl(
        &s,
        &client,
        true,
        &["get", "/registry/configmaps/default/first", "--keys-only"],
    );
    assert!(
        String::from_utf8_lossy(&keys.stdout).contains("/registry/configmaps/default/first"),
        "{}",
        String::from_utf8_lossy(&keys.stderr)
    );
    let anonymous = etcdctl(&s, &client, false, &["get", "/registry/", "--prefix"]);
    assert!(
        !anonymous.status.success(),
        "etcd served a client without a certificate"
    );

    // A member that dies is started again on its data.
    let first = members(&member_dir);
    assert_eq!(first.len(), 1, "one member: {first:?}");
    Command::new("kill")
        .args(["-9", &first[0].to_string()])
        .status()
        .expect("kill");
    wait_for("the member started again", Duration::from_secs(30), || {
        let now = members(&member_dir);
        (now.len() == 1 && now != first).then_some(())
    });
    wait_for("writes again", Duration::from_secs(30), || {
        s.kubectl(&["create", "configmap", "second", "--from-literal=a=2"])
            .status
            .success()
            .then_some(())
    });

    // A killed server takes its member with it, and the next start finds the data.
    s.kill();
    wait_for(
        "the member ended with the server",
        Duration::from_secs(10),
        || members(&member_dir).is_empty().then_some(()),
    );
    s.restart();
    for name in ["first", "second"] {
        s.ok(&["get", "configmap", name]);
    }
    // So does a server that stops.
    assert!(s.stop().success());
    assert!(
        members(&member_dir).is_empty(),
        "the member outlived the server"
    );
}
