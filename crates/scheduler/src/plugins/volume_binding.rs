//! VolumeBinding: a pod's PersistentVolumeClaims decide where it may run, as upstream's
//! plugin of that name.
//!
//! - A claim that does not exist, is being deleted, or is unbound in an Immediate class
//!   (the PersistentVolume controller has not bound it yet) keeps the pod off every
//!   node until that changes.
//! - A bound claim's volume may require nodes (`spec.nodeAffinity`: local volumes):
//!   only those fit.
//! - An unbound claim of a WaitForFirstConsumer class is bound with the node: a node
//!   fits if a free volume that satisfies the claim may be used there, or if the class
//!   has a provisioner to create one — and, if the class's CSI driver reports its
//!   capacity (`storageCapacity`), a CSIStorageCapacity of the class for the node's
//!   topology holds enough. After the cycle, the scheduler writes the choice
//!   ([`volume_choices`]): the chosen volume's `claimRef`, or the claim's
//!   `volume.kubernetes.io/selected-node` for its provisioner.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use krust_client::selector::Selector;
use krust_client::volume::{
    Placement, best_match, claim_class, fits_node, pod_claims, requested, storage_bytes,
};

use crate::framework::{
    CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, PreFilterPlugin, PreFilterResult,
    Snapshot, Status, Storage,
};

pub const NAME: &str = "VolumeBinding";
pub const ERR_REASON_UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
pub const ERR_REASON_NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";
pub const ERR_REASON_BIND_CONFLICT: &str =
    "node(s) didn't find available persistent volumes to bind";
pub const ERR_REASON_NOT_ENOUGH_SPACE: &str = "node(s) did not have enough free storage";
/// The provisioner of classes whose volumes are made by hand (local volumes).
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

pub struct VolumeBinding;

impl Plugin for VolumeBinding {
    fn name(&self) -> &'static str {
        NAME
    }
}

/// What PreFilter found: the volumes of the bound claims, and the claims to be bound
/// with the node (each with its class).
#[derive(Clone, Default)]
struct PodVolumes {
    bound: Vec<Arc<PersistentVolume>>,
    delayed: Vec<Delayed>,
    /// Every free volume, for the delayed claims to choose from.
    free: Vec<Arc<PersistentVolume>>,
}

/// A claim to be bound with the node.
#[derive(Clone)]
struct Delayed {
    claim: Arc<PersistentVolumeClaim>,
    class: Arc<StorageClass>,
    /// The class's capacities, if its driver reports them.
    capacities: Option<Vec<Arc<CSIStorageCapacity>>>,
}

impl Delayed {
    fn new(storage: &Storage, claim: Arc<PersistentVolumeClaim>, class: Arc<StorageClass>) -> Self {
        let tracked = storage
            .drivers
            .get(&class.provisioner)
            .is_some_and(|d| d.spec.storage_capacity == Some(true));
        let capacities = tracked.then(|| {
            let name = class.metadata.name.as_deref().unwrap_or_default();
            storage
                .capacities
                .values()
                .filter(|c| c.storage_class_name == name)
                .cloned()
                .collect()
        });
        Delayed {
            claim,
            class,
            capacities,
        }
    }

    /// Whether a provisioner may make the claim's volume on the node: capacity that
    /// is not tracked is assumed.
    fn provisionable_on(&self, node: &k8s_openapi::api::core::v1::Node) -> bool {
        let Some(capacities) = &self.capacities else {
            return true;
        };
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let wanted = requested(&self.claim);
        capacities.iter().any(|c| {
            let size = storage_bytes(c.maximum_volume_size.as_ref().or(c.capacity.as_ref()));
            size >= wanted
                && Selector::parse(c.node_topology.as_ref()).is_ok_and(|s| s.matches(&labels))
        })
    }
}

