//! The real kubectl against a real krust server: the everyday verbs.

use crate::common::{Server, manifest};
use serde_json::json;

const DEPLOYMENT: &str = "
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        ports: [{containerPort: 80}]
        env: [{name: A, value: '1'}, {name: B, value: '2'}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 80}]
";

#[test]
fn apply_is_idempotent_and_configures_changes() {
    let s = Server::start();
    let path = manifest(&s, "web.yaml", DEPLOYMENT);
    let out = s.ok(&["apply", "-f", &path]);
    assert!(
        out.contains("deployment.apps/web created") && out.contains("service/web created"),
        "{out}"
    );
    let out = s.ok(&["apply", "-f", &path]);
    assert!(
        out.contains("deployment.apps/web unchanged") && out.contains("service/web unchanged"),
        "{out}"
    );

    let deploy = s.get_json(&["deployment", "web"]);
    assert_eq!(deploy["metadata"]["generation"], 1);
    // Upstream defaults.
    assert_eq!(
        deploy["spec"]["strategy"]["rollingUpdate"]["maxSurge"],
        "25%"
    );
    assert_eq!(deploy["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(deploy["spec"]["progressDeadlineSeconds"], 600);
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(
        deploy["spec"]["template"]["spec"]["restartPolicy"],
        "Always"
    );

    let edited = manifest(
        &s,
        "web2.yaml",
        &DEPLOYMENT
            .replace("nginx:1.27", "nginx:1.28")
            .replace("{name: B, value: '2'}", "{name: C, value: '3'}"),
    );
    let out = s.ok(&["apply", "-f", &edited]);
    assert!(
        out.contains("deployment.apps/web configured") && out.contains("service/web unchanged"),
        "{out}"
    );
    let deploy = s.get_json(&["deployment", "web"]);
    assert_eq!(
        deploy["metadata"]["generation"], 2,
        "a spec change bumps generation"
    );
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "nginx:1.28");
    assert_eq!(
        c["env"],
        json!([{"name": "A", "value": "1"}, {"name": "C", "value": "3"}]),
        "apply removed B and added C"
    );

    let svc = s.get_json(&["service", "web"]);
    let ip = svc["spec"]["clusterIP"].as_str().unwrap();
    assert!(
        ip.starts_with("10.43."),
        "ClusterIP {ip} from the service CIDR"
    );
    assert_eq!(svc["spec"]["ports"][0]["protocol"], "TCP");
}

#[test]
fn get_prints_upstream_columns() {
    let s = Server::start();
    let path = manifest(&s, "web.yaml", DEPLOYMENT);
    s.ok(&["apply", "-f", &path]);
    let out = s.ok(&["get", "deployments"]);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]);
    assert!(out.lines().nth(1).unwrap().starts_with("web"), "{out}");
    let wide = s.ok(&["get", "deploy", "-o", "wide"]);
    assert!(
        wide.lines()
            .next()
            .unwrap()
            .contains("CONTAINERS   IMAGES       SELECTOR"),
        "{wide}"
    );
    assert!(
        wide.contains("nginx:1.27") && wide.contains("app=web"),
        "{wide}"
    );
    let svc = s.ok(&["get", "svc", "-A"]);
    assert!(
        svc.lines().next().unwrap().split_whitespace().eq([
            "NAMESPACE",
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ]),
        "{svc}"
    );
    assert!(
        svc.contains("kubernetes") && svc.contains("10.43.0.1") && svc.contains("443/TCP"),
        "{svc}"
    );
    let ns = s.ok(&["get", "ns"]);
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(ns.contains(n), "{ns}");
    }
    let names = s.ok(&["get", "deploy,svc", "-o", "name"]);
    assert!(
        names.contains("deployment.apps/web") && names.contains("service/web"),
        "{names}"
    );
    let labels = s.ok(&["get", "deploy", "--show-labels"]);
    assert!(labels.contains("app=web"), "{labels}");
}

