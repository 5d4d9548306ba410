//! `krust doctor` on a real cluster: each link of the chains broken on purpose — an
//! unschedulable pod, a bad image, a crashing container, a failing readiness probe, a
//! Service selector typo, a wrong targetPort, a missing ConfigMap, a Pending claim, a
//! quota that refuses pods, an Ingress to a missing Service, a cordoned node — and the
//! doctor names the component and the evidence; a healthy workload and the cluster's own
//! parts come out ok.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::agent::{EdgeDir, join_edge};
use crate::common::{Server, free_port, wait_for};
use crate::gateway::gateway_api;
use crate::webhooks::hook_server;

const DEADLINE: Duration = Duration::from_secs(90);

fn doctor(s: &Server, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_krust"))
        .arg("doctor")
        .args(args)
        .arg("--kubeconfig")
        .arg(s.kubeconfig())
        .output()
        .expect("running krust doctor")
}

/// The report of `krust doctor -o json TARGET`, and whether the command failed.
fn report(s: &Server, args: &[&str]) -> (Value, bool) {
    let mut all = vec!["-o", "json"];
    all.extend_from_slice(args);
    let out = doctor(s, &all);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (report, !out.status.success())
}

/// Waits until the doctor's first finding for `target` is in `state`, from `owner`,
/// with `evidence` in its text (and the command fails exactly when it is broken);
/// returns that finding.
fn names(s: &Server, target: &[&str], state: &str, owner: &str, evidence: &str) -> Value {
    let start = std::time::Instant::now();
    loop {
        let (report, failed) = report(s, target);
        let first = &report["first"];
        let text = first["evidence"].as_str().unwrap_or_default();
        if first["state"] == state
            && first["owner"] == owner
            && text.contains(evidence)
            && failed == (state == "broken")
        {
            return first.clone();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{target:?}: no {state} link from {owner} saying {evidence:?}; first: {first:#}\nlast report:\n{report:#}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn apply(s: &Server, obj: Value) {
    s.ok_stdin(&["apply", "-f", "-"], &obj.to_string());
}

fn deployment(name: &str, container: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 0, "automountServiceAccountToken": false,
                    "containers": [container]}}}})
}

fn sleeper(extra: Value) -> Value {
    let mut c = json!({"name": "c", "image": "busybox", "command": ["sleep", "3600"]});
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c
}

