//! The `pod-template-hash`: names a Deployment's ReplicaSet for one pod template and
//! keeps the pods of different templates apart in selectors.
//!
//! Upstream hashes the Go struct dump of the template with FNV-32a; that dump cannot be
//! reproduced outside Go, so krust hashes the template's canonical JSON instead (fields
//! in k8s-openapi's declaration order, maps sorted by key, the `pod-template-hash` label
//! left out) with the same FNV-32a, adds the `collisionCount` the same way, and encodes
//! the result with upstream's `SafeEncodeString` alphabet. The values therefore look like
//! upstream's (`web-7d9c5b8f6c`) and are stable for a given template, but differ from the
//! ones upstream computes. Nothing compares hashes across implementations: which
//! ReplicaSet belongs to a template is decided by comparing templates, as upstream does.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::serde_json;

pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

fn fnv32a(bytes: &[u8], mut hash: u32) -> u32 {
    for b in bytes {
        hash ^= *b as u32;
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The hash of `template` (ignoring its own `pod-template-hash` label) and
/// `collision_count`.
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let canonical = serde_json::to_vec(&without_hash(template)).expect("templates serialize");
    let mut hash = fnv32a(&canonical, 0x811c_9dc5);
    if let Some(c) = collision_count {
        hash = fnv32a(&(c as u32).to_le_bytes(), hash);
    }
    krust_api::names::safe_encode(hash.to_string().bytes())
}

/// The template without the `pod-template-hash` label (and without an empty label map).
pub fn without_hash(template: &PodTemplateSpec) -> PodTemplateSpec {
    let mut t = template.clone();
    if let Some(meta) = t.metadata.as_mut()
        && let Some(labels) = meta.labels.as_mut()
    {
        labels.remove(POD_TEMPLATE_HASH);
        if labels.is_empty() {
            meta.labels = None;
        }
    }
    t
}

/// Templates equal but for the `pod-template-hash` label (upstream's `EqualIgnoreHash`):
/// how a Deployment finds the ReplicaSet of its current template, including after
/// `kubectl rollout undo` copied an old ReplicaSet's template back.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    without_hash(a) == without_hash(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn template(image: &str, hash: Option<&str>) -> PodTemplateSpec {
        let mut labels = std::collections::BTreeMap::from([("app".to_string(), "web".to_string())]);
        if let Some(h) = hash {
            labels.insert(POD_TEMPLATE_HASH.into(), h.into());
        }
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_hash_is_stable_and_uses_the_safe_alphabet() {
        let h = compute_hash(&template("nginx:1", None), None);
        assert_eq!(h, compute_hash(&template("nginx:1", None), None));
        assert!(!h.is_empty() && h.len() <= 10, "{h}");
        assert!(
            h.bytes()
                .all(|b| krust_api::names::SAFE_ALPHABET.contains(&b)),
            "{h}"
        );
    }

    #[test]
    fn the_hash_ignores_its_own_label_and_changes_with_template_and_collisions() {
        let plain = compute_hash(&template("nginx:1", None), None);
        assert_eq!(
            plain,
            compute_hash(&template("nginx:1", Some(&plain)), None)
        );
        assert_ne!(plain, compute_hash(&template("nginx:2", None), None));
        assert_ne!(plain, compute_hash(&template("nginx:1", None), Some(1)));
    }

    #[test]
    fn templates_compare_equal_ignoring_the_hash_label() {
        assert!(equal_ignore_hash(
            &template("a", Some("x")),
            &template("a", None)
        ));
        assert!(!equal_ignore_hash(
            &template("a", Some("x")),
            &template("b", Some("x"))
        ));
    }
}
