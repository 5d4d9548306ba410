//! `CronJobController`: creates a Job at each scheduled time of a CronJob, as upstream's
//! cronjob controller (v2).
//!
//! A pass over a CronJob:
//! 1. its Jobs (by controller reference) update `status.active` (finished ones leave it:
//!    `SawCompletedJob`; vanished ones too: `MissingJob`) and `lastSuccessfulTime`;
//! 2. unless suspended: the most recent scheduled time since the last one (or since
//!    creation; no earlier than `startingDeadlineSeconds` ago) gets its Job, named
//!    `<cronjob>-<minutes since the epoch>` — unless `concurrencyPolicy: Forbid` and a Job
//!    still runs, or with `Replace` after deleting the running ones;
//! 3. finished Jobs beyond `successfulJobsHistoryLimit` (3) and `failedJobsHistoryLimit`
//!    (1) are deleted, oldest first;
//! 4. the pass comes back at the next scheduled time.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use krust_client::cache::Cache;
use krust_client::events::{EventRecorder, EventType};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::is_status;
use krust_client::queue::{Reconciler, WorkQueue};
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use kube::{Client, ResourceExt};

use crate::Error;
use crate::owner::{controller_of, controller_ref, key_of, split_key};
use krust_api::cron::Schedule;

/// The annotation with the scheduled time a Job was created for.
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// More missed times than this are reported instead of counted (upstream's 100).
const MAX_MISSED: usize = 100;

pub struct CronJobController {
    client: Client,
    cronjobs: Cache<CronJob>,
    jobs: Cache<Job>,
    queue: Arc<WorkQueue>,
    events: EventRecorder,
}

impl CronJobController {
    pub fn new(client: Client, informers: &SharedInformers, events: EventRecorder) -> Arc<Self> {
        let cronjobs = informers.get::<CronJob>();
        let jobs = informers.get::<Job>();
        let controller = Arc::new(CronJobController {
            client,
            cronjobs: cronjobs.cache(),
            jobs: jobs.cache(),
            queue: WorkQueue::new("cronjob"),
            events,
        });
        cronjobs.add_handler(Arc::new(CronJobEvents(controller.clone())));
        jobs.add_handler(Arc::new(JobEvents(controller.clone())));
        controller
    }
}

struct CronJobEvents(Arc<CronJobController>);

impl EventHandler<CronJob> for CronJobEvents {
    fn on_apply(&self, _old: Option<&CronJob>, new: &Arc<CronJob>) {
        self.0.queue.add(key_of(&new.metadata));
    }
    fn on_delete(&self, _obj: &Arc<CronJob>) {}
}

/// A Job's changes concern the CronJob that controls it.
struct JobEvents(Arc<CronJobController>);

impl JobEvents {
    fn owner(&self, job: &Job) {
        if let Some(r) = controller_of(&job.metadata).filter(|r| r.kind == "CronJob") {
            let ns = job.metadata.namespace.as_deref().unwrap_or_default();
            self.0.queue.add(format!("{ns}/{}", r.name));
        }
    }
}

impl EventHandler<Job> for JobEvents {
    fn on_apply(&self, _old: Option<&Job>, new: &Arc<Job>) {
        self.owner(new);
    }
    fn on_delete(&self, job: &Arc<Job>) {
        self.owner(job);
    }
}

/// `Complete` or `Failed`, when the Job has finished.
fn finished(job: &Job) -> Option<&str> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| c.type_.as_str())
}

/// The most recent scheduled time in `(since, now]` and how many there were.
fn most_recent(
    schedule: &Schedule,
    tz: &TimeZone,
    since: Timestamp,
    now: Timestamp,
) -> (Option<Timestamp>, usize) {
    let mut last = None;
    let mut count = 0;
    let mut t = since;
    while let Some(next) = schedule.next_after(t, tz) {
        if next > now {
            break;
        }
        count += 1;
        last = Some(next);
        t = next;
        if count > MAX_MISSED {
            // Too many to walk: jump to the last hour's worth.
            let recent = now
                .checked_sub(jiff::SignedDuration::from_hours(1))
                .unwrap_or(now);
            if t < recent {
                t = recent;
            }
        }
    }
    (last, count)
}

