//! Server-side apply and update records on Kubernetes-shaped objects, checked against
//! what upstream writes.

use serde_json::{Value, json};

use super::{
    ApplyError, Conflict, Endpoint, Manager, RESET_STATUS, apply, conflicts_message, record_update,
};

const T1: &str = "2024-05-01T10:00:00Z";
const T2: &str = "2024-05-01T11:00:00Z";
const T3: &str = "2024-05-01T12:00:00Z";

const CONFIG_MAP: Endpoint = Endpoint::new("", "v1", "ConfigMap");
const DEPLOYMENT: Endpoint = Endpoint::new("apps", "v1", "Deployment");

fn manager(name: &'static str, time: &'static str) -> Manager<'static> {
    Manager { name, time }
}

fn config_map(data: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "default"},
        "data": data,
    })
}

fn deployment(spec: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": spec,
    })
}

fn web_deployment(replicas: i64, containers: Value) -> Value {
    deployment(json!({
        "replicas": replicas,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": containers},
        },
    }))
}

/// Applies, panicking on errors.
fn applied(endpoint: &Endpoint, live: Option<&Value>, config: &Value, manager: Manager) -> Value {
    apply(endpoint, live, config, &manager, false)
        .unwrap_or_else(|e| panic!("apply by {} failed: {e}", manager.name))
}

fn conflicts(result: Result<Value, ApplyError>) -> Vec<Conflict> {
    match result {
        Err(ApplyError::Conflicts(conflicts)) => conflicts,
        other => panic!("expected conflicts, got {other:?}"),
    }
}

/// The managedFields entries, without their times.
fn entries(object: &Value) -> Vec<Value> {
    object["metadata"]["managedFields"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|entry| {
                    let mut entry = entry.clone();
                    entry.as_object_mut().unwrap().remove("time");
                    entry
                })
                .collect()
        })
        .unwrap_or_default()
}

fn fields_of<'a>(object: &'a Value, manager: &str) -> &'a Value {
    object["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["manager"] == manager)
        .map(|entry| &entry["fieldsV1"])
        .unwrap_or_else(|| panic!("{manager} has no entry in {object}"))
}

fn without_managed_fields(object: &Value) -> Value {
    let mut object = object.clone();
    object["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("managedFields");
    object
}

#[test]
fn first_apply_of_a_config_map_records_its_fields() {
    let mut config = config_map(json!({"a": "1", "b": "2"}));
    config["metadata"]["labels"] = json!({"app": "web"});
    let object = applied(&CONFIG_MAP, None, &config, manager("kubectl", T1));
    assert_eq!(without_managed_fields(&object), config);
    assert_eq!(
        serde_json::to_string(&object["metadata"]["managedFields"]).unwrap(),
        r#"[{"manager":"kubectl","operation":"Apply","apiVersion":"v1","time":"2024-05-01T10:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{"f:a":{},"f:b":{}},"f:metadata":{"f:labels":{"f:app":{}}}}}]"#
    );
}

#[test]
fn first_apply_of_a_deployment_records_its_fields() {
    let config = web_deployment(
        2,
        json!([{"name": "web", "image": "nginx:1.25", "ports": [{"containerPort": 80}]}]),
    );
    let object = applied(&DEPLOYMENT, None, &config, manager("kubectl", T1));
    assert_eq!(without_managed_fields(&object), config);
    assert_eq!(
        serde_json::to_string(fields_of(&object, "kubectl")).unwrap(),
        concat!(
            r#"{"f:spec":{"f:replicas":{},"f:selector":{},"f:template":{"f:metadata":{"f:labels":{"f:app":{}}},"#,
            r#""f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{".":{},"f:image":{},"f:name":{},"#,
            r#""f:ports":{"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{}}}}}}}}}"#
        )
    );
    assert_eq!(
        object["metadata"]["managedFields"][0]["apiVersion"],
        "apps/v1"
    );
}

#[test]
fn reapplying_without_a_field_removes_it() {
    let containers = json!([
        {"name": "web", "image": "nginx", "ports": [{"containerPort": 80}, {"containerPort": 443}]},
        {"name": "log", "image": "fluentd"},
    ]);
    let first = web_deployment(3, containers);
    let live = applied(&DEPLOYMENT, None, &first, manager("kubectl", T1));

    let mut second = deployment(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}]},
        },
    }));
    let object = applied(&DEPLOYMENT, Some(&live), &second, manager("kubectl", T2));
    assert_eq!(without_managed_fields(&object), second);
    assert_eq!(object["metadata"]["managedFields"][0]["time"], T2);

    // Dropping a whole struct the manager alone owned removes it, whatever it held.
    second["spec"].as_object_mut().unwrap().remove("template");
    let object = applied(&DEPLOYMENT, Some(&object), &second, manager("kubectl", T3));
    assert_eq!(
        object["spec"],
        json!({"selector": {"matchLabels": {"app": "web"}}})
    );
}

