//! `ClusterRoleAggregationController`: a ClusterRole with an `aggregationRule` gets as
//! its rules the rules of every ClusterRole its selectors match — how `admin`, `edit` and
//! `view` grow when a CRD's author labels a role `aggregate-to-view`. As upstream, the
//! matching roles are taken per selector in name order, a rule already present is not
//! repeated, and the role is written only when its rules differ.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::serde_json::json;
use krust_client::cache::Cache;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::Error;

pub struct ClusterRoleAggregationController {
    client: Client,
    roles: Cache<ClusterRole>,
    queue: Arc<WorkQueue>,
}

impl ClusterRoleAggregationController {
    /// Registers the controller's handler on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let informer = informers.get::<ClusterRole>();
        let controller = Arc::new(ClusterRoleAggregationController {
            client,
            roles: informer.cache(),
            queue: WorkQueue::new("clusterrole-aggregation"),
        });
        informer.add_handler(Arc::new(RoleEvents(controller.clone())));
        controller
    }

    /// Any ClusterRole's change may change what an aggregated role should hold: queue
    /// every aggregated role (there are few).
    fn enqueue_aggregated(&self) {
        for role in self.roles.state() {
            if role.aggregation_rule.is_some() {
                self.queue.add(role.name_any());
            }
        }
    }
}

/// The label selectors of an aggregation rule as `matchLabels` maps; a selector with
/// expressions matches nothing here (upstream's bootstrap roles use labels only).
fn selectors(role: &ClusterRole) -> Vec<BTreeMap<String, String>> {
    role.aggregation_rule
        .iter()
        .flat_map(|a| a.cluster_role_selectors.iter().flatten())
        .filter(|s| s.match_expressions.as_ref().is_none_or(Vec::is_empty))
        .map(|s| s.match_labels.clone().unwrap_or_default())
        .collect()
}

/// The aggregated rules for `role` out of `all` roles.
fn aggregate(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Vec<PolicyRule> {
    let mut sorted: Vec<&Arc<ClusterRole>> = all.iter().collect();
    sorted.sort_by_key(|r| r.name_any());
    let mut rules: Vec<PolicyRule> = Vec::new();
    for selector in selectors(role) {
        for other in &sorted {
            if other.name_any() == role.name_any() {
                continue;
            }
            let labels = other.labels();
            if !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                continue;
            }
            for rule in other.rules.iter().flatten() {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
        }
    }
    rules
}

impl Reconciler for ClusterRoleAggregationController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, name: &str) -> Result<Option<Duration>, Error> {
        let Some(role) = self.roles.get(None, name) else {
            return Ok(None);
        };
        if role.aggregation_rule.is_none() {
            return Ok(None);
        }
        let rules = aggregate(&role, &self.roles.state());
        if role.rules.as_deref().unwrap_or_default() == rules.as_slice() {
            return Ok(None);
        }
        let api: Api<ClusterRole> = Api::all(self.client.clone());
        // Replace the rules as a whole, conditioned on the version aggregated from.
        let patch =
            json!({"metadata": {"resourceVersion": role.resource_version()}, "rules": rules});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::api("aggregating clusterrole", name.to_string(), e))?;
        tracing::info!(name, rules = rules.len(), "aggregated clusterrole rules");
        Ok(None)
    }
}

struct RoleEvents(Arc<ClusterRoleAggregationController>);

impl EventHandler<ClusterRole> for RoleEvents {
    fn on_apply(&self, old: Option<&ClusterRole>, new: &Arc<ClusterRole>) {
        let unchanged = old.is_some_and(|o| {
            o.rules == new.rules
                && o.labels() == new.labels()
                && o.aggregation_rule == new.aggregation_rule
        });
        if !unchanged {
            self.0.enqueue_aggregated();
        }
    }
    fn on_delete(&self, _obj: &Arc<ClusterRole>) {
        self.0.enqueue_aggregated();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::AggregationRule;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kube::api::ObjectMeta;

    fn role(name: &str, label: Option<&str>, verbs: &[&str]) -> Arc<ClusterRole> {
        Arc::new(ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: label.map(|l| BTreeMap::from([(l.to_string(), "true".to_string())])),
                ..Default::default()
            },
            rules: Some(vec![PolicyRule {
                verbs: verbs.iter().map(|v| v.to_string()).collect(),
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["pods".into()]),
                ..Default::default()
            }]),
            ..Default::default()
        })
    }

    #[test]
    fn aggregated_rules_come_from_matching_roles_in_name_order_without_repeats() {
        let view = ClusterRole {
            metadata: ObjectMeta {
                name: Some("view".into()),
                ..Default::default()
            },
            aggregation_rule: Some(AggregationRule {
                cluster_role_selectors: Some(vec![LabelSelector {
                    match_labels: Some(BTreeMap::from([("agg".to_string(), "true".to_string())])),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        };
        let all = vec![
            role("z", Some("agg"), &["list"]),
            role("a", Some("agg"), &["get"]),
            role("b", Some("agg"), &["get"]),
            role("other", None, &["delete"]),
        ];
        let rules = aggregate(&view, &all);
        let verbs: Vec<&str> = rules.iter().map(|r| r.verbs[0].as_str()).collect();
        assert_eq!(verbs, ["get", "list"]);
    }
}
