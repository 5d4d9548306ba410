//! `JobController`: runs each Job's pods to completion, as upstream's job controller.
//!
//! Every pod it creates carries the `batch.kubernetes.io/job-tracking` finalizer, so a
//! finished pod cannot vanish before it is counted. Counting is crash-safe in three
//! steps, as upstream: the finished pod's UID goes into `status.uncountedTerminatedPods`
//! (written), its finalizer is removed, then it moves into `succeeded` or `failed`. A
//! pod being deleted before it succeeded counts as failed.
//!
//! A pass (level-triggered, safe to repeat):
//! 1. count finished pods (above); release the finalizers of pods whose Job is gone;
//! 2. decide: suspended (delete active pods, `Suspended` condition), failed (more
//!    failures than `backoffLimit`, `activeDeadlineSeconds` passed: `FailureTarget`,
//!    then `Failed` once no pod is left running), complete (`completions` succeeded, or
//!    in work-queue mode one succeeded and none running, or an Indexed Job meeting a
//!    `successPolicy` rule: `SuccessCriteriaMet`, then `Complete`; a `podFailurePolicy`
//!    rule may fail the Job at once (`FailJob`) or leave a failure uncounted
//!    (`Ignore`));
//! 3. otherwise keep `min(parallelism, what is left)` pods active — for Indexed Jobs
//!    one per missing completion index — recreating failed ones after a back-off of 10 s
//!    doubling per failure since the last success (at most 10 minutes);
//! 4. write status: active, ready, terminating, succeeded, failed, completedIndexes,
//!    startTime, completionTime, conditions.

pub mod indexes;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use krust_api::sync::Unpoisoned;
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, Informer, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use crate::Error;
use crate::expectations::Expectations;
use crate::owner::{controller_of, controller_ref, key_of, split_key};
use crate::podcontrol::PodControl;
use crate::replicaset::BURST_REPLICAS;

/// The finalizer that keeps a Job's pod until the controller has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// The annotation (and label) with an Indexed Job pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// The annotation with how many times a pod's index failed before it (backoffLimitPerIndex).
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
/// The label every pod of a Job has (its generated selector).
const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
/// Upstream's `DefaultJobPodFailureBackOff` and `MaxJobPodFailureBackOff`.
const BACKOFF_BASE: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// Failures since the last success, and when the last one was counted.
#[derive(Clone, Copy)]
struct Backoff {
    failures: u32,
    last: Instant,
}

impl Backoff {
    fn remaining(&self) -> Option<Duration> {
        backoff_delay(self.failures)?
            .checked_sub(self.last.elapsed())
            .filter(|d| !d.is_zero())
    }
}

/// The wait before a new pod after `failures` failures: none, then 10 s doubling per
/// failure, at most 10 minutes.
fn backoff_delay(failures: u32) -> Option<Duration> {
    let doublings = failures.checked_sub(1)?.min(16);
    Some(BACKOFF_BASE.saturating_mul(1 << doublings).min(BACKOFF_MAX))
}

/// How long index `i` must still wait for a new pod under backoffLimitPerIndex: the
/// back-off of its latest failed pod's failures, counted from when that pod finished
/// (upstream's `getRemainingTimePerIndex`; a pod without a finish time counts as
/// finished now).
fn index_backoff(all: &[Arc<Pod>], i: i32, now: Timestamp) -> Option<Duration> {
    let last = all
        .iter()
        .filter(|p| index_of(p) == Some(i) && phase(p) == "Failed")
        .max_by_key(|p| index_failures(p))?;
    let delay = backoff_delay(index_failures(last) as u32 + 1)?;
    let finished = last
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map(|t| t.0)
        .max()
        .unwrap_or(now);
    let since = Duration::try_from(now.duration_since(finished)).unwrap_or_default();
    delay.checked_sub(since).filter(|d| !d.is_zero())
}

pub struct JobController {
    client: Client,
    jobs: Cache<Job>,
    pods: Cache<Pod>,
    queue: Arc<WorkQueue>,
    expectations: Arc<Expectations>,
    events: EventRecorder,
    backoff: Mutex<HashMap<String, Backoff>>,
    /// The Job as this controller last wrote its status, until the cache catches up. The
    /// pod cache can be ahead of the Job cache: it may show pods whose finalizers were
    /// removed after a status write the Job cache has not seen yet, and a pass reading
    /// that older status would not count them and start pods beyond `completions`.
    written: Mutex<HashMap<String, Arc<Job>>>,
    /// Pods counted and released (their finalizer removal acknowledged), by Job, until
    /// the pod cache shows them without the finalizer: a pass in between must not count
    /// them again (upstream's finalizer expectations).
    released: Mutex<HashMap<String, HashSet<String>>>,
}