#[test]
fn pruning_keeps_fields_nobody_applied() {
    let live = applied(
        &DEPLOYMENT,
        None,
        &web_deployment(3, json!([{"name": "web", "image": "nginx"}])),
        manager("kubectl", T1),
    );
    // Defaults the server filled in after the apply are owned by nobody.
    let mut defaulted = live.clone();
    defaulted["spec"]["revisionHistoryLimit"] = json!(10);
    defaulted["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = json!("Always");
    let config = web_deployment(2, json!([{"name": "web", "image": "nginx"}]));
    let object = applied(
        &DEPLOYMENT,
        Some(&defaulted),
        &config,
        manager("kubectl", T2),
    );
    assert_eq!(object["spec"]["replicas"], 2);
    assert_eq!(object["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(
        object["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
        "Always"
    );
}

#[test]
fn managers_share_fields_they_set_to_the_same_value() {
    let live = applied(
        &CONFIG_MAP,
        None,
        &config_map(json!({"a": "1", "b": "2"})),
        manager("alice", T1),
    );
    let object = applied(
        &CONFIG_MAP,
        Some(&live),
        &config_map(json!({"a": "1", "c": "3"})),
        manager("bob", T2),
    );
    assert_eq!(object["data"], json!({"a": "1", "b": "2", "c": "3"}));
    assert_eq!(
        fields_of(&object, "alice"),
        &json!({"f:data": {"f:a": {}, "f:b": {}}})
    );
    assert_eq!(
        fields_of(&object, "bob"),
        &json!({"f:data": {"f:a": {}, "f:c": {}}})
    );

    // Alice stops applying `a`: Bob still owns it, so it stays.
    let object = applied(
        &CONFIG_MAP,
        Some(&object),
        &config_map(json!({"b": "2"})),
        manager("alice", T3),
    );
    assert_eq!(object["data"], json!({"a": "1", "b": "2", "c": "3"}));
    assert_eq!(fields_of(&object, "alice"), &json!({"f:data": {"f:b": {}}}));
}

#[test]
fn changing_another_appliers_field_conflicts_unless_forced() {
    let live = applied(
        &CONFIG_MAP,
        None,
        &config_map(json!({"a": "1", "b": "2"})),
        manager("alice", T1),
    );
    let config = config_map(json!({"a": "changed", "b": "2"}));
    let result = apply(
        &CONFIG_MAP,
        Some(&live),
        &config,
        &manager("bob", T2),
        false,
    );
    let expected = Conflict {
        manager: "\"alice\"".into(),
        field: ".data.a".into(),
    };
    assert_eq!(expected.message(), "conflict with \"alice\"");
    let error = result.clone().unwrap_err();
    assert_eq!(
        error.to_string(),
        "Apply failed with 1 conflict: conflict with \"alice\": .data.a"
    );
    assert_eq!(conflicts(result), [expected]);

    let object = apply(&CONFIG_MAP, Some(&live), &config, &manager("bob", T2), true).unwrap();
    assert_eq!(object["data"], json!({"a": "changed", "b": "2"}));
    assert_eq!(fields_of(&object, "alice"), &json!({"f:data": {"f:b": {}}}));
    assert_eq!(
        fields_of(&object, "bob"),
        &json!({"f:data": {"f:a": {}, "f:b": {}}})
    );
    // Alice now conflicts with Bob.
    let result = apply(
        &CONFIG_MAP,
        Some(&object),
        &config_map(json!({"a": "1", "b": "2"})),
        &manager("alice", T3),
        false,
    );
    assert_eq!(conflicts(result)[0].manager, "\"bob\"");
}

#[test]
fn an_update_takes_fields_from_an_applier() {
    let config = web_deployment(3, json!([{"name": "web", "image": "nginx:1.25"}]));
    let live = applied(&DEPLOYMENT, None, &config, manager("kubectl", T1));
    // Somebody scales with an update (e.g. `kubectl scale`, a PUT).
    let mut scaled = live.clone();
    scaled["spec"]["replicas"] = json!(5);
    record_update(
        &DEPLOYMENT,
        Some(&live),
        &mut scaled,
        &manager("kubectl-client-side-apply", T2),
    );
    assert_eq!(
        fields_of(&scaled, "kubectl-client-side-apply"),
        &json!({"f:spec": {"f:replicas": {}}})
    );
    let kubectl = fields_of(&scaled, "kubectl");
    assert!(kubectl["f:spec"].get("f:replicas").is_none(), "{kubectl}");

    let result = apply(
        &DEPLOYMENT,
        Some(&scaled),
        &config,
        &manager("kubectl", T3),
        false,
    );
    let error = result.clone().unwrap_err();
    assert_eq!(
        error.to_string(),
        "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas"
    );
    let [conflict] = &conflicts(result)[..] else {
        panic!("one conflict")
    };
    assert_eq!(conflict.field, ".spec.replicas");
    assert_eq!(
        conflict.message(),
        "conflict with \"kubectl-client-side-apply\" using apps/v1"
    );
    // Leaving the field out of the configuration gives it up instead.
    let mut without_replicas = config.clone();
    without_replicas["spec"]
        .as_object_mut()
        .unwrap()
        .remove("replicas");
    let object = applied(
        &DEPLOYMENT,
        Some(&scaled),
        &without_replicas,
        manager("kubectl", T3),
    );
    assert_eq!(object["spec"]["replicas"], 5);
}

#[test]
fn several_conflicts_are_listed_by_manager() {
    let live = applied(
        &CONFIG_MAP,
        None,
        &config_map(json!({"a": "1", "b": "1"})),
        manager("alice", T1),
    );
    let live = applied(
        &CONFIG_MAP,
        Some(&live),
        &config_map(json!({"c": "1"})),
        manager("bob", T2),
    );
    let result = apply(
        &CONFIG_MAP,
        Some(&live),
        &config_map(json!({"a": "2", "b": "2", "c": "2"})),
        &manager("carol", T3),
        false,
    );
    let error = result.unwrap_err();
    assert_eq!(
        error.to_string(),
        "Apply failed with 3 conflicts: conflicts with \"alice\":\n- .data.a\n- .data.b\nconflicts with \"bob\":\n- .data.c"
    );
    let ApplyError::Conflicts(list) = &error else {
        panic!()
    };
    assert_eq!(conflicts_message(list), error.to_string());
}

#[test]
fn containers_merge_by_name_and_ports_by_port_and_protocol() {
    let live = applied(
        &DEPLOYMENT,
        None,
        &web_deployment(
            1,
            json!([{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}]),
        ),
        manager("alice", T1),
    );
    // Bob adds a sidecar, and to Alice's container a UDP port 80 and an env var.
    let bob = deployment(json!({"template": {"spec": {"containers": [
        {"name": "web", "ports": [{"containerPort": 80, "protocol": "UDP"}], "env": [{"name": "MODE", "value": "x"}]},
        {"name": "log", "image": "fluentd"},
    ]}}}));
    let object = applied(&DEPLOYMENT, Some(&live), &bob, manager("bob", T2));
    let containers = &object["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        containers,
        &json!([
            {"name": "web", "image": "nginx",
             "ports": [{"containerPort": 80}, {"containerPort": 80, "protocol": "UDP"}],
             "env": [{"name": "MODE", "value": "x"}]},
            {"name": "log", "image": "fluentd"},
        ])
    );
    assert_eq!(
        fields_of(&object, "bob"),
        &json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
            "k:{\"name\":\"log\"}": {".": {}, "f:image": {}, "f:name": {}},
            "k:{\"name\":\"web\"}": {".": {}, "f:env": {"k:{\"name\":\"MODE\"}": {".": {}, "f:name": {}, "f:value": {}}},
                "f:name": {},
                "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"UDP\"}": {".": {}, "f:containerPort": {}, "f:protocol": {}}}},
        }}}}})
    );
    // An explicit TCP is the same item as a defaulted one: shared, not a conflict.
    let tcp = deployment(json!({"template": {"spec": {"containers": [
        {"name": "web", "ports": [{"containerPort": 80, "protocol": "TCP"}]},
    ]}}}));
    let shared = applied(&DEPLOYMENT, Some(&object), &tcp, manager("carol", T3));
    assert_eq!(
        shared["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"],
        "TCP"
    );
    // Bob dropping his container removes it, but not Alice's, which he shared.
    let object = applied(
        &DEPLOYMENT,
        Some(&object),
        &deployment(json!({"paused": false})),
        manager("bob", T3),
    );
    assert_eq!(
        object["spec"]["template"]["spec"]["containers"],
        json!([{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}])
    );
}