/// RFC 3339 as Go writes it: `Z` for UTC, else the offset.
fn rfc3339(t: Timestamp, tz: &TimeZone) -> String {
    let zoned = t.to_zoned(tz.clone());
    if zoned.offset().seconds() == 0 {
        zoned.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    } else {
        zoned.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string()
    }
}

impl Reconciler for CronJobController {
    type Error = Error;

    fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    async fn reconcile(&self, key: &str) -> Result<Option<Duration>, Error> {
        let (ns, name) = split_key(key);
        let Some(cj) = self.cronjobs.get(Some(ns), name) else {
            return Ok(None);
        };
        if cj.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let uid = cj.uid().unwrap_or_default();
        let jobs = self.jobs.state_filter(|j| {
            j.metadata.namespace.as_deref() == Some(ns)
                && controller_of(&j.metadata).is_some_and(|r| r.uid == uid)
        });
        let spec = cj.spec.clone().unwrap_or_default();
        let mut status = cj.status.clone().unwrap_or_default();
        self.track_jobs(&cj, &jobs, &mut status);

        let tz = match spec.time_zone.as_deref() {
            Some(name) => match TimeZone::get(name) {
                Ok(tz) => tz,
                Err(_) => {
                    self.events.record(
                        &*cj,
                        EventType::Warning,
                        "UnknownTimeZone",
                        format!("invalid timeZone: {name:?}"),
                    );
                    return self.finish(key, &cj, status, None).await;
                }
            },
            None => TimeZone::system(),
        };
        let schedule = match Schedule::parse(&spec.schedule) {
            Ok(s) => s,
            Err(e) => {
                self.events.record(
                    &*cj,
                    EventType::Warning,
                    "UnparseableSchedule",
                    format!("unparseable schedule: {:?} : {e}", spec.schedule),
                );
                return self.finish(key, &cj, status, None).await;
            }
        };
        let now = Timestamp::now();
        if schedule.next_after(now, &tz).is_none() {
            // A date that never comes (`59 23 31 2 *`): upstream finds no time between
            // two runs and says so in these words.
            self.events.record(
                &*cj,
                EventType::Warning,
                "InvalidSchedule",
                format!(
                    "invalid schedule: {} : time difference between two schedules is less than 1 second",
                    spec.schedule
                ),
            );
            return self.finish(key, &cj, status, None).await;
        }
        if spec.suspend != Some(true) {
            self.run_due(&cj, &spec, &schedule, &tz, now, &mut status)
                .await?;
        }
        self.clean_history(&cj, &spec, &jobs).await;
        let next = schedule
            .next_after(now, &tz)
            .map(|t| t.duration_since(now).unsigned_abs() + Duration::from_millis(100));
        self.finish(key, &cj, status, next).await
    }
}

impl CronJobController {
    async fn finish(
        &self,
        key: &str,
        cj: &CronJob,
        status: CronJobStatus,
        requeue: Option<Duration>,
    ) -> Result<Option<Duration>, Error> {
        if cj.status.as_ref() != Some(&status) {
            let mut updated = cj.clone();
            updated.status = Some(status);
            Api::<CronJob>::namespaced(self.client.clone(), split_key(key).0)
                .replace_status(&cj.name_any(), &PostParams::default(), &updated)
                .await
                .map_err(|e| Error::api("updating status of cronjob", key, e))?;
        }
        Ok(requeue)
    }

