//! Persistent storage: the PersistentVolume controller ([`binder`]: claims bound to
//! volumes, phases, reclaim) and the protection controllers ([`protection`]: a claim
//! in use by a pod, or a volume bound to a claim, is not removed while it is), and the
//! claims of pods' generic ephemeral volumes ([`ephemeral`]), and CSI volumes attached
//! to the nodes whose pods use them ([`attach`]).
//!
//! Binding is two-sided, as upstream: the volume's `spec.claimRef` names the claim (with
//! its UID) and the claim's `spec.volumeName` names the volume; annotations record who
//! made each half so that a binding the controller made can be undone and one a user
//! made is kept.

pub mod attach;
pub mod binder;
pub mod ephemeral;
pub mod protection;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
pub use krust_client::volume::{
    BETA_STORAGE_PROVISIONER, BIND_COMPLETED, BOUND_BY_CONTROLLER, PROVISIONED_BY, SELECTED_NODE,
    STORAGE_PROVISIONER, claim_class, volume_class,
};

pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn set_annotation(meta: &mut ObjectMeta, key: &str, value: &str) {
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_string(), value.to_string());
}
