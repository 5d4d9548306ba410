//! The scheduling framework: per-cycle types, the extension-point traits and the
//! [`Framework`] that runs a profile's plugins over a [`Snapshot`].
//!
//! A `Framework` is built once per profile (see [`crate::config`]) and is
//! shared; everything a cycle learns lives in its [`CycleState`], so cycles are
//! independent. The only state the framework keeps between cycles is where the
//! next node search starts (so every node gets examined in turn when only a
//! percentage of nodes is searched) and the random source for tie-breaking.

mod cycle;
mod cycle_state;
mod fit_error;
mod interface;
mod node_info;
mod snapshot;
mod status;

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

pub use cycle::{ScheduleError, ScheduleResult, num_feasible_nodes_to_find};
pub use cycle_state::{CycleState, StateData};
pub use fit_error::{Diagnosis, FitError, NodeToStatus};
pub use interface::{
    BindPlugin, FilterPlugin, PermitPlugin, Plugin, PostFilterPlugin, PostFilterResult,
    PreBindPlugin, PreFilterPlugin, PreFilterResult, PreScorePlugin, ReservePlugin, ScorePlugin,
};
pub use node_info::{
    AffinityTerm, BIND_ALL_HOST_IP, HostPort, HostPortUsage, NodeInfo, NonZeroRequested, PodInfo,
    Protocol, WeightedAffinityTerm, pod_namespace, pod_priority, pod_start_time,
};
pub use snapshot::{Snapshot, Storage};
pub use status::{Code, Status};

use crate::config::{ConfigError, PluginRef, PluginSet, Profile};
use crate::plugins::{self, PluginExtensions};

/// The highest score a Score plugin may give a node after normalization.
pub const MAX_NODE_SCORE: i64 = 100;
/// The lowest score a Score plugin may give a node after normalization.
pub const MIN_NODE_SCORE: i64 = 0;

/// A Score plugin and how much its opinion counts.
struct WeightedScorePlugin {
    plugin: Arc<dyn ScorePlugin>,
    weight: i64,
}

/// Binding-cycle plugins. krust's default profile has none (binding is done by
/// the caller through the API), but the caller may register its own.
#[derive(Default, Clone)]
pub struct BindingPlugins {
    pub reserve: Vec<Arc<dyn ReservePlugin>>,
    pub permit: Vec<Arc<dyn PermitPlugin>>,
    pub pre_bind: Vec<Arc<dyn PreBindPlugin>>,
    pub bind: Vec<Arc<dyn BindPlugin>>,
}

/// One profile's plugins, ordered per extension point, ready to run cycles.
pub struct Framework {
    profile_name: String,
    percentage_of_nodes_to_score: Option<i32>,
    pre_filter: Vec<Arc<dyn PreFilterPlugin>>,
    filter: Vec<Arc<dyn FilterPlugin>>,
    post_filter: Vec<Arc<dyn PostFilterPlugin>>,
    pre_score: Vec<Arc<dyn PreScorePlugin>>,
    score: Vec<WeightedScorePlugin>,
    binding: BindingPlugins,
    next_start_node_index: AtomicUsize,
    rng: AtomicU64,
}

impl std::fmt::Debug for Framework {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Framework")
            .field("profile", &self.profile_name)
            .field("filter", &self.filter_plugin_names())
            .field("score", &self.score_plugin_weights())
            .finish_non_exhaustive()
    }
}

/// Extension points a plugin from the registry can be placed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExtensionPoint {
    PreFilter,
    Filter,
    PostFilter,
    PreScore,
    Score,
}

impl ExtensionPoint {
    pub(crate) fn config_name(self) -> &'static str {
        match self {
            ExtensionPoint::PreFilter => "preFilter",
            ExtensionPoint::Filter => "filter",
            ExtensionPoint::PostFilter => "postFilter",
            ExtensionPoint::PreScore => "preScore",
            ExtensionPoint::Score => "score",
        }
    }

    fn config_set(self, profile: &Profile) -> &PluginSet {
        let p = &profile.plugins;
        match self {
            ExtensionPoint::PreFilter => &p.pre_filter,
            ExtensionPoint::Filter => &p.filter,
            ExtensionPoint::PostFilter => &p.post_filter,
            ExtensionPoint::PreScore => &p.pre_score,
            ExtensionPoint::Score => &p.score,
        }
    }
}

