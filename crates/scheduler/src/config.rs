//! `KubeSchedulerConfiguration` (kubescheduler.config.k8s.io/v1): parsing,
//! defaulting to the upstream default profile, and validation.
//!
//! Upstream enables every default plugin through `multiPoint`; a user profile is
//! merged into that default the way `v1` defaulting does it: `multiPoint.disabled`
//! removes defaults (`"*"` removes all), `multiPoint.enabled` entries replace a
//! default of the same name in place or are appended, and the per-extension-point
//! sets (`filter`, `score`, ...) are applied on top when the framework expands
//! `multiPoint` (see [`crate::framework::Framework::new`]).
//!
//! Plugins that exist upstream but live outside this crate are accepted where
//! they are harmless: `PrioritySort` (queue order), `SchedulingGates` (queue
//! admission) and `DefaultBinder` (binding) are implemented by the caller and
//! dropped here; disabling any upstream plugin is a no-op. Enabling an upstream
//! plugin krust lacks (volume plugins, DynamicResources) is an error, as is any
//! name upstream does not know.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::framework::Framework;
use crate::plugins;

pub const API_VERSION: &str = "kubescheduler.config.k8s.io/v1";
pub const KIND: &str = "KubeSchedulerConfiguration";
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// In-tree plugins the caller implements outside the framework.
const CALLER_IMPLEMENTED: &[&str] = &["PrioritySort", "SchedulingGates", "DefaultBinder"];
/// In-tree plugins krust does not implement.
const NOT_IMPLEMENTED: &[&str] = &["DynamicResources", "NodeVolumeLimits"];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("parsing scheduler configuration: {0}")]
    Parse(String),
    #[error("unsupported apiVersion {0:?}, expected {API_VERSION:?}")]
    ApiVersion(String),
    #[error("unsupported kind {0:?}, expected {KIND:?}")]
    Kind(String),
    #[error("profile {profile:?}: unknown plugin {plugin:?}")]
    UnknownPlugin { profile: String, plugin: String },
    #[error("profile {profile:?}: plugin {plugin:?} is not implemented by krust")]
    UnsupportedPlugin { profile: String, plugin: String },
    #[error("profile {profile:?}: plugin {plugin:?} cannot be enabled at {extension_point}")]
    WrongExtensionPoint {
        profile: String,
        plugin: String,
        extension_point: &'static str,
    },
    #[error("profile {profile:?}: plugin {plugin:?} is enabled twice in multiPoint")]
    DuplicatePlugin { profile: String, plugin: String },
    #[error("profile {profile:?}: invalid args for plugin {plugin:?}: {reason}")]
    InvalidArgs {
        profile: String,
        plugin: String,
        reason: String,
    },
    #[error("profile {profile:?}: score plugin {plugin:?} has a negative weight {weight}")]
    InvalidWeight {
        profile: String,
        plugin: String,
        weight: i32,
    },
    #[error("percentageOfNodesToScore {0} is not within [0, 100]")]
    Percentage(i32),
    #[error("more than one profile is named {0:?}")]
    DuplicateProfile(String),
}

/// A plugin named in an enabled or disabled list.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PluginRef {
    pub name: String,
    /// Only meaningful for Score plugins; unset or 0 means weight 1 (or the
    /// weight from `multiPoint`).
    #[serde(default)]
    pub weight: Option<i32>,
}

impl PluginRef {
    fn weighted(name: &str, weight: Option<i32>) -> Self {
        PluginRef {
            name: name.to_string(),
            weight,
        }
    }
}

/// Enabled and disabled plugins at one extension point.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PluginSet {
    #[serde(default)]
    pub enabled: Vec<PluginRef>,
    #[serde(default)]
    pub disabled: Vec<PluginRef>,
}

impl PluginSet {
    pub fn disables_all(&self) -> bool {
        self.disabled.iter().any(|d| d.name == "*")
    }

    pub fn disables(&self, name: &str) -> bool {
        self.disables_all() || self.disabled.iter().any(|d| d.name == name)
    }
}

