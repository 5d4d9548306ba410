//! Behaviour of [`apply_strategic_merge_patch`] on Kubernetes-shaped objects: one test
//! per merge rule and directive, with the results upstream's apiserver gives.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::{PatchError, TypeRef, apply_strategic_merge_patch, root_type};

fn pod_type() -> TypeRef {
    root_type("", "v1", "Pod").expect("Pod is in the table")
}

fn deployment_type() -> TypeRef {
    root_type("apps", "v1", "Deployment").expect("Deployment is in the table")
}

fn patch_pod(original: Value, patch: Value) -> Value {
    let patched = apply_strategic_merge_patch(&original, &patch, pod_type()).unwrap();
    // The result must still be a valid Pod.
    serde_json::from_value::<Pod>(patched.clone()).expect("result decodes as a Pod");
    patched
}

fn pod_err(original: Value, patch: Value) -> PatchError {
    apply_strategic_merge_patch(&original, &patch, pod_type()).unwrap_err()
}

fn pod_with_containers(containers: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": containers},
    })
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|item| item["name"].as_str().unwrap())
        .collect()
}

#[test]
fn containers_merge_by_name_keeping_unpatched_fields() {
    let original = pod_with_containers(json!([
        {"name": "app", "image": "nginx:1.26", "args": ["-g", "daemon off;"]},
        {"name": "sidecar", "image": "envoy:1"},
    ]));
    let patched = patch_pod(
        original,
        json!({"spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}}),
    );
    assert_eq!(
        patched["spec"]["containers"],
        json!([
            {"name": "app", "image": "nginx:1.27", "args": ["-g", "daemon off;"]},
            {"name": "sidecar", "image": "envoy:1"},
        ])
    );
    assert_eq!(patched["metadata"]["name"], "web");
}

#[test]
fn new_list_item_named_alone_goes_first() {
    // Upstream puts patch items before server-only items unless the original order
    // says otherwise; kubectl sends $setElementOrder when it cares.
    let original = pod_with_containers(json!([{"name": "app"}, {"name": "sidecar"}]));
    let patched = patch_pod(
        original,
        json!({"spec": {"containers": [{"name": "debug", "image": "busybox"}]}}),
    );
    assert_eq!(
        names(&patched["spec"]["containers"]),
        ["debug", "app", "sidecar"]
    );
}

#[test]
fn patch_order_wins_over_original_order() {
    let original = pod_with_containers(json!([{"name": "a"}, {"name": "b"}, {"name": "c"}]));
    let patched = patch_pod(
        original,
        json!({"spec": {"containers": [{"name": "c", "image": "x"}, {"name": "a", "image": "y"}]}}),
    );
    // b precedes c in the original, so it stays ahead of the patch run.
    assert_eq!(names(&patched["spec"]["containers"]), ["b", "c", "a"]);
}

#[test]
fn env_merges_by_name() {
    let original = pod_with_containers(json!([{
        "name": "app",
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "1"}],
    }]));
    let patched = patch_pod(
        original,
        json!({"spec": {"containers": [{
            "name": "app",
            "env": [{"name": "B", "value": "2"}, {"name": "C", "value": "3"}],
        }]}}),
    );
    assert_eq!(
        patched["spec"]["containers"][0]["env"],
        json!([
            {"name": "A", "value": "1"},
            {"name": "B", "value": "2"},
            {"name": "C", "value": "3"},
        ])
    );
}

