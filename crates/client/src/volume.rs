//! Which volume a claim gets, as the PersistentVolume controller and the scheduler's
//! VolumeBinding both decide it: upstream's `FindMatchingVolume`. A volume pre-bound to
//! the claim (its `claimRef` names the claim) wins if it fits; otherwise the smallest
//! free volume of the claim's class, volume mode, access modes, selector, size and (once
//! the node is known) node affinity.

use k8s_openapi::api::core::v1::{
    Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::selector::{NodeSelectorMatcher, Selector};

/// On a claim: binding is complete (both halves written).
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// On a volume or claim: the controller (not a user) made this half of the binding.
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// On a claim: which provisioner is asked to create its volume.
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// On a claim of a WaitForFirstConsumer class: the node the scheduler chose.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// On a volume: the provisioner that created it (and deletes it).
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// The storage class annotation that predates `storageClassName` (still honoured first).
pub const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// A claim's storage class, as upstream's `GetPersistentVolumeClaimClass` reads it.
pub fn claim_class(claim: &PersistentVolumeClaim) -> &str {
    class(
        &claim.metadata,
        claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref()),
    )
}

/// A volume's storage class (`GetPersistentVolumeClass`).
pub fn volume_class(volume: &PersistentVolume) -> &str {
    class(
        &volume.metadata,
        volume
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref()),
    )
}

/// The beta annotation first, then `storageClassName`.
fn class<'a>(meta: &'a ObjectMeta, named: Option<&'a str>) -> &'a str {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(BETA_CLASS))
        .map(String::as_str)
        .or(named)
        .unwrap_or_default()
}

/// Whether the volume may be used on `node` (its required node affinity matches).
pub fn fits_node(volume: &PersistentVolume, node: &Node) -> bool {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .is_none_or(|required| NodeSelectorMatcher::parse(required).matches(node))
}

/// The bytes of a storage quantity (0 when unparsable).
pub fn storage_bytes(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> i64 {
    q.and_then(|q| krust_api::quantity::scaled_value(&q.0, 0).ok())
        .unwrap_or(0)
}

/// The annotation that makes a StorageClass the default.
pub const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// The default StorageClass: of those annotated as default, the newest (then by name),
/// as upstream picks it.
pub fn default_class<'a>(
    classes: impl IntoIterator<Item = &'a k8s_openapi::api::storage::v1::StorageClass>,
) -> Option<&'a k8s_openapi::api::storage::v1::StorageClass> {
    classes
        .into_iter()
        .filter(|c| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS))
                .is_some_and(|v| v == "true")
        })
        .max_by(|a, b| {
            let created = |c: &k8s_openapi::api::storage::v1::StorageClass| {
                c.metadata.creation_timestamp.as_ref().map(|t| t.0)
            };
            (created(a), &b.metadata.name).cmp(&(created(b), &a.metadata.name))
        })
}

/// The name of the VolumeAttachment of a CSI volume to a node, as upstream's
/// attach/detach controller and kubelet name it: `csi-<sha256(handle + driver + node)>`.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    use sha2::{Digest, Sha256};
    format!(
        "csi-{:x}",
        Sha256::digest(format!("{handle}{driver}{node}").as_bytes())
    )
}

/// What a claim asks for.
pub fn requested(claim: &PersistentVolumeClaim) -> i64 {
    storage_bytes(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
    )
}

/// What a volume holds.
pub fn capacity(volume: &PersistentVolume) -> i64 {
    storage_bytes(
        volume
            .spec
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage")),
    )
}

/// The claim a pod volume uses: the one it names, or for a generic ephemeral volume the
/// one the ephemeral volume controller makes for it, `<pod>-<volume>`.
pub fn volume_claim(pod_name: &str, volume: &Volume) -> Option<String> {
    if let Some(claim) = &volume.persistent_volume_claim {
        return Some(claim.claim_name.clone());
    }
    volume
        .ephemeral
        .as_ref()
        .map(|_| ephemeral_claim_name(pod_name, &volume.name))
}

/// The claim of a pod's generic ephemeral volume.
pub fn ephemeral_claim_name(pod_name: &str, volume: &str) -> String {
    format!("{pod_name}-{volume}")
}

/// The names of the claims a pod's volumes use.
pub fn pod_claims(pod: &Pod) -> Vec<String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| volume_claim(name, v))
        .collect()
}

