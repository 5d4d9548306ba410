//! `NamespaceController`: empties a namespace that is being deleted, then releases it,
//! as upstream's namespace controller does.
//!
//! A pass over a namespace with a deletionTimestamp and the `kubernetes` finalizer in
//! `spec.finalizers` (level-triggered, safe to repeat):
//! 1. discover the namespaced resources the apiserver serves (discovery is run on every
//!    pass, so resources added since the last one are not missed);
//! 2. for each that supports `list` and `deletecollection`, delete everything in the
//!    namespace, then list what remains (objects held by finalizers or created since);
//! 3. report progress in the namespace's status conditions
//!    (`NamespaceDeletionDiscoveryFailure`, `NamespaceDeletionContentFailure`,
//!    `NamespaceContentRemaining`), with upstream's reasons and messages;
//! 4. when nothing remains, remove `kubernetes` from `spec.finalizers` through the
//!    `finalize` subresource; the apiserver then deletes the namespace. Until then the
//!    namespace is looked at again every [`RECHECK`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition, NamespaceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use krust_client::cache::Cache;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::{Discovery, Scope, verbs};
use kube::{Client, ResourceExt};

use crate::Error;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};

/// The finalizer this controller owns in `spec.finalizers`.
pub const FINALIZER: &str = "kubernetes";

/// How soon a namespace whose content is still going away is looked at again (nothing
/// tells this controller when the last object of some kind disappears).
pub const RECHECK: Duration = Duration::from_secs(1);

pub struct NamespaceController {
    client: Client,
    namespaces: Cache<Namespace>,
    queue: Arc<WorkQueue>,
}

impl NamespaceController {
    /// Registers the controller's handler on the shared namespace informer.
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let informer = informers.get::<Namespace>();
        let controller = Arc::new(NamespaceController {
            client,
            namespaces: informer.cache(),
            queue: WorkQueue::new("namespace"),
        });
        informer.add_handler(Arc::new(NamespaceEvents(controller.clone())));
        controller
    }
}

impl Reconciler for NamespaceController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, name: &str) -> Result<Option<Duration>, Error> {
        let Some(ns) = self.namespaces.get(None, name) else {
            return Ok(None);
        };
        if ns.metadata.deletion_timestamp.is_none() || !has_finalizer(&ns) {
            return Ok(None);
        }
        let progress = self.delete_content(name).await;
        let now = Timestamp::now();
        let status = deletion_status(&ns, &progress, now);
        let api: Api<Namespace> = Api::all(self.client.clone());
        if ns.status.as_ref() != Some(&status) {
            let mut updated = (*ns).clone();
            updated.status = Some(status);
            match api
                .replace_status(name, &PostParams::default(), &updated)
                .await
            {
                Ok(_) => {}
                // Finalized and deleted since the cache saw it.
                Err(e) if is_status(&e, 404) => return Ok(None),
                Err(e) => return Err(Error::api("updating status of namespace", name, e)),
            }
        }
        if !progress.is_done() {
            tracing::debug!(namespace = name, remaining = ?progress.remaining, "namespace content remaining");
            return Ok(Some(RECHECK));
        }
        // Finalize from the cached object: its resourceVersion makes the write fail with
        // a conflict (and the pass retry) if someone changed the namespace meanwhile.
        let mut finalized = (*ns).clone();
        if let Some(spec) = finalized.spec.as_mut() {
            spec.finalizers = spec
                .finalizers
                .take()
                .map(|f| f.into_iter().filter(|f| f != FINALIZER).collect());
        }
        match api
            .replace_subresource("finalize", name, &PostParams::default(), &finalized)
            .await
        {
            Ok(_) => {
                tracing::info!(namespace = name, "namespace emptied and finalized");
                Ok(None)
            }
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(Error::api("finalizing namespace", name, e)),
        }
    }
}

impl NamespaceController {
    /// Deletes everything in the namespace that can be deleted and reports what is left.
    async fn delete_content(&self, namespace: &str) -> Progress {
        let mut progress = Progress::default();
        let discovery = match Discovery::new(self.client.clone()).run().await {
            Ok(d) => d,
            Err(e) => {
                progress.discovery_failure = Some(e.to_string());
                return progress;
            }
        };
        for group in discovery.groups() {
            for (resource, caps) in group.recommended_resources() {
                if caps.scope != Scope::Namespaced
                    || !caps.supports_operation(verbs::LIST)
                    || !caps.supports_operation(verbs::DELETE_COLLECTION)
                {
                    continue;
                }
                let api: Api<DynamicObject> =
                    Api::namespaced_with(self.client.clone(), namespace, &resource);
                let gvr = if resource.group.is_empty() {
                    resource.plural.clone()
                } else {
                    format!("{}.{}", resource.plural, resource.group)
                };
                if let Err(e) = api
                    .delete_collection(&DeleteParams::background(), &ListParams::default())
                    .await
                {
                    // Not found or not allowed here: nothing of it can be in the way.
                    if !is_status(&e, 404) && !is_status(&e, 405) {
                        progress.content_failures.push(format!("{gvr}: {e}"));
                    }
                    continue;
                }
                match api.list(&ListParams::default()).await {
                    Ok(list) if !list.items.is_empty() => {
                        progress.remaining.insert(gvr, list.items.len());
                    }
                    Ok(_) => {}
                    Err(e) if is_status(&e, 404) || is_status(&e, 405) => {}
                    Err(e) => progress.content_failures.push(format!("{gvr}: {e}")),
                }
            }
        }
        progress
    }
}

