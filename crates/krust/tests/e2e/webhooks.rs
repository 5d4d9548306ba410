//! Admission webhooks end to end with the real kubectl against a real `krust server`:
//! a mutating webhook reached through its Service's endpoint and a validating webhook
//! reached by URL, both over HTTPS with their caBundle, selected by rules and
//! namespaceSelector, with upstream's refusal and failure messages, failurePolicy,
//! dry run and DELETE reviews.

pub(crate) mod hook_server;

use crate::common;
use crate::common::{AuditLog, Server};
use crate::https::HttpsServer;
use serde_json::{Value, json};

fn configmap(ns: &str, name: &str, data: Value) -> String {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": data})
        .to_string()
}

fn rules(operations: &[&str]) -> Value {
    json!([{"operations": operations, "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}])
}

/// The webhook configurations: mutating through the Service `hooks/hook`, validating by
/// URL for namespaces labelled `webhooks: on`.
fn install(s: &Server, hooks: &HttpsServer) {
    s.ok(&["create", "namespace", "hooks"]);
    // A Service without a selector and its EndpointSlice by hand: the endpoint is the
    // test process.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hook", "namespace": "hooks"},
             "spec": {"ports": [{"name": "https", "port": 443, "targetPort": hooks.port}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "hook-1", "namespace": "hooks", "labels": {"kubernetes.io/service-name": "hook"}},
             "addressType": "IPv4",
             "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
             "ports": [{"name": "https", "port": hooks.port, "protocol": "TCP"}]}
        ]})
        .to_string(),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "label-configmaps"},
            "webhooks": [{
                "name": "label.hooks.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "clientConfig": {"service": {"namespace": "hooks", "name": "hook", "path": "/mutate"}, "caBundle": hooks.ca_bundle()},
                "rules": rules(&["CREATE"]),
                "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["hooks"]}]}
            }]
        })
        .to_string(),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "check-configmaps"},
            "webhooks": [{
                "name": "check.hooks.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1", "v1beta1"],
                "clientConfig": {"url": format!("https://127.0.0.1:{}/validate", hooks.port), "caBundle": hooks.ca_bundle()},
                "rules": rules(&["CREATE", "UPDATE", "DELETE"]),
                "namespaceSelector": {"matchLabels": {"webhooks": "on"}}
            }]
        })
        .to_string(),
    );
}