impl JobController {
    /// Registers the controller on the shared Job informer and a pod informer of its own
    /// (only pods of Jobs, whole: the controller reads their finalizers, annotations and
    /// container states), which the caller runs.
    pub fn new(
        client: Client,
        informers: &SharedInformers,
        events: EventRecorder,
    ) -> (Arc<Self>, Arc<Informer<Pod>>) {
        let jobs = informers.get::<Job>();
        let pods = Informer::<Pod>::new(
            Api::all(client.clone()),
            watcher::Config::default().labels(CONTROLLER_UID),
        );
        let controller = Arc::new(JobController {
            client,
            jobs: jobs.cache(),
            pods: pods.cache(),
            queue: WorkQueue::new("job"),
            expectations: Arc::default(),
            events,
            backoff: Mutex::default(),
            written: Mutex::default(),
            released: Mutex::default(),
        });
        jobs.add_handler(Arc::new(JobEvents(controller.clone())));
        pods.add_handler(Arc::new(PodEvents(controller.clone())));
        (controller, pods)
    }
}

struct JobEvents(Arc<JobController>);

impl EventHandler<Job> for JobEvents {
    fn on_apply(&self, _old: Option<&Job>, new: &Arc<Job>) {
        self.0.queue.add(key_of(&new.metadata));
    }
    fn on_delete(&self, job: &Arc<Job>) {
        let key = key_of(&job.metadata);
        self.0.expectations.forget(&key);
        self.0.backoff.locked().remove(&key);
        self.0.written.locked().remove(&key);
        self.0.released.locked().remove(&key);
        // Its pods' finalizers must go.
        self.0.queue.add(key);
    }
}

struct PodEvents(Arc<JobController>);

/// The `namespace/name` of the Job that controls a pod.
fn job_key(pod: &Pod) -> Option<String> {
    let r = controller_of(&pod.metadata).filter(|r| r.kind == "Job")?;
    Some(format!(
        "{}/{}",
        pod.namespace().unwrap_or_default(),
        r.name
    ))
}