impl Framework {
    /// Builds the framework for one profile. `global_percentage` is the
    /// configuration-wide `percentageOfNodesToScore`, used when the profile sets none.
    pub fn new(profile: &Profile, global_percentage: Option<i32>) -> Result<Self, ConfigError> {
        let mut instances: HashMap<&str, PluginExtensions> = HashMap::new();
        let referenced = profile.plugins.multi_point.enabled.iter().chain(
            [
                ExtensionPoint::PreFilter,
                ExtensionPoint::Filter,
                ExtensionPoint::PostFilter,
                ExtensionPoint::PreScore,
                ExtensionPoint::Score,
            ]
            .iter()
            .flat_map(|p| p.config_set(profile).enabled.iter()),
        );
        for r in referenced {
            if instances.contains_key(r.name.as_str()) {
                continue;
            }
            let args = profile.plugin_config.get(&r.name);
            let ext =
                plugins::new_plugin(&r.name, args).map_err(|reason| ConfigError::InvalidArgs {
                    profile: profile.scheduler_name.clone(),
                    plugin: r.name.clone(),
                    reason,
                })?;
            let ext = ext.ok_or_else(|| ConfigError::UnknownPlugin {
                profile: profile.scheduler_name.clone(),
                plugin: r.name.clone(),
            })?;
            instances.insert(&r.name, ext);
        }

        let order = |point: ExtensionPoint| -> Result<Vec<&PluginRef>, ConfigError> {
            expand_multi_point(profile, point, &instances)
        };
        let pick = |point: ExtensionPoint| -> Result<Vec<&PluginExtensions>, ConfigError> {
            Ok(order(point)?
                .into_iter()
                .map(|r| &instances[r.name.as_str()])
                .collect())
        };

        let mut score = Vec::new();
        for r in order(ExtensionPoint::Score)? {
            let multi_point_weight = profile
                .plugins
                .multi_point
                .enabled
                .iter()
                .find(|m| m.name == r.name)
                .and_then(|m| m.weight);
            let weight = r.weight.or(multi_point_weight).unwrap_or(0);
            if weight < 0 {
                return Err(ConfigError::InvalidWeight {
                    profile: profile.scheduler_name.clone(),
                    plugin: r.name.clone(),
                    weight,
                });
            }
            let plugin = instances[r.name.as_str()]
                .score
                .clone()
                .expect("checked by expand_multi_point");
            // Zero means "not set": a configured plugin always counts at least once.
            score.push(WeightedScorePlugin {
                plugin,
                weight: i64::from(weight.max(1)),
            });
        }

        let seed = std::hash::RandomState::new().hash_one(profile.scheduler_name.as_str());
        Ok(Framework {
            profile_name: profile.scheduler_name.clone(),
            percentage_of_nodes_to_score: profile
                .percentage_of_nodes_to_score
                .or(global_percentage),
            pre_filter: pick(ExtensionPoint::PreFilter)?
                .into_iter()
                .filter_map(|e| e.pre_filter.clone())
                .collect(),
            filter: pick(ExtensionPoint::Filter)?
                .into_iter()
                .filter_map(|e| e.filter.clone())
                .collect(),
            post_filter: pick(ExtensionPoint::PostFilter)?
                .into_iter()
                .filter_map(|e| e.post_filter.clone())
                .collect(),
            pre_score: pick(ExtensionPoint::PreScore)?
                .into_iter()
                .filter_map(|e| e.pre_score.clone())
                .collect(),
            score,
            binding: BindingPlugins::default(),
            next_start_node_index: AtomicUsize::new(0),
            rng: AtomicU64::new(seed),
        })
    }

    /// Adds binding-cycle plugins (reserve, permit, pre-bind, bind).
    pub fn with_binding_plugins(mut self, binding: BindingPlugins) -> Self {
        self.binding = binding;
        self
    }

