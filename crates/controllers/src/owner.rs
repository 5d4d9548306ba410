//! Controller ownerReferences: who controls an object, building the reference a
//! controller puts on what it creates, and the merge patches that adopt an orphan or
//! release an object that no longer matches its owner's selector.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::serde_json::{Value, json};
use kube::{Resource, ResourceExt};

/// The ownerReference with `controller: true`, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// The reference an owner puts on what it controls; `blockOwnerDeletion` makes a
/// foreground deletion of the owner wait for it.
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A merge patch that makes `owner` the controller of `obj`. The resourceVersion makes it
/// a compare-and-swap: if the object changed since it was cached, the patch fails with a
/// conflict and the owner looks again.
pub fn adopt_patch<O: Resource<DynamicType = ()>>(obj: &ObjectMeta, owner: &O) -> Value {
    let mut refs: Vec<OwnerReference> = obj.owner_references.clone().unwrap_or_default();
    refs.push(controller_ref(owner));
    json!({"metadata": {"ownerReferences": refs, "resourceVersion": obj.resource_version}})
}

/// A merge patch that removes the references to `owner_uids` from the object's
/// ownerReferences (compare-and-swap on the resourceVersion, as [`adopt_patch`]).
pub fn release_patch(obj: &ObjectMeta, owner_uids: &[&str]) -> Value {
    let refs: Vec<&OwnerReference> = obj
        .owner_references
        .iter()
        .flatten()
        .filter(|r| !owner_uids.contains(&r.uid.as_str()))
        .collect();
    json!({"metadata": {"ownerReferences": refs, "resourceVersion": obj.resource_version}})
}

/// `namespace/name`, the work-queue key of an object.
pub fn key_of(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// Splits a work-queue key into namespace and name.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}