#[test]
fn webhooks_mutate_and_validate_writes_as_upstream() {
    let audit = AuditLog::new();
    let [policy_flag, log_flag] = audit.flags();
    let s = Server::start_with(&[&policy_flag, &log_flag]);
    let hooks = hook_server::start();
    install(&s, &hooks);
    s.ok(&["create", "namespace", "guarded"]);
    s.ok(&["label", "namespace", "guarded", "webhooks=on"]);
    s.ok(&["create", "namespace", "free"]);

    // Refused by the validating webhook, in upstream's words and with its code.
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &configmap("guarded", "bad", json!({"forbidden": "x"})),
    );
    assert!(
        err.contains(r#"Error from server (Forbidden): error when creating "STDIN": admission webhook "check.hooks.example.com" denied the request: forbidden key"#),
        "{err}"
    );
    // Allowed, mutated (the label) and warned about.
    let out = s.kubectl_with(
        "kubectl",
        &["create", "-f", "-"],
        Some(&configmap("guarded", "good", json!({"k": "v"}))),
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Warning: checked by hook"),
        "{out:?}"
    );
    let good = s.get_json(&["configmap", "-n", "guarded", "good"]);
    assert_eq!(good["metadata"]["labels"]["mutated-by"], "hook");
    let review = hook_server::requests(&hooks, "/mutate")
        .into_iter()
        .find(|r| r["name"] == "good")
        .expect("the mutating webhook saw the create");
    assert_eq!(review["operation"], "CREATE");
    assert_eq!(
        review["kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert_eq!(review["namespace"], "guarded");
    let me = s.ok(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(review["userInfo"]["username"], me.as_str());
    assert_eq!(review["dryRun"], false);
    // Its audit annotation is on the request's audit events, under its name; the one
    // with an invalid key is not.
    let audited = audit.completed("create", "good");
    let annotations = &audited["annotations"];
    assert_eq!(
        annotations["check.hooks.example.com/verdict"], "allowed",
        "{audited}"
    );
    assert!(
        !annotations
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.contains("not a key")),
        "{audited}"
    );
    // The validating webhook saw the mutated object.
    let validated = hook_server::requests(&hooks, "/validate")
        .into_iter()
        .find(|r| r["name"] == "good")
        .unwrap();
    assert_eq!(
        validated["object"]["metadata"]["labels"]["mutated-by"],
        "hook"
    );

    // The namespaceSelector keeps the validating webhook out of `free`.
    s.ok_stdin(
        &["create", "-f", "-"],
        &configmap("free", "anything", json!({"forbidden": "x"})),
    );
    assert_eq!(
        s.get_json(&["configmap", "-n", "free", "anything"])["metadata"]["labels"]["mutated-by"],
        "hook"
    );
    // Dry run reaches webhooks without side effects, marked as such.
    s.ok_stdin(
        &["create", "--dry-run=server", "-f", "-"],
        &configmap("guarded", "dry", json!({"k": "v"})),
    );
    assert!(
        hook_server::requests(&hooks, "/validate")
            .iter()
            .any(|r| r["name"] == "dry" && r["dryRun"] == true)
    );
    // Updates and deletes are reviewed too.
    let err = s.fails(&[
        "patch",
        "configmap",
        "-n",
        "guarded",
        "good",
        "-p",
        r#"{"data":{"forbidden":"y"}}"#,
    ]);
    assert!(err.contains("denied the request: forbidden key"), "{err}");
    s.ok_stdin(
        &["create", "-f", "-"],
        &configmap("guarded", "keep", json!({})),
    );
    let err = s.fails(&["delete", "configmap", "-n", "guarded", "keep"]);
    assert!(
        err.contains(
            r#"admission webhook "check.hooks.example.com" denied the request: keep stays"#
        ),
        "{err}"
    );
    let delete = hook_server::requests(&hooks, "/validate")
        .into_iter()
        .find(|r| r["operation"] == "DELETE")
        .unwrap();
    assert!(delete["object"].is_null());
    assert_eq!(delete["oldObject"]["metadata"]["name"], "keep");
    // A delete of the collection (DELETE on the list's path) reviews each item: the
    // refusal stops it.
    let err = s.fails_stdin(
        &[
            "delete",
            "--raw",
            "/api/v1/namespaces/guarded/configmaps",
            "-f",
            "-",
        ],
        "{}",
    );
    assert!(err.contains("denied the request: keep stays"), "{err}");
    s.ok(&["get", "configmap", "-n", "guarded", "keep"]);
}

#[test]
fn webhook_certificates_are_trusted_as_go_trusts_them() {
    let s = Server::start();
    let own = hook_server::start_self_signed();
    let other = hook_server::start();
    // One validating webhook per namespace `tls=<case>`, called at `port` with `bundle`.
    let install = |case: &str, port: u16, bundle: String| {
        s.ok(&["create", "namespace", case]);
        s.ok(&["label", "namespace", case, &format!("tls={case}")]);
        let config = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": case},
            "webhooks": [{
                "name": "check.hooks.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate"), "caBundle": bundle},
                "rules": rules(&["CREATE"]),
                "namespaceSelector": {"matchLabels": {"tls": case}}
            }]
        });
        s.ok_stdin(&["apply", "-f", "-"], &config.to_string());
    };
    // A certificate that is its own CA (CA:TRUE), named in its own caBundle: trusted.
    install("self-signed", own.port, own.ca_bundle());
    s.ok(&["create", "configmap", "fine", "-n", "self-signed"]);
    let refused = s.fails(&[
        "create",
        "configmap",
        "refused",
        "-n",
        "self-signed",
        "--from-literal=forbidden=1",
    ]);
    assert!(refused.contains("forbidden key"), "{refused}");
    // A certificate of another CA: refused, in Go's words.
    install("wrong-ca", other.port, own.ca_bundle());
    let err = s.fails(&["create", "configmap", "x", "-n", "wrong-ca"]);
    assert!(
        err.contains(
            "tls: failed to verify certificate: x509: certificate signed by unknown authority"
        ),
        "{err}"
    );
}