#[test]
fn container_ports_merge_by_container_port() {
    let original = pod_with_containers(json!([{
        "name": "app",
        "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443, "name": "https"}],
    }]));
    let patched = patch_pod(
        original,
        json!({"spec": {"containers": [{"name": "app", "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}),
    );
    assert_eq!(
        patched["spec"]["containers"][0]["ports"],
        json!([
            {"containerPort": 80, "name": "http", "protocol": "TCP"},
            {"containerPort": 443, "name": "https"},
        ])
    );
}

#[test]
fn merge_keys_compare_numbers_by_value() {
    let original = pod_with_containers(
        json!([{"name": "app", "ports": [{"containerPort": 80, "protocol": "TCP"}]}]),
    );
    let patch = json!({"spec": {"containers": [{"name": "app", "ports": [{"containerPort": 80.0, "name": "http"}]}]}});
    let patched = apply_strategic_merge_patch(&original, &patch, pod_type()).unwrap();
    assert_eq!(
        patched["spec"]["containers"][0]["ports"],
        json!([{"containerPort": 80.0, "protocol": "TCP", "name": "http"}])
    );
}

#[test]
fn service_ports_merge_by_port_alone() {
    let service = root_type("", "v1", "Service").unwrap();
    let original = json!({"spec": {"ports": [
        {"port": 80, "protocol": "TCP", "targetPort": 8080, "name": "http"},
        {"port": 53, "protocol": "UDP", "name": "dns"},
    ]}});
    // The SMP merge key is `port` (not the server-side-apply key [port, protocol]),
    // so a different protocol on port 80 still patches that same item.
    let patch = json!({"spec": {"ports": [{"port": 80, "protocol": "UDP", "targetPort": 9090}]}});
    let patched = apply_strategic_merge_patch(&original, &patch, service).unwrap();
    assert_eq!(
        patched["spec"]["ports"],
        json!([
            {"port": 80, "protocol": "UDP", "targetPort": 9090, "name": "http"},
            {"port": 53, "protocol": "UDP", "name": "dns"},
        ])
    );
}

#[test]
fn volume_retain_keys_switches_the_volume_source() {
    let mut original = pod_with_containers(json!([{"name": "app"}]));
    original["spec"]["volumes"] = json!([
        {"name": "data", "emptyDir": {"medium": "Memory"}},
        {"name": "config", "configMap": {"name": "app-config"}},
    ]);
    // What kubectl apply sends when a volume changes from emptyDir to a PVC.
    let patch = json!({"spec": {
        "$setElementOrder/volumes": [{"name": "data"}, {"name": "config"}],
        "volumes": [{
            "$retainKeys": ["name", "persistentVolumeClaim"],
            "name": "data",
            "persistentVolumeClaim": {"claimName": "data-pvc"},
        }],
    }});
    let patched = patch_pod(original, patch);
    assert_eq!(
        patched["spec"]["volumes"],
        json!([
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-pvc"}},
            {"name": "config", "configMap": {"name": "app-config"}},
        ])
    );
}

fn rolling_deployment() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "nginx"}]},
            },
        },
    })
}

#[test]
fn deployment_strategy_retain_keys_switches_to_recreate() {
    let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}});
    let patched =
        apply_strategic_merge_patch(&rolling_deployment(), &patch, deployment_type()).unwrap();
    assert_eq!(patched["spec"]["strategy"], json!({"type": "Recreate"}));
    serde_json::from_value::<Deployment>(patched).expect("result decodes as a Deployment");
}

#[test]
fn without_retain_keys_directive_the_strategy_merges() {
    // The retainKeys strategy is acted on by the client, through the directive.
    let patch = json!({"spec": {"strategy": {"type": "Recreate"}}});
    let patched =
        apply_strategic_merge_patch(&rolling_deployment(), &patch, deployment_type()).unwrap();
    assert_eq!(
        patched["spec"]["strategy"],
        json!({"type": "Recreate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    );
}

#[test]
fn retain_keys_must_name_every_key_the_patch_sets() {
    let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2}}}});
    let err =
        apply_strategic_merge_patch(&rolling_deployment(), &patch, deployment_type()).unwrap_err();
    assert!(
        matches!(&err, PatchError::InvalidDirective { path, directive: "$retainKeys", .. } if path == "spec.strategy"),
        "{err}"
    );
}

#[test]
fn kubectl_apply_patch_updates_image_and_env_in_a_deployment() {
    let mut original = rolling_deployment();
    original["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "A", "value": "1"}]);
    // A three-way patch as kubectl apply computes it.
    let patch = json!({"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "app"}],
        "containers": [{
            "$setElementOrder/env": [{"name": "A"}, {"name": "B"}],
            "env": [{"name": "B", "value": "2"}],
            "image": "nginx:1.27",
            "name": "app",
        }],
    }}}});
    let patched = apply_strategic_merge_patch(&original, &patch, deployment_type()).unwrap();
    assert_eq!(
        patched["spec"]["template"]["spec"]["containers"],
        json!([{
            "name": "app",
            "image": "nginx:1.27",
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
        }])
    );
}

