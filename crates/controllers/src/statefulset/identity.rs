//! A StatefulSet pod's identity, as upstream's `stateful_set_utils`: the name
//! `<set>-<ordinal>`, the hostname and the governing Service's subdomain (so that
//! `<pod>.<service>.<ns>.svc.<domain>` resolves), the `statefulset.kubernetes.io/pod-name`
//! and `apps.kubernetes.io/pod-index` labels, the revision label, and the volumes of
//! its claims (`<template>-<set>-<ordinal>`).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::history::REVISION_HASH;
use crate::owner::controller_ref;

pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// The ordinal in a pod name `<set>-<ordinal>` if the pod is a member of `set`.
pub fn ordinal_of(set: &str, pod: &str) -> Option<i32> {
    let digits = pod.strip_prefix(set)?.strip_prefix('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn pod_name(set: &str, ordinal: i32) -> String {
    format!("{set}-{ordinal}")
}

/// `spec.ordinals.start` (0 without it).
pub fn start_ordinal(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0)
}

/// The claim of a volume claim template for one pod.
pub fn claim_name(template: &str, set: &str, ordinal: i32) -> String {
    format!("{template}-{set}-{ordinal}")
}

/// `persistentVolumeClaimRetentionPolicy`: whether claims go when the set is deleted
/// (`whenDeleted`) and when their pod is scaled away (`whenScaled`); both Retain by
/// default.
pub fn claims_deleted_when(set: &StatefulSet) -> (bool, bool) {
    let policy = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    let delete = |p: Option<&String>| p.is_some_and(|p| p == "Delete");
    (
        delete(policy.and_then(|p| p.when_deleted.as_ref())),
        delete(policy.and_then(|p| p.when_scaled.as_ref())),
    )
}

/// The claims of the pod of `ordinal`, one per volume claim template, labelled with
/// the set's selector labels (upstream's `getPersistentVolumeClaims`) and owned by the
/// set when they go with it.
pub fn new_claims(set: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let set_name = set.name_any();
    let spec = set.spec.as_ref();
    let selector_labels = spec
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let (when_deleted, _) = claims_deleted_when(set);
    spec.and_then(|s| s.volume_claim_templates.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|mut claim| {
            let template = claim.metadata.name.clone().unwrap_or_default();
            claim.metadata.name = Some(claim_name(&template, &set_name, ordinal));
            claim.metadata.namespace = set.namespace();
            claim
                .metadata
                .labels
                .get_or_insert_with(Default::default)
                .extend(selector_labels.clone());
            if when_deleted {
                claim.metadata.owner_references = Some(vec![controller_ref(set)]);
            }
            claim.status = None;
            claim
        })
        .collect()
}

/// The pod of `ordinal` made from `template` (the template of the revision it gets),
/// labelled with that revision's name.
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, revision: &str, ordinal: i32) -> Pod {
    let set_name = set.name_any();
    let name = pod_name(&set_name, ordinal);
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(REVISION_HASH.into(), revision.into());
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.hostname = Some(name.clone());
    let service = set
        .spec
        .as_ref()
        .and_then(|s| s.service_name.clone())
        .filter(|s| !s.is_empty());
    if service.is_some() {
        spec.subdomain = service;
    }
    let claims = set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.clone())
        .unwrap_or_default();
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    for claim in &claims {
        let template_name = claim.metadata.name.clone().unwrap_or_default();
        let volume = Volume {
            name: template_name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&template_name, &set_name, ordinal),
                read_only: None,
            }),
            ..Default::default()
        };
        // A claim template replaces a template volume of the same name.
        volumes.retain(|v| v.name != template_name);
        volumes.push(volume);
    }
    if volumes.is_empty() {
        spec.volumes = None;
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: set.namespace(),
            labels: Some(labels),
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![controller_ref(set)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::{self, json};

    #[test]
    fn members_are_named_by_ordinal() {
        assert_eq!(ordinal_of("web", "web-0"), Some(0));
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        assert_eq!(ordinal_of("web", "web-x"), None);
        assert_eq!(ordinal_of("web", "web-"), None);
        assert_eq!(ordinal_of("web", "webby-1"), None);
        assert_eq!(ordinal_of("web", "web-1-2"), None);
        assert_eq!(ordinal_of("web-1", "web-1-2"), Some(2));
    }

    #[test]
    fn a_pod_gets_its_name_hostname_subdomain_labels_and_claims() {
        let set: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u"},
            "spec": {"serviceName": "nginx", "selector": {"matchLabels": {"app": "web"}},
                "ordinals": {"start": 5},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}],
                             "volumes": [{"name": "www", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "www"}}]}
        }))
        .unwrap();
        assert_eq!(start_ordinal(&set), 5);
        let template = set.spec.as_ref().unwrap().template.clone();
        let pod = new_pod(&set, &template, "web-abc", 6);
        assert_eq!(pod.metadata.name.as_deref(), Some("web-6"));
        let labels = pod.labels();
        assert_eq!(labels[POD_NAME_LABEL], "web-6");
        assert_eq!(labels[POD_INDEX_LABEL], "6");
        assert_eq!(labels[REVISION_HASH], "web-abc");
        assert_eq!(labels["app"], "web");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("web-6"));
        assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
        let volumes = spec.volumes.unwrap();
        assert_eq!(volumes.len(), 2);
        let www = volumes.iter().find(|v| v.name == "www").unwrap();
        assert_eq!(
            www.persistent_volume_claim.as_ref().unwrap().claim_name,
            "www-web-6"
        );
        assert_eq!(
            pod.metadata.owner_references.unwrap()[0].kind,
            "StatefulSet"
        );
    }
}
