//! Properties of [`apply`] over random configurations: applying twice is applying once,
//! a sole applier's object is exactly its last configuration, appliers of disjoint
//! fields or set items never conflict and keep each other's, and changing another
//! applier's field conflicts unless forced. Also: field sets survive their `FieldsV1`
//! form.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::path::PathElement;
use super::set::Set;
use super::{ApplyError, Endpoint, Manager, apply};

const CONFIG_MAP: Endpoint = Endpoint::new("", "v1", "ConfigMap");
const DEPLOYMENT: Endpoint = Endpoint::new("apps", "v1", "Deployment");
const T1: &str = "2024-05-01T10:00:00Z";
const T2: &str = "2024-05-01T11:00:00Z";

fn manager(name: &'static str, time: &'static str) -> Manager<'static> {
    Manager { name, time }
}

fn string_map(keys: &'static str) -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(keys, "[a-z0-9]{0,3}", 0..6)
}

fn config_map(labels: &BTreeMap<String, String>, data: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "labels": labels},
        "data": data,
    })
}

/// A Deployment with containers named from a small pool, each with some ports (by
/// number, protocol sometimes spelled out) and env vars.
fn deployment() -> impl Strategy<Value = Value> {
    let port = (
        prop::sample::select(vec![80, 443, 8080]),
        prop::option::of(prop::sample::select(vec!["TCP", "UDP"])),
    );
    let container = (
        prop::sample::select(vec!["web", "log", "side"]),
        "[a-z]{1,3}",
        prop::collection::btree_map(port.0, port.1, 0..3),
        prop::collection::btree_map("E[1-3]", "[a-z]{0,2}", 0..3),
    );
    (1..4i64, prop::collection::vec(container, 0..4)).prop_map(|(replicas, containers)| {
        let mut seen = BTreeSet::new();
        let containers: Vec<Value> = containers
            .into_iter()
            .filter(|(name, ..)| seen.insert(*name))
            .map(|(name, image, ports, env)| {
                let ports: Vec<Value> = ports
                    .into_iter()
                    .map(|(port, protocol)| match protocol {
                        Some(protocol) => json!({"containerPort": port, "protocol": protocol}),
                        None => json!({"containerPort": port}),
                    })
                    .collect();
                let env: Vec<Value> = env
                    .into_iter()
                    .map(|(name, value)| json!({"name": name, "value": value}))
                    .collect();
                let mut container = json!({"name": name, "image": image});
                // A list emptied by pruning is dropped, not left `[]`: generate none.
                if !ports.is_empty() {
                    container["ports"] = json!(ports);
                }
                if !env.is_empty() {
                    container["env"] = json!(env);
                }
                container
            })
            .collect();
        let mut pod = json!({});
        if !containers.is_empty() {
            pod["containers"] = json!(containers);
        }
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {"replicas": replicas, "template": {"spec": pod}},
        })
    })
}

