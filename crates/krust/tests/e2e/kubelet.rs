//! The kubelet end to end: `krust server` with its node agent (real containerd, runc
//! and CNI bridge) and the real kubectl. A busybox httpd Deployment runs and answers on
//! its pod IP; a crashing container backs off; a missing image cannot be pulled;
//! deleting ends the containers within the grace period.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{Server, free_port, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

fn create(s: &Server, obj: Value) {
    s.ok_stdin(&["create", "-f", "-"], &obj.to_string());
}

fn pod(name: &str, image: &str, command: &[&str]) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": image, "command": command}]}})
}

/// (reason, message) of the events about a pod, reported by the kubelet.
pub(crate) fn event_reasons(s: &Server, pod: &str) -> Vec<(String, String)> {
    let events = s.get_json(&[
        "events",
        "--field-selector",
        &format!("involvedObject.name={pod}"),
    ]);
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["source"]["component"] == "kubelet")
        .map(|e| {
            let text = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (text("reason"), text("message"))
        })
        .collect()
}

pub(crate) fn container_status(s: &Server, pod: &str) -> Value {
    s.get_json(&["pod", pod])["status"]["containerStatuses"][0].clone()
}

#[test]
fn pods_run_on_the_local_node_through_containerd() {
    let s = Server::with_agent(&["--cluster-cidr=10.61.0.0/16"]);
    // The node registers, gets a pod range, and is Ready.
    let node = wait_for("a Ready node", DEADLINE, || {
        let nodes = s.get_json(&["nodes"]);
        let node = nodes["items"].as_array()?.first()?.clone();
        let ready = node["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        (ready && node["spec"]["podCIDR"].is_string()).then_some(node)
    });
    assert_eq!(node["spec"]["podCIDR"], "10.61.0.0/24");
    // Pods' network namespaces go into /run/netns as a shared mount of its own (as
    // iproute2 makes it), so that a later `ip netns add` hides none of them.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let netns = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/run/netns"))
        .expect("/run/netns is a mount of its own");
    assert!(netns.contains(" shared:"), "{netns}");
    assert!(
        node["status"]["nodeInfo"]["containerRuntimeVersion"]
            .as_str()
            .unwrap()
            .starts_with("containerd://")
    );
    assert_eq!(node["status"]["allocatable"]["pods"], "110");

    // A Deployment of busybox httpd answers on its pod IP.
    let serve = "mkdir -p /www && echo hello-from-$(hostname) > /www/index.html && exec httpd -f -p 8080 -h /www";
    create(
        &s,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"terminationGracePeriodSeconds": 2, "containers": [{"name": "httpd", "image": "busybox",
                        "command": ["sh", "-c", serve], "ports": [{"containerPort": 8080}]}]}}}}),
    );
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let pods = s.get_json(&["pods", "-l", "app=web"]);
    for p in pods["items"].as_array().unwrap() {
        let name = p["metadata"]["name"].as_str().unwrap();
        let ip = p["status"]["podIP"].as_str().expect("a pod IP");
        assert!(ip.starts_with("10.61.0."), "{ip}");
        assert_eq!(p["status"]["phase"], "Running");
        assert_eq!(p["status"]["qosClass"], "BestEffort");
        let cs = &p["status"]["containerStatuses"][0];
        assert!(
            cs["containerID"]
                .as_str()
                .unwrap()
                .starts_with("containerd://")
        );
        assert!(cs["state"]["running"]["startedAt"].is_string());
        let body = wait_for("an HTTP answer", DEADLINE, || {
            let out = Command::new("curl")
                .args(["-s", "--max-time", "2", &format!("http://{ip}:8080/")])
                .output()
                .ok()?;
            let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (!body.is_empty()).then_some(body)
        });
        assert_eq!(body, format!("hello-from-{name}"));
    }

    // The kubelet says what it did, as upstream's does.
    let first = pods["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let reasons = wait_for("kubelet events", DEADLINE, || {
        let reasons = event_reasons(&s, &first);
        ["Pulled", "Created", "Started"]
            .iter()
            .all(|r| reasons.iter().any(|(reason, _)| reason == r))
            .then_some(reasons)
    });
    assert!(
        reasons.contains(&(
            "Created".to_string(),
            "Created container: httpd".to_string()
        )),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("Started".to_string(), "Started container httpd".to_string())),
        "{reasons:?}"
    );

    // A container that keeps failing is restarted with growing back-off.
    create(&s, pod("crash", "busybox", &["sh", "-c", "exit 3"]));
    let status = wait_for("CrashLoopBackOff", DEADLINE, || {
        let cs = container_status(&s, "crash");
        (cs["state"]["waiting"]["reason"] == "CrashLoopBackOff").then_some(cs)
    });
    assert!(status["restartCount"].as_i64().unwrap() >= 1, "{status}");
    assert_eq!(status["lastState"]["terminated"]["exitCode"], 3);
    assert_eq!(status["lastState"]["terminated"]["reason"], "Error");
    let backoff = wait_for("a BackOff event", DEADLINE, || {
        event_reasons(&s, "crash")
            .into_iter()
            .find(|(r, _)| r == "BackOff")
    });
    assert!(
        backoff
            .1
            .starts_with("Back-off restarting failed container c in pod crash_default("),
        "{backoff:?}"
    );

    // An image that exists nowhere cannot be pulled.
    create(
        &s,
        pod("missing", "registry.invalid/nothing:1.0", &["true"]),
    );
    let reason = wait_for("ErrImagePull", DEADLINE, || {
        let reason = container_status(&s, "missing")["state"]["waiting"]["reason"].clone();
        matches!(reason.as_str(), Some("ErrImagePull" | "ImagePullBackOff")).then_some(reason)
    });
    assert!(reason.is_string());

    // Deleting ends the containers (httpd ignores SIGTERM as PID 1: the 2 s grace
    // period runs out, then SIGKILL) and removes the pods.
    let started = Instant::now();
    s.ok(&["delete", "deployment", "web"]);
    s.ok(&["delete", "pod", "crash", "missing", "--timeout=60s"]);
    wait_for("all pods gone", DEADLINE, || {
        s.get_json(&["pods"])["items"]
            .as_array()
            .is_some_and(|a| a.is_empty())
            .then_some(())
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

fn curl(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-s", "-f", "--max-time", "2", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn config_maps_secrets_and_the_downward_api_reach_containers_and_follow_updates() {
    let s = Server::with_agent(&["--cluster-cidr=10.62.0.0/16"]);
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "site"},
            "data": {"greeting": "hello", "color": "blue"}}),
    );
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
            "stringData": {"password": "s3cret"}}),
    );
    let script = "echo \"$FROM_CM|$FROM_SECRET|$POD_NAME|$CM_color|$MEM\" > /tmp/env && exec httpd -f -p 8080 -h /";
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "labels": {"tier": "web"}},
            "spec": {"terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", script],
                    "resources": {"limits": {"memory": "64Mi"}},
                    "env": [
                        {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "site", "key": "greeting"}}},
                        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}],
                    "envFrom": [{"prefix": "CM_", "configMapRef": {"name": "site"}}],
                    "volumeMounts": [
                        {"name": "cfg", "mountPath": "/cfg"},
                        {"name": "sec", "mountPath": "/sec"},
                        {"name": "info", "mountPath": "/info"},
                        {"name": "scratch", "mountPath": "/scratch"}]}],
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "site", "items": [{"key": "greeting", "path": "greeting"}]}},
                    {"name": "sec", "secret": {"secretName": "creds", "defaultMode": 256}},
                    {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                    {"name": "scratch", "emptyDir": {}}]}}),
    );
    s.ok(&["wait", "--for=condition=Ready", "pod/app", "--timeout=60s"]);
    let pod = s.get_json(&["pod", "app"]);
    let ip = pod["status"]["podIP"].as_str().unwrap().to_string();
    let get = |path: &str| wait_for(path, DEADLINE, || curl(&format!("http://{ip}:8080{path}")));
    assert_eq!(get("/tmp/env"), "hello|s3cret|app|blue|64");
    assert_eq!(get("/cfg/greeting"), "hello");
    assert_eq!(get("/sec/password"), "s3cret");
    assert_eq!(get("/info/labels"), "tier=\"web\"");
    // Only the selected item is in the configMap volume.
    assert_eq!(curl(&format!("http://{ip}:8080/cfg/color")), None);

    // The memory limit is the container's cgroup limit.
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let cid = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    let limit = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/kubepods/burstable/pod{uid}/{cid}/memory.limit_in_bytes"
    ))
    .expect("the container's memory cgroup");
    assert_eq!(limit.trim(), (64u64 << 20).to_string());

    // A changed ConfigMap reaches the running container's volume.
    s.ok(&[
        "patch",
        "configmap",
        "site",
        "--type=merge",
        "-p",
        r#"{"data":{"greeting":"updated"}}"#,
    ]);
    wait_for("the updated file", DEADLINE, || {
        (curl(&format!("http://{ip}:8080/cfg/greeting")).as_deref() == Some("updated"))
            .then_some(())
    });

    // A missing key is a CreateContainerConfigError.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "broken"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"],
                "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "site", "key": "nope"}}}]}]}}),
    );
    let waiting = wait_for("CreateContainerConfigError", DEADLINE, || {
        let w = container_status(&s, "broken")["state"]["waiting"].clone();
        (w["reason"] == "CreateContainerConfigError").then_some(w)
    });
    assert_eq!(
        waiting["message"],
        "couldn't find key nope in ConfigMap default/site"
    );
    // A volume whose ConfigMap does not exist: FailedMount, the pod waits.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nomount"},
            "spec": {"volumes": [{"name": "cfg", "configMap": {"name": "absent"}}],
                "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}),
    );
    let failed = wait_for("FailedMount", DEADLINE, || {
        event_reasons(&s, "nomount")
            .into_iter()
            .find(|(r, _)| r == "FailedMount")
    });
    assert_eq!(
        failed.1,
        "MountVolume.SetUp failed for volume \"cfg\" : configmap \"absent\" not found"
    );
    assert_eq!(
        container_status(&s, "nomount")["state"]["waiting"]["reason"],
        "ContainerCreating"
    );
    s.ok(&["delete", "pod", "app", "broken", "nomount", "--timeout=60s"]);
}