    /// Brings `active` and `lastSuccessfulTime` up to date with the CronJob's Jobs.
    fn track_jobs(&self, cj: &CronJob, jobs: &[Arc<Job>], status: &mut CronJobStatus) {
        let mut active = status.active.take().unwrap_or_default();
        for job in jobs {
            let job_uid = job.uid();
            let listed = active.iter().any(|r| r.uid == job_uid);
            match finished(job) {
                Some(condition) if listed => {
                    active.retain(|r| r.uid != job_uid);
                    self.events.record(
                        cj,
                        EventType::Normal,
                        "SawCompletedJob",
                        format!(
                            "Saw completed job: {}, condition: {condition}",
                            job.name_any()
                        ),
                    );
                }
                None if !listed => self.events.record(
                    cj,
                    EventType::Warning,
                    "UnexpectedJob",
                    format!(
                        "Saw a job that the controller did not create or forgot: {}",
                        job.name_any()
                    ),
                ),
                _ => {}
            }
            if finished(job) == Some("Complete")
                && let Some(done) = job.status.as_ref().and_then(|s| s.completion_time.clone())
                && status
                    .last_successful_time
                    .as_ref()
                    .is_none_or(|t| t.0 < done.0)
            {
                status.last_successful_time = Some(done);
            }
        }
        active.retain(|r| {
            let present = jobs.iter().any(|j| j.uid() == r.uid);
            if !present {
                self.events.record(
                    cj,
                    EventType::Normal,
                    "MissingJob",
                    format!(
                        "Active job went missing: {}",
                        r.name.as_deref().unwrap_or_default()
                    ),
                );
            }
            present
        });
        status.active = (!active.is_empty()).then_some(active);
    }

    /// Starts the Job of the most recent scheduled time, if it is due.
    async fn run_due(
        &self,
        cj: &CronJob,
        spec: &k8s_openapi::api::batch::v1::CronJobSpec,
        schedule: &Schedule,
        tz: &TimeZone,
        now: Timestamp,
        status: &mut CronJobStatus,
    ) -> Result<(), Error> {
        let created = cj.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
        let mut since = status.last_schedule_time.as_ref().map_or(created, |t| t.0);
        if let Some(deadline) = spec.starting_deadline_seconds {
            let earliest = now
                .checked_sub(jiff::SignedDuration::from_secs(deadline))
                .unwrap_or(now);
            since = since.max(earliest);
        }
        let (due, missed) = most_recent(schedule, tz, since, now);
        let Some(due) = due else {
            return Ok(());
        };
        if missed > MAX_MISSED {
            self.events.record(
                cj,
                EventType::Warning,
                "TooManyMissedTimes",
                format!("too many missed start times: {missed}. Set or decrease .spec.startingDeadlineSeconds or check clock skew"),
            );
        }
        let ns = cj.namespace().unwrap_or_default();
        let active = status.active.clone().unwrap_or_default();
        match spec.concurrency_policy.as_deref() {
            Some("Forbid") if !active.is_empty() => return Ok(()),
            Some("Replace") => {
                let api: Api<Job> = Api::namespaced(self.client.clone(), &ns);
                let params = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Background),
                    ..Default::default()
                };
                for r in &active {
                    let job = r.name.as_deref().unwrap_or_default();
                    match api.delete(job, &params).await {
                        Ok(_) => self.events.record(
                            cj,
                            EventType::Normal,
                            "SuccessfulDelete",
                            format!("Deleted job {job}"),
                        ),
                        Err(e) if is_status(&e, 404) => {}
                        Err(e) => {
                            return Err(Error::api(
                                "deleting active job",
                                format!("{ns}/{job}"),
                                e,
                            ));
                        }
                    }
                }
                status.active = None;
            }
            _ => {}
        }
        let job = job_for(cj, due, tz);
        let job_name = job.name_any();
        let api: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let stored = match api.create(&PostParams::default(), &job).await {
            Ok(stored) => {
                self.events.record(
                    cj,
                    EventType::Normal,
                    "SuccessfulCreate",
                    format!("Created job {job_name}"),
                );
                Some(stored)
            }
            // Created before (a pass whose status write was lost): nothing to add.
            Err(e) if is_status(&e, 409) => None,
            Err(e) => {
                self.events.record(
                    cj,
                    EventType::Warning,
                    "FailedCreate",
                    format!("Error creating job: {e}"),
                );
                return Err(Error::api("creating job", format!("{ns}/{job_name}"), e));
            }
        };
        if let Some(stored) = stored {
            status
                .active
                .get_or_insert_with(Vec::new)
                .push(ObjectReference {
                    api_version: Some("batch/v1".into()),
                    kind: Some("Job".into()),
                    name: Some(job_name),
                    namespace: Some(ns),
                    uid: stored.uid(),
                    resource_version: stored.resource_version(),
                    ..Default::default()
                });
        }
        status.last_schedule_time = Some(Time(due));
        Ok(())
    }

    /// Deletes finished Jobs beyond the history limits, oldest first.
    async fn clean_history(
        &self,
        cj: &CronJob,
        spec: &k8s_openapi::api::batch::v1::CronJobSpec,
        jobs: &[Arc<Job>],
    ) {
        let api: Api<Job> =
            Api::namespaced(self.client.clone(), &cj.namespace().unwrap_or_default());
        for (condition, limit) in [
            ("Complete", spec.successful_jobs_history_limit.unwrap_or(3)),
            ("Failed", spec.failed_jobs_history_limit.unwrap_or(1)),
        ] {
            let mut done: Vec<&Arc<Job>> = jobs
                .iter()
                .filter(|j| {
                    finished(j) == Some(condition) && j.metadata.deletion_timestamp.is_none()
                })
                .collect();
            done.sort_by_key(|j| {
                j.status
                    .as_ref()
                    .and_then(|s| s.start_time.clone())
                    .or(j.metadata.creation_timestamp.clone())
                    .map(|t| t.0)
            });
            let excess = done.len().saturating_sub(limit.max(0) as usize);
            for job in &done[..excess] {
                let params = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Background),
                    ..Default::default()
                };
                match api.delete(&job.name_any(), &params).await {
                    Ok(_) => self.events.record(
                        cj,
                        EventType::Normal,
                        "SuccessfulDelete",
                        format!("Deleted job {}", job.name_any()),
                    ),
                    Err(e) if is_status(&e, 404) => {}
                    Err(e) => {
                        tracing::warn!(job = %key_of(&job.metadata), %e, "deleting an old job")
                    }
                }
            }
        }
    }
}