/// The `claimRef` that binds a volume to `claim` (with its UID).
pub fn claim_ref(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// Whether the volume's `claimRef` names this claim (by namespace and name, and by UID
/// when the reference has one).
pub fn refers_to(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let Some(r) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    r.namespace == claim.metadata.namespace
        && r.name == claim.metadata.name
        && r.uid
            .as_ref()
            .is_none_or(|uid| uid.is_empty() || Some(uid) == claim.metadata.uid.as_ref())
}

fn mode(m: Option<&String>) -> &str {
    m.map_or("Filesystem", String::as_str)
}

/// Whether `volume` can serve `claim` at all (class, mode, access modes, selector, size).
pub fn satisfies(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let (Some(vspec), Some(cspec)) = (volume.spec.as_ref(), claim.spec.as_ref()) else {
        return false;
    };
    if volume_class(volume) != claim_class(claim)
        || mode(vspec.volume_mode.as_ref()) != mode(cspec.volume_mode.as_ref())
        || capacity(volume) < requested(claim)
    {
        return false;
    }
    let offered = vspec.access_modes.as_deref().unwrap_or_default();
    if !cspec
        .access_modes
        .iter()
        .flatten()
        .all(|m| offered.contains(m))
    {
        return false;
    }
    match &cspec.selector {
        None => true,
        Some(sel) => Selector::parse(Some(sel))
            .is_ok_and(|s| s.matches(crate::selector::labels_or_empty(&volume.metadata.labels))),
    }
}

/// Where a claim is to be bound.
#[derive(Clone, Copy)]
pub enum Placement<'a> {
    /// Anywhere (an Immediate class).
    Anywhere,
    /// Not yet known (a WaitForFirstConsumer class before scheduling): only volumes
    /// pre-bound to the claim qualify; the scheduler picks the others with the node.
    Undecided,
    /// On this node: free volumes must be usable there.
    On(&'a Node),
}

/// The volume a claim should be bound to.
pub fn best_match<'a>(
    claim: &PersistentVolumeClaim,
    volumes: impl IntoIterator<Item = &'a PersistentVolume>,
    placement: Placement<'_>,
) -> Option<&'a PersistentVolume> {
    let mut best: Option<&PersistentVolume> = None;
    for volume in volumes {
        if volume.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let claim_ref = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        if claim_ref.is_some() {
            if refers_to(volume, claim) && satisfies(volume, claim) {
                return Some(volume);
            }
            continue;
        }
        let placeable = match placement {
            Placement::Anywhere => true,
            Placement::Undecided => false,
            Placement::On(node) => fits_node(volume, node),
        };
        if !placeable || !satisfies(volume, claim) {
            continue;
        }
        // A free volume must be Available (not Released or Failed with a stale state).
        let phase = volume.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Released" | "Failed")) {
            continue;
        }
        if best.is_none_or(|b| capacity(volume) < capacity(b)) {
            best = Some(volume);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    #[test]
    fn attachment_names_are_upstreams() {
        // sha256("vol-1" + "example.com/csi" + "node-a").
        assert_eq!(
            super::attachment_name("vol-1", "example.com/csi", "node-a"),
            "csi-62db87d76009bb8e3f76d57c6932e6f0f3aa588830b6bd7cda9aa94838d0bb36"
        );
    }

    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::serde_json::{self, json};

    fn volume(name: &str, size: &str, class: &str, modes: &[&str]) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"tier": name}},
            "spec": {"capacity": {"storage": size}, "accessModes": modes,
                "storageClassName": class, "hostPath": {"path": "/x"}},
            "status": {"phase": "Available"}
        }))
        .unwrap()
    }

    fn claim(size: &str, class: &str, modes: &[&str]) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "ns", "uid": "u1"},
            "spec": {"resources": {"requests": {"storage": size}}, "accessModes": modes,
                "storageClassName": class}
        }))
        .unwrap()
    }

    #[test]
    fn the_smallest_volume_that_fits_wins() {
        let vols = [
            volume("big", "10Gi", "", &["ReadWriteOnce"]),
            volume("small", "1Gi", "", &["ReadWriteOnce"]),
            volume("fit", "2Gi", "", &["ReadWriteOnce", "ReadOnlyMany"]),
            volume("other-class", "2Gi", "fast", &["ReadWriteOnce"]),
            volume("read-only", "2Gi", "", &["ReadOnlyMany"]),
        ];
        let c = claim("1500Mi", "", &["ReadWriteOnce"]);
        assert_eq!(
            best_match(&c, &vols, Placement::Anywhere)
                .unwrap()
                .metadata
                .name
                .as_deref(),
            Some("fit")
        );
        let c = claim("20Gi", "", &["ReadWriteOnce"]);
        assert!(best_match(&c, &vols, Placement::Anywhere).is_none());
        // An undecided claim takes no free volume.
        let c = claim("1Gi", "", &["ReadWriteOnce"]);
        assert!(best_match(&c, &vols, Placement::Undecided).is_none());
    }

    #[test]
    fn a_prebound_volume_wins_and_volumes_bound_elsewhere_are_skipped() {
        let mut mine = volume("mine", "5Gi", "", &["ReadWriteOnce"]);
        mine.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: Some("ns".into()),
            name: Some("data".into()),
            ..Default::default()
        });
        let mut theirs = volume("theirs", "1Gi", "", &["ReadWriteOnce"]);
        theirs.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: Some("ns".into()),
            name: Some("data".into()),
            uid: Some("another".into()),
            ..Default::default()
        });
        let free = volume("free", "1Gi", "", &["ReadWriteOnce"]);
        let c = claim("1Gi", "", &["ReadWriteOnce"]);
        let vols = [theirs, free, mine];
        assert_eq!(
            best_match(&c, &vols, Placement::Undecided)
                .unwrap()
                .metadata
                .name
                .as_deref(),
            Some("mine")
        );
    }

    #[test]
    fn selectors_pick_by_volume_labels() {
        let vols = [
            volume("gold", "1Gi", "", &["ReadWriteOnce"]),
            volume("silver", "1Gi", "", &["ReadWriteOnce"]),
        ];
        let mut c = claim("1Gi", "", &["ReadWriteOnce"]);
        c.spec.as_mut().unwrap().selector =
            Some(serde_json::from_value(json!({"matchLabels": {"tier": "silver"}})).unwrap());
        assert_eq!(
            best_match(&c, &vols, Placement::Anywhere)
                .unwrap()
                .metadata
                .name
                .as_deref(),
            Some("silver")
        );
    }
}
