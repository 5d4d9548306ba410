//! VolumeRestrictions, as upstream's plugin for the volumes krust serves: a claim with
//! the `ReadWriteOncePod` access mode is used by one pod in the whole cluster, so a
//! pod whose claim another pod already uses fits no node until that pod goes (which
//! preemption may arrange: the conflicting pods are tracked through AddPod/RemovePod).

use std::collections::HashSet;

use krust_client::volume::pod_claims;

use crate::framework::{
    CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, PreFilterPlugin, PreFilterResult,
    Snapshot, Status,
};

pub const NAME: &str = "VolumeRestrictions";
pub const ERR_REASON_READ_WRITE_ONCE_POD_CONFLICT: &str =
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode";

pub struct VolumeRestrictions;

impl Plugin for VolumeRestrictions {
    fn name(&self) -> &'static str {
        NAME
    }
}

/// The pod's ReadWriteOncePod claims (`namespace/name`), and how many uses of them by
/// other pods there are.
#[derive(Clone, Default)]
struct Conflicts {
    claims: HashSet<String>,
    uses: usize,
}

/// The `namespace/name` of each claim a pod uses.
fn claim_keys(pod: &PodInfo) -> impl Iterator<Item = String> + '_ {
    let ns = pod.pod.metadata.namespace.as_deref().unwrap_or_default();
    pod_claims(&pod.pod)
        .into_iter()
        .map(move |c| format!("{ns}/{c}"))
}

impl Conflicts {
    fn uses_of(&self, other: &PodInfo) -> usize {
        claim_keys(other)
            .filter(|k| self.claims.contains(k))
            .count()
    }
}

impl PreFilterPlugin for VolumeRestrictions {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let storage = snapshot.storage();
        let ns = pod.pod.metadata.namespace.clone().unwrap_or_default();
        let claims: HashSet<String> = pod_claims(&pod.pod)
            .into_iter()
            .filter(|name| {
                storage
                    .claims
                    .get(&(ns.clone(), name.clone()))
                    .and_then(|c| c.spec.as_ref()?.access_modes.as_ref())
                    .is_some_and(|modes| modes.iter().any(|m| m == "ReadWriteOncePod"))
            })
            .map(|name| format!("{ns}/{name}"))
            .collect();
        if claims.is_empty() {
            return (None, Status::skip());
        }
        let mut conflicts = Conflicts { claims, uses: 0 };
        let me = pod.pod.metadata.uid.as_deref();
        conflicts.uses = snapshot
            .nodes()
            .iter()
            .flat_map(|n| n.pods())
            .filter(|p| p.pod.metadata.uid.as_deref() != me)
            .map(|p| conflicts.uses_of(p))
            .sum();
        state.write(conflicts);
        (None, Status::success())
    }

    fn add_pod(
        &self,
        state: &mut CycleState,
        _pod: &PodInfo,
        added: &PodInfo,
        _node: &NodeInfo,
    ) -> Status {
        if let Some(c) = state.read_mut::<Conflicts>() {
            c.uses += c.uses_of(added);
        }
        Status::success()
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        _pod: &PodInfo,
        removed: &PodInfo,
        _node: &NodeInfo,
    ) -> Status {
        if let Some(c) = state.read_mut::<Conflicts>() {
            c.uses = c.uses.saturating_sub(c.uses_of(removed));
        }
        Status::success()
    }
}

impl FilterPlugin for VolumeRestrictions {
    fn filter(&self, state: &CycleState, _pod: &PodInfo, _node: &NodeInfo) -> Status {
        match state.read::<Conflicts>() {
            Some(c) if c.uses > 0 => Status::unschedulable(ERR_REASON_READ_WRITE_ONCE_POD_CONFLICT),
            _ => Status::success(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::framework::Storage;
    use crate::testing::{filter_statuses, node, node_with, pod, snapshot};
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use serde_json::json;

    fn with_claim(name: &str, claim: &str) -> crate::testing::PodBuilder {
        pod(name).volume(json!({"name": "data", "persistentVolumeClaim": {"claimName": claim}}))
    }

    fn claim(name: &str, mode: &str) -> Arc<PersistentVolumeClaim> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap(),
        )
    }

    #[test]
    fn a_read_write_once_pod_claim_in_use_keeps_others_off_every_node() {
        let mut storage = Storage::default();
        storage.claims.insert(
            ("default".into(), "solo".into()),
            claim("solo", "ReadWriteOncePod"),
        );
        storage.claims.insert(
            ("default".into(), "shared".into()),
            claim("shared", "ReadWriteOnce"),
        );
        let mut snap = snapshot(vec![
            node_with(
                node("a"),
                vec![with_claim("user", "solo"), with_claim("other", "shared")],
            ),
            node_with(node("b"), vec![]),
        ]);
        *snap.storage_mut() = storage;
        let statuses = filter_statuses(
            Some(&VolumeRestrictions),
            &VolumeRestrictions,
            with_claim("p", "solo"),
            &snap,
        );
        assert!(
            statuses
                .iter()
                .all(|s| s.reasons() == [ERR_REASON_READ_WRITE_ONCE_POD_CONFLICT])
        );
        // ReadWriteOnce is per node, not VolumeRestrictions' business.
        let statuses = filter_statuses(
            Some(&VolumeRestrictions),
            &VolumeRestrictions,
            with_claim("p", "shared"),
            &snap,
        );
        assert!(statuses.iter().all(Status::is_success));
    }
}