fn ready(s: &Server, pod: &str) -> bool {
    s.get_json(&["pod", pod])["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

#[test]
fn probes_gate_readiness_and_restart_unhealthy_containers() {
    let s = Server::with_agent(&["--cluster-cidr=10.63.0.0/16"]);
    let probe = |spec: Value| {
        let mut p = json!({"periodSeconds": 1, "failureThreshold": 1});
        for (k, v) in spec.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    // Ready only once the file the readiness probe looks for exists (after ~3 s).
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slow"},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", "sleep 3; touch /tmp/ready; exec sleep 3600"],
                "readinessProbe": probe(json!({"exec": {"command": ["test", "-f", "/tmp/ready"]}}))}]}}),
    );
    // Served over HTTP and TCP: ready and alive.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", "mkdir /www && echo ok > /www/healthz && exec httpd -f -p 8080 -h /www"],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": probe(json!({"httpGet": {"path": "/healthz", "port": "http"}})),
                "livenessProbe": probe(json!({"tcpSocket": {"port": 8080}}))}]}}),
    );
    // Healthy for 2 s, then its liveness probe fails and it is restarted.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sick"},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", "touch /tmp/alive; sleep 2; rm /tmp/alive; exec sleep 3600"],
                "livenessProbe": probe(json!({"exec": {"command": ["test", "-f", "/tmp/alive"]}}))}]}}),
    );
    wait_for("slow running", DEADLINE, || {
        (container_status(&s, "slow")["state"]["running"].is_object()).then_some(())
    });
    assert!(!ready(&s, "slow"), "ready before its probe passed");
    assert_eq!(container_status(&s, "slow")["ready"], false);
    wait_for("slow ready", DEADLINE, || ready(&s, "slow").then_some(()));
    // Its repeated probe failures are one Event with a count, as client-go records them.
    let unhealthy = wait_for("a counted Unhealthy event", DEADLINE, || {
        let events = s.get_json(&[
            "events",
            "--field-selector",
            "involvedObject.name=slow,reason=Unhealthy",
        ]);
        let items = events["items"].as_array()?.clone();
        (items.len() == 1 && items[0]["count"].as_i64()? >= 2).then(|| items[0].clone())
    });
    assert!(
        unhealthy["message"]
            .as_str()
            .unwrap()
            .starts_with("Readiness probe failed: ")
    );
    assert_ne!(unhealthy["firstTimestamp"], unhealthy["lastTimestamp"]);
    wait_for("web ready", DEADLINE, || ready(&s, "web").then_some(()));
    let restarts = wait_for("sick restarted", DEADLINE, || {
        let n = container_status(&s, "sick")["restartCount"]
            .as_i64()
            .unwrap_or(0);
        (n >= 1).then_some(n)
    });
    assert!(restarts >= 1);
    assert_eq!(
        container_status(&s, "web")["restartCount"],
        0,
        "a passing liveness probe restarts nothing"
    );
    s.ok(&["delete", "pod", "slow", "web", "sick", "--timeout=60s"]);
}