/// Why a claim the pod needs is missing: an ephemeral volume's claim is still to be
/// made by the ephemeral volume controller.
fn missing(pod: &Pod, name: &str) -> String {
    let ephemeral = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| {
            v.ephemeral.is_some()
                && krust_client::volume::volume_claim(
                    pod.metadata.name.as_deref().unwrap_or_default(),
                    v,
                )
                .as_deref()
                    == Some(name)
        });
    if ephemeral {
        format!(
            "waiting for ephemeral volume controller to create the persistentvolumeclaim \"{name}\""
        )
    } else {
        format!("persistentvolumeclaim \"{name}\" not found")
    }
}

/// The class of an unbound claim if it binds with the node (WaitForFirstConsumer).
fn delayed_class(storage: &Storage, claim: &PersistentVolumeClaim) -> Option<Arc<StorageClass>> {
    let class = storage.classes.get(claim_class(claim))?;
    (class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")).then(|| class.clone())
}

fn is_bound(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
}

impl PreFilterPlugin for VolumeBinding {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let storage = snapshot.storage();
        let namespace = pod.pod.metadata.namespace.clone().unwrap_or_default();
        let mut found = PodVolumes::default();
        let names = pod_claims(&pod.pod);
        if names.is_empty() {
            return (None, Status::skip());
        }
        for name in &names {
            let Some(claim) = storage.claims.get(&(namespace.clone(), name.clone())) else {
                return (None, Status::unresolvable(missing(&pod.pod, name)));
            };
            if claim.metadata.deletion_timestamp.is_some() {
                return (
                    None,
                    Status::unresolvable(format!(
                        "persistentvolumeclaim \"{name}\" is being deleted"
                    )),
                );
            }
            match is_bound(claim) {
                Some(volume) => match storage.volumes.get(volume) {
                    Some(pv) => found.bound.push(pv.clone()),
                    None => {
                        return (
                            None,
                            Status::unresolvable(format!(
                                "pvc(s) bound to non-existent pv(s): {volume}"
                            )),
                        );
                    }
                },
                None => match delayed_class(storage, claim) {
                    Some(class) => found
                        .delayed
                        .push(Delayed::new(storage, claim.clone(), class)),
                    None => return (None, Status::unresolvable(ERR_REASON_UNBOUND_IMMEDIATE)),
                },
            }
        }
        if !found.delayed.is_empty() {
            found.free = storage
                .volumes
                .values()
                .filter(|v| v.spec.as_ref().is_none_or(|s| s.claim_ref.is_none()))
                .cloned()
                .collect();
        }
        state.write(found);
        (None, Status::success())
    }
}

impl FilterPlugin for VolumeBinding {
    fn filter(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(found) = state.read::<PodVolumes>() else {
            return Status::success();
        };
        if !found.bound.iter().all(|pv| fits_node(pv, node.node())) {
            return Status::unresolvable(ERR_REASON_NODE_CONFLICT);
        }
        let mut short_of_space = false;
        let placeable = found.delayed.iter().all(|d| {
            let free = best_match(
                &d.claim,
                found.free.iter().map(|v| &**v),
                Placement::On(node.node()),
            )
            .is_some();
            let provisioned = d.class.provisioner != NO_PROVISIONER;
            let fits = free || (provisioned && d.provisionable_on(node.node()));
            short_of_space |= !fits && provisioned;
            fits
        });
        if placeable {
            Status::success()
        } else if short_of_space {
            Status::unschedulable(ERR_REASON_NOT_ENOUGH_SPACE)
        } else {
            Status::unschedulable(ERR_REASON_BIND_CONFLICT)
        }
    }
}

/// How the scheduler binds a pod's WaitForFirstConsumer claims on its node.
#[derive(Debug, PartialEq)]
pub enum VolumeChoice {
    /// Bind this free volume to the claim (set its `claimRef`).
    Volume {
        volume: Arc<PersistentVolume>,
        claim: Arc<PersistentVolumeClaim>,
    },
    /// Ask the class's provisioner for a volume on the node.
    Provision(Arc<PersistentVolumeClaim>),
}