#[test]
fn finalizers_are_unioned() {
    let original = json!({"metadata": {"finalizers": ["a", "b"]}});
    let patched = patch_pod(original, json!({"metadata": {"finalizers": ["b", "c"]}}));
    assert_eq!(patched["metadata"]["finalizers"], json!(["a", "b", "c"]));
}

#[test]
fn primitive_union_drops_duplicates() {
    let original = json!({"metadata": {"finalizers": ["a", "a", "b"]}});
    let patched = patch_pod(original, json!({"metadata": {"finalizers": ["b", "b"]}}));
    assert_eq!(patched["metadata"]["finalizers"], json!(["a", "b"]));
}

#[test]
fn null_deletes_a_label_and_unmatched_nulls_are_ignored() {
    let original = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
    let patched = patch_pod(
        original,
        json!({"metadata": {"labels": {"tier": null, "missing": null, "team": "a"}}}),
    );
    assert_eq!(
        patched["metadata"]["labels"],
        json!({"app": "web", "team": "a"})
    );
}

#[test]
fn set_element_order_reorders_without_changes() {
    let original = pod_with_containers(json!([
        {"name": "a", "image": "1"}, {"name": "b", "image": "2"}, {"name": "c", "image": "3"},
    ]));
    let patched = patch_pod(
        original,
        json!({"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}]}}),
    );
    assert_eq!(
        patched["spec"]["containers"],
        json!([{"name": "c", "image": "3"}, {"name": "a", "image": "1"}, {"name": "b", "image": "2"}])
    );
}

#[test]
fn set_element_order_places_a_new_item() {
    let original = pod_with_containers(json!([{"name": "a"}, {"name": "b"}, {"name": "c"}]));
    let patched = patch_pod(
        original,
        json!({"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "d"}, {"name": "b"}, {"name": "c"}],
            "containers": [{"name": "d", "image": "new"}],
        }}),
    );
    assert_eq!(names(&patched["spec"]["containers"]), ["a", "d", "b", "c"]);
}

#[test]
fn set_element_order_keeps_server_only_items_in_place() {
    let original = pod_with_containers(json!([{"name": "a"}, {"name": "x"}, {"name": "b"}]));
    let patched = patch_pod(
        original,
        json!({"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}]}}),
    );
    assert_eq!(names(&patched["spec"]["containers"]), ["x", "b", "a"]);
}

#[test]
fn set_element_order_interleaves_server_only_runs() {
    let containers =
        |names: &[&str]| Value::Array(names.iter().map(|name| json!({"name": name})).collect());
    let order = json!([{"name": "b"}, {"name": "a"}, {"name": "d"}, {"name": "c"}]);
    for (original, expected) in [
        (vec!["a", "b", "x", "c", "d"], vec!["b", "a", "x", "d", "c"]),
        (
            vec!["a", "b", "x", "y", "z", "c", "d"],
            vec!["b", "a", "x", "y", "z", "d", "c"],
        ),
    ] {
        let patched = patch_pod(
            pod_with_containers(containers(&original)),
            json!({"spec": {"$setElementOrder/containers": order}}),
        );
        assert_eq!(names(&patched["spec"]["containers"]), expected);
    }
}

#[test]
fn set_element_order_with_new_items_around_existing_ones() {
    let original = pod_with_containers(json!([
        {"name": "a", "image": "a"},
        {"name": "b", "image": "b"},
    ]));
    let patched = patch_pod(
        original,
        json!({"spec": {
            "$setElementOrder/containers": [{"name": "d"}, {"name": "a"}, {"name": "b"}, {"name": "c"}],
            "containers": [{"name": "d", "image": "d"}, {"name": "c", "image": "c"}],
        }}),
    );
    assert_eq!(
        patched["spec"]["containers"],
        json!([
            {"name": "d", "image": "d"},
            {"name": "a", "image": "a"},
            {"name": "b", "image": "b"},
            {"name": "c", "image": "c"},
        ])
    );
}

#[test]
fn set_element_order_orders_primitive_lists() {
    let original = json!({"metadata": {"finalizers": ["a", "b", "c"]}});
    let patched = patch_pod(
        original,
        json!({"metadata": {"$setElementOrder/finalizers": ["c", "b", "a"]}}),
    );
    assert_eq!(patched["metadata"]["finalizers"], json!(["c", "b", "a"]));
}

#[test]
fn set_element_order_must_agree_with_the_patch_list() {
    let original = pod_with_containers(json!([{"name": "a"}, {"name": "b"}]));
    let err = pod_err(
        original,
        json!({"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b", "image": "1"}, {"name": "a", "image": "2"}],
        }}),
    );
    assert!(
        matches!(&err, PatchError::InvalidDirective { path, directive: "$setElementOrder", .. } if path == "spec.containers"),
        "{err}"
    );
}