#[test]
fn init_containers_run_in_order_before_the_app_and_a_failed_one_fails_a_never_restarting_pod() {
    let s = Server::with_agent(&["--cluster-cidr=10.64.0.0/16"]);
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "staged"},
            "spec": {"terminationGracePeriodSeconds": 0,
                "initContainers": [
                    {"name": "first", "image": "busybox", "command": ["sh", "-c", "echo one > /work/log"],
                        "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
                    {"name": "second", "image": "busybox",
                        "command": ["sh", "-c", "sleep 2; grep -q one /work/log && echo two >> /work/log"],
                        "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
                "containers": [{"name": "app", "image": "busybox", "command": ["httpd", "-f", "-p", "8080", "-h", "/work"],
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
                "volumes": [{"name": "work", "emptyDir": {}}]}}),
    );
    // While the second init container runs, the app waits.
    let pending = wait_for("initializing", DEADLINE, || {
        let st = s.get_json(&["pod", "staged"])["status"].clone();
        (st["initContainerStatuses"][1]["state"]["running"].is_object()).then_some(st)
    });
    assert_eq!(pending["phase"], "Pending");
    assert_eq!(
        pending["containerStatuses"][0]["state"]["waiting"]["reason"],
        "PodInitializing"
    );
    let initialized = pending["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Initialized")
        .unwrap()
        .clone();
    assert_eq!(initialized["status"], "False");
    assert_eq!(
        pending["initContainerStatuses"][0]["state"]["terminated"]["reason"],
        "Completed"
    );

    s.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/staged",
        "--timeout=60s",
    ]);
    let st = s.get_json(&["pod", "staged"])["status"].clone();
    assert_eq!(st["initContainerStatuses"][1]["ready"], true);
    // The shared emptyDir shows the order the init containers ran in.
    let uid = s.get_json(&["pod", "staged"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let log = s
        .data_dir()
        .join(format!("agent/pods/{uid}/volumes/empty-dir/work/log"));
    assert_eq!(std::fs::read_to_string(log).unwrap(), "one\ntwo\n");
    assert!(st["containerStatuses"][0]["state"]["running"].is_object());

    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "doomed"},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                "initContainers": [{"name": "fail", "image": "busybox", "command": ["false"]}],
                "containers": [{"name": "app", "image": "busybox", "command": ["true"]}]}}),
    );
    wait_for("the pod failed", DEADLINE, || {
        (s.get_json(&["pod", "doomed"])["status"]["phase"] == "Failed").then_some(())
    });
    assert_eq!(
        s.get_json(&["pod", "doomed"])["status"]["initContainerStatuses"][0]["state"]["terminated"]
            ["exitCode"],
        1
    );
    s.ok(&["delete", "pod", "staged", "doomed", "--timeout=60s"]);
}

