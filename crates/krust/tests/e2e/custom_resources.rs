//! CustomResourceDefinitions end to end with the real kubectl against a real `krust
//! server`: a definition becomes a served kind (discovery, OpenAPI, every verb), objects
//! are pruned, defaulted and validated by its schema with upstream's messages, the
//! status and scale subresources work, several versions convert, and deleting the
//! definition deletes its objects first. Custom kinds take part in garbage collection
//! and namespace deletion as they appear.

use std::time::Duration;

use crate::common::{Server, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

/// Upstream's CronTab example, with a second (older) version, status and scale.
fn crontab_definition() -> String {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "crontabs.stable.example.com"},
        "spec": {
            "group": "stable.example.com",
            "scope": "Namespaced",
            "names": {"plural": "crontabs", "singular": "crontab", "kind": "CronTab", "shortNames": ["ct"], "categories": ["all"]},
            "versions": [
                {
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "required": ["cronSpec"], "properties": {
                                "cronSpec": {"type": "string", "pattern": "^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$"},
                                "image": {"type": "string", "default": "busybox"},
                                "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                                "settings": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                "ports": {"type": "array", "x-kubernetes-list-type": "map",
                                    "x-kubernetes-list-map-keys": ["name"],
                                    "items": {"type": "object", "properties": {
                                        "name": {"type": "string"}, "port": {"type": "integer"}}}}
                            }},
                            "status": {"type": "object", "properties": {
                                "replicas": {"type": "integer"},
                                "selector": {"type": "string"}
                            }}
                        }
                    }},
                    "subresources": {
                        "status": {},
                        "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}
                    },
                    "additionalPrinterColumns": [
                        {"name": "Spec", "type": "string", "jsonPath": ".spec.cronSpec"},
                        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}
                    ]
                },
                {
                    "name": "v1beta1", "served": true, "storage": false,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
                }
            ]
        }
    })
    .to_string()
}

fn crontab(name: &str, spec: Value) -> String {
    json!({
        "apiVersion": "stable.example.com/v1", "kind": "CronTab",
        "metadata": {"name": name},
        "spec": spec,
    })
    .to_string()
}

/// Installs the CronTab definition and waits until kubectl can use it.
fn install(s: &Server) {
    s.ok_stdin(&["apply", "-f", "-"], &crontab_definition());
    s.ok(&[
        "wait",
        "--for=condition=established",
        "crd/crontabs.stable.example.com",
        "--timeout=20s",
    ]);
}