#[test]
fn list_items_keep_their_order_around_applied_ones() {
    let config = |names: &[&str]| {
        let containers: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "image": n}))
            .collect();
        deployment(json!({"template": {"spec": {"containers": containers}}}))
    };
    let live = applied(
        &DEPLOYMENT,
        None,
        &config(&["a", "b", "c"]),
        manager("alice", T1),
    );
    let object = applied(
        &DEPLOYMENT,
        Some(&live),
        &config(&["c", "d"]),
        manager("bob", T2),
    );
    let names: Vec<&str> = object["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
}

#[test]
fn finalizers_are_a_set() {
    let with_finalizers = |finalizers: Value| {
        let mut config = config_map(json!({"a": "1"}));
        config["metadata"]["finalizers"] = finalizers;
        config
    };
    let live = applied(
        &CONFIG_MAP,
        None,
        &with_finalizers(json!(["example.com/a"])),
        manager("alice", T1),
    );
    assert_eq!(
        fields_of(&live, "alice"),
        &json!({"f:data": {"f:a": {}}, "f:metadata": {"f:finalizers": {"v:\"example.com/a\"": {}}}})
    );
    let object = applied(
        &CONFIG_MAP,
        Some(&live),
        &with_finalizers(json!(["example.com/b", "example.com/a"])),
        manager("bob", T2),
    );
    assert_eq!(
        object["metadata"]["finalizers"],
        json!(["example.com/b", "example.com/a"])
    );
    // Alice drops hers: Bob applied it too, so it stays; Bob then drops both.
    let object = applied(
        &CONFIG_MAP,
        Some(&object),
        &with_finalizers(json!([])),
        manager("alice", T3),
    );
    assert_eq!(
        object["metadata"]["finalizers"],
        json!(["example.com/b", "example.com/a"])
    );
    let object = applied(
        &CONFIG_MAP,
        Some(&object),
        &config_map(json!({})),
        manager("bob", T3),
    );
    assert_eq!(object["metadata"].get("finalizers"), None);
    // A set may not repeat a value.
    let result = apply(
        &CONFIG_MAP,
        None,
        &with_finalizers(json!(["x", "x"])),
        &manager("alice", T1),
        false,
    );
    assert_eq!(
        result,
        Err(ApplyError::Invalid(
            ".metadata.finalizers: duplicate entries for key [=\"x\"]".into()
        ))
    );
}

