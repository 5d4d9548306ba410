//! Namespaces end to end, with the real kubectl against a real `krust server` and its
//! controllers: a new namespace gets its `default` ServiceAccount and the
//! `kube-root-ca.crt` ConfigMap (holding the kubeconfig's CA), both come back when
//! deleted, `kubectl delete ns` empties the namespace and finishes once it is gone, and
//! NamespaceLifecycle keeps the system namespaces through `kubectl delete ns --all`.

use std::time::Duration;

use crate::common::{Server, wait_for};
use base64::Engine;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

/// The CA bundle the kubeconfig trusts, as text.
fn kubeconfig_ca(s: &Server) -> String {
    let config: Value = serde_json::from_str(&s.ok(&["config", "view", "--raw", "-o", "json"]))
        .expect("kubeconfig JSON");
    let cluster = &config["clusters"][0]["cluster"];
    match cluster["certificate-authority-data"].as_str() {
        Some(data) => String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .expect("base64 CA"),
        )
        .expect("PEM CA"),
        None => std::fs::read_to_string(
            cluster["certificate-authority"]
                .as_str()
                .expect("a CA in the kubeconfig"),
        )
        .expect("reading the CA file"),
    }
}

/// `kubectl get -o json` of one object, `None` while it does not exist.
fn get(s: &Server, args: &[&str]) -> Option<Value> {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "json", "--ignore-not-found"]);
    let out = s.ok(&a);
    (!out.trim().is_empty()).then(|| serde_json::from_str(&out).expect("kubectl JSON"))
}

fn wait_for_root_ca(s: &Server, ns: &str) -> Value {
    wait_for("kube-root-ca.crt", DEADLINE, || {
        get(s, &["configmap", "kube-root-ca.crt", "-n", ns])
    })
}

/// A ConfigMap `held` in `ns` whose finalizer keeps it, and so the namespace, once deleted.
fn hold_namespace(s: &Server, ns: &str) {
    s.ok(&["create", "configmap", "held", "-n", ns]);
    s.ok(&[
        "patch",
        "configmap",
        "held",
        "-n",
        ns,
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
    ]);
}

#[test]
fn a_new_namespace_gets_its_service_account_and_root_ca_back_after_deletion() {
    let s = Server::start();
    s.ok(&["create", "namespace", "x"]);
    wait_for("the default serviceaccount", DEADLINE, || {
        get(&s, &["serviceaccount", "default", "-n", "x"])
    });
    let cm = wait_for_root_ca(&s, "x");
    let ca = kubeconfig_ca(&s);
    assert!(ca.contains("BEGIN CERTIFICATE"), "{ca}");
    assert_eq!(cm["data"]["ca.crt"].as_str(), Some(ca.as_str()));

    // Deleted or tampered with, both come back as they were.
    s.ok(&["delete", "serviceaccount", "default", "-n", "x"]);
    s.ok(&["delete", "configmap", "kube-root-ca.crt", "-n", "x"]);
    wait_for("the default serviceaccount again", DEADLINE, || {
        get(&s, &["serviceaccount", "default", "-n", "x"])
    });
    wait_for_root_ca(&s, "x");
    s.ok(&[
        "patch",
        "configmap",
        "kube-root-ca.crt",
        "-n",
        "x",
        "--type=merge",
        "-p",
        r#"{"data":{"ca.crt":"tampered"}}"#,
    ]);
    wait_for("the CA restored", DEADLINE, || {
        let cm = get(&s, &["configmap", "kube-root-ca.crt", "-n", "x"])?;
        (cm["data"]["ca.crt"].as_str() == Some(ca.as_str())).then_some(())
    });
    // Namespaces that existed before the controllers started have them too.
    wait_for_root_ca(&s, "default");
}

#[test]
fn deleting_a_namespace_deletes_its_content_then_the_namespace() {
    let s = Server::start();
    s.ok(&["create", "namespace", "x"]);
    s.ok(&[
        "create",
        "configmap",
        "settings",
        "-n",
        "x",
        "--from-literal=a=b",
    ]);
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "x"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}
            }
        }
    });
    s.ok_stdin(&["apply", "-f", "-"], &deployment.to_string());
    wait_for("the deployment's pods", DEADLINE, || {
        let pods = s.get_json(&["pods", "-n", "x"]);
        (pods["items"].as_array().map_or(0, Vec::len) == 2).then_some(())
    });
    wait_for_root_ca(&s, "x");

    // kubectl waits until the namespace is gone.
    s.ok(&["delete", "namespace", "x", "--timeout=60s"]);
    assert_eq!(get(&s, &["namespace", "x"]), None);
    // Its content is gone with it: cluster-wide lists hold nothing from x.
    for kind in [
        "configmaps",
        "deployments",
        "replicasets",
        "pods",
        "serviceaccounts",
    ] {
        let all = s.get_json(&[kind, "-A"]);
        let left: Vec<&Value> = all["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| o["metadata"]["namespace"] == "x")
            .collect();
        assert!(left.is_empty(), "{kind} left in x: {left:?}");
    }

    // The name can be used again, and the new namespace is set up afresh.
    s.ok(&["create", "namespace", "x"]);
    wait_for_root_ca(&s, "x");
    assert_eq!(get(&s, &["configmap", "settings", "-n", "x"]), None);
}