impl EventHandler<Pod> for PodEvents {
    fn on_apply(&self, old: Option<&Pod>, new: &Arc<Pod>) {
        if let Some(key) = job_key(new) {
            if old.is_none() {
                self.0.expectations.creation_observed(&key);
            }
            self.0.queue.add(key);
        }
    }
    fn on_delete(&self, pod: &Arc<Pod>) {
        if let Some(key) = job_key(pod) {
            self.0
                .expectations
                .deletion_observed(&key, &key_of(&pod.metadata));
            self.0.queue.add(key);
        }
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn has_finalizer(pod: &Pod) -> bool {
    pod.finalizers().iter().any(|f| f == TRACKING_FINALIZER)
}

/// Finished for the Job: Succeeded, or Failed, or being deleted before it succeeded
/// (upstream's `isPodFailed`; with `podReplacementPolicy: Failed`, only Failed).
fn outcome(pod: &Pod, only_failed: bool) -> Option<bool> {
    match phase(pod) {
        "Succeeded" => Some(true),
        "Failed" => Some(false),
        _ if !only_failed && pod.metadata.deletion_timestamp.is_some() => Some(false),
        _ => None,
    }
}

fn is_active(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_none()
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// How many times the pod's index failed before this pod (backoffLimitPerIndex).
fn index_failures(pod: &Pod) -> i32 {
    pod.annotations()
        .get(INDEX_FAILURE_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn index_of(pod: &Pod) -> Option<i32> {
    pod.annotations().get(COMPLETION_INDEX)?.parse().ok()
}

/// Container restarts of a pod that is still running (restartPolicy OnFailure counts
/// them as failures).
fn restarts(pod: &Pod) -> i32 {
    let status = pod.status.as_ref();
    let lists = status.map(|s| [&s.init_container_statuses, &s.container_statuses]);
    lists
        .into_iter()
        .flatten()
        .flatten()
        .flatten()
        .map(|c| c.restart_count)
        .sum()
}

fn condition<'a>(status: &'a JobStatus, ty: &str) -> Option<&'a JobCondition> {
    status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ty && c.status == "True")
}

/// Sets a condition (keeping its transition time when its status does not change).
fn set_condition(status: &mut JobStatus, ty: &str, value: bool, reason: &str, message: &str) {
    let now = Time(Timestamp::now());
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let value = if value { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == ty) {
        Some(c) if c.status == value && c.reason.as_deref() == Some(reason) => {}
        Some(c) => {
            if c.status != value {
                c.last_transition_time = Some(now.clone());
            }
            c.status = value.into();
            c.reason = Some(reason.into());
            c.message = Some(message.into());
            c.last_probe_time = Some(now);
        }
        None => conditions.push(JobCondition {
            type_: ty.into(),
            status: value.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_probe_time: Some(now.clone()),
            last_transition_time: Some(now),
        }),
    }
}

/// How a pass ends the Job, when it does.
struct Ending {
    /// `Complete` or `Failed`.
    terminal: &'static str,
    /// `SuccessCriteriaMet` or `FailureTarget`: set first, while pods still stop.
    interim: &'static str,
    reason: String,
    message: String,
}

impl Ending {
    fn failed(reason: &str, message: impl Into<String>) -> Ending {
        Ending {
            terminal: "Failed",
            interim: "FailureTarget",
            reason: reason.into(),
            message: message.into(),
        }
    }

    fn complete(reason: &str, message: impl Into<String>) -> Ending {
        Ending {
            terminal: "Complete",
            interim: "SuccessCriteriaMet",
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// What a Job's `podFailurePolicy` says of a failed pod: the action of the first rule
/// that matches it and, for `FailJob`, upstream's message. `None`: no rule matches
/// (the failure counts).
fn failure_rule(spec: &JobSpec, pod: &Pod) -> Option<(String, String)> {
    let rules = &spec.pod_failure_policy.as_ref()?.rules;
    let status = pod.status.as_ref()?;
    let name = pod.name_any();
    let ns = pod.namespace().unwrap_or_default();
    for (index, rule) in rules.iter().enumerate() {
        let matched = if let Some(codes) = &rule.on_exit_codes {
            let statuses = [&status.init_container_statuses, &status.container_statuses];
            statuses.into_iter().flatten().flatten().find_map(|c| {
                let code = c.state.as_ref()?.terminated.as_ref()?.exit_code;
                let named = codes.container_name.as_ref().is_none_or(|n| *n == c.name);
                let listed = codes.values.contains(&code);
                let hit = match codes.operator.as_str() {
                    "In" => listed,
                    "NotIn" => !listed,
                    _ => false,
                };
                (code != 0 && named && hit).then(|| {
                    format!(
                        "Container {} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                        c.name, rule.action
                    )
                })
            })
        } else {
            let conditions = status.conditions.iter().flatten();
            let patterns = rule.on_pod_conditions.iter().flatten();
            let mut found = None;
            for pattern in patterns {
                let want = pattern.status.as_str();
                if let Some(c) = conditions
                    .clone()
                    .find(|c| c.type_ == pattern.type_ && c.status == want)
                {
                    found = Some(format!(
                        "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                        c.type_, rule.action
                    ));
                    break;
                }
            }
            found
        };
        if let Some(message) = matched {
            return Some((rule.action.clone(), message));
        }
    }
    None
}

/// Which rule of an Indexed Job's `successPolicy` its completed indexes meet, if any.
fn success_rule(spec: &JobSpec, completed: &BTreeSet<i32>) -> Option<usize> {
    let rules = &spec.success_policy.as_ref()?.rules;
    let completions = spec.completions.unwrap_or(0);
    rules.iter().position(|rule| {
        let (pool, all) = match &rule.succeeded_indexes {
            Some(text) => {
                let wanted = indexes::parse(text, completions);
                let done = wanted.intersection(completed).count();
                (done, wanted.len())
            }
            None => (completed.len(), completions as usize),
        };
        match rule.succeeded_count {
            Some(count) => pool >= count.max(0) as usize,
            None => pool == all && all > 0,
        }
    })
}

impl Reconciler for JobController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        // Before the pods are read (see `Expectations::satisfied`).
        let satisfied = self.expectations.satisfied(key);
        let pods: Vec<Arc<Pod>> = self.pods.state_filter(|p| {
            p.metadata.namespace.as_deref() == Some(ns)
                && controller_of(&p.metadata).is_some_and(|r| r.kind == "Job" && r.name == name)
        });
        let job = self.jobs.get(Some(ns), name).map(|j| self.newest(key, j));
        let uid = job.as_ref().and_then(|j| j.uid());
        let (owned, strays): (Vec<Arc<Pod>>, Vec<Arc<Pod>>) = pods.into_iter().partition(|p| {
            controller_of(&p.metadata).is_some_and(|r| Some(&r.uid) == uid.as_ref())
        });
        // Pods of a Job that is gone (or was replaced) are released at once.
        self.release(strays.iter().filter(|p| has_finalizer(p)))
            .await?;
        let Some(job) = job else {
            self.expectations.forget(key);
            return Ok(None);
        };
        if job.metadata.deletion_timestamp.is_some() {
            self.release(owned.iter().filter(|p| has_finalizer(p)))
                .await?;
            return Ok(None);
        }
        self.sync(key, &job, owned, satisfied).await
    }
}

impl JobController {
    /// Removes the tracking finalizer from `pods`.
    async fn release(&self, pods: impl Iterator<Item = &Arc<Pod>>) -> Result<(), Error> {
        let patch = serde_json::json!({"metadata": {
            "$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}});
        let results = join_all(pods.map(|pod| {
            let api: Api<Pod> = Api::namespaced(
                self.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or_default(),
            );
            let patch = patch.clone();
            async move {
                let name = pod.name_any();
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if is_status(&e, 404) => Ok(()),
                    Err(e) => Err(Error::api(
                        "removing the job-tracking finalizer",
                        key_of(&pod.metadata),
                        e,
                    )),
                }
            }
        }))
        .await;
        results.into_iter().collect()
    }

    async fn write_status(&self, key: &str, job: &Job, status: JobStatus) -> Result<Job, Error> {
        let mut updated = job.clone();
        updated.status = Some(status);
        let written = Api::<Job>::namespaced(self.client.clone(), split_key(key).0)
            .replace_status(&job.name_any(), &PostParams::default(), &updated)
            .await
            .map_err(|e| Error::api("updating status of job", key, e))?;
        self.written
            .locked()
            .insert(key.to_string(), Arc::new(written.clone()));
        Ok(written)
    }

    /// The cached Job, or the one last written when the cache is behind it (see
    /// `written`).
    fn newest(&self, key: &str, cached: Arc<Job>) -> Arc<Job> {
        let version = |j: &Job| j.resource_version().and_then(|v| v.parse::<u64>().ok());
        let mut written = self.written.locked();
        match written.get(key) {
            Some(w) if w.uid() == cached.uid() && version(w) > version(&cached) => w.clone(),
            _ => {
                written.remove(key);
                cached
            }
        }
    }

    async fn sync(
        &self,
        key: &str,
        job: &Arc<Job>,
        pods: Vec<Arc<Pod>>,
        satisfied: bool,
    ) -> Result<Option<Duration>, Error> {
        let spec = job.spec.clone().unwrap_or_default();
        let original = job.status.clone().unwrap_or_default();
        let mut status = original.clone();
        let indexed = spec.completion_mode.as_deref() == Some("Indexed");
        // With a podFailurePolicy (or podReplacementPolicy Failed) a pod counts as failed
        // only once it has failed, so the policy sees its exit codes.
        let only_failed = spec.pod_replacement_policy.as_deref() == Some("Failed")
            || spec.pod_failure_policy.is_some();
        let finished = ["Complete", "Failed"]
            .into_iter()
            .find(|t| condition(&original, t).is_some());

        // 1. Count finished pods: record their UIDs, release them, then count them.
        let mut uncounted = status.uncounted_terminated_pods.take().unwrap_or_default();
        let mut recorded = false;
        let released: HashSet<String> = {
            let mut all = self.released.locked();
            let mine = all.entry(key.to_string()).or_default();
            // Those the cache shows released (or gone) need no more watching.
            let holding: HashSet<String> = (pods.iter())
                .filter(|p| has_finalizer(p))
                .filter_map(|p| p.uid())
                .collect();
            mine.retain(|uid| holding.contains(uid));
            mine.clone()
        };
        for pod in pods.iter().filter(|p| has_finalizer(p)) {
            let uid = pod.uid().unwrap_or_default();
            let lists = [&uncounted.succeeded, &uncounted.failed];
            if released.contains(&uid) || lists.into_iter().flatten().flatten().any(|u| *u == uid) {
                continue;
            }
            // A finished Job lets go of every pod; still-running ones count as failed.
            let result = outcome(pod, only_failed).or(finished.map(|_| false));
            let list = match result {
                Some(true) => &mut uncounted.succeeded,
                Some(false) => &mut uncounted.failed,
                None => continue,
            };
            list.get_or_insert_with(Vec::new).push(uid);
            recorded = true;
        }
        let mut job = (**job).clone();
        if recorded {
            status.uncounted_terminated_pods = Some(uncounted.clone());
            job = self.write_status(key, &job, status.clone()).await?;
        }
        let counted: BTreeSet<String> = [&uncounted.succeeded, &uncounted.failed]
            .into_iter()
            .flatten()
            .flatten()
            .cloned()
            .collect();
        self.release(
            pods.iter()
                .filter(|p| has_finalizer(p) && counted.contains(&p.uid().unwrap_or_default())),
        )
        .await?;
        (self.released.locked().entry(key.to_string()).or_default())
            .extend(counted.iter().cloned());
        let completions = spec.completions;
        let mut completed = indexes::parse(
            status.completed_indexes.as_deref().unwrap_or_default(),
            completions.unwrap_or(0),
        );
        let newly_succeeded = uncounted.succeeded.take().unwrap_or_default();
        let newly_failed = uncounted.failed.take().unwrap_or_default();
        for uid in &newly_succeeded {
            let pod = pods.iter().find(|p| p.uid().as_deref() == Some(uid));
            if let Some(i) = pod.and_then(|p| index_of(p)) {
                completed.insert(i);
            }
        }
        // podFailurePolicy: Ignore does not count; FailJob fails the Job at once;
        // FailIndex, or backoffLimitPerIndex exhausted, fails the pod's index.
        let per_index = spec.backoff_limit_per_index.filter(|_| indexed);
        let mut failed_indexes = indexes::parse(
            status.failed_indexes.as_deref().unwrap_or_default(),
            completions.unwrap_or(0),
        );
        let mut failed_now = 0;
        let mut fail_job = None;
        for uid in &newly_failed {
            let pod = pods.iter().find(|p| p.uid().as_deref() == Some(uid));
            let action = pod.and_then(|p| failure_rule(&spec, p));
            match &action {
                Some((action, _)) if action == "Ignore" => continue,
                Some((action, message)) if action == "FailJob" => {
                    fail_job.get_or_insert(message.clone());
                }
                _ => {}
            }
            failed_now += 1;
            if let (Some(limit), Some(pod)) = (per_index, pod)
                && let Some(i) = index_of(pod)
            {
                let fail_index = matches!(&action, Some((a, _)) if a == "FailIndex");
                if fail_index || index_failures(pod) >= limit {
                    failed_indexes.insert(i);
                }
            }
        }
        if per_index.is_some() {
            status.failed_indexes = Some(indexes::format(&failed_indexes));
        }
        status.succeeded = Some(status.succeeded.unwrap_or(0) + newly_succeeded.len() as i32);
        status.failed = Some(status.failed.unwrap_or(0) + failed_now);
        status.uncounted_terminated_pods = Some(UncountedTerminatedPods::default());
        if indexed {
            completed.retain(|i| *i < completions.unwrap_or(0));
            status.completed_indexes = Some(indexes::format(&completed));
        }
        self.note_outcomes(key, newly_succeeded.len(), failed_now as usize);

        let active: Vec<&Arc<Pod>> = pods.iter().filter(|p| is_active(p)).collect();
        let terminating = pods
            .iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_some()
                    && !matches!(phase(p), "Succeeded" | "Failed")
            })
            .count() as i32;
        let succeeded = status.succeeded.unwrap_or(0);
        let failed = status.failed.unwrap_or(0);
        let suspended = spec.suspend == Some(true);
        let mut requeue = None;

        if finished.is_none() {
            let now = Timestamp::now();
            if suspended {
                if condition(&status, "Suspended").is_none() {
                    set_condition(
                        &mut status,
                        "Suspended",
                        true,
                        "JobSuspended",
                        "Job suspended",
                    );
                    self.events.record(
                        &job,
                        EventType::Normal,
                        "Suspended",
                        "Job suspended".into(),
                    );
                }
            } else if condition(&status, "Suspended").is_some() {
                set_condition(&mut status, "Suspended", false, "JobResumed", "Job resumed");
                // The deadline counts from the resumption.
                status.start_time = Some(Time(now));
                self.events
                    .record(&job, EventType::Normal, "Resumed", "Job resumed".into());
            }
            if !suspended && status.start_time.is_none() {
                status.start_time = Some(Time(now));
            }
            let all_done =
                completed.len() + failed_indexes.len() >= completions.unwrap_or(0).max(0) as usize;
            let too_many = spec
                .max_failed_indexes
                .is_some_and(|max| failed_indexes.len() > max.max(0) as usize);
            let undecided = condition(&status, "FailureTarget").is_none()
                && condition(&status, "SuccessCriteriaMet").is_none();
            let ending = match fail_job {
                Some(message) if undecided => Some(Ending::failed("PodFailurePolicy", message)),
                _ if undecided && too_many => Some(Ending::failed(
                    "MaxFailedIndexesExceeded",
                    "Job has exceeded the specified maximal number of failed indexes",
                )),
                _ if undecided && per_index.is_some() && !failed_indexes.is_empty() && all_done => {
                    Some(Ending::failed("FailedIndexes", "Job has failed indexes"))
                }
                _ => self.ending(&spec, &status, &active, &completed, succeeded, failed),
            };
            let deadline = spec
                .active_deadline_seconds
                .zip(status.start_time.as_ref())
                .map(|(seconds, start)| start.0.as_second() + seconds - now.as_second());
            let ending = ending.or(match deadline {
                Some(left) if left <= 0 && !suspended => Some(Ending::failed(
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                )),
                Some(left) if !suspended => {
                    requeue = Some(Duration::from_secs(left as u64));
                    None
                }
                _ => None,
            });
            match ending {
                Some(ending) => {
                    if condition(&status, ending.interim).is_none() {
                        set_condition(
                            &mut status,
                            ending.interim,
                            true,
                            &ending.reason,
                            &ending.message,
                        );
                    }
                    // Whatever still runs is stopped; the Job ends when nothing does.
                    self.delete_pods(key, &job, &active).await?;
                    if active.is_empty() && terminating == 0 {
                        set_condition(
                            &mut status,
                            ending.terminal,
                            true,
                            &ending.reason,
                            &ending.message,
                        );
                        if ending.terminal == "Complete" {
                            status.completion_time = Some(Time(now));
                            self.events.record(
                                &job,
                                EventType::Normal,
                                "Completed",
                                "Job completed".into(),
                            );
                        } else {
                            self.events.record(
                                &job,
                                EventType::Warning,
                                &ending.reason,
                                ending.message.clone(),
                            );
                        }
                    }
                }
                None if suspended => self.remove_pods(key, &job, &active).await?,
                None => {
                    if satisfied {
                        requeue = min(
                            requeue,
                            self.manage(
                                key,
                                &job,
                                &spec,
                                (&active, &pods),
                                &completed.union(&failed_indexes).copied().collect(),
                                succeeded,
                                terminating,
                            )
                            .await?,
                        );
                    }
                }
            }
        }

        let pending = self.expectations.pending_deletions(key);
        let active: Vec<&&Arc<Pod>> = active
            .iter()
            .filter(|p| !pending.contains(&key_of(&p.metadata)))
            .collect();
        status.active = Some(active.len() as i32);
        status.ready = Some(active.iter().filter(|p| is_ready(p)).count() as i32);
        status.terminating = Some(terminating);
        if job.status.as_ref() != Some(&status) {
            self.write_status(key, &job, status).await?;
        }
        Ok(requeue)
    }

    /// Whether the Job has now failed or succeeded, and how.
    fn ending(
        &self,
        spec: &JobSpec,
        status: &JobStatus,
        active: &[&Arc<Pod>],
        completed: &BTreeSet<i32>,
        succeeded: i32,
        failed: i32,
    ) -> Option<Ending> {
        if let Some(decided) = ["FailureTarget", "SuccessCriteriaMet"]
            .into_iter()
            .find_map(|t| condition(status, t))
        {
            // Decided before: finish what was started, for the same reason.
            let reason = decided.reason.as_deref().unwrap_or_default();
            let message = decided.message.clone().unwrap_or_default();
            return Some(if decided.type_ == "FailureTarget" {
                Ending::failed(reason, message)
            } else {
                Ending::complete(reason, message)
            });
        }
        let limit = spec.backoff_limit.unwrap_or(6);
        let on_failure = spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            == Some("OnFailure");
        let restarts: i32 = if on_failure {
            active.iter().map(|p| restarts(p)).sum()
        } else {
            0
        };
        let past_on_failure = on_failure
            && if limit == 0 {
                restarts > 0
            } else {
                restarts >= limit
            };
        if failed > limit || past_on_failure {
            return Some(Ending::failed(
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            ));
        }
        let indexed = spec.completion_mode.as_deref() == Some("Indexed");
        if indexed && let Some(rule) = success_rule(spec, completed) {
            return Some(Ending::complete(
                "SuccessPolicy",
                format!("Matched rules at index {rule}"),
            ));
        }
        let complete = match (indexed, spec.completions) {
            (true, Some(c)) => completed.len() as i32 >= c,
            (false, Some(c)) => succeeded >= c,
            (_, None) => succeeded > 0 && active.is_empty(),
        };
        complete.then(|| {
            Ending::complete(
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )
        })
    }

    /// Counts outcomes into the back-off: a success resets it, a failure doubles it.
    fn note_outcomes(&self, key: &str, succeeded: usize, failed: usize) {
        let mut backoff = self.backoff.locked();
        if succeeded > 0 {
            backoff.remove(key);
        }
        if failed > 0 {
            let entry = backoff.entry(key.to_string()).or_insert(Backoff {
                failures: 0,
                last: Instant::now(),
            });
            entry.failures += failed as u32;
            entry.last = Instant::now();
        }
    }

    /// Creates or deletes pods so that the right ones run. Returns when to look again
    /// (a back-off to wait out).
    #[allow(clippy::too_many_arguments)]
    async fn manage(
        &self,
        key: &str,
        job: &Job,
        spec: &JobSpec,
        (active, all): (&[&Arc<Pod>], &[Arc<Pod>]),
        completed: &BTreeSet<i32>,
        succeeded: i32,
        terminating: i32,
    ) -> Result<Option<Duration>, Error> {
        let parallelism = spec.parallelism.unwrap_or(1).max(0);
        let indexed = spec.completion_mode.as_deref() == Some("Indexed");
        // Which pods should go, and which indexes (None: unindexed) need a pod.
        let (excess, wanted): (Vec<&Arc<Pod>>, Vec<Option<i32>>) = if indexed {
            let completions = spec.completions.unwrap_or(0);
            let mut seen = BTreeSet::new();
            let mut excess = Vec::new();
            for pod in active {
                match index_of(pod) {
                    Some(i) if i < completions && !completed.contains(&i) && seen.insert(i) => {}
                    _ => excess.push(*pod),
                }
            }
            let room = (parallelism as usize).saturating_sub(seen.len());
            let missing = indexes::missing(completions, completed, &seen);
            (excess, missing.into_iter().take(room).map(Some).collect())
        } else {
            let want = match spec.completions {
                Some(c) => (c - succeeded).clamp(0, parallelism),
                None if succeeded > 0 => active.len() as i32,
                None => parallelism,
            } as usize;
            let mut ranked: Vec<&Arc<Pod>> = active.to_vec();
            // Not ready first, then the newest.
            ranked.sort_by_key(|p| {
                (
                    is_ready(p),
                    std::cmp::Reverse(p.metadata.creation_timestamp.clone()),
                )
            });
            let excess = ranked
                .into_iter()
                .take(active.len().saturating_sub(want))
                .collect();
            (excess, vec![None; want.saturating_sub(active.len())])
        };
        self.remove_pods(key, job, &excess).await?;
        if wanted.is_empty() {
            return Ok(None);
        }
        // podReplacementPolicy Failed: replacements wait until the old pods are gone.
        if spec.pod_replacement_policy.as_deref() == Some("Failed") && terminating > 0 {
            return Ok(None);
        }
        // Under backoffLimitPerIndex each index waits out its own back-off; otherwise
        // the Job's failures since its last success hold every new pod back.
        let mut wait = None;
        let wanted: Vec<Option<i32>> = if indexed && spec.backoff_limit_per_index.is_some() {
            let now = Timestamp::now();
            wanted
                .into_iter()
                .filter(|i| match i.and_then(|i| index_backoff(all, i, now)) {
                    Some(left) => {
                        wait = min(wait, Some(left));
                        false
                    }
                    None => true,
                })
                .collect()
        } else if let Some(left) = self.backoff.locked().get(key).and_then(Backoff::remaining) {
            return Ok(Some(left));
        } else {
            wanted
        };
        let wanted: Vec<Option<i32>> = wanted.into_iter().take(BURST_REPLICAS).collect();
        self.control(key, job)
            .create(wanted.len(), |n| {
                let mut pod = pod_for(job, wanted[n]);
                if let (Some(i), Some(_)) = (wanted[n], spec.backoff_limit_per_index) {
                    // How often this index failed before: one more than its last failure.
                    let before = all
                        .iter()
                        .filter(|p| index_of(p) == Some(i) && phase(p) == "Failed")
                        .map(|p| index_failures(p) + 1)
                        .max()
                        .unwrap_or(0);
                    pod.annotations_mut()
                        .insert(INDEX_FAILURE_COUNT.into(), before.to_string());
                }
                pod
            })
            .await?;
        Ok(wait)
    }

    fn control<'a>(&'a self, key: &'a str, job: &'a Job) -> PodControl<'a, Job> {
        PodControl {
            client: &self.client,
            expectations: &self.expectations,
            events: &self.events,
            key,
            owner: job,
        }
    }

    async fn delete_pods(&self, key: &str, job: &Job, pods: &[&Arc<Pod>]) -> Result<(), Error> {
        let pods: Vec<(&str, String)> = pods
            .iter()
            .map(|p| {
                (
                    p.metadata.name.as_deref().unwrap_or_default(),
                    key_of(&p.metadata),
                )
            })
            .collect();
        self.control(key, job).delete(&pods).await
    }

    /// Deletes pods the Job no longer wants (excess, or suspended) without counting
    /// them as failed: upstream lets go of them (the tracking finalizer) first.
    async fn remove_pods(&self, key: &str, job: &Job, pods: &[&Arc<Pod>]) -> Result<(), Error> {
        self.release(pods.iter().copied().filter(|p| has_finalizer(p)))
            .await?;
        self.delete_pods(key, job, pods).await
    }
}

fn min(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A pod for the Job: its template, the tracking finalizer, a controller reference;
/// for an Indexed Job its index (annotation, label, `JOB_COMPLETION_INDEX`, hostname
/// `<job>-<index>`), as upstream.
pub fn pod_for(job: &Job, index: Option<i32>) -> Pod {
    let template: PodTemplateSpec = job
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut finalizers = meta.finalizers.unwrap_or_default();
    finalizers.push(TRACKING_FINALIZER.into());
    let name = job.name_any();
    let mut pod = Pod {
        metadata: ObjectMeta {
            generate_name: Some(match index {
                Some(i) => format!("{name}-{i}-"),
                None => format!("{name}-"),
            }),
            namespace: job.namespace(),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: Some(finalizers),
            owner_references: Some(vec![controller_ref(job)]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    };
    if let Some(i) = index {
        let value = i.to_string();
        pod.annotations_mut()
            .insert(COMPLETION_INDEX.into(), value.clone());
        pod.labels_mut().insert(COMPLETION_INDEX.into(), value);
        let spec = pod.spec.get_or_insert_with(Default::default);
        if spec.hostname.as_deref().is_none_or(str::is_empty) {
            spec.hostname = Some(format!("{name}-{i}"));
        }
        let env = EnvVar {
            name: "JOB_COMPLETION_INDEX".into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                }),
                ..Default::default()
            }),
        };
        let init = spec.init_containers.iter_mut().flatten();
        for c in spec.containers.iter_mut().chain(init) {
            let vars = c.env.get_or_insert_with(Vec::new);
            if !vars.iter().any(|v| v.name == env.name) {
                vars.push(env.clone());
            }
        }
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(spec: serde_json::Value) -> Job {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "pi", "namespace": "ns", "uid": "u1"},
            "spec": spec}))
        .unwrap()
    }

    #[test]
    fn indexed_pods_carry_their_index_everywhere_upstream_puts_it() {
        let j = job(
            serde_json::json!({"completionMode": "Indexed", "completions": 3,
            "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": "u1"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}),
        );
        let pod = pod_for(&j, Some(2));
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("pi-2-"));
        assert_eq!(pod.annotations()[COMPLETION_INDEX], "2");
        assert_eq!(pod.labels()[COMPLETION_INDEX], "2");
        assert_eq!(pod.labels()[CONTROLLER_UID], "u1");
        assert!(has_finalizer(&pod));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("pi-2"));
        let env = &spec.containers[0].env.as_ref().unwrap()[0];
        assert_eq!(env.name, "JOB_COMPLETION_INDEX");
        assert_eq!(
            env.value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
        let owner = &pod.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("Job", Some(true)));
        let plain = pod_for(&j, None);
        assert_eq!(plain.metadata.generate_name.as_deref(), Some("pi-"));
        assert!(plain.annotations().get(COMPLETION_INDEX).is_none());
    }

    fn failed_pod(code: i32, conditions: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "status": {"phase": "Failed", "conditions": conditions, "containerStatuses": [
                {"name": "main", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": code}}}]}}))
        .unwrap()
    }

    #[test]
    fn pod_failure_policies_match_exit_codes_and_conditions_in_order() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "template": {},
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
                {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [42]}}]}}))
        .unwrap();
        let (action, message) =
            failure_rule(&spec, &failed_pod(42, serde_json::json!([]))).unwrap();
        assert_eq!(action, "FailJob");
        assert_eq!(
            message,
            "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 1"
        );
        let disrupted = failed_pod(
            42,
            serde_json::json!([{"type": "DisruptionTarget", "status": "True"}]),
        );
        assert_eq!(failure_rule(&spec, &disrupted).unwrap().0, "Ignore");
        assert_eq!(
            failure_rule(&spec, &failed_pod(1, serde_json::json!([])))
                .unwrap()
                .0,
            "Count"
        );
        // Exit code 0 never matches an exit-code rule.
        let none: JobSpec = serde_json::from_value(serde_json::json!({"template": {},
            "podFailurePolicy": {"rules": [{"action": "FailJob",
                "onExitCodes": {"operator": "NotIn", "values": [1]}}]}}))
        .unwrap();
        assert!(failure_rule(&none, &failed_pod(0, serde_json::json!([]))).is_none());
    }

    #[test]
    fn success_policies_match_by_indexes_and_counts() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "template": {}, "completions": 10, "completionMode": "Indexed",
            "successPolicy": {"rules": [
                {"succeededIndexes": "0-2"},
                {"succeededIndexes": "5-9", "succeededCount": 2}]}}))
        .unwrap();
        let done = |text: &str| indexes::parse(text, 10);
        assert_eq!(success_rule(&spec, &done("0,1")), None);
        assert_eq!(success_rule(&spec, &done("0-2")), Some(0));
        assert_eq!(success_rule(&spec, &done("1,6,9")), Some(1));
        assert_eq!(success_rule(&spec, &done("3,4,6")), None);
    }

    #[test]
    fn back_off_doubles_per_failure_up_to_ten_minutes() {
        let at = |failures| {
            Backoff {
                failures,
                last: Instant::now(),
            }
            .remaining()
            .map(|d| d.as_secs() + 1)
        };
        assert_eq!(at(0), None);
        assert_eq!(at(1), Some(10));
        assert_eq!(at(3), Some(40));
        assert_eq!(at(20), Some(600));
    }

    #[test]
    fn each_index_waits_out_the_back_off_of_its_own_failures() {
        let now = Timestamp::now();
        let failed = |index: i32, failures_before: i32, finished_secs_ago: i64| -> Arc<Pod> {
            let finished = now - k8s_openapi::jiff::SignedDuration::from_secs(finished_secs_ago);
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"annotations": {
                        "batch.kubernetes.io/job-completion-index": index.to_string(),
                        INDEX_FAILURE_COUNT: failures_before.to_string()}},
                    "status": {"phase": "Failed", "containerStatuses": [{"name": "c", "image": "i",
                        "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 1, "finishedAt": finished.to_string()}}}]}
                }))
                .unwrap(),
            )
        };
        // Index 0 failed once 4 s ago (10 s), index 1 twice, the last 5 s ago (20 s).
        let pods = vec![failed(0, 0, 4), failed(1, 0, 30), failed(1, 1, 5)];
        // Timestamps keep whole seconds: a second either way.
        let secs = |i| index_backoff(&pods, i, now).map(|d| d.as_secs());
        assert!(matches!(secs(0), Some(5..=6)), "{:?}", secs(0));
        assert!(matches!(secs(1), Some(14..=15)), "{:?}", secs(1));
        assert_eq!(secs(2), None, "never failed");
        let long_ago = vec![failed(0, 0, 11)];
        assert_eq!(index_backoff(&long_ago, 0, now), None, "waited out");
    }

    #[test]
    fn deleted_pods_count_as_failed_unless_only_failures_are_replaced() {
        let mut pod = Pod::default();
        assert_eq!(outcome(&pod, false), None);
        pod.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        assert_eq!(outcome(&pod, false), Some(false));
        assert_eq!(outcome(&pod, true), None);
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert_eq!(outcome(&pod, false), Some(true));
    }
}