#[test]
fn mutating_webhooks_are_consulted_on_deletes_and_connects_as_upstream() {
    let s = Server::start();
    let hooks = hook_server::start();
    let config = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "consulted"},
        "webhooks": [{
            "name": "consulted.hooks.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{}/consult", hooks.port), "caBundle": hooks.ca_bundle()},
            "rules": [{"operations": ["DELETE", "CONNECT"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps", "pods/exec"]}]
        }]
    });
    s.ok_stdin(&["apply", "-f", "-"], &config.to_string());
    for name in ["keep", "gone"] {
        s.ok_stdin(
            &["create", "-f", "-"],
            &configmap("default", name, json!({})),
        );
    }
    let err = s.fails(&["delete", "configmap", "keep"]);
    assert!(
        err.contains(
            r#"admission webhook "consulted.hooks.example.com" denied the request: keep stays"#
        ),
        "{err}"
    );
    s.ok(&["delete", "configmap", "gone"]);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"nodeName": "ghost", "containers": [{"name": "c", "image": "busybox"}]}});
    s.ok_stdin(&["apply", "-f", "-"], &pod.to_string());
    let exec = "/api/v1/namespaces/default/pods/p/exec?command=ls&stdout=true&tty=true";
    let (code, refused) = s.curl("POST", exec, None, None);
    assert_eq!(code, 403, "{refused}");
    let seen = hook_server::requests(&hooks, "/consult");
    let operations: Vec<&Value> = seen.iter().map(|r| &r["operation"]).collect();
    assert_eq!(operations, ["DELETE", "DELETE", "CONNECT"], "{seen:?}");
    assert!(seen[0]["object"].is_null());
    assert_eq!(seen[0]["oldObject"]["metadata"]["name"], "keep");
    assert_eq!(seen[2]["kind"]["kind"], "PodExecOptions");
}

#[test]
fn connections_to_pods_are_admitted_with_their_options_as_upstream() {
    let s = Server::start();
    let hooks = hook_server::start();
    let config = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "exec"},
        "webhooks": [{
            "name": "exec.hooks.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{}/validate", hooks.port), "caBundle": hooks.ca_bundle()},
            "rules": [{"operations": ["CONNECT"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/exec"]}]
        }]
    });
    s.ok_stdin(&["apply", "-f", "-"], &config.to_string());
    // Bound to a node that does not exist: admission comes before the kubelet.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"nodeName": "ghost", "containers": [{"name": "c", "image": "busybox"}]}});
    s.ok_stdin(&["apply", "-f", "-"], &pod.to_string());
    let exec = "/api/v1/namespaces/default/pods/p/exec?command=ls&command=-l&stdout=true";
    let (code, refused) = s.curl("POST", &format!("{exec}&tty=true"), None, None);
    assert_eq!(code, 403, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no terminals here"),
        "{refused}"
    );
    // Admitted, the request goes on to the pod's node, which is not there.
    let (code, failed) = s.curl("POST", exec, None, None);
    assert_eq!(code, 500, "{failed}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap_or_default()
            .contains("ghost"),
        "{failed}"
    );
    let seen = hook_server::requests(&hooks, "/validate");
    assert_eq!(seen.len(), 2, "{seen:?}");
    let request = &seen[1];
    assert_eq!(request["operation"], "CONNECT");
    assert_eq!(
        request["kind"],
        json!({"group": "", "version": "v1", "kind": "PodExecOptions"})
    );
    assert_eq!(request["subResource"], "exec");
    assert_eq!(
        (&request["name"], &request["namespace"]),
        (&json!("p"), &json!("default"))
    );
    assert_eq!(
        request["object"],
        json!({"kind": "PodExecOptions", "apiVersion": "v1", "stdout": true, "command": ["ls", "-l"]})
    );
    assert!(
        request.get("options").is_none_or(Value::is_null),
        "{request}"
    );
}

