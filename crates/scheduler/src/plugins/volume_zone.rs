//! VolumeZone, as upstream's plugin: a pod whose bound volumes carry zone or region
//! labels (`topology.kubernetes.io/zone`, `.../region`, and their deprecated
//! `failure-domain.beta` forms; several values joined by `__`) fits only nodes in
//! those zones. A node without any zone or region label fits (upstream's rule);
//! unbound claims are VolumeBinding's.

use std::collections::{BTreeMap, HashSet};

use krust_client::volume::pod_claims;

use crate::framework::{
    CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, PreFilterPlugin, PreFilterResult,
    Snapshot, Status,
};

pub const NAME: &str = "VolumeZone";
pub const ERR_REASON_CONFLICT: &str = "node(s) had no available volume zone";

const ZONE: &str = "topology.kubernetes.io/zone";
const REGION: &str = "topology.kubernetes.io/region";
const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
const TOPOLOGY_LABELS: [&str; 4] = [ZONE, REGION, BETA_ZONE, BETA_REGION];

/// The GA form of a label (a volume's beta label matches a node's GA one).
fn ga(key: &str) -> &str {
    match key {
        BETA_ZONE => ZONE,
        BETA_REGION => REGION,
        other => other,
    }
}

pub struct VolumeZone;

impl Plugin for VolumeZone {
    fn name(&self) -> &'static str {
        NAME
    }
}

/// What the pod's volumes require: label → the values any of which will do.
#[derive(Clone, Default)]
struct Required(Vec<(String, HashSet<String>)>);

impl PreFilterPlugin for VolumeZone {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let storage = snapshot.storage();
        let ns = pod.pod.metadata.namespace.clone().unwrap_or_default();
        let mut required = Required::default();
        for name in pod_claims(&pod.pod) {
            let volume = storage
                .claims
                .get(&(ns.clone(), name))
                .and_then(|c| c.spec.as_ref()?.volume_name.clone())
                .and_then(|v| storage.volumes.get(&v));
            let labels = volume.and_then(|v| v.metadata.labels.as_ref());
            for (key, value) in labels.into_iter().flatten() {
                if TOPOLOGY_LABELS.contains(&key.as_str()) {
                    let values = value.split("__").map(str::to_string).collect();
                    required.0.push((key.clone(), values));
                }
            }
        }
        if required.0.is_empty() {
            return (None, Status::skip());
        }
        state.write(required);
        (None, Status::success())
    }
}

impl FilterPlugin for VolumeZone {
    fn filter(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(Required(required)) = state.read::<Required>() else {
            return Status::success();
        };
        static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
        let labels = node.node().metadata.labels.as_ref().unwrap_or(&NO_LABELS);
        if !TOPOLOGY_LABELS.iter().any(|k| labels.contains_key(*k)) {
            return Status::success();
        }
        let fits = required.iter().all(|(key, values)| {
            labels
                .get(key)
                .or_else(|| labels.get(ga(key)))
                .is_some_and(|v| values.contains(v))
        });
        if fits {
            Status::success()
        } else {
            Status::unresolvable(ERR_REASON_CONFLICT)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::framework::Storage;
    use crate::testing::{filter_statuses, node, node_with, pod, snapshot};
    use serde_json::json;

    #[test]
    fn zoned_volumes_keep_pods_in_their_zones() {
        let mut storage = Storage::default();
        storage.claims.insert(
            ("default".into(), "data".into()),
            Arc::new(
                serde_json::from_value(
                    json!({"metadata": {"name": "data", "namespace": "default"},
                    "spec": {"volumeName": "pv-1"}}),
                )
                .unwrap(),
            ),
        );
        storage.volumes.insert(
            "pv-1".into(),
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": "pv-1",
                    "labels": {BETA_ZONE: "z1__z2"}},
                    "spec": {"capacity": {"storage": "1Gi"}}}))
                .unwrap(),
            ),
        );
        let mut snap = snapshot(vec![
            node_with(node("in-z1").label(ZONE, "z1"), vec![]),
            node_with(node("in-z2").label(BETA_ZONE, "z2"), vec![]),
            node_with(node("in-z3").label(ZONE, "z3"), vec![]),
            node_with(node("unzoned"), vec![]),
        ]);
        *snap.storage_mut() = storage;
        let with_claim =
            pod("p").volume(json!({"name": "d", "persistentVolumeClaim": {"claimName": "data"}}));
        let statuses = filter_statuses(Some(&VolumeZone), &VolumeZone, with_claim, &snap);
        assert!(statuses[0].is_success());
        assert!(statuses[1].is_success());
        assert_eq!(statuses[2].reasons(), [ERR_REASON_CONFLICT]);
        assert!(statuses[3].is_success(), "a node without zone labels fits");
        // No claims, nothing to do.
        let statuses = filter_statuses(Some(&VolumeZone), &VolumeZone, pod("q"), &snap);
        assert!(statuses.iter().all(Status::is_success));
    }
}
