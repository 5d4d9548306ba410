//! `ResourceQuotaController`: keeps every ResourceQuota's status true. The apiserver's
//! admission step charges each new object to `status.used` as it is written; this
//! controller recounts `status.used` from what is stored (the objects of the counted
//! kinds in the quota's namespace that its scopes take in), sets `status.hard` from
//! `spec.hard`, and so gives back what deleted objects, finished pods and writes
//! refused after their charge held — upstream's quota controller.
//!
//! A quota is recounted when it is created or its `spec.hard` changes, when an object
//! it counts is deleted (pods, Services, ConfigMaps and Secrets are watched) or a
//! pod finishes, and every five minutes in any case (upstream's
//! `--resource-quota-sync-period`), which covers every other counted kind.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota, ResourceQuotaStatus, Secret, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use krust_api::quota::{self, Usage};
use krust_client::cache::{Cache, Cached};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::pods::{CachedPod, Phase};

/// How often every quota is recounted regardless of events.
const RESYNC: Duration = Duration::from_secs(300);

pub struct ResourceQuotaController {
    client: Client,
    quotas: Cache<ResourceQuota>,
    queue: Arc<WorkQueue>,
}

impl ResourceQuotaController {
    /// Registers the controller's handlers on the shared informers.
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let quotas = informers.get::<ResourceQuota>();
        let controller = Arc::new(ResourceQuotaController {
            client,
            quotas: quotas.cache(),
            queue: WorkQueue::new("resourcequota"),
        });
        quotas.add_handler(Arc::new(QuotaEvents(controller.clone())));
        informers
            .get::<CachedPod>()
            .add_handler(Arc::new(PodsReplenish(controller.clone())));
        informers
            .get::<Service>()
            .add_handler(Arc::new(Replenish(controller.clone())));
        informers
            .get::<ConfigMap>()
            .add_handler(Arc::new(Replenish(controller.clone())));
        informers
            .get::<Secret>()
            .add_handler(Arc::new(Replenish(controller.clone())));
        controller
    }

    /// Enqueues every quota of a namespace.
    fn replenish(&self, namespace: &str) {
        for q in self
            .quotas
            .state_filter(|q| q.metadata.namespace.as_deref() == Some(namespace))
        {
            self.queue.add(format!("{namespace}/{}", q.name_any()));
        }
    }
}

/// New quotas and changed limits are counted.
struct QuotaEvents(Arc<ResourceQuotaController>);

impl EventHandler<ResourceQuota> for QuotaEvents {
    fn on_apply(&self, old: Option<&ResourceQuota>, new: &Arc<ResourceQuota>) {
        let hard = |q: &ResourceQuota| q.spec.as_ref().and_then(|s| s.hard.clone());
        let status_hard = new.status.as_ref().and_then(|s| s.hard.clone());
        let counted = new.status.as_ref().is_some_and(|s| s.used.is_some());
        if old.is_none_or(|old| hard(old) != hard(new)) || status_hard != hard(new) || !counted {
            self.0.queue.add(format!(
                "{}/{}",
                new.metadata.namespace.as_deref().unwrap_or_default(),
                new.name_any()
            ));
        }
    }
    fn on_delete(&self, _obj: &Arc<ResourceQuota>) {}
}

/// Deletions give quota back.
struct Replenish(Arc<ResourceQuotaController>);

impl<K: Cached> EventHandler<K> for Replenish {
    fn on_apply(&self, _old: Option<&K>, _new: &Arc<K>) {}
    fn on_delete(&self, obj: &Arc<K>) {
        if let Some(ns) = obj.namespace() {
            self.0.replenish(ns);
        }
    }
}

/// Pods give quota back when deleted and when they finish.
struct PodsReplenish(Arc<ResourceQuotaController>);

impl EventHandler<CachedPod> for PodsReplenish {
    fn on_apply(&self, old: Option<&CachedPod>, new: &Arc<CachedPod>) {
        let finished =
            |p: &CachedPod| matches!(p.status.phase, Some(Phase::Succeeded | Phase::Failed));
        if finished(new) && !old.is_some_and(finished) {
            self.0.replenish(&new.metadata.namespace);
        }
    }
    fn on_delete(&self, obj: &Arc<CachedPod>) {
        self.0.replenish(&obj.metadata.namespace);
    }
}

impl Reconciler for ResourceQuotaController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let Some((namespace, name)) = key.split_once('/') else {
            return Ok(None);
        };
        let Some(cached) = self.quotas.get(Some(namespace), name) else {
            return Ok(None);
        };
        let hard = cached
            .spec
            .as_ref()
            .and_then(|s| s.hard.clone())
            .unwrap_or_default();
        let quota_value = serde_json::to_value(&*cached).unwrap_or_default();
        let used = self.count(namespace, &quota_value, &hard).await?;
        let status = ResourceQuotaStatus {
            hard: Some(hard),
            used: Some(used),
        };
        if cached.status.as_ref() == Some(&status) {
            return Ok(Some(RESYNC));
        }
        let mut updated = (*cached).clone();
        updated.status = Some(status);
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), namespace);
        api.replace_status(name, &PostParams::default(), &updated)
            .await
            .map_err(|e| Error::api("updating quota status", key, e))?;
        tracing::debug!(quota = key, "recounted quota usage");
        Ok(Some(RESYNC))
    }
}

impl ResourceQuotaController {
    /// What the namespace's objects use of each resource in `hard` (zero for the ones
    /// nothing uses), counting only the objects the quota's scopes take in.
    async fn count(
        &self,
        namespace: &str,
        quota_value: &serde_json::Value,
        hard: &BTreeMap<String, Quantity>,
    ) -> Result<BTreeMap<String, Quantity>, Error> {
        let kinds: BTreeSet<(&str, &str)> =
            hard.keys().filter_map(|r| quota::counted_kind(r)).collect();
        let mut total = Usage::new();
        for (group, plural) in kinds {
            // Kinds krust does not serve have nothing to count.
            let Some(info) = krust_api::registry::RESOURCES
                .iter()
                .find(|r| r.group == group && r.plural == plural && r.namespaced)
            else {
                continue;
            };
            let gvk = GroupVersionKind::gvk(info.group, info.version, info.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, info.plural);
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), namespace, &resource);
            let list = api
                .list(&ListParams::default())
                .await
                .map_err(|e| Error::api("listing for quota", format!("{namespace}/{plural}"), e))?;
            for obj in list.items {
                let value = serde_json::to_value(&obj).unwrap_or_default();
                if quota::in_scope(quota_value, group, plural, &value) {
                    quota::add(&mut total, &quota::usage(group, plural, &value));
                }
            }
        }
        Ok(hard
            .keys()
            .map(|name| {
                let amount = total.get(name).copied().unwrap_or_default();
                (name.clone(), Quantity(amount.to_string()))
            })
            .collect())
    }
}