/// The Job of one scheduled time: the CronJob's template, named by the time in minutes
/// since the epoch, with the time in an annotation and the CronJob as its controller.
pub fn job_for(cj: &CronJob, scheduled: Timestamp, tz: &TimeZone) -> Job {
    let template = cj
        .spec
        .as_ref()
        .map(|s| s.job_template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(SCHEDULED_TIMESTAMP.into(), rfc3339(scheduled, tz));
    Job {
        metadata: ObjectMeta {
            name: Some(format!("{}-{}", cj.name_any(), scheduled.as_second() / 60)),
            namespace: cj.namespace(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(cj)]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_named_and_stamped_by_their_scheduled_minute() {
        let cj: CronJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "backup", "namespace": "ns", "uid": "u"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {
                "metadata": {"labels": {"app": "backup"}},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": []}}}}}}))
        .unwrap();
        let at: Timestamp = "2026-12-01T10:05:00Z".parse().unwrap();
        let job = job_for(&cj, at, &TimeZone::UTC);
        assert_eq!(job.name_any(), format!("backup-{}", at.as_second() / 60));
        assert_eq!(
            job.annotations()[SCHEDULED_TIMESTAMP],
            "2026-12-01T10:05:00Z"
        );
        assert_eq!(job.labels()["app"], "backup");
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        assert_eq!(rfc3339(at, &berlin), "2026-12-01T11:05:00+01:00");
    }

    #[test]
    fn the_most_recent_missed_time_runs() {
        let s = Schedule::parse("*/10 * * * *").unwrap();
        let since: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let now: Timestamp = "2026-12-01T10:35:00Z".parse().unwrap();
        let (last, missed) = most_recent(&s, &TimeZone::UTC, since, now);
        assert_eq!(last.unwrap().to_string(), "2026-12-01T10:30:00Z");
        assert_eq!(missed, 3);
        let (none, _) = most_recent(&s, &TimeZone::UTC, now, now);
        assert!(none.is_none());
    }
}