/// The choices for a pod scheduled on `node`: for each unbound claim of a
/// WaitForFirstConsumer class, the smallest free volume usable there, else
/// provisioning. Two claims of one pod never get the same volume.
pub fn volume_choices(storage: &Storage, pod: &Pod, node: &NodeInfo) -> Vec<VolumeChoice> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut free: Vec<&PersistentVolume> = storage
        .volumes
        .values()
        .filter(|v| v.spec.as_ref().is_none_or(|s| s.claim_ref.is_none()))
        .map(|v| &**v)
        .collect();
    let mut choices = Vec::new();
    for name in pod_claims(pod) {
        let Some(claim) = storage.claims.get(&(namespace.clone(), name)) else {
            continue;
        };
        if is_bound(claim).is_some() || delayed_class(storage, claim).is_none() {
            continue;
        }
        match best_match(claim, free.iter().copied(), Placement::On(node.node())) {
            Some(pv) => {
                let name = pv.metadata.name.clone();
                free.retain(|v| v.metadata.name != name);
                choices.push(VolumeChoice::Volume {
                    volume: storage.volumes[name.as_deref().unwrap_or_default()].clone(),
                    claim: claim.clone(),
                });
            }
            None => choices.push(VolumeChoice::Provision(claim.clone())),
        }
    }
    choices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::testing::{filter_statuses, node, node_with, pod, snapshot};
    use serde_json::json;

    fn claim(name: &str, class: &str, volume: Option<&str>) -> Arc<PersistentVolumeClaim> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                    "resources": {"requests": {"storage": "1Gi"}}, "volumeName": volume}
            }))
            .unwrap(),
        )
    }

    fn local_volume(name: &str, node: &str, class: &str) -> Arc<PersistentVolume> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                    "capacity": {"storage": "1Gi"}, "local": {"path": "/data"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}
            }))
            .unwrap(),
        )
    }

    fn class(name: &str, provisioner: &str) -> Arc<StorageClass> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name}, "provisioner": provisioner,
                "volumeBindingMode": "WaitForFirstConsumer"
            }))
            .unwrap(),
        )
    }

    fn with_claim(name: &str) -> crate::testing::PodBuilder {
        pod("p").volume(json!({"name": "data", "persistentVolumeClaim": {"claimName": name}}))
    }

    fn cluster(storage: Storage) -> Snapshot {
        let mut snap = snapshot(vec![
            node_with(node("a").label("kubernetes.io/hostname", "a"), vec![]),
            node_with(node("b").label("kubernetes.io/hostname", "b"), vec![]),
        ]);
        *snap.storage_mut() = storage;
        snap
    }

    #[test]
    fn bound_local_volumes_pin_pods_and_unbound_immediate_claims_wait() {
        let mut storage = Storage::default();
        storage.claims.insert(
            ("default".into(), "bound".into()),
            claim("bound", "", Some("pv-b")),
        );
        storage.claims.insert(
            ("default".into(), "pending".into()),
            claim("pending", "", None),
        );
        storage
            .volumes
            .insert("pv-b".into(), local_volume("pv-b", "b", ""));
        let snap = cluster(storage);
        let statuses = filter_statuses(
            Some(&VolumeBinding),
            &VolumeBinding,
            with_claim("bound"),
            &snap,
        );
        assert_eq!(statuses[0].code(), Code::UnschedulableAndUnresolvable);
        assert_eq!(statuses[0].reasons(), [ERR_REASON_NODE_CONFLICT]);
        assert!(statuses[1].is_success());
        let statuses = filter_statuses(
            Some(&VolumeBinding),
            &VolumeBinding,
            with_claim("pending"),
            &snap,
        );
        assert!(
            statuses
                .iter()
                .all(|s| s.reasons() == [ERR_REASON_UNBOUND_IMMEDIATE])
        );
        let statuses = filter_statuses(
            Some(&VolumeBinding),
            &VolumeBinding,
            with_claim("missing"),
            &snap,
        );
        assert!(
            statuses
                .iter()
                .all(|s| s.reasons() == ["persistentvolumeclaim \"missing\" not found"])
        );
    }

    #[test]
    fn delayed_claims_go_where_a_free_volume_or_a_provisioner_is() {
        let mut storage = Storage::default();
        storage
            .classes
            .insert("local".into(), class("local", NO_PROVISIONER));
        storage
            .classes
            .insert("dynamic".into(), class("dynamic", "example.com/csi"));
        storage
            .claims
            .insert(("default".into(), "l".into()), claim("l", "local", None));
        storage
            .claims
            .insert(("default".into(), "d".into()), claim("d", "dynamic", None));
        storage
            .volumes
            .insert("pv-a".into(), local_volume("pv-a", "a", "local"));
        let snap = cluster(storage);
        let statuses =
            filter_statuses(Some(&VolumeBinding), &VolumeBinding, with_claim("l"), &snap);
        assert!(statuses[0].is_success());
        assert_eq!(statuses[1].reasons(), [ERR_REASON_BIND_CONFLICT]);
        let statuses =
            filter_statuses(Some(&VolumeBinding), &VolumeBinding, with_claim("d"), &snap);
        assert!(statuses.iter().all(Status::is_success));

        let nodes: Vec<_> = snap.nodes().to_vec();
        let chosen = volume_choices(snap.storage(), &with_claim("l").build(), &nodes[0]);
        assert!(matches!(&chosen[..], [VolumeChoice::Volume { volume, .. }]
            if volume.metadata.name.as_deref() == Some("pv-a")));
        let chosen = volume_choices(snap.storage(), &with_claim("d").build(), &nodes[1]);
        assert!(matches!(&chosen[..], [VolumeChoice::Provision(c)]
            if c.metadata.name.as_deref() == Some("d")));
    }

    #[test]
    fn drivers_that_report_capacity_get_claims_only_where_enough_is_free() {
        let mut storage = Storage::default();
        storage
            .classes
            .insert("fast".into(), class("fast", "example.com/csi"));
        storage
            .claims
            .insert(("default".into(), "d".into()), claim("d", "fast", None));
        storage.drivers.insert(
            "example.com/csi".into(),
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": "example.com/csi"},
                    "spec": {"storageCapacity": true}}))
                .unwrap(),
            ),
        );
        // Node a has 2Gi free, node b 512Mi (its largest volume), node c nothing known.
        for (node, capacity, maximum) in [("a", "2Gi", None), ("b", "10Gi", Some("512Mi"))] {
            let mut object = json!({"metadata": {"name": format!("csisc-{node}"), "namespace": "kube-system"},
                "storageClassName": "fast", "capacity": capacity,
                "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": node}}});
            if let Some(maximum) = maximum {
                object["maximumVolumeSize"] = json!(maximum);
            }
            storage.capacities.insert(
                ("kube-system".into(), format!("csisc-{node}")),
                Arc::new(serde_json::from_value(object).unwrap()),
            );
        }
        let mut snap = snapshot(vec![
            node_with(node("a").label("kubernetes.io/hostname", "a"), vec![]),
            node_with(node("b").label("kubernetes.io/hostname", "b"), vec![]),
            node_with(node("c").label("kubernetes.io/hostname", "c"), vec![]),
        ]);
        *snap.storage_mut() = storage;
        let statuses =
            filter_statuses(Some(&VolumeBinding), &VolumeBinding, with_claim("d"), &snap);
        assert!(statuses[0].is_success());
        assert_eq!(statuses[1].reasons(), [ERR_REASON_NOT_ENOUGH_SPACE]);
        assert_eq!(statuses[2].reasons(), [ERR_REASON_NOT_ENOUGH_SPACE]);

        // A driver that does not report capacity is assumed to have room.
        snap.storage_mut().drivers.clear();
        let statuses =
            filter_statuses(Some(&VolumeBinding), &VolumeBinding, with_claim("d"), &snap);
        assert!(statuses.iter().all(Status::is_success));
    }
}
