//! Controller ownerReferences: who controls an object, building the reference a
//! controller puts on what it creates, and the merge patches that adopt an orphan or
//! release an object that no longer matches its owner's selector.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::serde_json::{Value, json};
use kube::core::Selector;
use kube::{Resource, ResourceExt};

use crate::Error;

/// What the ownership helpers read of an object's metadata: a full `ObjectMeta`, or the
/// compact metadata of a cached pod.
pub trait Owned {
    fn namespace_and_name(&self) -> (&str, &str);
    fn owner_refs(&self) -> &[OwnerReference];
    fn version(&self) -> Option<&str>;
}

impl Owned for ObjectMeta {
    fn namespace_and_name(&self) -> (&str, &str) {
        (
            self.namespace.as_deref().unwrap_or_default(),
            self.name.as_deref().unwrap_or_default(),
        )
    }
    fn owner_refs(&self) -> &[OwnerReference] {
        self.owner_references.as_deref().unwrap_or_default()
    }
    fn version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
}

/// The ownerReference with `controller: true`, if any.
pub fn controller_of(meta: &impl Owned) -> Option<&OwnerReference> {
    meta.owner_refs()
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
pub fn adopt_patch<O: Resource<DynamicType = ()>>(obj: &impl Owned, owner: &O) -> Value {
    let mut refs: Vec<OwnerReference> = obj.owner_refs().to_vec();
    refs.push(controller_ref(owner));
    json!({"metadata": {"ownerReferences": refs, "resourceVersion": obj.version()}})
}

/// A merge patch that removes the references to `owner_uids` from the object's
/// ownerReferences (compare-and-swap on the resourceVersion, as [`adopt_patch`]).
pub fn release_patch(obj: &impl Owned, owner_uids: &[&str]) -> Value {
    let refs: Vec<&OwnerReference> = obj
        .owner_refs()
        .iter()
        .filter(|r| !owner_uids.contains(&r.uid.as_str()))
        .collect();
    json!({"metadata": {"ownerReferences": refs, "resourceVersion": obj.version()}})
}

/// `namespace/name`, the work-queue key of an object.
pub fn key_of(meta: &impl Owned) -> String {
    let (namespace, name) = meta.namespace_and_name();
    format!("{namespace}/{name}")
}

/// Splits a work-queue key into namespace and name.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// An owner's `spec.selector`, parsed (an error names the owner: `replicaset ns/name`).
pub fn parse_selector<K: Resource<DynamicType = ()>>(
    owner: &K,
    selector: LabelSelector,
) -> Result<Selector, Error> {
    Selector::try_from(selector).map_err(|e| Error::InvalidSelector {
        object: format!("{} {}", K::kind(&()).to_lowercase(), key_of(owner.meta())),
        reason: e.to_string(),
    })
}