#[test]
fn the_doctor_names_the_broken_link_of_each_chain() {
    // With the cluster DNS and the Ingress controller, which the doctor checks too.
    let ingress_port = free_port();
    let s = Server::with_agent(&[
        "--cluster-cidr=10.49.0.0/16",
        // The Service proxy too: the probes go through its rules.
        "--nftables-table=krust-test-doctor",
        &format!("--dns-port={}", free_port()),
        &format!("--ingress-http-port={ingress_port}"),
    ]);
    // Healthy: a web server behind a Service with a named port.
    let web = sleeper(
        json!({"command": ["sh", "-c", "exec httpd -f -p 8080 -h /"],
        "ports": [{"name": "http", "containerPort": 8080}]}),
    );
    apply(&s, deployment("web", web));
    // Broken, each in one link.
    apply(
        &s,
        deployment(
            "huge",
            sleeper(json!({"resources": {"requests": {"cpu": "500"}}})),
        ),
    );
    apply(
        &s,
        deployment(
            "badimg",
            sleeper(json!({"image": "nonexistent.invalid/x:1"})),
        ),
    );
    apply(
        &s,
        deployment(
            "crash",
            sleeper(json!({"command": ["sh", "-c", "echo boom; exit 3"]})),
        ),
    );
    apply(
        &s,
        deployment(
            "unready",
            sleeper(json!({"readinessProbe":
        {"exec": {"command": ["false"]}, "periodSeconds": 1}})),
        ),
    );
    for (name, selector, target) in [
        ("typo", "wbe", json!("http")),
        ("wrongport", "web", json!("htp")),
    ] {
        apply(
            &s,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": selector}, "ports": [{"port": 80, "targetPort": target}]}}),
        );
    }
    apply(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nocm"},
        "spec": {"terminationGracePeriodSeconds": 0, "automountServiceAccountToken": false,
            "containers": [sleeper(json!({"volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}))],
            "volumes": [{"name": "cfg", "configMap": {"name": "missing"}}]}}),
    );
    apply(
        &s,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "orphan"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "no-such-class",
            "resources": {"requests": {"storage": "1Mi"}}}}),
    );
    apply(
        &s,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nopvc"},
        "spec": {"terminationGracePeriodSeconds": 0, "automountServiceAccountToken": false,
            "containers": [sleeper(json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]}))],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "orphan"}}]}}),
    );
    s.ok(&["create", "namespace", "limited"]);
    s.ok(&[
        "create",
        "quota",
        "one-pod",
        "-n",
        "limited",
        "--hard=pods=1",
    ]);
    let mut capped = deployment("capped", sleeper(json!({})));
    capped["metadata"]["namespace"] = json!("limited");
    capped["spec"]["replicas"] = json!(2);
    apply(&s, capped);
    s.ok(&["create", "namespace", "strict"]);
    s.ok(&[
        "label",
        "namespace",
        "strict",
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let mut refused = deployment("refused", sleeper(json!({})));
    refused["metadata"]["namespace"] = json!("strict");
    apply(&s, refused);
    apply(
        &s,
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "shop"},
        "spec": {"rules": [{"host": "shop.example", "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": "no-such-service", "port": {"number": 80}}}}]}}]}}),
    );
    let mut picky = deployment("picky", sleeper(json!({})));
    picky["spec"]["template"]["spec"]["nodeSelector"] = json!({"disktype": "ssd"});
    apply(&s, picky);
    // Pods that run and are ready but listen nowhere: only a probe finds the refused
    // port behind their Ingress (a 502).
    apply(&s, deployment("quiet", sleeper(json!({}))));
    apply(
        &s,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "quiet"},
        "spec": {"selector": {"app": "quiet"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
    );
    for (name, service) in [("quiet", "quiet"), ("unready", "unready")] {
        apply(
            &s,
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name},
            "spec": {"rules": [{"host": format!("{name}.example"), "http": {"paths": [{"path": "/",
                "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}]}}),
        );
    }
    apply(
        &s,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "unready"},
        "spec": {"selector": {"app": "unready"}, "ports": [{"port": 80}]}}),
    );
    // Pods behind a Service in a namespace whose policy admits nothing.
    s.ok(&["create", "namespace", "fenced"]);
    let mut fenced = deployment("web", sleeper(json!({})));
    fenced["metadata"]["namespace"] = json!("fenced");
    apply(&s, fenced);
    s.ok(&["expose", "deployment", "web", "-n", "fenced", "--port=80"]);
    apply(
        &s,
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "deny-all", "namespace": "fenced"}, "spec": {"podSelector": {}}}),
    );
    // Webhooks that refuse a Deployment's pods, and one that never answers.
    let hooks = hook_server::start();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    for (namespace, url, bundle) in [
        (
            "hooked",
            format!("https://127.0.0.1:{}/validate", hooks.port),
            hooks.ca_bundle(),
        ),
        (
            "stalled",
            format!("https://{}/validate", silent.local_addr().unwrap()),
            hooks.ca_bundle(),
        ),
    ] {
        s.ok(&["create", "namespace", namespace]);
        apply(
            &s,
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": namespace},
            "webhooks": [{"name": "check.hooks.example.com", "sideEffects": "None",
                "admissionReviewVersions": ["v1"], "timeoutSeconds": 1, "failurePolicy": "Fail",
                "clientConfig": {"url": url, "caBundle": bundle},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}]}),
        );
        let mut hooked = deployment("hooked", sleeper(json!({})));
        hooked["metadata"]["namespace"] = json!(namespace);
        hooked["spec"]["template"]["metadata"]["labels"]["refuse"] = json!("yes");
        apply(&s, hooked);
    }

    // The table of the architecture, row by row.
    let first = names(
        &s,
        &["deploy/huge"],
        "broken",
        "scheduler",
        "Insufficient cpu",
    );
    assert_eq!(first["subject"], "scheduled");
    names(
        &s,
        &["deploy/picky"],
        "broken",
        "scheduler",
        "didn't match Pod's node affinity/selector",
    );
    let first = names(
        &s,
        &["deploy/badimg"],
        "broken",
        "kubelet/registry",
        "ImagePull",
    );
    assert_eq!(
        first["subject"],
        "container c: image nonexistent.invalid/x:1"
    );
    let first = names(
        &s,
        &["deploy/crash"],
        "broken",
        "application",
        "CrashLoopBackOff",
    );
    assert!(
        first["evidence"]
            .as_str()
            .unwrap()
            .contains("last exit code 3"),
        "{first}"
    );
    assert!(
        first["next"].as_str().unwrap().contains("--previous"),
        "{first}"
    );
    names(
        &s,
        &["deploy/unready"],
        "broken",
        "application",
        "Readiness probe failed",
    );
    names(
        &s,
        &["svc/typo"],
        "broken",
        "manifest",
        "app=wbe matches no pods",
    );
    names(
        &s,
        &["svc/wrongport"],
        "broken",
        "manifest",
        "\"htp\" names no container port",
    );
    names(
        &s,
        &["pod/nocm"],
        "broken",
        "storage",
        "configmap \"missing\" not found",
    );
    let first = names(&s, &["pod/nopvc"], "broken", "storage", "Pending");
    assert_eq!(first["subject"], "persistentvolumeclaim/orphan");
    names(
        &s,
        &["deploy/capped", "-n", "limited"],
        "broken",
        "quota",
        "exceeded quota",
    );
    names(
        &s,
        &["ingress/shop"],
        "broken",
        "manifest",
        "\"no-such-service\" not found",
    );
    names(
        &s,
        &["deploy/refused", "-n", "strict"],
        "broken",
        "admission",
        "violates PodSecurity",
    );
    names(
        &s,
        &["deploy/hooked", "-n", "hooked"],
        "broken",
        "admission",
        "admission webhook \"check.hooks.example.com\" denied the request: labelled refuse",
    );
    names(
        &s,
        &["deploy/hooked", "-n", "stalled"],
        "broken",
        "admission",
        "failed calling webhook \"check.hooks.example.com\"",
    );
    let first = names(
        &s,
        &["svc/web", "-n", "fenced"],
        "broken",
        "network policy",
        "deny-all isolates the pods for ingress and admits nothing",
    );
    assert!(
        first["next"]
            .as_str()
            .unwrap()
            .contains("describe networkpolicy"),
        "{first}"
    );
    // URLs, resolved as a client's request would be.
    let first = names(
        &s,
        &["http://shop.example/cart"],
        "broken",
        "manifest",
        "requests get 503",
    );
    assert_eq!(first["subject"], "shop.example/");
    names(
        &s,
        &["http://nothing.example/"],
        "broken",
        "manifest",
        "answers 404",
    );
    // An Ingress to pods that are not ready: the probe that fails is named, not the 503.
    names(
        &s,
        &["http://unready.example/"],
        "broken",
        "application",
        "Readiness probe failed",
    );
    // Ready pods that refuse the port: all is well in the API; the probes find the
    // refused connection, and the Ingress's 502 it causes.
    s.ok(&["rollout", "status", "deployment/quiet", "--timeout=60s"]);
    let quiet = format!("http://quiet.example:{ingress_port}/");
    let (calm, failed) = report(&s, &[&quiet]);
    assert!(!failed && calm["state"] == "ok", "{calm:#}");
    let first = names(
        &s,
        &["--probe", &quiet],
        "broken",
        "application",
        "connection refused: nothing listens on port 8080",
    );
    assert!(
        first["subject"]
            .as_str()
            .unwrap()
            .starts_with("probe: endpoint 10.49."),
        "{first}"
    );
    let (probed, _) = report(&s, &["--probe", &quiet]);
    let request = &probed["links"][0]["links"][2];
    assert_eq!(request["state"], "broken", "{probed:#}");
    assert!(
        request["evidence"].as_str().unwrap().starts_with("502"),
        "{probed:#}"
    );

    // Healthy: every link ok, exit 0, and the text tree names the links.
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let missing = doctor(&s, &["svc/web"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .contains("service \"web\" not found in namespace \"default\""),
        "a missing target is an error, not a report: {missing:?}"
    );
    s.ok(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=http",
    ]);
    let (svc, failed) = wait_for("svc/web ok", DEADLINE, || {
        let (r, failed) = report(&s, &["svc/web"]);
        (r["state"] == "ok").then_some((r, failed))
    });
    assert!(!failed, "{svc:#}");
    let subjects: Vec<&str> = svc["links"][0]["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, ["selector", "endpoints", "DNS name"]);
    let (url, failed) = report(&s, &["http://web.default.svc.cluster.local/"]);
    assert!(
        !failed && url["links"][0]["subject"] == "service/web",
        "{url:#}"
    );
    // Gateway API routes, as targets and as URLs on a listener's port.
    gateway_api(&s);
    let gateway_port = free_port();
    apply(
        &s,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw"},
        "spec": {"gatewayClassName": "krust",
            "listeners": [{"name": "http", "protocol": "HTTP", "port": gateway_port}]}}),
    );
    for (name, path, backend) in [
        ("gw-web", "/", "web"),
        ("gw-broken", "/broken", "no-such-service"),
    ] {
        apply(
            &s,
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["gw.example"],
                "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": path}}],
                    "backendRefs": [{"name": backend, "port": 80}]}]}}),
        );
    }
    let first = names(
        &s,
        &["httproute/gw-broken"],
        "broken",
        "manifest",
        "ResolvedRefs=False: BackendNotFound",
    );
    assert_eq!(first["subject"], "attached to gateway/gw");
    names(
        &s,
        &[&format!("http://gw.example:{gateway_port}/broken/x")],
        "broken",
        "manifest",
        "BackendNotFound",
    );
    let file = format!("http://gw.example:{gateway_port}/etc/hostname");
    let probed = wait_for("the route to web probed ok", DEADLINE, || {
        let (r, failed) = report(&s, &["--probe", &file]);
        (r["state"] == "ok" && !failed).then_some(r)
    });
    let route = &probed["links"][0];
    assert_eq!(route["subject"], "httproute/gw-web", "{probed:#}");
    let request = route["links"].as_array().unwrap().last().unwrap();
    assert_eq!(request["evidence"], "answered 200 OK", "{probed:#}");
    // A typo in a name of the cluster DNS.
    let first = names(
        &s,
        &["http://wbe.default.svc.cluster.local/"],
        "broken",
        "DNS",
        "NXDOMAIN: no Service \"wbe\" in namespace \"default\"",
    );
    assert!(
        first["evidence"]
            .as_str()
            .unwrap()
            .ends_with("did you mean web?"),
        "{first}"
    );
    // The probes along the healthy path: every ready endpoint and the cluster IP accept
    // a connection from the node, the cluster DNS answers the name with the cluster IP.
    let probed = wait_for("svc/web probed ok", DEADLINE, || {
        let (r, failed) = report(&s, &["--probe", "svc/web"]);
        (r["state"] == "ok" && !failed).then_some(r)
    });
    let probes: Vec<&str> = probed["links"][0]["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["subject"].as_str()?.strip_prefix("probe: "))
        .collect();
    assert_eq!(probes.len(), 3, "{probed:#}");
    assert!(
        probes[0].starts_with("endpoint 10.49.") && probes[0].ends_with(":8080"),
        "{probes:?}"
    );
    assert!(
        probes[1].starts_with("cluster IP 10.43.") && probes[1].ends_with(":80"),
        "{probes:?}"
    );
    assert_eq!(probes[2], "DNS web.default.svc.cluster.local");
    // The rollout's timeline: every step of the one pod happened, none before creation.
    let (timeline, failed) = report(&s, &["--timeline", "deploy/web"]);
    assert!(!failed, "{timeline:#}");
    let pods = timeline["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 1, "{timeline:#}");
    let steps = pods[0]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 5);
    assert!(
        steps.iter().all(|s| s.as_i64().is_some_and(|s| s >= 0)),
        "{timeline:#}"
    );
    assert!(timeline["slowest"][0].is_string(), "{timeline:#}");
    let table = doctor(&s, &["--timeline", "deploy/web"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.starts_with("timeline of deployment/web: 1 pods\n"),
        "{table}"
    );
    let text = doctor(&s, &["deploy/web"]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.starts_with("ok deployment/web\n"), "{text}");
    assert!(text.ends_with("Every link is ok.\n"), "{text}");

    // A cordoned node: waiting, with the command that undoes it.
    let node = s.get_json(&["nodes"])["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    s.ok(&["cordon", &node]);
    let first = names(
        &s,
        &[&format!("node/{node}")],
        "waiting",
        "node",
        "cordoned",
    );
    assert_eq!(first["next"], format!("kubectl uncordon {node}"));
    s.ok(&["uncordon", &node]);
    s.ok(&["taint", "node", &node, "dedicated=db:NoSchedule"]);
    names(
        &s,
        &[&format!("node/{node}")],
        "waiting",
        "node",
        "tainted dedicated=db:NoSchedule",
    );
    s.ok(&["taint", "node", &node, "dedicated-"]);

    // The cluster itself: apiserver, leaders, the node, DNS, Ingress — all ok.
    let (cluster, failed) = report(&s, &[]);
    assert!(!failed, "{cluster:#}");
    let subjects: Vec<&str> = cluster["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["subject"].as_str().unwrap())
        .collect();
    assert_eq!(
        subjects,
        [
            "apiserver",
            "store",
            "kube-controller-manager leader",
            "kube-scheduler leader",
            "nodes",
            "cluster DNS",
            "ingress"
        ]
    );
    let store = cluster["links"][1]["evidence"].as_str().unwrap();
    assert!(
        store.starts_with("a read answers in ")
            && store.contains(" MiB at revision ")
            && store.contains("history compacted to "),
        "{store}"
    );
    s.delete_all_pods();
}

#[test]
fn the_doctor_watches_a_rollout_and_names_a_node_under_disk_pressure_or_gone_silent() {
    // A threshold no disk can meet: the server's node is under disk pressure from the
    // start; pods run on a second node, which then goes silent.
    let s = Server::with_agent(&[
        "--cluster-cidr=10.47.0.0/16",
        "--eviction-hard=nodefs.available<99.999%",
        "--housekeeping-interval=1s",
    ]);
    let node = wait_for("the server's node", DEADLINE, || {
        let nodes = s.get_json(&["nodes"]);
        Some(nodes["items"][0]["metadata"]["name"].as_str()?.to_string())
    });
    names(
        &s,
        &[&format!("node/{node}")],
        "broken",
        "node",
        "KubeletHasDiskPressure: kubelet has disk pressure",
    );
    let edge_dir = EdgeDir::new();
    let (edge, _) = join_edge(&s, edge_dir.path());

    // --watch: a report each time the chain changes, while the rollout goes on (the
    // readiness delay keeps it waiting a few seconds), until it is ok.
    let mut watching = Command::new(env!("CARGO_BIN_EXE_krust"))
        .args([
            "doctor",
            "--watch",
            "-o",
            "json",
            "deploy/watched",
            "--kubeconfig",
        ])
        .arg(s.kubeconfig())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("krust doctor --watch");
    let stdout = watching.stdout.take().unwrap();
    let (tx, reports) = mpsc::channel();
    std::thread::spawn(move || {
        for report in serde_json::Deserializer::from_reader(stdout).into_iter::<Value>() {
            if report.is_ok_and(|r| tx.send(r).is_ok()) {
                continue;
            }
            return;
        }
    });
    apply(
        &s,
        deployment(
            "watched",
            sleeper(json!({"readinessProbe":
                {"exec": {"command": ["true"]}, "initialDelaySeconds": 3, "periodSeconds": 1}})),
        ),
    );
    let mut states = Vec::new();
    while states.last() != Some(&"ok".to_string()) {
        let report = reports
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|e| panic!("no report from --watch ({e}); states so far {states:?}"));
        states.push(report["state"].as_str().unwrap().to_string());
    }
    let _ = watching.kill();
    let _ = watching.wait();
    let mut stderr = String::new();
    watching
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.contains("deployment \"watched\" not found"),
        "a target not there yet is said, then watched for: {stderr}"
    );
    assert!(
        states.len() >= 2 && states[0] == "waiting",
        "reports while the rollout went on: {states:?}"
    );
    let on = s.get_json(&["pods", "-l", "app=watched"])["items"][0]["spec"]["nodeName"].clone();
    assert_eq!(on, "edge");

    // The second node's agent dies: its kubelet no longer reports.
    drop(edge);
    let first = names(&s, &["node/edge"], "broken", "kubelet", "the kubelet");
    assert!(
        ["Ready", "heartbeat"].contains(&first["subject"].as_str().unwrap()),
        "{first}"
    );
    let (cluster, failed) = report(&s, &[]);
    assert!(failed, "{cluster:#}");
    // The pods on the silent node cannot be ended through it: its directory's reaper
    // ends them (EdgeDir, dropped last).
}