#[test]
fn a_definition_serves_its_kind_with_schema_defaults_validation_and_columns() {
    let s = Server::start();
    install(&s);
    let crd = s.get_json(&["crd", "crontabs.stable.example.com"]);
    let conditions = crd["status"]["conditions"].as_array().unwrap();
    let find = |ty: &str| conditions.iter().find(|c| c["type"] == ty).unwrap();
    assert_eq!(find("NamesAccepted")["reason"], "NoConflicts");
    assert_eq!(find("Established")["reason"], "InitialNamesAccepted");
    assert_eq!(crd["status"]["acceptedNames"]["kind"], "CronTab");
    assert_eq!(crd["status"]["storedVersions"], json!(["v1"]));

    // Discovery: the short name and the category reach kubectl.
    let resources = s.ok(&["api-resources", "--api-group=stable.example.com"]);
    assert!(
        resources.contains("crontabs") && resources.contains("ct"),
        "{resources}"
    );
    // Unknown fields are pruned (with kubectl's Warn they are warnings), defaults filled.
    let out = s.kubectl_with(
        "kubectl",
        &["create", "--validate=warn", "-f", "-"],
        Some(&crontab(
            "nightly",
            json!({"cronSpec": "0 3 * * *", "bogus": true, "settings": {"free": {"form": 1}}}),
        )),
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(r#"unknown field "spec.bogus""#),
        "{out:?}"
    );
    let obj = s.get_json(&["ct", "nightly"]);
    assert_eq!(obj["spec"]["image"], "busybox");
    assert_eq!(obj["spec"]["replicas"], 1);
    assert_eq!(obj["spec"]["settings"]["free"]["form"], 1);
    assert!(obj["spec"].get("bogus").is_none());
    assert_eq!(obj["metadata"]["generation"], 1);

    // Strict validation (kubectl's default) refuses unknown fields as upstream.
    let err = s.fails_stdin(
        &["apply", "-f", "-"],
        &crontab("strict", json!({"cronSpec": "* * * * *", "bogus": 1})),
    );
    assert!(
        err.contains(r#"CronTab in version "v1" cannot be handled as a CronTab: strict decoding error: unknown field "spec.bogus""#),
        "{err}"
    );
    // Schema violations, in upstream's words.
    let err = s.fails_stdin(
        &["apply", "-f", "-"],
        &crontab("bad", json!({"cronSpec": "often", "replicas": "many"})),
    );
    assert!(
        err.contains(r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#)
            && err.contains(r#"spec.cronSpec: Invalid value: "often": spec.cronSpec in body should match"#),
        "{err}"
    );
    let err = s.fails_stdin(
        &["apply", "-f", "-"],
        &crontab("bad", json!({"replicas": 11})),
    );
    assert!(
        err.contains("spec.cronSpec: Required value")
            && err.contains("spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10"),
        "{err}"
    );
    assert!(
        s.kubectl(&["get", "ct", "bad"])
            .stderr
            .starts_with(b"Error from server (NotFound)")
    );

    // Printer columns, short name and category.
    let table = s.ok(&["get", "ct"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    // Columns named by the definition replace the default AGE, as upstream.
    assert_eq!(header, ["NAME", "SPEC", "REPLICAS"]);
    assert!(table.contains("0 3 * * *"), "{table}");
    assert!(
        s.ok(&["get", "all"])
            .contains("crontab.stable.example.com/nightly")
    );

    // kubectl explain reads the schema from OpenAPI v3.
    let explain = s.ok(&["explain", "crontab.spec"]);
    assert!(
        explain.contains("cronSpec") && explain.contains("replicas"),
        "{explain}"
    );

    // apply again with a change: merge patch (no strategic merge for custom kinds).
    s.ok_stdin(
        &["apply", "-f", "-"],
        &crontab("nightly", json!({"cronSpec": "0 4 * * *"})),
    );
    let obj = s.get_json(&["ct", "nightly"]);
    assert_eq!(obj["spec"]["cronSpec"], "0 4 * * *");
    assert_eq!(obj["metadata"]["generation"], 2);
    let err = s.fails(&["patch", "ct", "nightly", "-p", r#"{"spec":{"image":"x"}}"#]);
    assert!(
        err.contains("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"),
        "{err}"
    );
}

#[test]
fn status_scale_and_versions_behave_as_upstream() {
    let s = Server::start();
    install(&s);
    s.ok_stdin(
        &["create", "-f", "-"],
        &crontab("web", json!({"cronSpec": "* * * * *"})),
    );
    // The main endpoint ignores status; the status subresource writes only status, and
    // neither bumps the generation.
    s.ok(&[
        "patch",
        "ct",
        "web",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":5}}"#,
    ]);
    assert!(s.get_json(&["ct", "web"])["status"].is_null());
    s.ok(&[
        "patch",
        "ct",
        "web",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":2,"selector":"app=web"},"spec":{"replicas":9}}"#,
    ]);
    let obj = s.get_json(&["ct", "web"]);
    assert_eq!(obj["status"]["replicas"], 2);
    assert_eq!(obj["spec"]["replicas"], 1);
    assert_eq!(obj["metadata"]["generation"], 1);

    // Scale reads and writes the paths the definition names.
    s.ok(&["scale", "ct", "web", "--replicas=4"]);
    let (code, scale) = s.curl(
        "GET",
        "/apis/stable.example.com/v1/namespaces/default/crontabs/web/scale",
        None,
        None,
    );
    assert_eq!(code, 200, "{scale}");
    assert_eq!(scale["spec"]["replicas"], 4);
    assert_eq!(scale["status"]["replicas"], 2);
    assert_eq!(scale["status"]["selector"], "app=web");
    let obj = s.get_json(&["ct", "web"]);
    assert_eq!(obj["spec"]["replicas"], 4);
    assert_eq!(obj["metadata"]["generation"], 2);

    // One object, two versions: each read says the version it was asked for.
    let beta = s.get_json(&["crontabs.v1beta1.stable.example.com", "web"]);
    assert_eq!(beta["apiVersion"], "stable.example.com/v1beta1");
    assert_eq!(beta["spec"]["replicas"], 4);
    s.ok(&[
        "label",
        "crontabs.v1beta1.stable.example.com",
        "web",
        "tier=front",
    ]);
    let v1 = s.get_json(&["crontabs.v1.stable.example.com", "web"]);
    assert_eq!(v1["apiVersion"], "stable.example.com/v1");
    assert_eq!(v1["metadata"]["labels"]["tier"], "front");

    // Server-side apply: fields owned per manager, a conflict named as upstream names it.
    s.ok_stdin(
        &["apply", "--server-side", "--field-manager=ops", "-f", "-"],
        &crontab("applied", json!({"cronSpec": "* * * * *", "image": "a"})),
    );
    let err = s.fails_stdin(
        &["apply", "--server-side", "--field-manager=other", "-f", "-"],
        &crontab("applied", json!({"cronSpec": "* * * * *", "image": "b"})),
    );
    assert!(
        err.contains("conflict with \"ops\"") && err.contains(".spec.image"),
        "{err}"
    );
    let applied = s.get_json(&["ct", "applied"]);
    assert_eq!(applied["spec"]["image"], "a");
    assert_eq!(applied["spec"]["replicas"], 1);
    // The schema's list types merge as upstream's: a keyed list item by item, each
    // manager owning its own.
    let with_port = |manager: &str, name: &str, port: i64| {
        s.ok_stdin(
            &[
                "apply",
                "--server-side",
                &format!("--field-manager={manager}"),
                "-f",
                "-",
            ],
            &crontab(
                "applied",
                json!({"cronSpec": "* * * * *", "ports": [{"name": name, "port": port}]}),
            ),
        );
    };
    with_port("ops", "http", 80);
    with_port("edge", "https", 443);
    let applied = s.get_json(&["ct", "applied"]);
    assert_eq!(
        applied["spec"]["ports"],
        json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}])
    );
    with_port("edge", "admin", 8080);
    let ports = s.get_json(&["ct", "applied"])["spec"]["ports"].clone();
    assert_eq!(
        ports,
        json!([{"name": "http", "port": 80}, {"name": "admin", "port": 8080}])
    );

    // Everything survives a restart.
    let mut s = s;
    s.restart();
    let obj = s.get_json(&["ct", "web"]);
    assert_eq!(obj["spec"]["replicas"], 4);
    s.ok_stdin(
        &["create", "-f", "-"],
        &crontab("after-restart", json!({"cronSpec": "* * * * *"})),
    );
}

#[test]
fn deleting_a_definition_deletes_its_objects_first() {
    let s = Server::start();
    install(&s);
    for name in ["a", "b"] {
        s.ok_stdin(
            &["create", "-f", "-"],
            &crontab(name, json!({"cronSpec": "* * * * *"})),
        );
    }
    // An object with a finalizer of its own holds the definition in Terminating.
    s.ok(&[
        "patch",
        "ct",
        "a",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
    ]);
    s.ok(&[
        "delete",
        "crd",
        "crontabs.stable.example.com",
        "--wait=false",
    ]);
    let terminating = wait_for("the definition to be cleaning up", DEADLINE, || {
        let crd = s.get_json(&["crd", "crontabs.stable.example.com"]);
        let c = crd["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Terminating")?
            .clone();
        (c["reason"] == "InstanceDeletionInProgress"
            && s.kubectl(&["get", "ct", "b"]).status.code() == Some(1))
        .then_some(crd)
    });
    assert!(
        terminating["metadata"]["finalizers"]
            .as_array()
            .unwrap()
            .contains(&json!("customresourcecleanup.apiextensions.k8s.io"))
    );
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &crontab("c", json!({"cronSpec": "* * * * *"})),
    );
    assert!(
        err.contains("create not allowed while custom resource definition is terminating"),
        "{err}"
    );
    s.ok(&[
        "patch",
        "ct",
        "a",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    wait_for("the definition to go", DEADLINE, || {
        (s.kubectl(&["get", "crd", "crontabs.stable.example.com"])
            .status
            .code()
            == Some(1))
        .then_some(())
    });
    let (code, _) = s.curl(
        "GET",
        "/apis/stable.example.com/v1/namespaces/default/crontabs",
        None,
        None,
    );
    assert_eq!(code, 404);
    // Installed again, the kind starts empty.
    install(&s);
    assert!(s.ok(&["get", "ct", "-o", "name"]).trim().is_empty());
}

#[test]
fn names_in_use_are_refused_and_the_definition_itself_is_validated() {
    let s = Server::start();
    install(&s);
    let mut other: Value = serde_json::from_str(&crontab_definition()).unwrap();
    other["metadata"]["name"] = json!("crontab2s.stable.example.com");
    other["spec"]["names"] = json!({"plural": "crontab2s", "kind": "CronTab"});
    s.ok_stdin(&["create", "-f", "-"], &other.to_string());
    let crd = wait_for("the naming verdict", DEADLINE, || {
        let crd = s.get_json(&["crd", "crontab2s.stable.example.com"]);
        crd["status"]["conditions"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
            .then_some(crd)
    });
    let conditions = crd["status"]["conditions"].as_array().unwrap();
    let names = conditions
        .iter()
        .find(|c| c["type"] == "NamesAccepted")
        .unwrap();
    assert_eq!(names["status"], "False");
    // Kind and list kind are both taken; upstream reports the last it checks.
    assert_eq!(names["reason"], "ListKindConflict");
    assert_eq!(names["message"], r#""CronTabList" is already in use"#);
    let established = conditions
        .iter()
        .find(|c| c["type"] == "Established")
        .unwrap();
    assert_eq!(established["status"], "False");

    let mut bad: Value = serde_json::from_str(&crontab_definition()).unwrap();
    bad["metadata"]["name"] = json!("crontabs.example");
    bad["spec"]["versions"][1]["storage"] = json!(true);
    let err = s.fails_stdin(&["create", "-f", "-"], &bad.to_string());
    assert!(
        err.contains(r#"metadata.name: Invalid value: "crontabs.example": must be spec.names.plural+"."+spec.group"#)
            && err.contains("must have exactly one version marked as storage version"),
        "{err}"
    );
}

#[test]
fn custom_objects_take_part_in_garbage_collection_and_namespace_deletion() {
    let s = Server::start();
    install(&s);
    s.ok(&["create", "namespace", "team"]);
    let created: Value = serde_json::from_str(&s.ok_stdin(
        &["create", "-n", "team", "-o", "json", "-f", "-"],
        &crontab("owner", json!({"cronSpec": "* * * * *"})),
    ))
    .unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap();
    // A ConfigMap owned by a CronTab goes with it...
    s.ok_stdin(
        &["create", "-n", "team", "-f", "-"],
        &json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "owned", "ownerReferences": [{
                "apiVersion": "stable.example.com/v1", "kind": "CronTab", "name": "owner", "uid": uid
            }]}
        })
        .to_string(),
    );
    // ...and a CronTab owned by a ConfigMap goes with the ConfigMap.
    let cm: Value =
        serde_json::from_str(&s.ok(&["create", "configmap", "-n", "team", "parent", "-o", "json"]))
            .unwrap();
    s.ok_stdin(
        &["create", "-n", "team", "-f", "-"],
        &json!({
            "apiVersion": "stable.example.com/v1", "kind": "CronTab",
            "metadata": {"name": "child", "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": cm["metadata"]["uid"]
            }]},
            "spec": {"cronSpec": "* * * * *"}
        })
        .to_string(),
    );
    s.ok(&["delete", "-n", "team", "ct", "owner"]);
    s.ok(&["delete", "-n", "team", "configmap", "parent"]);
    wait_for("dependents collected", DEADLINE, || {
        let left = s.ok(&[
            "get",
            "-n",
            "team",
            "configmap/owned",
            "ct/child",
            "--ignore-not-found",
            "-o",
            "name",
        ]);
        left.trim().is_empty().then_some(())
    });
    // Deleting the namespace deletes the custom objects in it.
    s.ok_stdin(
        &["create", "-n", "team", "-f", "-"],
        &crontab("last", json!({"cronSpec": "* * * * *"})),
    );
    s.ok(&["delete", "namespace", "team", "--timeout=30s"]);
    let (code, body) = s.curl(
        "GET",
        "/apis/stable.example.com/v1/namespaces/team/crontabs",
        None,
        None,
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["items"], json!([]));
}

/// A definition whose schema carries CEL rules: a plain one with a message, a
/// transition rule with a message expression and a reason, one on list entries by key.
fn guarded_definition(rule: &str) -> String {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "guards.stable.example.com"},
        "spec": {
            "group": "stable.example.com", "scope": "Namespaced",
            "names": {"plural": "guards", "singular": "guard", "kind": "Guard"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                    "type": "object",
                    "x-kubernetes-validations": [
                        {"rule": rule, "message": "replicas must not exceed maxReplicas"},
                        {"rule": "self.replicas >= oldSelf.replicas", "reason": "FieldValueForbidden",
                         "messageExpression": "'may not scale below ' + string(oldSelf.replicas)"}
                    ],
                    "properties": {
                        "replicas": {"type": "integer"},
                        "maxReplicas": {"type": "integer"},
                        "ports": {"type": "array", "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "required": ["name"], "properties": {
                                "name": {"type": "string"}, "port": {"type": "integer"}},
                                "x-kubernetes-validations": [{"rule": "self.port == oldSelf.port",
                                    "message": "port is immutable", "fieldPath": ".port"}]}}
                    }
                }}}}}]
        }
    })
    .to_string()
}