#[test]
fn delete_from_primitive_list_removes_finalizers() {
    let original = json!({"metadata": {"finalizers": ["a", "b", "c", "b"]}});
    let patched = patch_pod(
        original,
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b", "zzz"]}}),
    );
    assert_eq!(patched["metadata"]["finalizers"], json!(["a", "c"]));
}

#[test]
fn delete_from_primitive_list_with_order_as_kubectl_sends_it() {
    let original = json!({"metadata": {"finalizers": ["a", "b"]}});
    let patched = patch_pod(
        original,
        json!({"metadata": {
            "$deleteFromPrimitiveList/finalizers": ["a"],
            "$setElementOrder/finalizers": ["b", "c"],
            "finalizers": ["c"],
        }}),
    );
    assert_eq!(patched["metadata"]["finalizers"], json!(["b", "c"]));
}

#[test]
fn delete_from_primitive_list_of_a_missing_list_adds_nothing() {
    let original = json!({"metadata": {"name": "web"}});
    let patched = patch_pod(
        original.clone(),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
    );
    assert_eq!(patched, original);
}

#[test]
fn delete_from_primitive_list_refuses_lists_of_objects() {
    let original = pod_with_containers(json!([{"name": "a"}]));
    let err = pod_err(
        original,
        json!({"spec": {"$deleteFromPrimitiveList/containers": [{"name": "a"}]}}),
    );
    assert!(
        matches!(
            err,
            PatchError::InvalidDirective {
                directive: "$deleteFromPrimitiveList",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn patch_replace_item_replaces_a_merging_list() {
    let original = pod_with_containers(json!([{"name": "a", "image": "1"}, {"name": "b"}]));
    let patched = patch_pod(
        original,
        json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "c", "image": "3"}]}}),
    );
    assert_eq!(
        patched["spec"]["containers"],
        json!([{"name": "c", "image": "3"}])
    );
}

#[test]
fn patch_delete_item_removes_by_merge_key() {
    let original = pod_with_containers(json!([{
        "name": "app",
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
    }]));
    let patched = patch_pod(
        original,
        json!({"spec": {"containers": [{
            "name": "app",
            "env": [{"name": "A", "$patch": "delete"}, {"name": "GONE", "$patch": "delete"}],
        }]}}),
    );
    assert_eq!(
        patched["spec"]["containers"][0]["env"],
        json!([{"name": "B", "value": "2"}])
    );
}

#[test]
fn patch_delete_item_needs_the_merge_key() {
    let original = pod_with_containers(json!([{"name": "app"}]));
    let err = pod_err(
        original,
        json!({"spec": {"containers": [{"$patch": "delete"}]}}),
    );
    assert_eq!(
        err,
        PatchError::MissingMergeKey {
            path: "spec.containers".into(),
            key: "name".into()
        }
    );
}

#[test]
fn patch_replace_on_an_object_replaces_it() {
    let original = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
    let patched = patch_pod(
        original,
        json!({"metadata": {"labels": {"$patch": "replace", "team": "a"}}}),
    );
    assert_eq!(patched["metadata"]["labels"], json!({"team": "a"}));
}