#[test]
fn owner_references_are_keyed_by_uid_and_atomic() {
    let mut config = config_map(json!({}));
    config["metadata"]["ownerReferences"] = json!([
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u-1", "controller": true},
    ]);
    let object = applied(&CONFIG_MAP, None, &config, manager("alice", T1));
    assert_eq!(
        fields_of(&object, "alice"),
        &json!({"f:data": {}, "f:metadata": {"f:ownerReferences": {"k:{\"uid\":\"u-1\"}": {}}}})
    );
}

#[test]
fn status_is_left_to_its_subresource() {
    let endpoint = Endpoint {
        reset_fields: RESET_STATUS,
        ..DEPLOYMENT
    };
    let mut config = web_deployment(1, json!([{"name": "web", "image": "nginx"}]));
    config["status"] = json!({"replicas": 7});
    let object = applied(&endpoint, None, &config, manager("kubectl", T1));
    assert_eq!(object.get("status"), None);
    assert!(fields_of(&object, "kubectl").get("f:status").is_none());

    let mut live = object.clone();
    live["status"] = json!({"replicas": 1});
    let object = applied(&endpoint, Some(&live), &config, manager("kubectl", T2));
    assert_eq!(object["status"], json!({"replicas": 1}));

    // Through the status subresource, status is what is applied, and owned apart.
    let status = Endpoint {
        subresource: Some("status"),
        reset_fields: &[&["spec"], &["metadata", "labels"]],
        ..DEPLOYMENT
    };
    let config = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                        "spec": {"replicas": 9}, "status": {"replicas": 2}});
    let object = applied(&status, Some(&object), &config, manager("controller", T3));
    assert_eq!(object["status"], json!({"replicas": 2}));
    assert_eq!(object["spec"]["replicas"], 1);
    let entry = object["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["manager"] == "controller")
        .unwrap();
    assert_eq!(entry["subresource"], "status");
    assert_eq!(entry["fieldsV1"], json!({"f:status": {"f:replicas": {}}}));
}