#[test]
fn a_webhook_that_cannot_be_called_fails_closed_or_open_as_configured() {
    let s = Server::start();
    let hooks = hook_server::start();
    let closed = common::free_port();
    let config = |policy: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "unreachable"},
            "webhooks": [{
                "name": "down.hooks.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "failurePolicy": policy, "timeoutSeconds": 2,
                "clientConfig": {"url": format!("https://127.0.0.1:{closed}/validate"), "caBundle": hooks.ca_bundle()},
                "rules": rules(&["CREATE"])
            }]
        })
        .to_string()
    };
    s.ok_stdin(&["apply", "-f", "-"], &config("Fail"));
    let err = s.fails(&["create", "configmap", "blocked"]);
    assert!(
        err.contains(&format!(
            r#"Internal error occurred: failed calling webhook "down.hooks.example.com": failed to call webhook: Post "https://127.0.0.1:{closed}/validate?timeout=2s""#
        )),
        "{err}"
    );
    s.ok_stdin(&["apply", "-f", "-"], &config("Ignore"));
    s.ok(&["create", "configmap", "through"]);
    // A bad configuration is refused with upstream's messages.
    let err = s.fails_stdin(
        &["apply", "-f", "-"],
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "bad"},
            "webhooks": [{"name": "bad", "sideEffects": "Unknown", "admissionReviewVersions": ["v1"],
                          "clientConfig": {"url": "http://example.com/"}}]
        })
        .to_string(),
    );
    assert!(
        err.contains("should be a domain with at least three segments separated by dots")
            && err.contains("'https' is the only allowed URL scheme"),
        "{err}"
    );
}

#[test]
fn match_conditions_decide_which_requests_a_webhook_sees() {
    let s = Server::start();
    let hooks = hook_server::start();
    let config = |conditions: Value, policy: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "conditional"},
            "webhooks": [{
                "name": "conditional.hooks.example.com", "sideEffects": "None",
                "admissionReviewVersions": ["v1"], "failurePolicy": policy,
                "clientConfig": {"url": format!("https://127.0.0.1:{}/validate", hooks.port), "caBundle": hooks.ca_bundle()},
                "rules": rules(&["CREATE"]),
                "matchConditions": conditions
            }]
        })
        .to_string()
    };
    let labelled = json!({"name": "labelled",
        "expression": "has(object.metadata.labels) && object.metadata.labels['check'] == 'yes'"});
    let by_users = json!({"name": "not-the-system",
        "expression": "!request.userInfo.username.startsWith('system:serviceaccount:')"});
    s.ok_stdin(
        &["apply", "-f", "-"],
        &config(json!([labelled, by_users]), "Fail"),
    );
    let cm = |name: &str, labels: Value| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels}, "data": {"forbidden": "x"}})
        .to_string()
    };
    // Not labelled: the webhook is not called, the write goes through.
    s.ok_stdin(&["create", "-f", "-"], &cm("unchecked", json!({})));
    assert!(hook_server::requests(&hooks, "/validate").is_empty());
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &cm("checked", json!({"check": "yes"})),
    );
    assert!(
        err.contains(
            r#"admission webhook "conditional.hooks.example.com" denied the request: forbidden key"#
        ),
        "{err}"
    );
    // A condition that cannot be evaluated fails the call: closed, or open.
    let broken = json!([{"name": "broken", "expression": "object.spec.replicas > 1"}]);
    s.ok_stdin(&["apply", "-f", "-"], &config(broken.clone(), "Fail"));
    let err = s.fails_stdin(&["create", "-f", "-"], &cm("closed", json!({})));
    assert!(
        err.contains(r#"failed calling webhook "conditional.hooks.example.com": failed evaluating match conditions, failing closed: matchCondition 'broken' failed"#),
        "{err}"
    );
    s.ok_stdin(&["apply", "-f", "-"], &config(broken, "Ignore"));
    s.ok_stdin(&["create", "-f", "-"], &cm("open", json!({})));
    // Conditions that do not compile are refused with the configuration.
    let err = s.fails_stdin(
        &["apply", "-f", "-"],
        &config(json!([{"name": "bad", "expression": "object.x >"}]), "Fail"),
    );
    assert!(
        err.contains("webhooks[0].matchConditions[0].expression: Invalid value: \"object.x >\": compilation failed"),
        "{err}"
    );
}