fn without_managed_fields(object: &Value) -> Value {
    let mut object = object.clone();
    object["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("managedFields");
    object
}

proptest! {
    #[test]
    fn applying_twice_is_applying_once(config in deployment()) {
        let once = apply(&DEPLOYMENT, None, &config, &manager("a", T1), false).unwrap();
        let twice = apply(&DEPLOYMENT, Some(&once), &config, &manager("a", T2), false).unwrap();
        prop_assert_eq!(&twice, &once);
        prop_assert_eq!(without_managed_fields(&once), config);
    }

    #[test]
    fn a_sole_applier_gets_its_last_configuration(first in deployment(), second in deployment()) {
        let live = apply(&DEPLOYMENT, None, &first, &manager("a", T1), false).unwrap();
        let object = apply(&DEPLOYMENT, Some(&live), &second, &manager("a", T2), false).unwrap();
        prop_assert_eq!(without_managed_fields(&object), second);
    }

    #[test]
    fn appliers_of_disjoint_keys_keep_each_others(
        a_labels in string_map("a[0-9]"),
        a_data in string_map("a[0-9]"),
        b_labels in string_map("b[0-9]"),
        b_data in string_map("b[0-9]"),
        a_again in string_map("a[0-9]"),
    ) {
        let live = apply(&CONFIG_MAP, None, &config_map(&a_labels, &a_data), &manager("a", T1), false)
            .unwrap();
        let live = apply(&CONFIG_MAP, Some(&live), &config_map(&b_labels, &b_data), &manager("b", T1), false)
            .unwrap();
        // A re-applies with other data: B's keys stay, A's are exactly the new ones.
        let object = apply(&CONFIG_MAP, Some(&live), &config_map(&a_labels, &a_again), &manager("a", T2), false)
            .unwrap();
        let mut data = b_data.clone();
        data.extend(a_again);
        let mut labels = b_labels.clone();
        labels.extend(a_labels);
        let data_json = serde_json::to_value(&data).unwrap();
        let labels_json = serde_json::to_value(&labels).unwrap();
        prop_assert_eq!(&object["data"], &data_json);
        prop_assert_eq!(&object["metadata"]["labels"], &labels_json);
    }

    #[test]
    fn finalizers_of_two_appliers_are_their_union(
        a in prop::collection::btree_set("f[0-5]", 0..4),
        b in prop::collection::btree_set("f[0-5]", 0..4),
    ) {
        let with = |finalizers: &BTreeSet<String>| json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "finalizers": finalizers},
        });
        let live = apply(&CONFIG_MAP, None, &with(&a), &manager("a", T1), false).unwrap();
        let object = apply(&CONFIG_MAP, Some(&live), &with(&b), &manager("b", T2), false).unwrap();
        let finalizers: BTreeSet<String> = object["metadata"]
            .get("finalizers")
            .map(|f| serde_json::from_value(f.clone()).unwrap())
            .unwrap_or_default();
        prop_assert_eq!(finalizers, a.union(&b).cloned().collect::<BTreeSet<_>>());
    }

    #[test]
    fn changing_anothers_value_conflicts_unless_forced(
        data in string_map("[a-c]"),
        key in "[a-c]",
        value in "[a-z0-9]{0,3}",
    ) {
        let live = apply(&CONFIG_MAP, None, &config_map(&BTreeMap::new(), &data), &manager("a", T1), false)
            .unwrap();
        let mut theirs = BTreeMap::new();
        theirs.insert(key.clone(), value.clone());
        let config = config_map(&BTreeMap::new(), &theirs);
        let result = apply(&CONFIG_MAP, Some(&live), &config, &manager("b", T2), false);
        match data.get(&key) {
            Some(current) if *current != value => {
                let Err(ApplyError::Conflicts(conflicts)) = result else {
                    return Err(TestCaseError::fail("expected a conflict"));
                };
                prop_assert_eq!(conflicts.len(), 1);
                prop_assert_eq!(&conflicts[0].field, &format!(".data.{key}"));
                let forced = apply(&CONFIG_MAP, Some(&live), &config, &manager("b", T2), true).unwrap();
                prop_assert_eq!(&forced["data"][&key], &json!(value));
            }
            _ => prop_assert!(result.is_ok()),
        }
    }

    #[test]
    fn field_sets_survive_fields_v1(
        paths in prop::collection::vec(
            prop::collection::vec(
                prop_oneof![
                    "[a-c]".prop_map(PathElement::Field),
                    "[a-c]".prop_map(|v| PathElement::Value(json!(v))),
                    (0..3i64).prop_map(|n| PathElement::Key(vec![("name".into(), json!(n))])),
                ],
                1..4,
            ),
            0..8,
        ),
    ) {
        let mut set = Set::new();
        for path in &paths {
            set.insert(path);
        }
        prop_assert_eq!(Set::from_fields_v1(&set.to_fields_v1()).unwrap(), set);
    }
}
