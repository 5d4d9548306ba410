//! Store snapshots as k3s's `etcd-snapshot` keeps them: `krust etcd-snapshot
//! save|ls|delete|prune` against a serving server, scheduled snapshots with a retention,
//! the list in the `krust-etcd-snapshots` ConfigMap, and `--cluster-reset
//! --cluster-reset-restore-path` bringing back exactly the snapshot's objects, from which
//! the controllers carry on.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::common::{Server, free_port, wait_for};

fn krust(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_krust"))
        .args(args)
        .output()
        .expect("running krust")
}

/// `krust etcd-snapshot ARGS` against `s`, which must succeed; returns stdout.
fn snapshot_ok(s: &Server, args: &[&str]) -> String {
    let out = snapshot(s, args);
    assert!(
        out.status.success(),
        "krust etcd-snapshot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn snapshot(s: &Server, args: &[&str]) -> Output {
    let kubeconfig = s.kubeconfig();
    let mut all = vec!["etcd-snapshot"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--kubeconfig", kubeconfig.to_str().expect("UTF-8 path")]);
    krust(&all)
}

fn records(s: &Server) -> Vec<Value> {
    let listed: Value =
        serde_json::from_str(&snapshot_ok(s, &["ls", "-o", "json"])).expect("ls -o json");
    listed.as_array().expect("a list").clone()
}

fn names(s: &Server) -> Vec<String> {
    records(s)
        .iter()
        .map(|r| r["name"].as_str().expect("a name").to_owned())
        .collect()
}

/// The names the ConfigMap lists.
fn published(s: &Server) -> Vec<String> {
    let cm = s.get_json(&["configmap", "-n", "kube-system", "krust-etcd-snapshots"]);
    let mut names: Vec<String> = cm["data"]
        .as_object()
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default();
    names.sort();
    names
}

fn pods_of(s: &Server, app: &str) -> usize {
    s.get_json(&["pods", "-l", &format!("app={app}")])["items"]
        .as_array()
        .map_or(0, Vec::len)
}

fn wait_pods(s: &Server, app: &str, count: usize) {
    wait_for(
        &format!("{count} pods of {app}"),
        Duration::from_secs(60),
        || (pods_of(s, app) == count).then_some(()),
    );
}

#[test]
fn snapshots_of_the_embedded_store_are_saved_listed_pruned_scheduled_and_restore_exactly() {
    round_trip(&[]);
}

#[test]
fn snapshots_of_managed_etcd_are_saved_listed_pruned_scheduled_and_restore_exactly() {
    let (client, peer) = (free_port().to_string(), free_port().to_string());
    round_trip(&[
        "--cluster-init",
        "--etcd-client-port",
        &client,
        "--etcd-peer-port",
        &peer,
    ]);
}

/// Snapshots of the store that `store_flags` choose, taken, listed, pruned, deleted,
/// scheduled, and one restored.
fn round_trip(store_flags: &[&str]) {
    let mut flags = vec![
        "--etcd-snapshot-schedule-cron",
        "* * * * *",
        "--etcd-snapshot-retention",
        "1",
        "--node-name",
        "snapnode",
    ];
    flags.extend_from_slice(store_flags);
    let mut s = Server::start_with(&flags);
    s.ok(&["create", "configmap", "kept", "--from-literal=a=1"]);
    s.ok(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--replicas=2",
    ]);
    wait_pods(&s, "web", 2);
    let kept = s.get_json(&["configmap", "kept"]);

    let saved = snapshot_ok(&s, &["save"]);
    let name = saved
        .trim()
        .strip_prefix("Snapshot ")
        .and_then(|n| n.strip_suffix(" saved."))
        .unwrap_or_else(|| panic!("save said {saved:?}"))
        .to_owned();
    assert!(name.starts_with("on-demand-snapnode-"), "{name}");
    let record = records(&s)
        .into_iter()
        .find(|r| r["name"] == name.as_str())
        .expect("the snapshot listed");
    let location = record["location"].as_str().expect("a location");
    let file = Path::new(location.strip_prefix("file://").expect("a file URL")).to_owned();
    assert_eq!(
        file.parent(),
        Some(s.data_dir().join("server/db/snapshots").as_path())
    );
    assert_eq!(
        record["size"].as_u64(),
        Some(std::fs::metadata(&file).expect("the file").len())
    );
    assert_eq!(record["nodeName"], "snapnode");
    let table = snapshot_ok(&s, &["ls"]);
    assert!(table.starts_with("Name"), "{table}");
    assert!(table.contains(&name), "{table}");
    assert!(published(&s).contains(&name), "{:?}", published(&s));

    // Only the cluster's administrators may take or read backups.
    let denied = s.fails(&["get", "--raw", "/db/snapshots", "--as=someone"]);
    assert!(denied.contains("forbidden"), "{denied}");

    // Named snapshots, pruned to the newest; deleted by name.
    let mut named = Vec::new();
    for _ in 0..3 {
        let out = snapshot_ok(&s, &["save", "--name", "pre-upgrade"]);
        named.push(
            out.trim()["Snapshot ".len()..]
                .trim_end_matches(" saved.")
                .to_owned(),
        );
        // Names carry the second they were taken in.
        std::thread::sleep(Duration::from_millis(1100));
    }
    let pruned = snapshot_ok(
        &s,
        &[
            "prune",
            "--name",
            "pre-upgrade",
            "--snapshot-retention",
            "1",
        ],
    );
    for old in &named[..2] {
        assert!(pruned.contains(old.as_str()), "{pruned}");
    }
    let now = names(&s);
    assert!(
        now.contains(&named[2]) && !now.contains(&named[0]),
        "{now:?}"
    );
    snapshot_ok(&s, &["delete", &named[2]]);
    assert!(!names(&s).contains(&named[2]));
    assert!(!published(&s).contains(&named[2]));
    let again = snapshot(&s, &["delete", &named[2]]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not found"));

    // What happens after the snapshot is undone by the restore.
    s.ok(&["create", "configmap", "later", "--from-literal=a=2"]);
    s.ok(&["delete", "configmap", "kept"]);
    s.ok(&["scale", "deployment", "web", "--replicas=4"]);
    wait_pods(&s, "web", 4);
    assert!(s.stop().success());

    // A file that is not a snapshot is refused and the store is left as it was.
    let bogus = s.dir.path().join("bogus");
    std::fs::write(&bogus, b"not a store").expect("writing");
    let data_dir = s.data_dir();
    let data_dir = data_dir.to_str().expect("UTF-8 path");
    let reset = |path: &Path| {
        let mut args = vec![
            "server",
            "--data-dir",
            data_dir,
            "--advertise-address",
            "127.0.0.1",
            "--cluster-reset",
            "--cluster-reset-restore-path",
            path.to_str().expect("UTF-8 path"),
        ];
        args.extend_from_slice(store_flags);
        krust(&args)
    };
    let refused = reset(&bogus);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    let expected = match store_flags.is_empty() {
        true => "not a krust store snapshot",
        false => "could not restore",
    };
    assert!(why.contains(expected), "{why}");
    let restored = reset(&file);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    s.restart();
    let back = s.get_json(&["configmap", "kept"]);
    assert_eq!(back["metadata"]["uid"], kept["metadata"]["uid"]);
    assert_eq!(
        back["metadata"]["resourceVersion"],
        kept["metadata"]["resourceVersion"]
    );
    assert!(s.fails(&["get", "configmap", "later"]).contains("NotFound"));
    let replicas = s.get_json(&["deployment", "web"])["spec"]["replicas"].clone();
    assert_eq!(replicas, 2);
    wait_pods(&s, "web", 2);
    // The controllers carry on from the restored state.
    s.ok(&["scale", "deployment", "web", "--replicas=3"]);
    wait_pods(&s, "web", 3);

    // The schedule (every minute here) takes snapshots and keeps its retention of one.
    wait_for("a scheduled snapshot", Duration::from_secs(90), || {
        let scheduled: Vec<String> = published(&s)
            .into_iter()
            .filter(|n| n.starts_with("etcd-snapshot-snapnode-"))
            .collect();
        (scheduled.len() == 1).then_some(())
    });
}