    pub fn profile_name(&self) -> &str {
        &self.profile_name
    }

    /// Names of the filter plugins in the order they run.
    pub fn filter_plugin_names(&self) -> Vec<&'static str> {
        self.filter.iter().map(|p| p.name()).collect()
    }

    /// Score plugins and their weights in the order they run.
    pub fn score_plugin_weights(&self) -> Vec<(&'static str, i64)> {
        self.score
            .iter()
            .map(|s| (s.plugin.name(), s.weight))
            .collect()
    }

    pub fn has_post_filter_plugins(&self) -> bool {
        !self.post_filter.is_empty()
    }

    /// A uniformly distributed number in `0..n` (SplitMix64 over an atomic
    /// counter: cheap, lock-free and good enough for tie-breaking).
    pub(crate) fn random_below(&self, n: usize) -> usize {
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z % n.max(1) as u64) as usize
    }
}

/// Orders the plugins of one extension point the way kube-scheduler expands
/// `multiPoint`: plugins also listed explicitly at this point first (in that
/// list's order), then the remaining multiPoint plugins that implement the
/// point, then the other explicitly listed plugins. A `disabled: ["*"]` at the
/// point keeps only its explicit list.
fn expand_multi_point<'a>(
    profile: &'a Profile,
    point: ExtensionPoint,
    instances: &HashMap<&str, PluginExtensions>,
) -> Result<Vec<&'a PluginRef>, ConfigError> {
    let specific = point.config_set(profile);
    for r in &specific.enabled {
        if !instances[r.name.as_str()].implements(point) {
            return Err(ConfigError::WrongExtensionPoint {
                profile: profile.scheduler_name.clone(),
                plugin: r.name.clone(),
                extension_point: point.config_name(),
            });
        }
    }
    if specific.disables_all() {
        return Ok(specific.enabled.iter().collect());
    }
    let explicitly_enabled: BTreeSet<&str> =
        specific.enabled.iter().map(|r| r.name.as_str()).collect();
    let mut overridden = BTreeSet::new();
    let mut from_multi_point = Vec::new();
    for r in &profile.plugins.multi_point.enabled {
        if !instances[r.name.as_str()].implements(point) || specific.disables(&r.name) {
            continue;
        }
        if explicitly_enabled.contains(r.name.as_str()) {
            overridden.insert(r.name.as_str());
        } else if from_multi_point
            .iter()
            .any(|m: &&PluginRef| m.name == r.name)
        {
            return Err(ConfigError::DuplicatePlugin {
                profile: profile.scheduler_name.clone(),
                plugin: r.name.clone(),
            });
        } else {
            from_multi_point.push(r);
        }
    }
    let (first, rest): (Vec<&PluginRef>, Vec<&PluginRef>) = specific
        .enabled
        .iter()
        .partition(|r| overridden.contains(r.name.as_str()));
    Ok(first
        .into_iter()
        .chain(from_multi_point)
        .chain(rest)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_profile_order_and_weights() {
        let fw = Framework::new(&Profile::default_profile(), None).unwrap();
        assert_eq!(
            fw.filter_plugin_names(),
            vec![
                "NodeUnschedulable",
                "NodeName",
                "TaintToleration",
                "NodeAffinity",
                "NodePorts",
                "NodeResourcesFit",
                "VolumeRestrictions",
                "VolumeBinding",
                "VolumeZone",
                "PodTopologySpread",
                "InterPodAffinity"
            ]
        );
        assert_eq!(
            fw.score_plugin_weights(),
            vec![
                ("TaintToleration", 3),
                ("NodeAffinity", 2),
                ("NodeResourcesFit", 1),
                ("PodTopologySpread", 2),
                ("InterPodAffinity", 2),
                ("NodeResourcesBalancedAllocation", 1),
                ("ImageLocality", 1)
            ]
        );
        assert!(fw.has_post_filter_plugins());
    }

    #[test]
    fn random_below_stays_in_range() {
        let fw = Framework::new(&Profile::default_profile(), None).unwrap();
        let mut seen = [false; 3];
        for _ in 0..200 {
            seen[fw.random_below(3)] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }
}
