//! The in-tree plugins and the registry that builds them by name.
//!
//! Each plugin is one file with upstream semantics, reason strings and tests.
//! A plugin is instantiated once per profile and shared by every extension
//! point it implements.

pub mod default_preemption;
pub mod image_locality;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_name;
pub mod node_ports;
pub mod node_resources;
pub mod node_unschedulable;
pub mod pod_topology_spread;
pub mod taint_toleration;
pub mod volume_binding;
pub mod volume_restrictions;
pub mod volume_zone;

use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::framework::{
    ExtensionPoint, FilterPlugin, MAX_NODE_SCORE, PostFilterPlugin, PreFilterPlugin,
    PreScorePlugin, ScorePlugin,
};

/// Upstream v1.33's default `multiPoint` set, in upstream order, with score
/// weights. PrioritySort, SchedulingGates and DefaultBinder are the caller's;
/// of the volume plugins, VolumeRestrictions (ReadWriteOncePod), VolumeBinding's
/// filters and VolumeZone are implemented (not VolumeBinding's scoring, nor the
/// per-driver volume limits).
pub const DEFAULT_PLUGINS: &[(&str, Option<i32>)] = &[
    (node_unschedulable::NAME, None),
    (node_name::NAME, None),
    (taint_toleration::NAME, Some(3)),
    (node_affinity::NAME, Some(2)),
    (node_ports::NAME, None),
    (node_resources::fit::NAME, Some(1)),
    (volume_restrictions::NAME, None),
    (volume_binding::NAME, None),
    (volume_zone::NAME, None),
    (pod_topology_spread::NAME, Some(2)),
    (inter_pod_affinity::NAME, Some(2)),
    (default_preemption::NAME, None),
    (node_resources::balanced_allocation::NAME, Some(1)),
    (image_locality::NAME, Some(1)),
];

/// One plugin instance, seen through each extension point it implements.
#[derive(Default)]
pub(crate) struct PluginExtensions {
    pub pre_filter: Option<Arc<dyn PreFilterPlugin>>,
    pub filter: Option<Arc<dyn FilterPlugin>>,
    pub post_filter: Option<Arc<dyn PostFilterPlugin>>,
    pub pre_score: Option<Arc<dyn PreScorePlugin>>,
    pub score: Option<Arc<dyn ScorePlugin>>,
}

impl PluginExtensions {
    pub(crate) fn implements(&self, point: ExtensionPoint) -> bool {
        match point {
            ExtensionPoint::PreFilter => self.pre_filter.is_some(),
            ExtensionPoint::Filter => self.filter.is_some(),
            ExtensionPoint::PostFilter => self.post_filter.is_some(),
            ExtensionPoint::PreScore => self.pre_score.is_some(),
            ExtensionPoint::Score => self.score.is_some(),
        }
    }
}

/// Whether `name` is a plugin this crate implements.
pub fn is_registered(name: &str) -> bool {
    DEFAULT_PLUGINS.iter().any(|(n, _)| *n == name)
}