#[test]
fn reapplying_the_same_configuration_changes_nothing() {
    let config = web_deployment(2, json!([{"name": "web", "image": "nginx"}]));
    let live = applied(&DEPLOYMENT, None, &config, manager("kubectl", T1));
    let again = applied(&DEPLOYMENT, Some(&live), &config, manager("kubectl", T2));
    assert_eq!(again, live);
    // A new manager applying the same values shares them, with no time: it changed
    // nothing.
    let shared = applied(&DEPLOYMENT, Some(&live), &config, manager("other", T2));
    assert_eq!(
        without_managed_fields(&shared),
        without_managed_fields(&live)
    );
    let other = shared["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["manager"] == "other")
        .unwrap();
    assert!(other.get("time").is_none());
}

#[test]
fn fields_set_before_the_first_apply_belong_to_before_first_apply() {
    let live = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "default", "uid": "u-1"},
        "data": {"a": "1"},
    });
    let result = apply(
        &CONFIG_MAP,
        Some(&live),
        &config_map(json!({"a": "2"})),
        &manager("kubectl", T1),
        false,
    );
    assert_eq!(
        result.unwrap_err().to_string(),
        "Apply failed with 1 conflict: conflict with \"before-first-apply\" using v1: .data.a"
    );
    let object = applied(
        &CONFIG_MAP,
        Some(&live),
        &config_map(json!({"a": "1", "b": "2"})),
        manager("kubectl", T1),
    );
    assert_eq!(
        entries(&object),
        [
            json!({"manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:data": {"f:a": {}, "f:b": {}}}}),
            json!({"manager": "before-first-apply", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:data": {".": {}, "f:a": {}}}}),
        ]
    );
}

#[test]
fn creates_record_what_they_set() {
    let mut new = config_map(json!({"a": "1"}));
    new["metadata"]["labels"] = json!({"app": "web"});
    record_update(&CONFIG_MAP, None, &mut new, &manager("kubectl-create", T1));
    assert_eq!(
        serde_json::to_string(&new["metadata"]["managedFields"]).unwrap(),
        r#"[{"manager":"kubectl-create","operation":"Update","apiVersion":"v1","time":"2024-05-01T10:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:a":{}},"f:metadata":{"f:labels":{".":{},"f:app":{}}}}}]"#
    );

    let mut new = web_deployment(1, json!([{"name": "web", "image": "nginx"}]));
    record_update(&DEPLOYMENT, None, &mut new, &manager("", T1));
    let fields = fields_of(&new, "unknown");
    assert_eq!(fields["f:spec"]["f:replicas"], json!({}));
    assert!(fields["f:spec"].get(".").is_none());
}

