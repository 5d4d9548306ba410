//! Container streams end to end: `kubectl logs`, `exec`, `cp`, `attach` (`run -i`) and
//! `port-forward` through the apiserver to the kubelet's HTTPS server and on to
//! containerd's streaming server — WebSocket (kubectl 1.32, translated to SPDY by the
//! kubelet) and SPDY (kubectl 1.27).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{KUBECTL, Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);
const KUBECTL_127: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.27";

fn create(s: &Server, obj: Value) {
    s.ok_stdin(&["create", "-f", "-"], &obj.to_string());
}

fn pod(name: &str, restart: &str, script: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1, "restartPolicy": restart,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}})
}

fn phase(s: &Server, name: &str) -> String {
    s.get_json(&["pod", name])["status"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn wait_running(s: &Server, name: &str) {
    wait_for(&format!("pod {name} running"), DEADLINE, || {
        (phase(s, name) == "Running").then_some(())
    });
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn logs_exec_cp_attach_and_port_forward_reach_containers() {
    let s = Server::with_agent(&["--cluster-cidr=10.66.0.0/16"]);

    // --- logs ---
    create(
        &s,
        pod(
            "talk",
            "Never",
            "echo one; sleep 0.3; echo two >&2; sleep 3; echo three; sleep 1",
        ),
    );
    wait_running(&s, "talk");
    // Following ends by itself when the container exits.
    let followed = s.kubectl(&["logs", "-f", "talk", "--request-timeout=30s"]);
    assert!(followed.status.success(), "{}", stderr(&followed));
    assert_eq!(stdout(&followed), "one\ntwo\nthree\n");
    wait_for("talk completed", DEADLINE, || {
        (phase(&s, "talk") == "Succeeded").then_some(())
    });
    assert_eq!(s.ok(&["logs", "talk"]), "one\ntwo\nthree\n");
    assert_eq!(s.ok(&["logs", "talk", "--tail=1"]), "three\n");
    assert_eq!(s.ok(&["logs", "talk", "--limit-bytes=5"]), "one\nt");
    let stamped = s.ok(&["logs", "talk", "--timestamps"]);
    let lines: Vec<&str> = stamped.lines().collect();
    assert_eq!(lines.len(), 3, "{stamped}");
    for (line, text) in lines.iter().zip(["one", "two", "three"]) {
        let (time, rest) = line.split_once(' ').unwrap();
        assert!(time.parse::<jiff::Timestamp>().is_ok(), "{line}");
        assert_eq!(rest, text);
    }
    assert_eq!(s.ok(&["logs", "talk", "--since=1h"]), "one\ntwo\nthree\n");
    // A future sinceTime leaves everything out.
    let (code, log) = s.curl(
        "GET",
        "/api/v1/namespaces/default/pods/talk/log?sinceTime=2099-01-01T00:00:00Z",
        None,
        None,
    );
    assert_eq!((code, log), (200, json!("")));

    // --previous shows the attempt before the current one.
    create(
        &s,
        pod(
            "crash",
            "Always",
            "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo attempt-$n; exit 1",
        ),
    );
    let number = |text: &str| -> u32 {
        text.trim()
            .strip_prefix("attempt-")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected log {text:?}"))
    };
    wait_for("two attempts of crash", DEADLINE, || {
        let restarts =
            s.get_json(&["pod", "crash"])["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()?;
        if restarts < 1 {
            return None;
        }
        let current = s.kubectl(&["logs", "crash"]);
        let previous = s.kubectl(&["logs", "crash", "--previous"]);
        if !(current.status.success() && previous.status.success()) {
            return None;
        }
        // A restart between the two reads makes them two apart; try again then.
        (number(&stdout(&current)) == number(&stdout(&previous)) + 1).then_some(())
    });
    let never_restarted = s.fails(&["logs", "talk", "--previous"]);
    assert!(
        never_restarted.contains("previous terminated container \"c\" in pod \"talk\" not found"),
        "{never_restarted}"
    );

    // Upstream's errors for a missing container name and an image that never came.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two"},
            "spec": {"containers": [
                {"name": "a", "image": "busybox", "command": ["sleep", "3600"]},
                {"name": "b", "image": "krust.local/missing:1", "imagePullPolicy": "Never"}]}}),
    );
    let (code, status) = s.curl("GET", "/api/v1/namespaces/default/pods/two/log", None, None);
    assert_eq!(code, 400);
    assert_eq!(
        status["message"],
        "a container name must be specified for pod two, choose one of: [a b]"
    );

    // A pod no node can take: upstream answers a log request with 204 No Content and an
    // exec with "no host"; a wrong container name is reported first all the same.
    create(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nowhere"},
            "spec": {"nodeSelector": {"krust.test/none": "x"},
                "containers": [{"name": "c", "image": "busybox"}]}}),
    );
    let logs = "/api/v1/namespaces/default/pods/nowhere/log";
    assert_eq!(
        s.curl("GET", logs, None, None),
        (204, Value::String(String::new()))
    );
    let exec = "/api/v1/namespaces/default/pods/nowhere/exec?command=true&stdout=true";
    let (code, status) = s.curl("POST", exec, None, None);
    assert_eq!(
        (code, status["message"].as_str()),
        (400, Some("pod nowhere does not have a host assigned"))
    );
    let (code, status) = s.curl("GET", &format!("{logs}?container=x"), None, None);
    assert_eq!(
        (code, status["message"].as_str()),
        (400, Some("container x is not valid for pod nowhere"))
    );
    let waiting = wait_for("b waiting with a reason", DEADLINE, || {
        let out = s.kubectl(&["logs", "two", "-c", "b"]);
        let err = stderr(&out);
        err.contains("is waiting to start: ErrImageNeverPull")
            .then_some(err)
    });
    assert!(
        waiting.contains("container \"b\" in pod \"two\""),
        "{waiting}"
    );

    // --- exec, over WebSocket (1.32: no fallback to SPDY) and SPDY (1.27) ---
    create(&s, pod("shell", "Always", "exec sleep 3600"));
    wait_running(&s, "shell");
    let script = "echo out; echo err >&2; exit 3";
    let out = s.kubectl(&["exec", "-v=6", "shell", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(stdout(&out), "out\n");
    assert!(stderr(&out).contains("err\n"));
    assert!(
        !stderr(&out).contains("fallback"),
        "WebSocket was refused: {}",
        stderr(&out)
    );
    let old = s.kubectl_with(
        KUBECTL_127,
        &["exec", "shell", "--", "sh", "-c", script],
        None,
    );
    assert_eq!(old.status.code(), Some(3), "{}", stderr(&old));
    assert_eq!(stdout(&old), "out\n");
    // Stdin reaches the command and its end closes the command's stdin.
    for kubectl in [KUBECTL, KUBECTL_127] {
        let out = s.kubectl_with(
            kubectl,
            &[
                "exec",
                "-i",
                "shell",
                "--",
                "sh",
                "-c",
                "cat > /tmp/in; wc -c < /tmp/in",
            ],
            Some("12345"),
        );
        assert!(out.status.success(), "{kubectl}: {}", stderr(&out));
        assert_eq!(stdout(&out).trim(), "5", "{kubectl}");
    }

    // --- cp both ways, with enough data to need many frames ---
    let dir = tempfile::tempdir().unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let local = dir.path().join("payload.bin");
    std::fs::write(&local, &payload).unwrap();
    s.ok(&["cp", local.to_str().unwrap(), "shell:/tmp/payload.bin"]);
    assert_eq!(
        s.ok(&["exec", "shell", "--", "wc", "-c", "/tmp/payload.bin"])
            .split_whitespace()
            .next(),
        Some("300000")
    );
    let back = dir.path().join("back.bin");
    s.ok(&["cp", "shell:/tmp/payload.bin", back.to_str().unwrap()]);
    assert!(
        std::fs::read(&back).unwrap() == payload,
        "cp changed the bytes"
    );

    // --- attach: `kubectl run -i` feeds stdin and shows the output ---
    let run = s.kubectl_with(
        KUBECTL,
        &[
            "run",
            "att",
            "--image=busybox",
            "--restart=Never",
            "-i",
            "--rm",
            "--",
            "sh",
            "-c",
            "read l; echo got $l",
        ],
        Some("hello\n"),
    );
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stdout(&run).contains("got hello"), "{}", stdout(&run));

    // --- port-forward: WebSocket tunnel (1.32) and SPDY (1.27) ---
    create(
        &s,
        pod(
            "web",
            "Always",
            "mkdir -p /www && echo forwarded > /www/index.html && exec httpd -f -p 8080 -h /www",
        ),
    );
    wait_running(&s, "web");
    for kubectl in [KUBECTL, KUBECTL_127] {
        let mut child = Command::new(kubectl)
            .args(["port-forward", "pod/web", ":8080", "--address=127.0.0.1"])
            .env("KUBECONFIG", s.kubeconfig())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Kept open: kubectl reports each connection on stdout.
        let mut output = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        // "Forwarding from 127.0.0.1:PORT -> 8080"
        let port = line
            .split_whitespace()
            .nth(2)
            .and_then(|a| a.rsplit(':').next())
            .unwrap_or_else(|| panic!("unexpected port-forward output {line:?}"))
            .to_string();
        let body = wait_for("a page through port-forward", DEADLINE, || {
            let out = Command::new("curl")
                .args([
                    "-s",
                    "--max-time",
                    "3",
                    &format!("http://127.0.0.1:{port}/"),
                ])
                .output()
                .ok()?;
            out.status.success().then(|| stdout(&out))
        });
        let _ = child.kill();
        let _ = child.wait();
        drop(output);
        assert_eq!(body, "forwarded\n", "{kubectl}");
    }
}

