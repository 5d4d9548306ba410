//! Properties of [`apply_strategic_merge_patch`] over random inputs: on string maps it
//! is a JSON merge patch, and merging items a list already has never changes the
//! list's length.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{apply_strategic_merge_patch, root_type};

fn string_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map("[a-z]{1,3}(/[a-z]{1,3})?", "[a-z0-9]{0,4}", 0..8)
}

/// A map patch: a string sets a key, `None` (JSON null) deletes it.
fn map_patch() -> impl Strategy<Value = BTreeMap<String, Option<String>>> {
    prop::collection::btree_map(
        "[a-z]{1,3}(/[a-z]{1,3})?",
        prop::option::of("[a-z0-9]{0,4}"),
        0..8,
    )
}

proptest! {
    #[test]
    fn labels_and_annotations_patch_like_json_merge_patch(
        labels in string_map(),
        annotations in string_map(),
        label_patch in map_patch(),
        annotation_patch in map_patch(),
    ) {
        let original = json!({
            "metadata": {"name": "web", "labels": labels, "annotations": annotations},
        });
        let patch = json!({
            "metadata": {"labels": label_patch, "annotations": annotation_patch},
        });
        let patched =
            apply_strategic_merge_patch(&original, &patch, root_type("", "v1", "Pod").unwrap())
                .unwrap();
        let mut expected = original.clone();
        json_patch::merge(&mut expected, &patch);
        prop_assert_eq!(patched, expected);
    }

    #[test]
    fn merging_existing_containers_keeps_the_list_length(
        (containers, patched_names) in prop::collection::btree_set("[a-z]{1,6}", 1..8)
            .prop_flat_map(|names| {
                let names: Vec<String> = names.into_iter().collect();
                let count = names.len();
                (
                    Just(names.clone()),
                    prop::sample::subsequence(names, 0..=count).prop_shuffle(),
                )
            }),
    ) {
        let original = json!({"spec": {"containers": containers
            .iter()
            .map(|name| json!({"name": name, "image": format!("{name}:1"), "env": [{"name": "A", "value": "1"}]}))
            .collect::<Vec<_>>()}});
        let patch = json!({"spec": {"containers": patched_names
            .iter()
            .map(|name| json!({"name": name, "image": format!("{name}:2"), "env": [{"name": "B", "value": "2"}]}))
            .collect::<Vec<_>>()}});
        let deployment_spec = json!({"spec": {"template": original}});
        let deployment_patch = json!({"spec": {"template": patch}});
        let patched = apply_strategic_merge_patch(
            &deployment_spec,
            &deployment_patch,
            root_type("apps", "v1", "Deployment").unwrap(),
        )
        .unwrap();

        let result = patched["spec"]["template"]["spec"]["containers"].as_array().unwrap();
        prop_assert_eq!(result.len(), containers.len());
        let result_names: BTreeSet<&str> =
            result.iter().map(|c| c["name"].as_str().unwrap()).collect();
        prop_assert_eq!(result_names, containers.iter().map(String::as_str).collect());
        for container in result {
            let name = container["name"].as_str().unwrap();
            let was_patched = patched_names.iter().any(|patched| patched == name);
            // A new item named alone in the patch goes first (see `order`).
            let expected_env: Value = if was_patched {
                json!([{"name": "B", "value": "2"}, {"name": "A", "value": "1"}])
            } else {
                json!([{"name": "A", "value": "1"}])
            };
            let version = if was_patched { 2 } else { 1 };
            prop_assert_eq!(&container["image"], &json!(format!("{name}:{version}")));
            prop_assert_eq!(&container["env"], &expected_env);
        }
    }
}