#[test]
fn updates_keep_their_managers_apart() {
    let mut live = config_map(json!({"a": "1"}));
    live["metadata"]["uid"] = json!("u-1");
    record_update(&CONFIG_MAP, None, &mut live, &manager("creator", T1));
    let mut new = live.clone();
    new["data"]["b"] = json!("2");
    new["data"]["a"] = json!("changed");
    record_update(&CONFIG_MAP, Some(&live), &mut new, &manager("editor", T2));
    assert_eq!(
        entries(&new),
        [
            json!({"manager": "creator", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:data": {}}}),
            json!({"manager": "editor", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:data": {"f:a": {}, "f:b": {}}}}),
        ]
    );
    // A write that changes nothing leaves the record as it was.
    let mut same = new.clone();
    record_update(&CONFIG_MAP, Some(&new), &mut same, &manager("third", T3));
    assert_eq!(same, new);
    // Removing a field takes it from its owner.
    let mut removed = new.clone();
    removed["data"].as_object_mut().unwrap().remove("b");
    record_update(&CONFIG_MAP, Some(&new), &mut removed, &manager("third", T3));
    assert_eq!(
        fields_of(&removed, "editor"),
        &json!({"f:data": {"f:a": {}}})
    );
}

#[test]
fn requests_can_clear_the_record_and_untracked_objects_stay_untracked() {
    let mut live = config_map(json!({"a": "1"}));
    live["metadata"]["uid"] = json!("u-1");
    let untracked = live.clone();
    record_update(&CONFIG_MAP, None, &mut live, &manager("creator", T1));
    let mut cleared = live.clone();
    cleared["metadata"]["managedFields"] = json!([]);
    cleared["data"]["a"] = json!("2");
    record_update(
        &CONFIG_MAP,
        Some(&live),
        &mut cleared,
        &manager("editor", T2),
    );
    assert_eq!(cleared["metadata"].get("managedFields"), None);

    let mut new = untracked.clone();
    new["data"]["a"] = json!("2");
    record_update(
        &CONFIG_MAP,
        Some(&untracked),
        &mut new,
        &manager("editor", T2),
    );
    assert_eq!(new["metadata"].get("managedFields"), None);
}

#[test]
fn status_updates_are_recorded_apart() {
    let config = web_deployment(1, json!([{"name": "web", "image": "nginx"}]));
    let live = applied(&DEPLOYMENT, None, &config, manager("kubectl", T1));
    let mut new = live.clone();
    new["status"] = json!({"replicas": 1});
    let status = Endpoint {
        subresource: Some("status"),
        ..DEPLOYMENT
    };
    record_update(&status, Some(&live), &mut new, &manager("controller", T2));
    let entry = &new["metadata"]["managedFields"][1];
    assert_eq!(entry["subresource"], "status");
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:status": {".": {}, "f:replicas": {}}})
    );
}

#[test]
fn kubectl_takes_over_from_client_side_apply() {
    let last = config_map(json!({"a": "1"}));
    let mut live = last.clone();
    live["metadata"]["annotations"] = json!({
        "kubectl.kubernetes.io/last-applied-configuration": last.to_string(),
    });
    record_update(
        &CONFIG_MAP,
        None,
        &mut live,
        &manager("kubectl-client-side-apply", T1),
    );
    live["metadata"]["uid"] = json!("u-1");

    let config = config_map(json!({"a": "2"}));
    // Another applier conflicts; kubectl may take what the annotation describes.
    let result = apply(
        &CONFIG_MAP,
        Some(&live),
        &config,
        &manager("other", T2),
        false,
    );
    assert_eq!(conflicts(result).len(), 1);
    let object = applied(&CONFIG_MAP, Some(&live), &config, manager("kubectl", T2));
    assert_eq!(object["data"]["a"], "2");
    assert_eq!(
        object["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
        "{\"apiVersion\":\"v1\",\"data\":{\"a\":\"2\"},\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"settings\",\"namespace\":\"default\"}}\n"
    );
}

#[test]
fn unknown_kinds_merge_as_free_form_json() {
    let endpoint = Endpoint::new("example.com", "v1", "Widget");
    let config = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "labels": {"a": "b"}, "finalizers": ["x"]},
        "spec": {"size": 1, "ports": [1, 2], "nested": {"deep": true}},
    });
    let object = applied(&endpoint, None, &config, manager("kubectl", T1));
    assert_eq!(
        fields_of(&object, "kubectl"),
        &json!({
            "f:metadata": {"f:finalizers": {"v:\"x\"": {}}, "f:labels": {"f:a": {}}},
            "f:spec": {".": {}, "f:nested": {".": {}, "f:deep": {}}, "f:ports": {}, "f:size": {}},
        })
    );
    // Lists are atomic: another manager's list replaces the whole.
    let other = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                       "spec": {"ports": [3]}});
    let result = apply(
        &endpoint,
        Some(&object),
        &other,
        &manager("other", T2),
        false,
    );
    assert_eq!(conflicts(result)[0].field, ".spec.ports");
}