/// The plugins of a profile, per extension point.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Plugins {
    #[serde(default)]
    pub multi_point: PluginSet,
    #[serde(default)]
    pub queue_sort: PluginSet,
    #[serde(default)]
    pub pre_enqueue: PluginSet,
    #[serde(default)]
    pub pre_filter: PluginSet,
    #[serde(default)]
    pub filter: PluginSet,
    #[serde(default)]
    pub post_filter: PluginSet,
    #[serde(default)]
    pub pre_score: PluginSet,
    #[serde(default)]
    pub score: PluginSet,
    #[serde(default)]
    pub reserve: PluginSet,
    #[serde(default)]
    pub permit: PluginSet,
    #[serde(default)]
    pub pre_bind: PluginSet,
    #[serde(default)]
    pub bind: PluginSet,
    #[serde(default)]
    pub post_bind: PluginSet,
}

/// One scheduling profile, already merged with the defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub scheduler_name: String,
    pub percentage_of_nodes_to_score: Option<i32>,
    pub plugins: Plugins,
    /// Plugin name → its args object (as written, `kind`/`apiVersion` included).
    pub plugin_config: BTreeMap<String, serde_json::Value>,
}

impl Profile {
    /// Upstream's `default-scheduler` profile (minus the plugins krust leaves to
    /// the caller or does not implement).
    pub fn default_profile() -> Self {
        Profile {
            scheduler_name: DEFAULT_SCHEDULER_NAME.to_string(),
            percentage_of_nodes_to_score: None,
            plugins: Plugins {
                multi_point: PluginSet {
                    enabled: default_multi_point(),
                    disabled: Vec::new(),
                },
                ..Plugins::default()
            },
            plugin_config: BTreeMap::new(),
        }
    }
}

fn default_multi_point() -> Vec<PluginRef> {
    plugins::DEFAULT_PLUGINS
        .iter()
        .map(|(name, weight)| PluginRef::weighted(name, *weight))
        .collect()
}

/// The whole scheduler configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfiguration {
    /// Cluster-wide default; `None` (or 0) means adaptive.
    pub percentage_of_nodes_to_score: Option<i32>,
    pub profiles: Vec<Profile>,
}

