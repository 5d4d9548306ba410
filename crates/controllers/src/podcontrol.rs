//! Creating and deleting a controller's pods, as upstream's `PodControl`: the
//! expectations are raised before the requests, each result becomes an event on the
//! owner (SuccessfulCreate, FailedCreate, SuccessfulDelete, FailedDelete), and requests
//! that will never be observed are taken off the expectations again.

use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use krust_client::events::{EventRecorder, EventType};
use krust_client::is_status;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{Selector, SelectorExt};
use kube::{Client, Resource, ResourceExt};

use crate::Error;
use crate::expectations::Expectations;
use crate::owner::{adopt_patch, controller_of, key_of, release_patch};
use crate::pods::{CachedPod, WirePod};
use crate::replicaset::slow_start_batch;

/// One owner's pod writes.
pub struct PodControl<'a, K> {
    pub client: &'a Client,
    pub expectations: &'a Expectations,
    pub events: &'a EventRecorder,
    /// The owner's `namespace/name` (its expectations key).
    pub key: &'a str,
    pub owner: &'a K,
}

impl<K: Resource<DynamicType = ()>> PodControl<'_, K> {
    fn api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), crate::owner::split_key(self.key).0)
    }

    /// Creates `count` pods, the `n`th from `pod(n)`, in slow-start batches (a failing
    /// create costs one request, not `count`).
    pub async fn create(&self, count: usize, pod: impl Fn(usize) -> Pod) -> Result<(), Error> {
        self.expectations.expect_creations(self.key, count);
        let api = self.api();
        let (created, err) = slow_start_batch(count, |n| {
            let api = api.clone();
            let pod = pod(n);
            async move { api.create(&PostParams::default(), &pod).await }
        })
        .await;
        for pod in &created {
            self.events.record(
                self.owner,
                EventType::Normal,
                "SuccessfulCreate",
                format!("Created pod: {}", pod.name_any()),
            );
        }
        let Some(e) = err else {
            return Ok(());
        };
        // Creates that failed or were never sent will not be observed.
        for _ in created.len()..count {
            self.expectations.creation_observed(self.key);
        }
        self.events.record(
            self.owner,
            EventType::Warning,
            "FailedCreate",
            format!("Error creating: {e}"),
        );
        Err(Error::api("creating pod", self.key, e))
    }

    /// Deletes pods given as (name, `namespace/name`), all at once.
    pub async fn delete(&self, pods: &[(&str, String)]) -> Result<(), Error> {
        if pods.is_empty() {
            return Ok(());
        }
        self.expectations
            .expect_deletions(self.key, pods.iter().map(|(_, key)| key.clone()));
        let api = self.api();
        let results = join_all(pods.iter().map(|(name, key)| {
            let api = api.clone();
            async move { (*name, key, api.delete(name, &DeleteParams::default()).await) }
        }))
        .await;
        let mut first_err = None;
        for (name, key, result) in results {
            match result {
                Ok(_) => self.events.record(
                    self.owner,
                    EventType::Normal,
                    "SuccessfulDelete",
                    format!("Deleted pod: {name}"),
                ),
                Err(e) => {
                    // It will not go away through us: stop waiting for it.
                    self.expectations.deletion_observed(self.key, key);
                    if !is_status(&e, 404) {
                        self.events.record(
                            self.owner,
                            EventType::Warning,
                            "FailedDelete",
                            format!("Error deleting: {e}"),
                        );
                        first_err.get_or_insert(Error::api("deleting pod", key.clone(), e));
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// The pods among `candidates` (of the owner's namespace) that `owner` controls, after
/// adopting the orphans its selector matches (not while it is being deleted) and
/// releasing the pods it controls that stopped matching. Adoption and release are
/// compare-and-swap patches: a pod that changed meanwhile fails with a conflict and the
/// owner looks again.
pub async fn claim_pods<K: Resource<DynamicType = ()>>(
    client: &Client,
    owner: &K,
    selector: &Selector,
    candidates: Vec<Arc<CachedPod>>,
) -> Result<Vec<Arc<CachedPod>>, Error> {
    let uid = owner.uid().unwrap_or_default();
    let api: Api<WirePod> = Api::namespaced(
        client.clone(),
        owner.meta().namespace.as_deref().unwrap_or_default(),
    );
    let kind = K::kind(&());
    let mut claimed = Vec::new();
    for pod in candidates {
        let matches = selector.matches(pod.labels());
        let patch = match controller_of(&pod.metadata) {
            Some(r) if r.uid == uid && matches => {
                claimed.push(pod);
                continue;
            }
            Some(r) if r.uid == uid => release_patch(&pod.metadata, &[&uid]),
            None if matches && owner.meta().deletion_timestamp.is_none() => {
                adopt_patch(&pod.metadata, owner)
            }
            _ => continue,
        };
        let adopting = matches;
        let result = api
            .patch(
                &pod.metadata.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await;
        match result {
            Ok(patched) => {
                let action = if adopting { "adopted" } else { "released" };
                tracing::info!(pod = %key_of(&pod.metadata), owner = %format!("{kind}/{}", owner.name_any()), "{action} pod");
                if adopting {
                    claimed.push(Arc::new(patched.into()));
                }
            }
            Err(e) if is_status(&e, 404) => {}
            Err(e) => {
                let action = if adopting {
                    "adopting pod"
                } else {
                    "releasing pod"
                };
                return Err(Error::api(action, key_of(&pod.metadata), e));
            }
        }
    }
    Ok(claimed)
}