#[test]
fn reinvoked_webhooks_see_later_changes_and_are_matched_again() {
    let s = Server::start();
    let hooks = hook_server::start();
    let hook = |name: &str| {
        json!({
            "name": format!("{name}.hooks.example.com"), "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{}/{name}", hooks.port), "caBundle": hooks.ca_bundle()},
            "rules": rules(&["CREATE"]),
        })
    };
    let mut first = hook("first");
    first["reinvocationPolicy"] = json!("IfNeeded");
    first["matchConditions"] = json!([{"name": "not-skipped",
        "expression": "!('skip-first' in object.metadata.labels)"}]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "reinvoke"},
            "webhooks": [first, hook("second")]
        })
        .to_string(),
    );
    let cm = |name: &str, labels: Value| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
        .to_string()
    };
    let calls = |name: &str| {
        hook_server::requests(&hooks, "/first")
            .iter()
            .filter(|r| r["name"] == name)
            .count()
    };
    // The second webhook changed the object after the first: the first is called again
    // and sees the change.
    s.ok_stdin(&["create", "-f", "-"], &cm("again", json!({"app": "x"})));
    let again = s.get_json(&["configmap", "again"]);
    assert_eq!(again["data"]["first"], "after second", "{again}");
    assert_eq!(calls("again"), 2);
    // Here the second webhook's change makes the first's match condition false: it is
    // not called again.
    s.ok_stdin(
        &["create", "-f", "-"],
        &cm("skipped", json!({"ask-skip": "yes"})),
    );
    let skipped = s.get_json(&["configmap", "skipped"]);
    assert_eq!(skipped["metadata"]["labels"]["skip-first"], "yes");
    assert_eq!(skipped["data"]["first"], "alone", "{skipped}");
    assert_eq!(calls("skipped"), 1);
}

#[test]
fn what_webhooks_add_is_decoded_as_a_request_body() {
    let s = Server::start();
    let hooks = hook_server::start();
    s.ok_stdin(
        &["apply", "-f", "-"],
        &json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gadgets.hooks.example.com"},
            "spec": {"group": "hooks.example.com", "scope": "Namespaced",
                "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]}
        })
        .to_string(),
    );
    s.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/gadgets.hooks.example.com",
    ]);
    let mut stray = mutating(&hooks, "stray", json!(["CREATE"]), "", "configmaps");
    stray["webhooks"][0]["rules"] = json!([
        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]},
        {"operations": ["CREATE"], "apiGroups": ["hooks.example.com"], "apiVersions": ["v1"], "resources": ["gadgets"]}
    ]);
    s.ok_stdin(&["apply", "-f", "-"], &stray.to_string());
    // Fields the kind does not have are dropped (a custom kind's pruned by its schema);
    // the others stay.
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "hooks.example.com/v1", "kind": "Gadget",
                "metadata": {"name": "g"}, "spec": {"size": 1}})
        .to_string(),
    );
    let gadget = s.get_json(&["gadget", "g"]);
    assert_eq!(gadget["spec"], json!({"size": 3}), "{gadget}");
    s.ok_stdin(
        &["create", "-f", "-"],
        &configmap("default", "c", json!({"k": "v"})),
    );
    let cm = s.get_json(&["configmap", "c"]);
    assert_eq!(cm["data"], json!({"k": "v", "added": "3"}), "{cm}");
    assert!(cm.get("stray").is_none(), "{cm}");
}