#[test]
fn create_label_annotate_patch_replace_delete() {
    let s = Server::start();
    s.ok(&["create", "namespace", "t1"]);
    s.ok(&[
        "-n",
        "t1",
        "create",
        "configmap",
        "cfg",
        "--from-literal=a=1",
    ]);
    s.ok(&["-n", "t1", "label", "configmap", "cfg", "tier=db"]);
    s.ok(&["-n", "t1", "annotate", "configmap", "cfg", "note=hello"]);
    let cm = s.get_json(&["-n", "t1", "configmap", "cfg"]);
    assert_eq!(cm["metadata"]["labels"]["tier"], "db");
    assert_eq!(cm["metadata"]["annotations"]["note"], "hello");
    assert_eq!(
        s.ok(&["-n", "t1", "get", "cm", "-l", "tier=db", "-o", "name"])
            .trim(),
        "configmap/cfg"
    );
    assert_eq!(
        // Every namespace also holds kube-root-ca.crt, which has no tier label.
        s.ok(&["-n", "t1", "get", "cm", "-l", "tier!=db", "-o", "name"])
            .trim(),
        "configmap/kube-root-ca.crt"
    );
    s.ok(&["-n", "t1", "label", "configmap", "cfg", "tier-"]);
    assert!(
        s.get_json(&["-n", "t1", "configmap", "cfg"])["metadata"]["labels"]
            .get("tier")
            .is_none()
    );

    // The four patch types.
    s.ok(&[
        "-n",
        "t1",
        "patch",
        "configmap",
        "cfg",
        "--type=merge",
        "-p",
        r#"{"data":{"b":"2"}}"#,
    ]);
    s.ok(&[
        "-n",
        "t1",
        "patch",
        "configmap",
        "cfg",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/data/a","value":"10"}]"#,
    ]);
    s.ok(&[
        "-n",
        "t1",
        "patch",
        "configmap",
        "cfg",
        "-p",
        r#"{"data":{"c":"3"}}"#,
    ]);
    // A strategic merge patch whose result does not fit the kind: upstream's converter
    // error, the patch quoted as Go prints it.
    let out = s.kubectl(&[
        "-n",
        "t1",
        "patch",
        "configmap",
        "cfg",
        "-p",
        r#"{"metadata":{"labels":"invalid"},"data":{"n":"1"}}"#,
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && said.contains(
                r#"patch: Invalid value: "map[data:map[n:1] metadata:map[labels:invalid]]": cannot restore map from string"#
            ),
        "{said}"
    );
    // kubectl patch has no apply type: send the server-side apply patch directly.
    let apply = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  d: '4'\n";
    let (code, body) = s.curl(
        "PATCH",
        "/api/v1/namespaces/t1/configmaps/cfg?fieldManager=tester",
        Some("application/apply-patch+yaml"),
        Some(apply.as_bytes()),
    );
    assert_eq!(code, 200, "{body}");
    let cm = s.get_json(&["-n", "t1", "configmap", "cfg"]);
    assert_eq!(cm["data"], json!({"a": "10", "b": "2", "c": "3", "d": "4"}));
    let failed = s.fails(&[
        "-n",
        "t1",
        "patch",
        "configmap",
        "cfg",
        "--type=json",
        "-p",
        r#"[{"op":"test","path":"/data/a","value":"nope"}]"#,
    ]);
    assert!(failed.contains("The request is invalid"), "{failed}");

    // replace with a stale resourceVersion conflicts; with the current one it works.
    let mut cm = s.get_json(&["-n", "t1", "configmap", "cfg"]);
    cm["data"] = json!({"only": "this"});
    let path = manifest(&s, "cm.json", &cm.to_string());
    s.ok(&["-n", "t1", "replace", "-f", &path]);
    let err = s.fails(&["-n", "t1", "replace", "-f", &path]);
    assert!(err.contains("the object has been modified; please apply your changes to the latest version and try again"), "{err}");
    assert_eq!(
        s.get_json(&["-n", "t1", "configmap", "cfg"])["data"],
        json!({"only": "this"})
    );

    s.ok(&["-n", "t1", "delete", "configmap", "cfg"]);
    let err = s.fails(&["-n", "t1", "get", "configmap", "cfg"]);
    assert!(err.contains(r#"configmaps "cfg" not found"#), "{err}");
}

#[test]
fn dry_run_server_writes_nothing() {
    let s = Server::start();
    let out = s.ok(&[
        "create",
        "configmap",
        "dry",
        "--from-literal=a=1",
        "--dry-run=server",
        "-o",
        "json",
    ]);
    let obj: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(obj["data"]["a"], "1");
    assert!(
        obj["metadata"]["uid"].is_string(),
        "dry-run still fills metadata"
    );
    let err = s.fails(&["get", "configmap", "dry"]);
    assert!(err.contains("not found"), "{err}");
    let path = manifest(&s, "web.yaml", DEPLOYMENT);
    s.ok(&["apply", "-f", &path, "--dry-run=server"]);
    assert!(
        s.ok(&["get", "deploy,svc", "-o", "name"])
            .trim()
            .ends_with("service/kubernetes")
    );
}

#[test]
fn server_side_apply_creates_and_updates() {
    let s = Server::start();
    let path = manifest(&s, "web.yaml", DEPLOYMENT);
    let out = s.ok(&["apply", "--server-side", "-f", &path]);
    assert!(
        out.contains("deployment.apps/web serverside-applied"),
        "{out}"
    );
    let deploy = s.get_json(&["deployment", "web", "--show-managed-fields"]);
    let applied = deploy["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["manager"] == "kubectl" && m["operation"] == "Apply")
        .expect("an Apply entry for kubectl")
        .clone();
    let fields = &applied["fieldsV1"];
    assert!(fields["f:spec"]["f:replicas"].is_object(), "{fields}");
    assert!(
        fields["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"web\"}"]["f:image"]
            .is_object(),
        "{fields}"
    );

    // Another manager takes spec.replicas: applying a different value now conflicts.
    s.ok(&[
        "patch",
        "deployment",
        "web",
        "--field-manager=autoscaler",
        "-p",
        r#"{"spec":{"replicas":4}}"#,
    ]);
    let edited = manifest(
        &s,
        "web2.yaml",
        &DEPLOYMENT.replace("replicas: 3", "replicas: 5"),
    );
    let err = s.fails(&["apply", "--server-side", "-f", &edited]);
    assert!(
        err.contains("Apply failed with 1 conflict")
            && err.contains(r#"conflict with "autoscaler""#)
            && err.contains(".spec.replicas"),
        "{err}"
    );
    assert_eq!(
        s.get_json(&["deployment", "web"])["spec"]["replicas"],
        4,
        "a refused apply writes nothing"
    );
    s.ok(&["apply", "--server-side", "--force-conflicts", "-f", &edited]);
    assert_eq!(s.get_json(&["deployment", "web"])["spec"]["replicas"], 5);

    // Fields the applier stops applying are removed.
    let fewer = manifest(
        &s,
        "web3.yaml",
        &DEPLOYMENT
            .replace("replicas: 3", "replicas: 5")
            .replace(", {name: B, value: '2'}", ""),
    );
    s.ok(&["apply", "--server-side", "-f", &fewer]);
    let env =
        &s.get_json(&["deployment", "web"])["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(env, &json!([{"name": "A", "value": "1"}]));
}

#[test]
fn diff_explain_and_api_resources() {
    let s = Server::start();
    let path = manifest(&s, "web.yaml", DEPLOYMENT);
    s.ok(&["apply", "-f", &path]);
    let same = s.kubectl(&["diff", "-f", &path]);
    assert_eq!(
        same.status.code(),
        Some(0),
        "no diff: {}",
        String::from_utf8_lossy(&same.stderr)
    );
    let edited = manifest(
        &s,
        "web2.yaml",
        &DEPLOYMENT.replace("replicas: 3", "replicas: 4"),
    );
    let diff = s.kubectl(&["diff", "-f", &edited]);
    assert_eq!(
        diff.status.code(),
        Some(1),
        "diff found: {}",
        String::from_utf8_lossy(&diff.stderr)
    );
    let text = String::from_utf8_lossy(&diff.stdout);
    assert!(
        text.contains("-  replicas: 3") && text.contains("+  replicas: 4"),
        "{text}"
    );

    let explain = s.ok(&["explain", "deployment.spec.replicas"]);
    assert!(
        explain.contains("KIND:       Deployment") && explain.contains("replicas"),
        "{explain}"
    );
    let explain = s.ok(&["explain", "pods.spec.containers"]);
    assert!(
        explain.contains("List of containers belonging to the pod"),
        "{explain}"
    );

    let resources = s.ok(&["api-resources"]);
    for line in ["deployments", "deploy", "apps/v1", "Deployment"] {
        assert!(resources.contains(line), "{resources}");
    }
    let versions = s.ok(&["api-versions"]);
    assert!(
        versions.contains("apps/v1") && versions.contains("networking.k8s.io/v1"),
        "{versions}"
    );
}

#[test]
fn older_and_newer_kubectl_work() {
    let s = Server::start();
    let path = manifest(&s, "web.yaml", DEPLOYMENT);
    for version in ["1.27", "1.33"] {
        let bin = format!("/usr/lib/google-cloud-sdk/bin/kubectl.{version}");
        let ns = format!("v{}", version.replace('.', ""));
        let run = |args: &[&str]| {
            let out = s.kubectl_with(&bin, args, None);
            assert!(
                out.status.success(),
                "kubectl {version} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        run(&["create", "ns", &ns]);
        assert!(run(&["-n", &ns, "apply", "-f", &path]).contains("created"));
        assert!(run(&["-n", &ns, "apply", "-f", &path]).contains("unchanged"));
        assert!(run(&["-n", &ns, "get", "deploy", "web"]).contains("web"));
        run(&["-n", &ns, "scale", "deploy", "web", "--replicas=2"]);
        assert!(
            run(&[
                "-n",
                &ns,
                "get",
                "deploy",
                "web",
                "-o",
                "jsonpath={.spec.replicas}"
            ]) == "2"
        );
        run(&["-n", &ns, "delete", "-f", &path]);
    }
}

#[test]
fn generators_that_send_protobuf_bodies() {
    let s = Server::start();
    s.ok(&["create", "namespace", "gen"]);
    s.ok(&[
        "-n",
        "gen",
        "create",
        "deployment",
        "web",
        "--image=nginx:1.27",
        "--replicas=2",
        "--port=80",
    ]);
    s.ok(&[
        "-n",
        "gen",
        "create",
        "secret",
        "generic",
        "creds",
        "--from-literal=password=s3cret",
    ]);
    s.ok(&[
        "-n",
        "gen",
        "create",
        "service",
        "nodeport",
        "np",
        "--tcp=80:8080",
    ]);
    s.ok(&[
        "-n",
        "gen",
        "create",
        "job",
        "once",
        "--image=busybox:1.36",
        "--",
        "true",
    ]);
    s.ok(&[
        "-n",
        "gen",
        "create",
        "cronjob",
        "tick",
        "--image=busybox:1.36",
        "--schedule=*/5 * * * *",
        "--",
        "date",
    ]);
    s.ok(&["-n", "gen", "create", "serviceaccount", "robot"]);
    s.ok(&[
        "-n",
        "gen",
        "create",
        "role",
        "reader",
        "--verb=get",
        "--resource=pods",
    ]);
    s.ok(&[
        "-n",
        "gen",
        "create",
        "rolebinding",
        "robot-reads",
        "--role=reader",
        "--serviceaccount=gen:robot",
    ]);
    s.ok(&[
        "-n",
        "gen",
        "run",
        "one",
        "--image=busybox:1.36",
        "--restart=Never",
    ]);
    s.ok(&["-n", "gen", "expose", "deployment", "web", "--port=80"]);

    let deploy = s.get_json(&["-n", "gen", "deployment", "web"]);
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(
        deploy["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
        80
    );
    let secret = s.get_json(&["-n", "gen", "secret", "creds"]);
    assert_eq!(secret["data"]["password"], "czNjcmV0", "base64 of s3cret");
    assert_eq!(secret["type"], "Opaque");
    let np = s.get_json(&["-n", "gen", "service", "np"]);
    let node_port = np["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
    assert!((30000..=32767).contains(&node_port), "{node_port}");
    let job = s.get_json(&["-n", "gen", "job", "once"]);
    let uid = job["metadata"]["uid"].as_str().unwrap();
    assert_eq!(
        job["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"],
        uid
    );
    assert_eq!(
        job["spec"]["template"]["metadata"]["labels"]["job-name"],
        "once"
    );
    let pod = s.get_json(&["-n", "gen", "pod", "one"]);
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(pod["status"]["phase"], "Pending");
    assert_eq!(pod["status"]["qosClass"], "BestEffort");
    let svc = s.get_json(&["-n", "gen", "service", "web"]);
    assert_eq!(svc["spec"]["selector"]["app"], "web");
    let rb = s.get_json(&["-n", "gen", "rolebinding", "robot-reads"]);
    assert_eq!(rb["subjects"][0]["name"], "robot");
}

#[test]
fn a_pod_gets_its_priority_from_its_priority_class() {
    let s = Server::apiserver(&[]);
    let classes = s.ok(&["get", "priorityclasses", "-o", "name"]);
    assert!(classes.contains("system-node-critical"), "{classes}");
    assert!(classes.contains("system-cluster-critical"), "{classes}");
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": "high"}, "value": 1000, "preemptionPolicy": "Never"})
        .to_string(),
    );
    let pod = |name: &str, spec_extra: serde_json::Value| {
        let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
        for (k, v) in spec_extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
            .to_string()
    };
    s.ok_stdin(
        &["create", "-f", "-"],
        &pod("hi", json!({"priorityClassName": "high"})),
    );
    let hi = s.get_json(&["pod", "hi"]);
    assert_eq!(hi["spec"]["priority"], 1000);
    assert_eq!(hi["spec"]["preemptionPolicy"], "Never");
    s.ok_stdin(&["create", "-f", "-"], &pod("plain", json!({})));
    let plain = s.get_json(&["pod", "plain"]);
    assert_eq!(plain["spec"]["priority"], 0);
    assert_eq!(plain["spec"]["preemptionPolicy"], "PreemptLowerPriority");
    s.ok_stdin(
        &["create", "-f", "-"],
        &pod(
            "critical",
            json!({"priorityClassName": "system-node-critical"}),
        ),
    );
    assert_eq!(
        s.get_json(&["pod", "critical"])["spec"]["priority"],
        2_000_001_000
    );

    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &pod("x", json!({"priorityClassName": "nope"})),
    );
    assert!(
        err.contains("pods \"x\" is forbidden: no PriorityClass with name nope was found"),
        "{err}"
    );
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &pod("y", json!({"priorityClassName": "high", "priority": 5})),
    );
    assert!(
        err.contains("the integer value of priority (5) must not be provided in pod spec; priority admission controller computed 1000 from the given PriorityClass name"),
        "{err}"
    );
    // A global default applies to pods that name no class.
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": "normal"}, "value": 10, "globalDefault": true})
        .to_string(),
    );
    s.ok_stdin(&["create", "-f", "-"], &pod("defaulted", json!({})));
    let d = s.get_json(&["pod", "defaulted"]);
    assert_eq!(
        (
            d["spec"]["priority"].as_i64(),
            d["spec"]["priorityClassName"].as_str()
        ),
        (Some(10), Some("normal"))
    );
}

/// Objects, lists and watch events come out as kube-apiserver writes them: `kind` before
/// `apiVersion`, then each struct's fields in Go's order, map keys sorted.
#[test]
fn objects_are_written_in_go_field_order() {
    let s = Server::start();
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ordered", "labels": {"zeta": "1", "alpha": "2"}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "resources": {"limits": {"memory": "1Gi", "cpu": "1"}}}]}})
        .to_string(),
    );
    let pod = s.ok(&["get", "--raw", "/api/v1/namespaces/default/pods/ordered"]);
    assert!(
        pod.starts_with(r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"ordered","namespace":"default","uid":""#),
        "{pod}"
    );
    for (before, after) in [
        (r#""metadata":"#, r#""spec":"#),
        (r#""spec":"#, r#""status":"#),
        (r#""resourceVersion":"#, r#""creationTimestamp":"#),
        (r#""alpha":"2""#, r#""zeta":"1""#),
        (r#""name":"c","image":"busybox""#, r#""resources":"#),
        (r#""cpu":"1""#, r#""memory":"1Gi""#),
    ] {
        let (b, a) = (pod.find(before), pod.find(after));
        assert!(
            b.is_some() && a.is_some() && b < a,
            "{before} before {after}: {pod}"
        );
    }
    let list = s.ok(&["get", "--raw", "/api/v1/namespaces/default/pods"]);
    assert!(
        list.starts_with(r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"#)
            && list.contains(
                r#""items":[{"kind":"Pod","apiVersion":"v1","metadata":{"name":"ordered","#
            ),
        "{list}"
    );
    let service = s.ok(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/services/kubernetes",
    ]);
    assert!(
        service.starts_with(r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"kubernetes","namespace":"default","uid":""#),
        "{service}"
    );
}