#[test]
fn the_kubelet_server_answers_only_cluster_certificates() {
    let s = Server::with_agent(&["--cluster-cidr=10.67.0.0/16"]);
    let port = wait_for("the kubelet port", DEADLINE, || {
        let nodes = s.get_json(&["nodes"]);
        nodes["items"][0]["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"].as_u64()
    });
    let url = format!("https://127.0.0.1:{port}/healthz");
    let tls = s.tls();
    let with_admin = Command::new("curl")
        .args(["-sk", "--max-time", "5", &url, "--cert"])
        .arg(tls.join("admin.crt"))
        .arg("--key")
        .arg(tls.join("admin.key"))
        .output()
        .unwrap();
    assert_eq!(stdout(&with_admin), "ok");
    // The serving certificate is signed by the cluster CA, for the node's address.
    let nodes = s.get_json(&["nodes"]);
    let ip = nodes["items"][0]["status"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .unwrap()
        .to_string();
    let verified = Command::new("curl")
        .args(["-s", "--max-time", "5", "--cacert"])
        .arg(tls.join("ca.crt"))
        .arg(format!("https://{ip}:{port}/healthz"))
        .arg("--cert")
        .arg(tls.join("admin.crt"))
        .arg("--key")
        .arg(tls.join("admin.key"))
        .output()
        .unwrap();
    assert_eq!(stdout(&verified), "ok", "{}", stderr(&verified));
    let anonymous = Command::new("curl")
        .args(["-sk", "--max-time", "5", &url])
        .output()
        .unwrap();
    assert!(
        !anonymous.status.success(),
        "an anonymous caller got {}",
        stdout(&anonymous)
    );
}

/// `kubectl debug` adds an ephemeral container through `pods/ephemeralcontainers`: it
/// starts at once in the running pod, runs once (never restarted), reports its status
/// apart, never ready, and serves logs and attach; only additions are allowed.
#[test]
fn kubectl_debug_runs_an_ephemeral_container_once_in_a_running_pod() {
    let s = Server::with_agent(&["--cluster-cidr=10.74.0.0/16"]);
    create(&s, pod("web", "Always", "sleep 3600"));
    wait_running(&s, "web");

    s.ok(&[
        "debug",
        "web",
        "--image=busybox",
        "-c",
        "dbg",
        "--",
        "sh",
        "-c",
        "echo from-debug",
    ]);
    let status = wait_for("the ephemeral container to finish", DEADLINE, || {
        let pod = s.get_json(&["pod", "web"]);
        let st = pod["status"]["ephemeralContainerStatuses"][0].clone();
        st["state"]["terminated"].is_object().then_some(st)
    });
    assert_eq!(status["name"], "dbg");
    assert_eq!(status["ready"], false);
    assert_eq!(status["restartCount"], 0);
    assert_eq!(status["state"]["terminated"]["exitCode"], 0);
    assert_eq!(s.ok(&["logs", "web", "-c", "dbg"]), "from-debug\n");
    let spec = s.get_json(&["pod", "web"])["spec"]["ephemeralContainers"][0].clone();
    assert_eq!(spec["imagePullPolicy"], "Always", "defaulted: {spec}");
    assert_eq!(spec["terminationMessagePolicy"], "File");
    // The pod itself is untouched: its container kept running, and stays Ready.
    let pod = s.get_json(&["pod", "web"]);
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(pod["status"]["containerStatuses"][0]["ready"], true);

    // Interactive: kubectl attaches to the new container's stdin, the only way the
    // commands reach its shell. (Its output is read from the log: kubectl debug does
    // not set stdinOnce, so containerd detaches stdout as soon as stdin ends, before
    // the shell has answered.)
    let out = s.kubectl_with(
        KUBECTL,
        &[
            "debug",
            "-i",
            "web",
            "--image=busybox",
            "-c",
            "shell",
            "--",
            "sh",
        ],
        Some("echo via-attach\nexit 3\n"),
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let shell = wait_for("the interactive shell to exit", DEADLINE, || {
        let pod = s.get_json(&["pod", "web"]);
        pod["status"]["ephemeralContainerStatuses"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "shell" && c["state"]["terminated"].is_object())
            .cloned()
    });
    assert_eq!(shell["state"]["terminated"]["exitCode"], 3, "{shell}");
    assert_eq!(s.ok(&["logs", "web", "-c", "shell"]), "via-attach\n");

    // `--target`: the container joins the target's process namespace and sees its
    // processes (a container of its own would see only itself).
    s.ok(&[
        "debug",
        "web",
        "--image=busybox",
        "-c",
        "peek",
        "--target=c",
        "--",
        "ps",
        "-o",
        "args",
    ]);
    let seen = wait_for("the targeting container's output", DEADLINE, || {
        let pod = s.get_json(&["pod", "web"]);
        let done = pod["status"]["ephemeralContainerStatuses"]
            .as_array()?
            .iter()
            .any(|c| c["name"] == "peek" && c["state"]["terminated"].is_object());
        done.then(|| s.ok(&["logs", "web", "-c", "peek"]))
    });
    assert!(seen.contains("sleep 3600"), "{seen}");
    let err = s.fails(&[
        "debug",
        "web",
        "--image=busybox",
        "-c",
        "lost",
        "--target=nope",
        "--",
        "true",
    ]);
    assert!(
        err.contains("].targetContainerName: Not found: \"nope\""),
        "{err}"
    );

    // Removing or changing an ephemeral container, or adding one through the main
    // resource, is refused with upstream's messages.
    let mut removed = s.get_json(&["pod", "web"]);
    removed["spec"]["ephemeralContainers"] = json!([]);
    let path = "/api/v1/namespaces/default/pods/web/ephemeralcontainers";
    let (code, body) = s.curl(
        "PUT",
        path,
        Some("application/json"),
        Some(removed.to_string().as_bytes()),
    );
    assert_eq!(code, 422, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains(
            "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"dbg\" may not be removed"
        ),
        "{body}"
    );
    let patch =
        json!({"spec": {"ephemeralContainers": [{"name": "via-main", "image": "busybox"}]}});
    let err = s.fails(&["patch", "pod", "web", "-p", &patch.to_string()]);
    assert!(
        err.contains("pod updates may not change fields other than"),
        "{err}"
    );
    let forbidden = json!({"spec": {"ephemeralContainers": [
        {"name": "ports", "image": "busybox", "ports": [{"containerPort": 80}]}]}});
    let (code, body) = s.curl(
        "PATCH",
        path,
        Some("application/strategic-merge-patch+json"),
        Some(forbidden.to_string().as_bytes()),
    );
    assert_eq!(code, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("].ports: Forbidden: cannot be set for an Ephemeral Container"),
        "{body}"
    );
}