fn guard(replicas: i64, max: i64, port: i64) -> String {
    json!({"apiVersion": "stable.example.com/v1", "kind": "Guard", "metadata": {"name": "g"},
        "spec": {"replicas": replicas, "maxReplicas": max, "ports": [{"name": "http", "port": port}]}})
    .to_string()
}

#[test]
fn cel_validation_rules_decide_creates_and_updates() {
    let s = Server::start();
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &guarded_definition("self.replicas <="),
    );
    assert!(
        err.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: \"self.replicas <=\": compilation failed: "),
        "{err}"
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &guarded_definition("self.replicas <= self.maxReplicas"),
    );
    s.ok(&[
        "wait",
        "--for=condition=established",
        "crd/guards.stable.example.com",
        "--timeout=20s",
    ]);
    let err = s.fails_stdin(&["create", "-f", "-"], &guard(5, 3, 80));
    assert!(
        err.contains(r#"The Guard "g" is invalid: spec: Invalid value: "object": replicas must not exceed maxReplicas"#),
        "{err}"
    );
    assert!(
        s.get_json(&["guards"])["items"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    s.ok_stdin(&["create", "-f", "-"], &guard(2, 3, 80));
    // Transition rules: against the stored object.
    let err = s.fails_stdin(&["replace", "-f", "-"], &guard(1, 3, 81));
    assert!(
        err.contains("spec: Forbidden: may not scale below 2")
            && err.contains(r#"spec.ports[0].port: Invalid value: "object": port is immutable"#),
        "{err}"
    );
    s.ok_stdin(&["replace", "-f", "-"], &guard(3, 3, 80));
    assert_eq!(s.get_json(&["guard", "g"])["spec"]["replicas"], 3);
}