#[test]
fn restarting_krust_leaves_running_pods_running_and_adopts_them() {
    let mut s = Server::with_agent(&["--cluster-cidr=10.65.0.0/16"]);
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "steady"},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", "echo up > /tmp/index.html && exec httpd -f -p 8080 -h /tmp"]}]}}),
    );
    s.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/steady",
        "--timeout=60s",
    ]);
    let before = s.get_json(&["pod", "steady"])["status"].clone();
    let ip = before["podIP"].as_str().unwrap().to_string();
    assert_eq!(
        wait_for("HTTP", DEADLINE, || curl(&format!("http://{ip}:8080/"))),
        "up"
    );

    // SIGKILL: krust gets no chance to stop anything; its containerd keeps running and
    // is adopted by the next krust, which finds the pod's sandbox and container again.
    s.restart();
    assert_eq!(
        curl(&format!("http://{ip}:8080/")).as_deref(),
        Some("up"),
        "the container kept serving"
    );
    let after = wait_for("the pod reported again", DEADLINE, || {
        let st = s.get_json(&["pod", "steady"])["status"].clone();
        let ready = st["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        ready.then_some(st)
    });
    assert_eq!(
        after["containerStatuses"][0]["containerID"],
        before["containerStatuses"][0]["containerID"]
    );
    assert_eq!(after["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(after["podIP"], ip.as_str());
    s.ok(&["delete", "pod", "steady", "--timeout=60s"]);
}

fn terminated(s: &Server, pod: &str) -> Option<Value> {
    let state = container_status(s, pod)["state"]["terminated"].clone();
    state.is_object().then_some(state)
}

#[test]
fn lifecycle_hooks_termination_messages_and_security_contexts() {
    let s = Server::with_agent(&["--cluster-cidr=10.68.0.0/16"]);
    let host = tempfile::tempdir().unwrap();
    let host_dir = host.path().to_str().unwrap();

    // postStart runs before the container counts as started; preStop runs before
    // SIGTERM on deletion.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hooks"},
            "spec": {"terminationGracePeriodSeconds": 10,
                "volumes": [{"name": "host", "hostPath": {"path": host_dir}}],
                "containers": [{"name": "c", "image": "busybox",
                    "command": ["sh", "-c", "trap 'echo term >> /host/order; exit 0' TERM; while true; do sleep 0.1; done"],
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                    "lifecycle": {
                        "postStart": {"exec": {"command": ["sh", "-c", "echo started > /tmp/post"]}},
                        "preStop": {"exec": {"command": ["sh", "-c", "echo prestop >> /host/order"]}}}}]}}),
    );
    s.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/hooks",
        "--timeout=60s",
    ]);
    assert_eq!(
        s.ok(&["exec", "hooks", "--", "cat", "/tmp/post"]),
        "started\n"
    );
    s.ok(&["delete", "pod", "hooks", "--timeout=60s"]);
    let order = std::fs::read_to_string(host.path().join("order")).unwrap();
    assert_eq!(order, "prestop\nterm\n");

    // A failing postStart kills the container, which restarts under its policy.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "badhook"},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox",
                "command": ["sleep", "3600"],
                "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "exit 7"]}}}}]}}),
    );
    wait_for("FailedPostStartHook and a restart", DEADLINE, || {
        let hooked = event_reasons(&s, "badhook")
            .iter()
            .any(|(r, m)| r == "FailedPostStartHook" && m == "PostStartHook failed");
        let restarts = container_status(&s, "badhook")["restartCount"].as_u64()?;
        (hooked && restarts >= 1).then_some(())
    });

    // Termination messages: the file, a custom path, and the log fallback.
    let pod_with = |name: &str, script: &str, extra: Value| {
        let mut container =
            json!({"name": "c", "image": "busybox", "command": ["sh", "-c", script]});
        for (k, v) in extra.as_object().unwrap() {
            container[k] = v.clone();
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [container]}})
    };
    create(
        &s,
        pod_with(
            "msg",
            "echo custom-message > /dev/termination-log; exit 2",
            json!({}),
        ),
    );
    create(
        &s,
        pod_with(
            "custompath",
            "echo elsewhere > /tmp/why; exit 0",
            json!({"terminationMessagePath": "/tmp/why"}),
        ),
    );
    create(
        &s,
        pod_with(
            "fallback",
            "echo from-logs; exit 1",
            json!({"terminationMessagePolicy": "FallbackToLogsOnError"}),
        ),
    );
    let msg = wait_for("msg terminated", DEADLINE, || terminated(&s, "msg"));
    assert_eq!(
        (&msg["exitCode"], &msg["reason"], &msg["message"]),
        (&json!(2), &json!("Error"), &json!("custom-message\n"))
    );
    let custom = wait_for("custompath terminated", DEADLINE, || {
        terminated(&s, "custompath")
    });
    assert_eq!(
        (&custom["reason"], &custom["message"]),
        (&json!("Completed"), &json!("elsewhere\n"))
    );
    let fallback = wait_for("fallback terminated", DEADLINE, || {
        terminated(&s, "fallback")
    });
    assert_eq!(fallback["message"], "from-logs\n");

    // securityContext: users and groups, a read-only root, capabilities, privileged.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sc"},
            "spec": {"terminationGracePeriodSeconds": 0,
                "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000},
                "containers": [
                    {"name": "locked", "image": "busybox", "command": ["sleep", "3600"],
                     "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]}}},
                    {"name": "root", "image": "busybox", "command": ["sleep", "3600"],
                     "securityContext": {"runAsUser": 0, "privileged": true}}]}}),
    );
    s.ok(&["wait", "--for=condition=Ready", "pod/sc", "--timeout=60s"]);
    let id = s.ok(&["exec", "sc", "-c", "locked", "--", "id"]);
    assert!(id.starts_with("uid=1000 gid=3000"), "{id}");
    assert!(id.contains("2000"), "fsGroup is a supplemental group: {id}");
    let touch = s.kubectl(&["exec", "sc", "-c", "locked", "--", "touch", "/x"]);
    assert!(!touch.status.success(), "the root filesystem is writable");
    let caps = |c: &str| {
        let status = s.ok(&["exec", "sc", "-c", c, "--", "cat", "/proc/self/status"]);
        let line = status
            .lines()
            .find(|l| l.starts_with("CapEff:"))
            .unwrap()
            .to_string();
        line.split_whitespace().nth(1).unwrap().to_string()
    };
    assert_eq!(caps("locked"), "0000000000000000");
    assert_ne!(
        caps("root").trim_start_matches('0'),
        "",
        "privileged has capabilities"
    );
    let no_new_privs = s.ok(&[
        "exec",
        "sc",
        "-c",
        "locked",
        "--",
        "cat",
        "/proc/self/status",
    ]);
    assert!(
        no_new_privs
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["NoNewPrivs:", "1"])
    );
    assert!(
        s.ok(&["exec", "sc", "-c", "root", "--", "id"])
            .starts_with("uid=0")
    );

    // runAsNonRoot with an image that runs as root never starts.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nonroot"},
            "spec": {"securityContext": {"runAsNonRoot": true},
                "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]}}),
    );
    let waiting = wait_for("CreateContainerConfigError", DEADLINE, || {
        let w = container_status(&s, "nonroot")["state"]["waiting"].clone();
        (w["reason"] == "CreateContainerConfigError").then_some(w)
    });
    assert_eq!(
        waiting["message"],
        "container has runAsNonRoot and image will run as root (pod: \"nonroot\", container: c)"
    );
}