#[test]
fn an_equivalent_match_calls_a_webhook_in_the_version_it_names() {
    let s = Server::start();
    let hooks = hook_server::start();
    // Both name autoscaling/v2 HPAs only; the mutating one leaves matchPolicy to its
    // default (Equivalent), the validating one asks for Exact.
    let hook = |kind: &str, name: &str, path: &str, policy: Option<&str>| {
        let mut webhook = json!({
            "name": name, "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{}{path}", hooks.port), "caBundle": hooks.ca_bundle()},
            "rules": [{"operations": ["CREATE"], "apiGroups": ["autoscaling"], "apiVersions": ["v2"],
                       "resources": ["horizontalpodautoscalers"]}]
        });
        if let Some(policy) = policy {
            webhook["matchPolicy"] = json!(policy);
        }
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
               "metadata": {"name": name}, "webhooks": [webhook]})
        .to_string()
    };
    s.ok_stdin(
        &["apply", "-f", "-"],
        &hook(
            "MutatingWebhookConfiguration",
            "label.hooks.example.com",
            "/mutate",
            None,
        ),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &hook(
            "ValidatingWebhookConfiguration",
            "exact.hooks.example.com",
            "/validate",
            Some("Exact"),
        ),
    );
    let hpa = |version: &str, name: &str| {
        let spec = if version == "v1" {
            json!({"maxReplicas": 3, "targetCPUUtilizationPercentage": 50,
                   "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}})
        } else {
            json!({"maxReplicas": 3,
                   "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}})
        };
        json!({"apiVersion": format!("autoscaling/{version}"), "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": name}, "spec": spec})
        .to_string()
    };
    // Sent as v1: the mutating webhook is called in v2, the one it names, and its
    // label is kept; the Exact one is not called.
    s.ok_stdin(&["create", "-f", "-"], &hpa("v1", "old"));
    let review = hook_server::requests(&hooks, "/mutate")
        .into_iter()
        .find(|r| r["name"] == "old")
        .expect("the mutating webhook saw the v1 create");
    let v2 = json!({"group": "autoscaling", "version": "v2", "kind": "HorizontalPodAutoscaler"});
    let v1 = json!({"group": "autoscaling", "version": "v1", "kind": "HorizontalPodAutoscaler"});
    assert_eq!(review["kind"], v2);
    assert_eq!(review["requestKind"], v1);
    assert_eq!(review["resource"]["version"], "v2");
    assert_eq!(review["requestResource"]["version"], "v1");
    assert_eq!(review["object"]["apiVersion"], "autoscaling/v2");
    assert_eq!(
        review["object"]["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 50,
        "the object converted to v2: {review}"
    );
    let old = s.get_json(&["horizontalpodautoscalers.v1.autoscaling", "old"]);
    assert_eq!(old["metadata"]["labels"]["mutated-by"], "hook", "{old}");
    assert_eq!(old["spec"]["targetCPUUtilizationPercentage"], 50, "{old}");
    assert!(
        !hook_server::requests(&hooks, "/validate")
            .iter()
            .any(|r| r["name"] == "old"),
        "matchPolicy Exact: not called for v1"
    );
    // Sent as v2: both are called, in the request's own version.
    s.ok_stdin(&["create", "-f", "-"], &hpa("v2", "new"));
    let exact = hook_server::requests(&hooks, "/validate")
        .into_iter()
        .find(|r| r["name"] == "new")
        .expect("the Exact webhook saw the v2 create");
    assert_eq!((&exact["kind"], &exact["requestKind"]), (&v2, &v2));
}

/// A MutatingWebhookConfiguration `name` of one webhook, `<name>.hooks.example.com`,
/// served on the hook server's `/<name>` for `operations` on v1 `resource` of `group`.
fn mutating(
    hooks: &HttpsServer,
    name: &str,
    operations: Value,
    group: &str,
    resource: &str,
) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": format!("{name}.hooks.example.com"), "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{}/{name}", hooks.port), "caBundle": hooks.ca_bundle()},
            "rules": [{"operations": operations, "apiGroups": [group], "apiVersions": ["v1"], "resources": [resource]}]
        }]
    })
}

