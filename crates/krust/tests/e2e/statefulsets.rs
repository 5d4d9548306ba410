//! StatefulSets through the real kubectl. On a real node (containerd + runc) with the
//! cluster DNS: pods come up in ordinal order, each only once the one before is Running
//! and Ready (checked on a watch), resolve each other as
//! `<pod>.<service>.<ns>.svc.cluster.local`, and go in reverse order. On simulated
//! nodes: Parallel pod management, `ordinals.start`, a partitioned rolling update,
//! `rollout undo`, and OnDelete.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{Component, Server, free_port, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(90);

fn statefulset(name: &str, replicas: i32, extra: Value, command: &str) -> String {
    let mut spec = json!({"replicas": replicas, "serviceName": name,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
            "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", command]}]}}});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name}, "spec": spec})
        .to_string()
}

fn running_and_ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// name → pod, for the live pods of a set.
fn pods(s: &Server, app: &str) -> HashMap<String, Value> {
    s.get_json(&["pods", "-l", &format!("app={app}")])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| (p["metadata"]["name"].as_str().unwrap().to_string(), p))
        .collect()
}

fn revision_of(pod: &Value) -> String {
    pod["metadata"]["labels"]["controller-revision-hash"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn ordered_pods_come_up_in_order_and_resolve_each_other_by_name() {
    let s = Server::with_agent(&[
        "--cluster-cidr=10.84.0.0/16",
        "--service-cidr=10.97.0.0/16",
        "--cluster-dns=10.97.0.10",
        "--nftables-table=krust-test-sts",
        &format!("--dns-port={}", free_port()),
    ]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 80}]}})
        .to_string(),
    );
    // Every change of the set's pods, as the watch saw them.
    let watch_log = s.data_dir().join("watch.json");
    let mut watch = Command::new("kubectl")
        .args(["--kubeconfig"])
        .arg(s.kubeconfig())
        .args(["get", "pods", "-l", "app=web", "--watch", "-o", "json"])
        .stdout(std::fs::File::create(&watch_log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl watch");
    std::thread::sleep(Duration::from_millis(500));
    s.ok_stdin(
        &["apply", "-f", "-"],
        &statefulset("web", 3, json!({}), "exec sleep 3600"),
    );
    s.ok(&["rollout", "status", "statefulset/web", "--timeout=120s"]);
    let set = s.get_json(&["statefulset", "web"]);
    assert_eq!(set["status"]["readyReplicas"], 3);
    assert_eq!(
        set["status"]["currentRevision"],
        set["status"]["updateRevision"]
    );
    let live = pods(&s, "web");
    assert_eq!(live.len(), 3);
    for (ordinal, name) in ["web-0", "web-1", "web-2"].iter().enumerate() {
        let pod = &live[*name];
        assert_eq!(pod["spec"]["hostname"], *name);
        assert_eq!(pod["spec"]["subdomain"], "web");
        assert_eq!(
            pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"],
            *name
        );
        assert_eq!(
            pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"],
            ordinal.to_string()
        );
        assert_eq!(
            revision_of(pod),
            set["status"]["updateRevision"].as_str().unwrap()
        );
    }

    // From inside web-0: its peers by their stable names.
    let ip_of_1 = live["web-1"]["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();
    let out = wait_for("web-1 by name from web-0", DEADLINE, || {
        let out = s.kubectl(&[
            "exec",
            "web-0",
            "--",
            "nslookup",
            "web-1.web.default.svc.cluster.local",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains(&ip_of_1).then_some(text)
    });
    assert!(
        out.contains("10.97.0.10"),
        "answered by the cluster DNS: {out}"
    );
    let out = s.kubectl(&["exec", "web-2", "--", "hostname"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "web-2");

    // Scale down: the highest ordinal goes first.
    s.ok(&["scale", "statefulset/web", "--replicas=1"]);
    wait_for("one pod left", DEADLINE, || {
        let all = s.get_json(&["pods", "-l", "app=web"]);
        (all["items"].as_array().map(Vec::len) == Some(1)).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    let _ = watch.kill();
    let _ = watch.wait();

    // The watch: no pod appeared before the one below it was Running and Ready, and
    // web-1 began terminating only after web-2 had.
    let text = std::fs::read_to_string(&watch_log).unwrap();
    let mut ready: HashMap<String, bool> = HashMap::new();
    let mut first_terminating: Vec<String> = Vec::new();
    for event in serde_json::Deserializer::from_str(&text).into_iter::<Value>() {
        let pod = event.expect("a pod from the watch");
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        let ordinal: usize = name["web-".len()..].parse().unwrap();
        if !ready.contains_key(&name) && ordinal > 0 {
            let before = format!("web-{}", ordinal - 1);
            assert_eq!(
                ready.get(&before),
                Some(&true),
                "{name} appeared before {before} was Running and Ready"
            );
        }
        ready.insert(name.clone(), running_and_ready(&pod));
        if pod["metadata"]["deletionTimestamp"].is_string() && !first_terminating.contains(&name) {
            first_terminating.push(name);
        }
    }
    assert_eq!(first_terminating, ["web-2", "web-1"]);
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector=involvedObject.kind=StatefulSet",
    ]);
    assert!(
        events.contains("create Pod web-0 in StatefulSet web successful"),
        "{events}"
    );
    assert!(
        events.contains("delete Pod web-2 in StatefulSet web successful"),
        "{events}"
    );
}

#[test]
fn parallel_sets_partitions_undo_and_on_delete_on_simulated_nodes() {
    let s = Server::start();
    let _sim = Component::start(&s, "sim", "sim", &["--nodes=2"]);
    wait_for("two nodes", DEADLINE, || {
        let out = s.ok(&["get", "nodes", "--no-headers"]);
        (out.matches(" Ready ").count() == 2).then_some(())
    });
    let parallel = json!({"podManagementPolicy": "Parallel", "ordinals": {"start": 3},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}});
    s.ok_stdin(
        &["apply", "-f", "-"],
        &statefulset("db", 4, parallel.clone(), "sleep 1d # v1"),
    );
    s.ok(&["rollout", "status", "statefulset/db", "--timeout=60s"]);
    let mut names: Vec<String> = pods(&s, "db").into_keys().collect();
    names.sort();
    assert_eq!(names, ["db-3", "db-4", "db-5", "db-6"]);
    let first = s.get_json(&["statefulset", "db"])["status"]["updateRevision"]
        .as_str()
        .unwrap()
        .to_string();

    // A partition of 2: only the pods from the third ordinal up are updated. The
    // change cause the set carries goes with the revision it makes.
    s.ok(&[
        "annotate",
        "statefulset",
        "db",
        "kubernetes.io/change-cause=moved to v2",
    ]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &statefulset("db", 4, parallel.clone(), "sleep 1d # v2"),
    );
    let second = wait_for("db-5 and db-6 updated", DEADLINE, || {
        let set = s.get_json(&["statefulset", "db"]);
        let update = set["status"]["updateRevision"].as_str()?.to_string();
        let live = pods(&s, "db");
        (update != first
            && set["status"]["updatedReplicas"] == 2
            && set["status"]["readyReplicas"] == 4
            && live.len() == 4
            && ["db-5", "db-6"]
                .iter()
                .all(|n| revision_of(&live[*n]) == update)
            && ["db-3", "db-4"]
                .iter()
                .all(|n| revision_of(&live[*n]) == first))
        .then_some(update)
    });
    let set = s.get_json(&["statefulset", "db"]);
    assert_eq!(
        set["status"]["currentRevision"],
        first.as_str(),
        "not complete below the partition"
    );
    let status = s.ok(&["rollout", "status", "statefulset/db", "--timeout=30s"]);
    assert!(status.contains("partitioned roll out complete"), "{status}");

    // A deleted pod below the partition comes back at the current revision. (Not
    // `--wait=true`: kubectl up to 1.33 waits for a deletion *by name* once it has seen
    // the pod still there, so when the set recreates it between kubectl's GET and LIST
    // it waits forever. `pods` leaves terminating pods out.)
    s.ok(&["delete", "pod", "db-3", "--wait=false"]);
    wait_for("db-3 back at the first revision", DEADLINE, || {
        let live = pods(&s, "db");
        live.get("db-3")
            .filter(|p| revision_of(p) == first && running_and_ready(p))
            .map(|_| ())
    });

    // Undo brings the first template back everywhere (the partition moved to 0).
    let mut whole = parallel.clone();
    whole["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &statefulset("db", 4, whole, "sleep 1d # v2"),
    );
    s.ok(&["rollout", "status", "statefulset/db", "--timeout=60s"]);
    assert!(pods(&s, "db").values().all(|p| revision_of(p) == second));
    s.ok(&["rollout", "undo", "statefulset/db"]);
    wait_for("every pod back at the first revision", DEADLINE, || {
        let set = s.get_json(&["statefulset", "db"]);
        let live = pods(&s, "db");
        (set["status"]["currentRevision"] == first.as_str()
            && live.len() == 4
            && live
                .values()
                .all(|p| revision_of(p) == first && running_and_ready(p)))
        .then_some(())
    });
    let history = s.ok(&["rollout", "history", "statefulset/db"]);
    assert!(history.contains('2') && history.contains('3'), "{history}");
    assert!(history.contains("moved to v2"), "{history}");

    // OnDelete: a new template reaches only the pods users delete.
    let on_delete = json!({"podManagementPolicy": "Parallel", "ordinals": {"start": 3},
        "updateStrategy": {"type": "OnDelete"}});
    s.ok_stdin(
        &["apply", "-f", "-"],
        &statefulset("db", 4, on_delete, "sleep 1d # v3"),
    );
    let third = wait_for("a third revision", DEADLINE, || {
        let update = s.get_json(&["statefulset", "db"])["status"]["updateRevision"]
            .as_str()?
            .to_string();
        (update != first && update != second).then_some(update)
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        pods(&s, "db").values().all(|p| revision_of(p) == first),
        "nothing rolled"
    );
    s.ok(&["delete", "pod", "db-6", "--wait=false"]);
    wait_for("db-6 at the new revision", DEADLINE, || {
        pods(&s, "db")
            .get("db-6")
            .filter(|p| revision_of(p) == third)
            .map(|_| ())
    });
    assert_eq!(revision_of(&pods(&s, "db")["db-3"]), first);

    // Parallel scale-down takes every condemned pod at once.
    s.ok(&["scale", "statefulset/db", "--replicas=1"]);
    wait_for("only db-3 left", DEADLINE, || {
        let all = s.get_json(&["pods", "-l", "app=db"]);
        let names: Vec<&str> = all["items"]
            .as_array()?
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str())
            .collect();
        (names == ["db-3"]).then_some(())
    });
}