#[test]
fn disk_pressure_taints_the_node_and_evicts_all_but_critical_pods() {
    // A threshold no disk can meet: the node is under disk pressure from the start.
    let s = Server::with_agent(&[
        "--cluster-cidr=10.69.0.0/16",
        "--eviction-hard=nodefs.available<99.999%",
        "--housekeeping-interval=1s",
    ]);
    let node = wait_for("DiskPressure and its taint", DEADLINE, || {
        let node = s.get_json(&["nodes"])["items"][0].clone();
        let pressure = node["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "DiskPressure" && c["status"] == "True")?
            .clone();
        let tainted = node["spec"]["taints"]
            .as_array()?
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/disk-pressure" && t["effect"] == "NoSchedule");
        tainted.then_some((node, pressure))
    });
    let (node, pressure) = node;
    assert_eq!(pressure["reason"], "KubeletHasDiskPressure");
    assert_eq!(pressure["message"], "kubelet has disk pressure");
    let memory = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "MemoryPressure")
        .unwrap()
        .clone();
    assert_eq!(memory["status"], "False");
    let name = node["metadata"]["name"].as_str().unwrap();

    // Bound straight to the node: a plain pod is evicted, a system-critical one stays.
    for (pod, class) in [("plain", None), ("critical", Some("system-node-critical"))] {
        let mut obj = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
            "spec": {"nodeName": name, "terminationGracePeriodSeconds": 30,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]}});
        if let Some(class) = class {
            obj["spec"]["priorityClassName"] = json!(class);
        }
        create(&s, obj);
    }
    let evicted = wait_for("plain evicted", DEADLINE, || {
        let st = s.get_json(&["pod", "plain"])["status"].clone();
        (st["reason"] == "Evicted").then_some(st)
    });
    assert_eq!(evicted["phase"], "Failed");
    let message = evicted["message"].as_str().unwrap();
    assert!(
        message
            .starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "),
        "{message}"
    );
    let disruption = evicted["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .expect("a DisruptionTarget condition")
        .clone();
    assert_eq!(
        (&disruption["status"], &disruption["reason"]),
        (&json!("True"), &json!("TerminationByKubelet"))
    );
    assert!(
        event_reasons(&s, "plain")
            .iter()
            .any(|(r, m)| r == "Evicted" && m == message)
    );
    let terminated = &evicted["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["exitCode"], 137, "{evicted}");
    // Several intervals later the critical pod still runs.
    std::thread::sleep(Duration::from_secs(3));
    let critical = s.get_json(&["pod", "critical"])["status"].clone();
    assert_eq!(critical["phase"], "Running", "{critical}");
    assert!(critical["reason"].is_null());
}

#[test]
fn host_ports_and_host_network_pods_answer_on_the_node() {
    let s = Server::with_agent(&["--cluster-cidr=10.76.0.0/16"]);
    let serve = |port: u16| {
        format!(
            "mkdir -p /www && echo on-{port} > /www/index.html && exec httpd -f -p {port} -h /www"
        )
    };
    // hostPort: the node's address and that port reach the container's port.
    let host_port = free_port();
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hp"},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", serve(8080)],
                "ports": [{"containerPort": 8080, "hostPort": host_port}]}]}}),
    );
    // hostNetwork: the pod shares the node's network namespace and address.
    let node_port = free_port();
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hn"},
            "spec": {"terminationGracePeriodSeconds": 1, "hostNetwork": true,
                "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", serve(node_port)]}]}}),
    );
    s.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/hp",
        "pod/hn",
        "--timeout=60s",
    ]);
    let host_ip = s.get_json(&["pod", "hp"])["status"]["hostIP"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        wait_for("the hostPort", DEADLINE, || curl(&format!(
            "http://{host_ip}:{host_port}/"
        ))),
        "on-8080"
    );
    let hn = s.get_json(&["pod", "hn"]);
    assert_eq!(hn["status"]["podIP"], hn["status"]["hostIP"]);
    assert_eq!(
        wait_for("the host-network pod", DEADLINE, || curl(&format!(
            "http://127.0.0.1:{node_port}/"
        ))),
        format!("on-{node_port}")
    );
    s.ok(&["delete", "pod", "hp", "hn", "--timeout=60s"]);
}

