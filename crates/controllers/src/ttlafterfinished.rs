//! `TtlAfterFinishedController`: deletes a finished Job (`Complete` or `Failed`)
//! `ttlSecondsAfterFinished` seconds after it finished, its pods with it (foreground
//! propagation), as upstream's ttl-after-finished controller.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use krust_client::cache::Cache;
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, DeleteParams, Preconditions, PropagationPolicy};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::owner::{key_of, split_key};

pub struct TtlAfterFinishedController {
    client: Client,
    jobs: Cache<Job>,
    queue: Arc<WorkQueue>,
}

impl TtlAfterFinishedController {
    pub fn new(client: Client, informers: &SharedInformers) -> Arc<Self> {
        let jobs = informers.get::<Job>();
        let controller = Arc::new(TtlAfterFinishedController {
            client,
            jobs: jobs.cache(),
            queue: WorkQueue::new("ttl-after-finished"),
        });
        jobs.add_handler(Arc::new(JobEvents(controller.clone())));
        controller
    }
}

struct JobEvents(Arc<TtlAfterFinishedController>);

impl EventHandler<Job> for JobEvents {
    fn on_apply(&self, _old: Option<&Job>, new: &Arc<Job>) {
        if expiry(new).is_some() {
            self.0.queue.add(key_of(&new.metadata));
        }
    }
    fn on_delete(&self, _job: &Arc<Job>) {}
}

/// When a finished Job with a TTL expires.
fn expiry(job: &Job) -> Option<Timestamp> {
    let ttl = job.spec.as_ref()?.ttl_seconds_after_finished?;
    let finished = job
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")?;
    let at = finished.last_transition_time.as_ref()?.0;
    at.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(ttl.into()))
        .ok()
}

impl Reconciler for TtlAfterFinishedController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let Some(job) = self.jobs.get(Some(ns), name) else {
            return Ok(None);
        };
        if job.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let Some(expires) = expiry(&job) else {
            return Ok(None);
        };
        let left = expires.duration_since(Timestamp::now());
        if left.is_positive() {
            return Ok(Some(left.unsigned_abs()));
        }
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            preconditions: Some(Preconditions {
                uid: job.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match Api::<Job>::namespaced(self.client.clone(), ns)
            .delete(name, &params)
            .await
        {
            Ok(_) => {
                tracing::info!(job = key, "deleted a finished job past its TTL");
                Ok(None)
            }
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(None),
            Err(e) => Err(Error::api("deleting finished job", key, e)),
        }
    }
}