#[test]
fn patch_delete_on_an_object_empties_it() {
    let mut original = pod_with_containers(json!([{"name": "app"}]));
    original["spec"]["securityContext"] = json!({"runAsUser": 1000, "runAsNonRoot": true});
    let patched = patch_pod(
        original,
        json!({"spec": {"securityContext": {"$patch": "delete"}}}),
    );
    assert_eq!(patched["spec"]["securityContext"], json!({}));
}

#[test]
fn patch_delete_on_a_missing_object_adds_nothing() {
    let original = pod_with_containers(json!([{"name": "app"}]));
    let patched = patch_pod(
        original.clone(),
        json!({"spec": {"securityContext": {"$patch": "delete"}}}),
    );
    assert_eq!(patched, original);
}

#[test]
fn patch_replace_at_the_root_replaces_the_document() {
    let original = json!({"metadata": {"name": "a"}, "spec": {"containers": []}});
    let patched = patch_pod(
        original,
        json!({"$patch": "replace", "metadata": {"name": "b"}}),
    );
    assert_eq!(patched, json!({"metadata": {"name": "b"}}));
}

#[test]
fn patch_merge_and_unknown_directives_are_refused() {
    let original = pod_with_containers(json!([{"name": "app"}]));
    for patch in [
        json!({"metadata": {"$patch": "merge"}}),
        json!({"metadata": {"$patch": "frobnicate"}}),
        json!({"spec": {"containers": [{"name": "app", "$patch": "merge"}]}}),
        json!({"spec": {"initContainers": [{"name": "new", "$patch": "bogus"}]}}),
    ] {
        let err = pod_err(original.clone(), patch.clone());
        assert!(
            matches!(err, PatchError::UnknownDirective { .. }),
            "{patch}: {err}"
        );
    }
}

#[test]
fn malformed_directive_keys_are_refused() {
    let original = json!({"metadata": {"finalizers": ["a"]}});
    let err = pod_err(original, json!({"metadata": {"$setElementOrder": ["a"]}}));
    assert!(
        matches!(
            err,
            PatchError::InvalidDirective {
                directive: "$setElementOrder",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn atomic_lists_are_replaced() {
    let mut original = pod_with_containers(json!([{"name": "app", "args": ["a", "b"]}]));
    original["spec"]["tolerations"] = json!([{"key": "a", "operator": "Exists"}]);
    let patched = patch_pod(
        original,
        json!({"spec": {
            "tolerations": [{"key": "b", "operator": "Exists"}],
            "containers": [{"name": "app", "args": ["c"]}],
        }}),
    );
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([{"key": "b", "operator": "Exists"}])
    );
    assert_eq!(patched["spec"]["containers"][0]["args"], json!(["c"]));
}

#[test]
fn replace_strategy_replaces_an_object() {
    let pdb = root_type("policy", "v1", "PodDisruptionBudget").unwrap();
    let original =
        json!({"spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}});
    let patch = json!({"spec": {"selector": {"matchLabels": {"tier": "front"}}}});
    let patched = apply_strategic_merge_patch(&original, &patch, pdb).unwrap();
    assert_eq!(
        patched["spec"],
        json!({"minAvailable": 1, "selector": {"matchLabels": {"tier": "front"}}})
    );
    // The same shape under a Deployment (no replace strategy) merges.
    let patched = apply_strategic_merge_patch(&original, &patch, deployment_type()).unwrap();
    assert_eq!(
        patched["spec"]["selector"],
        json!({"matchLabels": {"app": "web", "tier": "front"}})
    );
}

#[test]
fn owner_references_merge_by_uid() {
    let original = json!({"metadata": {"ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1"},
    ]}});
    let patched = patch_pod(
        original,
        json!({"metadata": {"ownerReferences": [
            {"uid": "u1", "controller": true},
            {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u2"},
        ]}}),
    );
    assert_eq!(
        patched["metadata"]["ownerReferences"],
        json!([
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1", "controller": true},
            {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u2"},
        ])
    );
}

#[test]
fn node_status_lists_merge_by_type() {
    let node = root_type("", "v1", "Node").unwrap();
    let original = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n1"}],
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "DiskPressure", "status": "False"}],
    }});
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let patched = apply_strategic_merge_patch(&original, &patch, node).unwrap();
    assert_eq!(
        patched["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}])
    );
    assert_eq!(
        patched["status"]["addresses"],
        original["status"]["addresses"]
    );
}

#[test]
fn unknown_fields_merge_as_plain_json() {
    let original = json!({"spec": {"future": {"a": {"b": 1}, "list": [{"name": "x"}]}}});
    let patched = apply_strategic_merge_patch(
        &original,
        &json!({"spec": {"future": {"a": {"c": 2}, "list": [{"name": "y"}]}}}),
        pod_type(),
    )
    .unwrap();
    assert_eq!(
        patched,
        json!({"spec": {"future": {"a": {"b": 1, "c": 2}, "list": [{"name": "y"}]}}})
    );
}

#[test]
fn untyped_documents_patch_like_json_merge_patch() {
    let original = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x"});
    let patch = json!({"a": {"b": null, "c": [3]}, "d": {"e": true}});
    let patched = apply_strategic_merge_patch(&original, &patch, TypeRef::UNTYPED).unwrap();
    assert_eq!(patched, json!({"a": {"c": [3]}, "d": {"e": true}}));
}

#[test]
fn new_values_lose_their_nulls_and_directives() {
    let original = pod_with_containers(json!([{"name": "app"}]));
    let patched = patch_pod(
        original,
        json!({"spec": {
            "affinity": {"nodeAffinity": null, "podAntiAffinity": {"$patch": "replace", "preferredDuringSchedulingIgnoredDuringExecution": []}},
            "initContainers": [{"name": "init", "image": null}, {"name": "gone", "$patch": "delete"}],
            "containers": [{"name": "new", "env": [{"$patch": "replace"}, {"name": "A", "value": "1"}], "$setElementOrder/env": [{"name": "A"}]}],
        }}),
    );
    assert_eq!(
        patched["spec"]["affinity"],
        json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}})
    );
    assert_eq!(patched["spec"]["initContainers"], json!([{"name": "init"}]));
    assert_eq!(
        patched["spec"]["containers"][0],
        json!({"name": "new", "env": [{"name": "A", "value": "1"}]})
    );
}