#[test]
fn refuses_invalid_configurations() {
    let wrong_kind = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}});
    assert_eq!(
        apply(&CONFIG_MAP, None, &wrong_kind, &manager("a", T1), false),
        Err(ApplyError::Invalid(
            "invalid object type: /v1, Kind=Secret".into()
        ))
    );
    let mut with_fields = config_map(json!({}));
    with_fields["metadata"]["managedFields"] = json!([]);
    assert_eq!(
        apply(&CONFIG_MAP, None, &with_fields, &manager("a", T1), false),
        Err(ApplyError::Invalid(
            "metadata.managedFields must be nil".into()
        ))
    );
    let duplicate = web_deployment(1, json!([{"name": "web"}, {"name": "web"}]));
    assert_eq!(
        apply(&DEPLOYMENT, None, &duplicate, &manager("a", T1), false),
        Err(ApplyError::Invalid(
            ".spec.template.spec.containers: duplicate entries for key [name=\"web\"]".into()
        ))
    );
    let not_an_object = web_deployment(1, json!(["web"]));
    let Err(ApplyError::Invalid(message)) =
        apply(&DEPLOYMENT, None, &not_an_object, &manager("a", T1), false)
    else {
        panic!("refused")
    };
    assert_eq!(
        message,
        ".spec.template.spec.containers: element 0: associative list with keys may not have non-map elements"
    );
    let mut broken = config_map(json!({}));
    broken["metadata"]["managedFields"] = json!([{"manager": "x"}]);
    let Err(ApplyError::Invalid(message)) = apply(
        &CONFIG_MAP,
        Some(&broken),
        &config_map(json!({})),
        &manager("a", T1),
        false,
    ) else {
        panic!("refused")
    };
    assert!(
        message.starts_with("failed to decode managed fields"),
        "{message}"
    );
}

/// A custom resource merges by its definition's schema: a keyed list item by item, a
/// set value by value, an atomic map as a whole, free-form fields key by key.
#[test]
fn custom_resources_merge_by_their_schema() {
    use super::CustomSchema;
    let schema = CustomSchema::leak(&json!({
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {
                "ports": {"type": "array", "x-kubernetes-list-type": "map",
                          "x-kubernetes-list-map-keys": ["name"],
                          "items": {"type": "object", "properties": {
                              "name": {"type": "string"}, "port": {"type": "integer"}}}},
                "hosts": {"type": "array", "x-kubernetes-list-type": "set",
                          "items": {"type": "string"}},
                "args": {"type": "array", "items": {"type": "string"}},
                "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                             "additionalProperties": {"type": "string"}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }}
        }
    }));
    let widget = Endpoint {
        schema: Some(schema),
        ..Endpoint::new("example.com", "v1", "Widget")
    };
    let object = |spec: Value| {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
               "metadata": {"name": "w", "namespace": "default"}, "spec": spec})
    };
    let a = applied(
        &widget,
        None,
        &object(json!({
            "ports": [{"name": "http", "port": 80}], "hosts": ["a"], "args": ["x"],
            "selector": {"app": "w"}, "extra": {"one": 1}
        })),
        manager("a", T1),
    );
    let b = applied(
        &widget,
        Some(&a),
        &object(json!({
            "ports": [{"name": "https", "port": 443}], "hosts": ["b"], "extra": {"two": 2}
        })),
        manager("b", T2),
    );
    let spec = &b["spec"];
    assert_eq!(
        spec["ports"],
        json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}])
    );
    assert_eq!(spec["hosts"], json!(["a", "b"]));
    assert_eq!(spec["extra"], json!({"one": 1, "two": 2}));
    assert_eq!(
        fields_of(&b, "b")["f:spec"]["f:ports"],
        json!({"k:{\"name\":\"https\"}": {".": {}, "f:name": {}, "f:port": {}}})
    );
    // The atomic list and map are owned whole: another manager's value conflicts.
    let clash = apply(
        &widget,
        Some(&b),
        &object(json!({"args": ["y"], "selector": {"app": "w", "tier": "x"}})),
        &manager("c", T3),
        false,
    );
    let fields: Vec<String> = conflicts(clash).into_iter().map(|c| c.field).collect();
    assert_eq!(fields, [".spec.args", ".spec.selector"]);
}

/// Keys without a default identify items by the item's own value (ownerReferences by
/// `uid`): they used to be taken as missing.
#[test]
fn items_keyed_by_a_field_without_default_merge() {
    let mut cm = config_map(json!({"a": "1"}));
    cm["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1"}]);
    let applied = applied(&CONFIG_MAP, None, &cm, manager("a", T1));
    assert_eq!(
        fields_of(&applied, "a")["f:metadata"]["f:ownerReferences"],
        json!({"k:{\"uid\":\"u1\"}": {}})
    );
}