fn has_finalizer(ns: &Namespace) -> bool {
    ns.spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// What one deletion pass achieved.
#[derive(Debug, Default)]
struct Progress {
    discovery_failure: Option<String>,
    /// `plural[.group]` and the error of each resource that could not be emptied.
    content_failures: Vec<String>,
    /// `plural[.group]` → objects still present.
    remaining: BTreeMap<String, usize>,
}

impl Progress {
    fn is_done(&self) -> bool {
        self.discovery_failure.is_none()
            && self.content_failures.is_empty()
            && self.remaining.is_empty()
    }
}

/// The namespace's status after a pass: phase Terminating and upstream's deletion
/// conditions, each True with the reason and message of the problem or False with
/// reason `...Success`/`ContentDeleted`. A condition keeps its lastTransitionTime while
/// its status does not change.
fn deletion_status(ns: &Namespace, progress: &Progress, now: Timestamp) -> NamespaceStatus {
    let old = ns.status.as_ref().and_then(|s| s.conditions.as_ref());
    let condition = |type_: &str, problem: Option<(&str, String)>, ok_reason: &str| {
        let (status, reason, message) = match problem {
            Some((reason, message)) => ("True", reason, message),
            None => ("False", ok_reason, String::new()),
        };
        let previous = old.and_then(|cs| cs.iter().find(|c| c.type_ == type_));
        let last_transition_time = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Some(Time(now)),
        };
        NamespaceCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: (!message.is_empty()).then_some(message),
            last_transition_time,
        }
    };
    let discovery = progress
        .discovery_failure
        .as_ref()
        .map(|e| ("DiscoveryFailed", format!("Discovery failed: {e}")));
    let content = (!progress.content_failures.is_empty()).then(|| {
        (
            "ContentDeletionFailed",
            format!(
                "Failed to delete all resource types, {} remaining: {}",
                progress.content_failures.len(),
                progress.content_failures.join(", ")
            ),
        )
    });
    let remaining = (!progress.remaining.is_empty()).then(|| {
        let counts: Vec<String> = progress
            .remaining
            .iter()
            .map(|(gvr, n)| format!("{gvr} has {n} resource instances"))
            .collect();
        (
            "SomeResourcesRemain",
            format!("Some resources are remaining: {}", counts.join(", ")),
        )
    });
    NamespaceStatus {
        phase: Some("Terminating".into()),
        conditions: Some(vec![
            condition(
                "NamespaceDeletionDiscoveryFailure",
                discovery,
                "ResourcesDiscovered",
            ),
            condition("NamespaceDeletionContentFailure", content, "ContentDeleted"),
            condition("NamespaceContentRemaining", remaining, "ContentRemoved"),
        ]),
    }
}

struct NamespaceEvents(Arc<NamespaceController>);

impl EventHandler<Namespace> for NamespaceEvents {
    fn on_apply(&self, _old: Option<&Namespace>, new: &Arc<Namespace>) {
        if new.metadata.deletion_timestamp.is_some() {
            self.0.queue.add(new.name_any());
        }
    }
    fn on_delete(&self, _obj: &Arc<Namespace>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NamespaceSpec;

    fn terminating() -> Namespace {
        Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some("x".into()),
                deletion_timestamp: Some(Time(Timestamp::UNIX_EPOCH)),
                ..Default::default()
            },
            spec: Some(NamespaceSpec {
                finalizers: Some(vec![FINALIZER.into()]),
            }),
            status: None,
        }
    }

    #[test]
    fn remaining_content_is_reported_with_upstream_message() {
        let mut progress = Progress::default();
        progress.remaining.insert("pods".into(), 2);
        progress.remaining.insert("deployments.apps".into(), 1);
        assert!(!progress.is_done());
        let status = deletion_status(&terminating(), &progress, Timestamp::UNIX_EPOCH);
        assert_eq!(status.phase.as_deref(), Some("Terminating"));
        let conditions = status.conditions.unwrap();
        let remaining = conditions
            .iter()
            .find(|c| c.type_ == "NamespaceContentRemaining")
            .unwrap();
        assert_eq!(remaining.status, "True");
        assert_eq!(remaining.reason.as_deref(), Some("SomeResourcesRemain"));
        assert_eq!(
            remaining.message.as_deref(),
            Some(
                "Some resources are remaining: deployments.apps has 1 resource instances, pods has 2 resource instances"
            )
        );
        let content = conditions
            .iter()
            .find(|c| c.type_ == "NamespaceDeletionContentFailure")
            .unwrap();
        assert_eq!(content.status, "False");
        assert_eq!(content.reason.as_deref(), Some("ContentDeleted"));
    }

    #[test]
    fn unchanged_conditions_keep_their_transition_time() {
        let progress = Progress::default();
        assert!(progress.is_done());
        let mut ns = terminating();
        ns.status = Some(deletion_status(&ns, &progress, Timestamp::UNIX_EPOCH));
        let later = Timestamp::UNIX_EPOCH + k8s_openapi::jiff::SignedDuration::from_secs(60);
        // Same status twice: no write is needed.
        assert_eq!(
            ns.status.as_ref(),
            Some(&deletion_status(&ns, &progress, later))
        );
    }
}