#[test]
fn an_object_with_a_finalizer_holds_the_namespace_in_terminating_until_released() {
    let s = Server::start();
    s.ok(&["create", "namespace", "x"]);
    hold_namespace(&s, "x");
    s.ok(&["delete", "namespace", "x", "--wait=false"]);
    let ns = wait_for("the content-remaining condition", DEADLINE, || {
        let ns = get(&s, &["namespace", "x"])?;
        let remaining = ns["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "NamespaceContentRemaining")?
            .clone();
        (remaining["status"] == "True").then_some((ns, remaining))
    });
    let (ns, remaining) = ns;
    assert_eq!(ns["status"]["phase"], "Terminating");
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
    assert_eq!(remaining["reason"], "SomeResourcesRemain");
    assert_eq!(
        remaining["message"],
        "Some resources are remaining: configmaps has 1 resource instances"
    );

    s.ok(&[
        "patch",
        "configmap",
        "held",
        "-n",
        "x",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    wait_for("the namespace gone", DEADLINE, || {
        get(&s, &["namespace", "x"]).is_none().then_some(())
    });
}

#[test]
fn deleting_every_namespace_spares_the_system_ones_and_the_cluster_keeps_working() {
    let s = Server::start();
    s.ok(&["create", "namespace", "x"]);
    hold_namespace(&s, "x");

    let out = s.kubectl(&["delete", "namespace", "--all", "--wait=false"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    for ns in ["default", "kube-system", "kube-public"] {
        let refusal =
            format!("namespaces \"{ns}\" is forbidden: this namespace may not be deleted");
        assert!(stderr.contains(&refusal), "{stderr}");
    }
    for ns in ["x", "kube-node-lease"] {
        assert!(
            stdout.contains(&format!("namespace \"{ns}\" deleted")),
            "{stdout}"
        );
    }
    for ns in ["default", "kube-system", "kube-public"] {
        let namespace = get(&s, &["namespace", ns]).expect("an immortal namespace");
        assert_eq!(namespace["status"]["phase"], "Active", "{namespace}");
    }

    // x is held in Terminating by its ConfigMap: nothing new may be created there.
    wait_for("x terminating", DEADLINE, || {
        let ns = get(&s, &["namespace", "x"])?;
        (ns["status"]["phase"] == "Terminating").then_some(())
    });
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}});
    let (code, status) = s.curl(
        "POST",
        "/api/v1/namespaces/x/configmaps",
        Some("application/json"),
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(code, 403, "{status}");
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["message"],
        "configmaps \"late\" is forbidden: unable to create new content in namespace x because it is being terminated"
    );
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "NamespaceTerminating", "message": "namespace x is being terminated",
                "field": "metadata.namespace"}])
    );
    // In a namespace that does not exist: NotFound, naming the namespace.
    let (code, status) = s.curl(
        "POST",
        "/api/v1/namespaces/nowhere/configmaps",
        Some("application/json"),
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(code, 404, "{status}");
    assert_eq!(status["message"], "namespaces \"nowhere\" not found");

    // kube-node-lease is not immortal: it is created again once gone, as upstream.
    wait_for(
        "kube-node-lease created again",
        Duration::from_secs(60),
        || {
            let ns = get(&s, &["namespace", "kube-node-lease"])?;
            (ns["status"]["phase"] == "Active").then_some(())
        },
    );
    // The kubernetes Service is created again too when someone deletes it.
    s.ok(&["delete", "service", "kubernetes", "-n", "default"]);
    let svc = wait_for("the kubernetes service again", DEADLINE, || {
        get(&s, &["service", "kubernetes", "-n", "default"])
    });
    assert_eq!(svc["spec"]["ports"][0]["port"], 443, "{svc}");

    // The controllers still work: a Deployment in default gets its pods.
    s.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx",
        "--replicas=2",
        "-n",
        "default",
    ]);
    wait_for("the deployment's pods", DEADLINE, || {
        let pods = s.get_json(&["pods", "-n", "default"]);
        (pods["items"].as_array().map_or(0, Vec::len) == 2).then_some(())
    });
}