/// Whether [`refuse_node_deletes`] refuses the kubelet's deletes.
static REFUSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// A validating webhook that refuses deletes by a node while [`REFUSING`] holds.
fn refuse_node_deletes(seen: &crate::https::Seen) -> (u16, Value) {
    let request = &seen.body["request"];
    let by_node = request["userInfo"]["username"]
        .as_str()
        .is_some_and(|u| u.starts_with("system:node:"));
    let allowed = !(by_node && REFUSING.load(std::sync::atomic::Ordering::Relaxed));
    let response = json!({"uid": request["uid"], "allowed": allowed,
        "status": {"code": 503, "message": "not now"}});
    (
        200,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

/// The kubelet's final delete of a pod whose containers are gone can fail (an
/// apiserver restarting, say); it is tried again until it succeeds, or the pod would
/// stay Terminating for good.
#[test]
fn a_final_delete_that_fails_is_tried_again() {
    let s = Server::with_agent(&["--cluster-cidr=10.57.0.0/16"]);
    let hooks = crate::https::HttpsServer::start(&[], None, refuse_node_deletes);
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "hold-deletes"},
            "webhooks": [{
                "name": "hold.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": format!("https://127.0.0.1:{}/", hooks.port), "caBundle": hooks.ca_bundle()},
                "rules": [{"operations": ["DELETE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "objectSelector": {"matchLabels": {"held": "yes"}}
            }]
        })
        .to_string(),
    );
    let mut held = pod("held", "busybox", &["sleep", "3600"]);
    held["metadata"]["labels"] = json!({"held": "yes"});
    create(&s, held);
    s.ok(&["wait", "--for=condition=Ready", "pod/held", "--timeout=60s"]);
    s.ok(&["delete", "pod", "held", "--wait=false"]);
    let node_deletes = || {
        hooks
            .requests()
            .iter()
            .filter(|r| {
                r.body["request"]["userInfo"]["username"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("system:node:"))
            })
            .count()
    };
    wait_for("the kubelet's final delete", DEADLINE, || {
        (node_deletes() > 0).then_some(())
    });
    assert!(s.get_json(&["pod", "held"])["metadata"]["deletionTimestamp"].is_string());
    REFUSING.store(false, std::sync::atomic::Ordering::Relaxed);
    wait_for("the pod to be gone", DEADLINE, || {
        (!s.kubectl(&["get", "pod", "held"]).status.success()).then_some(())
    });
    assert!(node_deletes() >= 2, "the delete was tried again");
}