/// Builds the named plugin with its args; `Ok(None)` for an unknown name.
pub(crate) fn new_plugin(
    name: &str,
    args: Option<&serde_json::Value>,
) -> Result<Option<PluginExtensions>, String> {
    use node_resources::balanced_allocation::BalancedAllocation;
    use node_resources::fit::Fit;

    let ext = match name {
        node_unschedulable::NAME => {
            parse_args::<NoArgs>(args)?;
            let p = Arc::new(node_unschedulable::NodeUnschedulable);
            PluginExtensions {
                filter: Some(p),
                ..Default::default()
            }
        }
        node_name::NAME => {
            parse_args::<NoArgs>(args)?;
            PluginExtensions {
                filter: Some(Arc::new(node_name::NodeName)),
                ..Default::default()
            }
        }
        taint_toleration::NAME => {
            parse_args::<NoArgs>(args)?;
            let p = Arc::new(taint_toleration::TaintToleration);
            PluginExtensions {
                filter: Some(p.clone()),
                pre_score: Some(p.clone()),
                score: Some(p),
                ..Default::default()
            }
        }
        node_affinity::NAME => {
            parse_args::<NoArgs>(args)?;
            let p = Arc::new(node_affinity::NodeAffinity);
            PluginExtensions {
                pre_filter: Some(p.clone()),
                filter: Some(p.clone()),
                pre_score: Some(p.clone()),
                score: Some(p),
                ..Default::default()
            }
        }
        volume_binding::NAME => {
            parse_args::<NoArgs>(args)?;
            let p = Arc::new(volume_binding::VolumeBinding);
            PluginExtensions {
                pre_filter: Some(p.clone()),
                filter: Some(p),
                ..Default::default()
            }
        }
        volume_restrictions::NAME => {
            parse_args::<NoArgs>(args)?;
            let p = Arc::new(volume_restrictions::VolumeRestrictions);
            PluginExtensions {
                pre_filter: Some(p.clone()),
                filter: Some(p),
                ..Default::default()
            }
        }
        volume_zone::NAME => {
            parse_args::<NoArgs>(args)?;
            let p = Arc::new(volume_zone::VolumeZone);
            PluginExtensions {
                pre_filter: Some(p.clone()),
                filter: Some(p),
                ..Default::default()
            }
        }
        node_ports::NAME => {
            parse_args::<NoArgs>(args)?;
            let p = Arc::new(node_ports::NodePorts);
            PluginExtensions {
                pre_filter: Some(p.clone()),
                filter: Some(p),
                ..Default::default()
            }
        }
        node_resources::fit::NAME => {
            let p = Arc::new(Fit::new(parse_args(args)?)?);
            PluginExtensions {
                filter: Some(p.clone()),
                pre_score: Some(p.clone()),
                score: Some(p),
                ..Default::default()
            }
        }
        node_resources::balanced_allocation::NAME => {
            let p = Arc::new(BalancedAllocation::new(parse_args(args)?));
            PluginExtensions {
                pre_score: Some(p.clone()),
                score: Some(p),
                ..Default::default()
            }
        }
        pod_topology_spread::NAME => {
            let p = Arc::new(pod_topology_spread::PodTopologySpread::new(parse_args(
                args,
            )?)?);
            PluginExtensions {
                pre_filter: Some(p.clone()),
                filter: Some(p.clone()),
                pre_score: Some(p.clone()),
                score: Some(p),
                ..Default::default()
            }
        }
        inter_pod_affinity::NAME => {
            let p = Arc::new(inter_pod_affinity::InterPodAffinity::new(parse_args(
                args,
            )?)?);
            PluginExtensions {
                pre_filter: Some(p.clone()),
                filter: Some(p.clone()),
                pre_score: Some(p.clone()),
                score: Some(p),
                ..Default::default()
            }
        }
        default_preemption::NAME => {
            let p = Arc::new(default_preemption::DefaultPreemption::new(parse_args(
                args,
            )?)?);
            PluginExtensions {
                post_filter: Some(p),
                ..Default::default()
            }
        }
        image_locality::NAME => {
            parse_args::<NoArgs>(args)?;
            let p = Arc::new(image_locality::ImageLocality);
            PluginExtensions {
                pre_score: Some(p.clone()),
                score: Some(p),
                ..Default::default()
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(ext))
}

/// Args for plugins that take none: only `kind`/`apiVersion` are allowed.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// Decodes a plugin's args object strictly (unknown fields are errors, as in
/// upstream's strict decoding), ignoring the optional `kind` and `apiVersion`.
fn parse_args<T: DeserializeOwned + Default>(
    args: Option<&serde_json::Value>,
) -> Result<T, String> {
    match args {
        None | Some(serde_json::Value::Null) => Ok(T::default()),
        Some(serde_json::Value::Object(map)) => {
            let mut map = map.clone();
            map.remove("kind");
            map.remove("apiVersion");
            serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| e.to_string())
        }
        Some(other) => Err(format!("args must be an object, got {other}")),
    }
}

/// PreFilter state that counts the pods matching the incoming pod's terms, so that
/// preemption can ask "what if this pod were added or removed" (upstream's
/// PreFilterExtensions AddPod/RemovePod).
pub(crate) trait PodCounts: crate::framework::StateData {
    fn update_with_pod(
        &mut self,
        other: &crate::framework::PodInfo,
        incoming: &crate::framework::PodInfo,
        node: &crate::framework::NodeInfo,
        delta: i64,
    );
}

/// Counts `other` (`delta` +1 when added to `node`, -1 when removed) in the cycle's
/// state `S`, if the plugin's PreFilter wrote one.
pub(crate) fn count_pod<S: PodCounts>(
    state: &mut crate::framework::CycleState,
    incoming: &crate::framework::PodInfo,
    other: &crate::framework::PodInfo,
    node: &crate::framework::NodeInfo,
    delta: i64,
) -> crate::framework::Status {
    if let Some(s) = state.read_mut::<S>() {
        s.update_with_pod(other, incoming, node, delta);
    }
    crate::framework::Status::success()
}

/// Rescales scores so the highest becomes `MAX_NODE_SCORE` (and, when `reverse`,
/// flips them so the lowest raw score wins). All-zero scores stay zero, or
/// become the maximum when reversed.
pub(crate) fn default_normalize_score(reverse: bool, scores: &mut [i64]) {
    let max = scores.iter().copied().max().unwrap_or(0);
    for s in scores.iter_mut() {
        let scaled = if max == 0 {
            0
        } else {
            MAX_NODE_SCORE * *s / max
        };
        *s = if reverse {
            MAX_NODE_SCORE - scaled
        } else {
            scaled
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_scales_and_reverses() {
        let mut s = vec![0, 5, 10];
        default_normalize_score(false, &mut s);
        assert_eq!(s, vec![0, 50, 100]);
        let mut s = vec![0, 1, 4];
        default_normalize_score(true, &mut s);
        assert_eq!(s, vec![100, 75, 0]);
        let mut s = vec![0, 0];
        default_normalize_score(true, &mut s);
        assert_eq!(s, vec![100, 100]);
    }

    #[test]
    fn args_are_strict() {
        assert!(new_plugin("NodeName", Some(&serde_json::json!({"kind": "X"}))).is_ok());
        assert!(new_plugin("NodeName", Some(&serde_json::json!({"foo": 1}))).is_err());
        assert!(new_plugin("Nope", None).unwrap().is_none());
    }
}