#[test]
fn a_value_of_another_json_type_is_replaced() {
    let original = json!({"spec": {"containers": [{"name": "app"}], "nodeSelector": "oops"}});
    let patched = patch_pod(original, json!({"spec": {"nodeSelector": {"disk": "ssd"}}}));
    assert_eq!(patched["spec"]["nodeSelector"], json!({"disk": "ssd"}));
}

#[test]
fn merge_list_items_need_their_merge_key() {
    let original = pod_with_containers(json!([{"name": "app"}]));
    let err = pod_err(original, json!({"spec": {"containers": [{"image": "x"}]}}));
    assert_eq!(
        err.to_string(),
        "list item at spec.containers lacks its merge key \"name\""
    );
}

#[test]
fn merge_lists_of_mixed_types_are_refused() {
    let original = json!({"metadata": {"finalizers": ["a"]}});
    let err = pod_err(original, json!({"metadata": {"finalizers": [{"x": 1}]}}));
    assert!(
        matches!(&err, PatchError::UnmergeableList { path, .. } if path == "metadata.finalizers"),
        "{err}"
    );
}

#[test]
fn errors_name_the_list_item() {
    let original = pod_with_containers(json!([{"name": "app", "env": [{"name": "A"}]}]));
    let err = pod_err(
        original,
        json!({"spec": {"containers": [{"name": "app", "env": [{"value": "1"}]}]}}),
    );
    assert_eq!(
        err,
        PatchError::MissingMergeKey {
            path: "spec.containers[name=\"app\"].env".into(),
            key: "name".into()
        }
    );
}

#[test]
fn documents_must_be_objects() {
    assert_eq!(
        apply_strategic_merge_patch(&json!({}), &json!([1]), pod_type()),
        Err(PatchError::NotAnObject("patch"))
    );
    assert_eq!(
        apply_strategic_merge_patch(&json!(null), &json!({}), pod_type()),
        Err(PatchError::NotAnObject("original document"))
    );
}