/// A container whose start was lost — created, never started, because the runtime died
/// during the start — is replaced by a new instance that runs, as upstream's kubelet
/// does for containers in the created state. Here the lost start is made by hand: a
/// newer instance of the pod's container is created through CRI and left unstarted.
#[test]
fn a_container_created_but_never_started_is_replaced_by_one_that_runs() {
    use krust_cri::api::{
        ContainerConfig, ContainerFilter, ContainerMetadata, CreateContainerRequest, ImageSpec,
        LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
        ListContainersRequest, PodSandboxConfig, PodSandboxStatusRequest,
    };
    let s = Server::with_agent(&["--cluster-cidr=10.53.0.0/16"]);
    create(&s, pod("lost", "busybox", &["sleep", "3600"]));
    s.ok(&["wait", "--for=condition=Ready", "pod/lost", "--timeout=60s"]);
    let first = container_status(&s, "lost")["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    let socket = krust_cri::containerd::default_dir(&s.data_dir()).join("containerd.sock");
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let created = tokio.block_on(async {
        let mut cri = krust_cri::Runtime::connect(&socket.display().to_string())
            .await
            .unwrap()
            .runtime;
        let running = cri
            .list_containers(ListContainersRequest {
                filter: Some(ContainerFilter {
                    id: first.clone(),
                    ..ContainerFilter::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .containers
            .remove(0);
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "c".into(),
                attempt: 1,
            }),
            image: Some(ImageSpec {
                image: "busybox".into(),
                ..ImageSpec::default()
            }),
            command: vec!["sleep".into(), "3600".into()],
            labels: running.labels,
            annotations: running.annotations,
            // containerd 1.6 dies on a container without its Linux part.
            linux: Some(LinuxContainerConfig {
                resources: Some(LinuxContainerResources::default()),
                security_context: Some(LinuxContainerSecurityContext::default()),
            }),
            ..ContainerConfig::default()
        };
        // containerd names the container after its sandbox's metadata.
        let sandbox = cri
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: running.pod_sandbox_id.clone(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        cri.create_container(CreateContainerRequest {
            pod_sandbox_id: running.pod_sandbox_id,
            config: Some(config),
            sandbox_config: Some(PodSandboxConfig {
                metadata: sandbox.metadata,
                ..PodSandboxConfig::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id
    });
    let replaced = wait_for("a new instance running", DEADLINE, || {
        let status = container_status(&s, "lost");
        let id = status["containerID"].as_str().unwrap_or_default();
        let new = !id.ends_with(&first) && !id.ends_with(&created);
        (new && status["state"]["running"].is_object()).then_some(status)
    });
    assert_eq!(replaced["ready"], true, "{replaced}");
    s.ok(&["delete", "pod", "lost", "--timeout=60s"]);
}