#[test]
fn validating_plugins_judge_the_pod_that_mutating_webhooks_made() {
    let s = Server::start();
    let hooks = hook_server::start();
    s.ok(&["create", "namespace", "secured"]);
    s.ok(&[
        "label",
        "namespace",
        "secured",
        "pod-security.kubernetes.io/enforce=baseline",
    ]);
    let mut unhost = mutating(&hooks, "unhost", json!(["CREATE"]), "", "pods");
    unhost["webhooks"][0]["objectSelector"] =
        json!({"matchExpressions": [{"key": "keep-host", "operator": "DoesNotExist"}]});
    s.ok_stdin(&["apply", "-f", "-"], &unhost.to_string());
    let pod = |name: &str, labels: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "secured", "labels": labels},
               "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "busybox"}]}})
        .to_string()
    };
    // Mutating admission comes first, as upstream orders it: PodSecurity judges the pod
    // the webhook made, which no longer asks for the host's network.
    s.ok_stdin(&["create", "-f", "-"], &pod("fixed", json!({})));
    let fixed = s.get_json(&["pod", "-n", "secured", "fixed"]);
    assert_ne!(fixed["spec"]["hostNetwork"], true, "{fixed}");
    // A pod the webhook leaves alone is refused.
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &pod("loud", json!({"keep-host": "yes"})),
    );
    assert!(
        err.contains(
            r#"violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)"#
        ),
        "{err}"
    );
    // LimitRanger defaults before the webhooks and checks its bounds after them: a
    // webhook cannot raise a limit past the LimitRange's maximum.
    s.ok_stdin(
        &["create", "-n", "secured", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "limits"},
                "spec": {"limits": [{"type": "Container", "max": {"memory": "1Gi"}}]}})
        .to_string(),
    );
    let mut grow = mutating(&hooks, "grow", json!(["CREATE"]), "", "pods");
    grow["webhooks"][0]["objectSelector"] = json!({"matchLabels": {"grow": "yes"}});
    s.ok_stdin(&["apply", "-f", "-"], &grow.to_string());
    let small = |name: &str, labels: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "secured", "labels": labels},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        .to_string()
    };
    s.ok_stdin(&["create", "-f", "-"], &small("defaulted", json!({})));
    let defaulted = s.get_json(&["pod", "-n", "secured", "defaulted"]);
    assert_eq!(
        defaulted["spec"]["containers"][0]["resources"]["limits"]["memory"], "1Gi",
        "{defaulted}"
    );
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &small("grown", json!({"grow": "yes"})),
    );
    assert!(
        err.contains(
            r#"pods "grown" is forbidden: maximum memory usage per Container is 1Gi, but limit is 2Gi"#
        ),
        "{err}"
    );
}

#[test]
fn webhooks_change_what_clients_may_change_and_their_spec_changes_bump_the_generation() {
    let s = Server::apiserver(&[]);
    let hooks = hook_server::start();
    s.ok(&["create", "deployment", "old", "--image=busybox"]);
    let meddle = mutating(
        &hooks,
        "meddle",
        json!(["CREATE", "UPDATE"]),
        "apps",
        "deployments",
    );
    s.ok_stdin(&["apply", "-f", "-"], &meddle.to_string());
    // The store's fields are the store's: the webhook's uid does not stick.
    s.ok(&["create", "deployment", "web", "--image=busybox"]);
    let created = s.get_json(&["deployment", "web"]);
    assert_ne!(created["metadata"]["uid"], "meddled", "{created}");
    assert_eq!(created["spec"]["minReadySeconds"], 7);
    assert_eq!(created["metadata"]["generation"], 1);
    // The client changes metadata only; the webhook changes the spec: a new generation.
    let before = s.get_json(&["deployment", "old"]);
    s.ok(&["annotate", "deployment", "old", "touched=yes"]);
    let after = s.get_json(&["deployment", "old"]);
    assert_eq!(after["spec"]["minReadySeconds"], 7);
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(
        after["metadata"]["generation"].as_i64(),
        before["metadata"]["generation"].as_i64().map(|g| g + 1),
        "{after}"
    );
}