impl Default for SchedulerConfiguration {
    fn default() -> Self {
        SchedulerConfiguration {
            percentage_of_nodes_to_score: None,
            profiles: vec![Profile::default_profile()],
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    percentage_of_nodes_to_score: Option<i32>,
    #[serde(default)]
    profiles: Vec<RawProfile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawProfile {
    scheduler_name: Option<String>,
    percentage_of_nodes_to_score: Option<i32>,
    #[serde(default)]
    plugins: Plugins,
    #[serde(default)]
    plugin_config: Vec<RawPluginConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPluginConfig {
    name: String,
    #[serde(default)]
    args: serde_json::Value,
}

impl SchedulerConfiguration {
    /// Parses, defaults and validates a configuration file. Fields upstream has
    /// but the framework does not use (leader election, client connection,
    /// backoff) are ignored here; the caller reads them if it needs them.
    pub fn from_yaml(yaml: &str) -> Result<Self, ConfigError> {
        let raw: RawConfiguration =
            serde_saphyr::from_str(yaml).map_err(|e| ConfigError::Parse(e.to_string()))?;
        match raw.api_version.as_deref() {
            Some(API_VERSION) => {}
            other => {
                return Err(ConfigError::ApiVersion(
                    other.unwrap_or_default().to_string(),
                ));
            }
        }
        match raw.kind.as_deref() {
            Some(KIND) => {}
            other => return Err(ConfigError::Kind(other.unwrap_or_default().to_string())),
        }
        check_percentage(raw.percentage_of_nodes_to_score)?;
        let mut profiles = Vec::new();
        for p in raw.profiles {
            let profile = merge_with_defaults(p)?;
            if profiles
                .iter()
                .any(|q: &Profile| q.scheduler_name == profile.scheduler_name)
            {
                return Err(ConfigError::DuplicateProfile(profile.scheduler_name));
            }
            profiles.push(profile);
        }
        if profiles.is_empty() {
            profiles.push(Profile::default_profile());
        }
        let config = SchedulerConfiguration {
            percentage_of_nodes_to_score: raw.percentage_of_nodes_to_score,
            profiles,
        };
        config.build_frameworks()?;
        Ok(config)
    }

    /// One framework per profile, in profile order.
    pub fn build_frameworks(&self) -> Result<Vec<Framework>, ConfigError> {
        self.profiles
            .iter()
            .map(|p| Framework::new(p, self.percentage_of_nodes_to_score))
            .collect()
    }
}

fn check_percentage(p: Option<i32>) -> Result<(), ConfigError> {
    match p {
        Some(v) if !(0..=100).contains(&v) => Err(ConfigError::Percentage(v)),
        _ => Ok(()),
    }
}

fn merge_with_defaults(raw: RawProfile) -> Result<Profile, ConfigError> {
    let name = raw
        .scheduler_name
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_SCHEDULER_NAME.to_string());
    check_percentage(raw.percentage_of_nodes_to_score)?;
    let mut plugins = raw.plugins;
    let unknown = |plugin: &str| ConfigError::UnknownPlugin {
        profile: name.clone(),
        plugin: plugin.to_string(),
    };
    let unsupported = |plugin: &str| ConfigError::UnsupportedPlugin {
        profile: name.clone(),
        plugin: plugin.to_string(),
    };

    // Every point: disabled names must exist somewhere; enabled ones must be
    // implemented here or by the caller (and are then dropped).
    let all_sets = [
        &mut plugins.multi_point,
        &mut plugins.queue_sort,
        &mut plugins.pre_enqueue,
        &mut plugins.pre_filter,
        &mut plugins.filter,
        &mut plugins.post_filter,
        &mut plugins.pre_score,
        &mut plugins.score,
        &mut plugins.reserve,
        &mut plugins.permit,
        &mut plugins.pre_bind,
        &mut plugins.bind,
        &mut plugins.post_bind,
    ];
    for set in all_sets {
        for d in &set.disabled {
            if d.name != "*" && !is_upstream_name(&d.name) {
                return Err(unknown(&d.name));
            }
        }
        let mut kept = Vec::new();
        for e in set.enabled.drain(..) {
            if plugins::is_registered(&e.name) {
                kept.push(e);
            } else if CALLER_IMPLEMENTED.contains(&e.name.as_str()) {
                continue;
            } else if NOT_IMPLEMENTED.contains(&e.name.as_str()) {
                return Err(unsupported(&e.name));
            } else {
                return Err(unknown(&e.name));
            }
        }
        set.enabled = kept;
    }

    // Merge multiPoint with the default multiPoint set.
    let custom = std::mem::take(&mut plugins.multi_point);
    let mut merged: Vec<PluginRef> = default_multi_point()
        .into_iter()
        .filter(|d| !custom.disables(&d.name))
        .collect();
    for e in custom.enabled {
        match merged.iter_mut().find(|d| d.name == e.name) {
            Some(slot) => *slot = e,
            None => merged.push(e),
        }
    }
    plugins.multi_point = PluginSet {
        enabled: merged,
        disabled: custom.disabled,
    };

    let mut plugin_config = BTreeMap::new();
    for pc in raw.plugin_config {
        if plugins::is_registered(&pc.name) {
            plugin_config.insert(pc.name, pc.args);
        } else if !is_upstream_name(&pc.name) {
            return Err(unknown(&pc.name));
        }
    }
    Ok(Profile {
        scheduler_name: name,
        percentage_of_nodes_to_score: raw.percentage_of_nodes_to_score,
        plugins,
        plugin_config,
    })
}

fn is_upstream_name(name: &str) -> bool {
    plugins::is_registered(name)
        || CALLER_IMPLEMENTED.contains(&name)
        || NOT_IMPLEMENTED.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n";

    #[test]
    fn empty_configuration_is_the_default_profile() {
        let config = SchedulerConfiguration::from_yaml(HEADER).unwrap();
        assert_eq!(config, SchedulerConfiguration::default());
        assert_eq!(config.profiles[0].scheduler_name, "default-scheduler");
    }

    #[test]
    fn score_overrides_weights_and_disables() {
        let yaml = format!(
            "{HEADER}percentageOfNodesToScore: 30
profiles:
- schedulerName: bin-packer
  plugins:
    score:
      enabled:
      - name: NodeResourcesFit
        weight: 5
      disabled:
      - name: ImageLocality
      - name: NodeResourcesBalancedAllocation
    multiPoint:
      enabled:
      - name: PrioritySort
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - name: cpu
          weight: 2
        - name: memory
          weight: 1
"
        );
        let config = SchedulerConfiguration::from_yaml(&yaml).unwrap();
        assert_eq!(config.percentage_of_nodes_to_score, Some(30));
        let fw = &config.build_frameworks().unwrap()[0];
        assert_eq!(fw.profile_name(), "bin-packer");
        assert_eq!(
            fw.score_plugin_weights(),
            vec![
                ("NodeResourcesFit", 5),
                ("TaintToleration", 3),
                ("NodeAffinity", 2),
                ("PodTopologySpread", 2),
                ("InterPodAffinity", 2),
            ]
        );
    }

    #[test]
    fn disable_all_then_enable_some() {
        let yaml = format!(
            "{HEADER}profiles:
- schedulerName: minimal
  plugins:
    multiPoint:
      disabled:
      - name: '*'
    filter:
      enabled:
      - name: NodeResourcesFit
      - name: NodeName
"
        );
        let config = SchedulerConfiguration::from_yaml(&yaml).unwrap();
        let fw = &config.build_frameworks().unwrap()[0];
        assert_eq!(
            fw.filter_plugin_names(),
            vec!["NodeResourcesFit", "NodeName"]
        );
        assert!(fw.score_plugin_weights().is_empty());
        assert!(!fw.has_post_filter_plugins());
    }

    #[test]
    fn errors_carry_context() {
        let unknown = format!(
            "{HEADER}profiles:\n- plugins:\n    filter:\n      enabled:\n      - name: NodeFoo\n"
        );
        let err = SchedulerConfiguration::from_yaml(&unknown).unwrap_err();
        assert_eq!(
            err.to_string(),
            "profile \"default-scheduler\": unknown plugin \"NodeFoo\""
        );

        let unsupported = format!(
            "{HEADER}profiles:\n- plugins:\n    filter:\n      enabled:\n      - name: NodeVolumeLimits\n"
        );
        assert!(matches!(
            SchedulerConfiguration::from_yaml(&unsupported),
            Err(ConfigError::UnsupportedPlugin { .. })
        ));

        let wrong_point = format!(
            "{HEADER}profiles:\n- plugins:\n    score:\n      enabled:\n      - name: NodeName\n"
        );
        let err = SchedulerConfiguration::from_yaml(&wrong_point).unwrap_err();
        assert_eq!(
            err.to_string(),
            "profile \"default-scheduler\": plugin \"NodeName\" cannot be enabled at score"
        );

        let bad_args = format!(
            "{HEADER}profiles:\n- pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoringStrategy:\n        type: Bogus\n"
        );
        assert!(matches!(
            SchedulerConfiguration::from_yaml(&bad_args),
            Err(ConfigError::InvalidArgs { .. })
        ));

        let wrong_version =
            "apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n";
        assert!(matches!(
            SchedulerConfiguration::from_yaml(wrong_version),
            Err(ConfigError::ApiVersion(_))
        ));
        assert!(matches!(
            SchedulerConfiguration::from_yaml(&format!("{HEADER}percentageOfNodesToScore: 120\n")),
            Err(ConfigError::Percentage(120))
        ));
        let dup = format!("{HEADER}profiles:\n- schedulerName: a\n- schedulerName: a\n");
        assert!(matches!(
            SchedulerConfiguration::from_yaml(&dup),
            Err(ConfigError::DuplicateProfile(_))
        ));
    }
}
