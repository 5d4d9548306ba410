//! batch/v1 Jobs and CronJobs: defaults, the Job's generated selector (keyed by its uid,
//! as upstream), validation and columns.

use krust_api::status::Cause;
use serde_json::{Value, json};

use super::Strategy;
use super::pod::{default_pod_spec, validate_pod_spec};
use crate::table::{AGE, Column, containers, images, int_at, selector, str_or_none};
use crate::validation::{immutable, non_negative, set_default};

const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
const JOB_NAME: &str = "batch.kubernetes.io/job-name";

fn default_job_spec(spec: &mut Value) {
    // Both unset: one pod, once. Parallelism alone: a work queue, without completions.
    if spec["completions"].is_null() && spec["parallelism"].is_null() {
        set_default(spec, "/completions", json!(1));
    }
    set_default(spec, "/parallelism", json!(1));
    // With a limit per index, the Job-wide limit is off unless given.
    let backoff_limit = if spec["backoffLimitPerIndex"].is_null() {
        6
    } else {
        i32::MAX
    };
    set_default(spec, "/backoffLimit", json!(backoff_limit));
    set_default(spec, "/completionMode", json!("NonIndexed"));
    set_default(spec, "/suspend", json!(false));
    set_default(spec, "/podReplacementPolicy", json!("TerminatingOrFailed"));
    set_default(spec, "/manualSelector", Value::Null);
    default_pod_spec(&mut spec["template"]["spec"]);
}

pub struct Job;
pub static JOB: Job = Job;
impl Strategy for Job {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        default_job_spec(&mut obj["spec"]);
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
        // Without manualSelector the job selects its pods by its own uid, and stamps the
        // labels on its template.
        if obj["spec"]["manualSelector"] != json!(true) {
            let uid = obj["metadata"]["uid"].clone();
            let name = obj["metadata"]["name"].clone();
            obj["spec"]["selector"] = json!({"matchLabels": {CONTROLLER_UID: uid}});
            let labels = &mut obj["spec"]["template"]["metadata"]["labels"];
            if !labels.is_object() {
                *labels = json!({});
            }
            for (k, v) in [
                (CONTROLLER_UID, &uid),
                ("controller-uid", &uid),
                (JOB_NAME, &name),
                ("job-name", &name),
            ] {
                labels[k] = v.clone();
            }
        }
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        for (p, f) in [
            ("/spec/parallelism", "spec.parallelism"),
            ("/spec/completions", "spec.completions"),
            ("/spec/backoffLimit", "spec.backoffLimit"),
        ] {
            non_negative(obj, p, f, errs);
        }
        let policy = &obj["spec"]["template"]["spec"]["restartPolicy"];
        if policy != "OnFailure" && policy != "Never" {
            errs.push(Cause::not_supported(
                "spec.template.spec.restartPolicy",
                policy,
                &["OnFailure", "Never"],
            ));
        }
        validate_pod_spec(&obj["spec"]["template"]["spec"], "spec.template.spec", errs);
    }
    fn validate_update(&self, new: &Value, old: &Value, errs: &mut Vec<Cause>) {
        immutable(new, old, "/spec/selector", "spec.selector", errs);
        immutable(new, old, "/spec/completions", "spec.completions", errs);
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Status",
                ty: "string",
                priority: 0,
                description: "Status of the job.",
                cell: &job_status,
            },
            Column {
                name: "Completions",
                ty: "string",
                priority: 0,
                description: "The desired number of successfully finished pods the job should be run with.",
                cell: &|o| {
                    json!(format!(
                        "{}/{}",
                        int_at(o, "/status/succeeded"),
                        int_at(o, "/spec/completions")
                    ))
                },
            },
            Column {
                name: "Duration",
                ty: "string",
                priority: 0,
                description: "Time required to complete the job.",
                cell: &job_duration,
            },
            AGE,
            Column {
                name: "Containers",
                ty: "string",
                priority: 1,
                description: "Names of each container in the template.",
                cell: &|o| containers(o, "/spec/template/spec/containers"),
            },
            Column {
                name: "Images",
                ty: "string",
                priority: 1,
                description: "Images referenced by each container in the template.",
                cell: &|o| images(o, "/spec/template/spec/containers"),
            },
            Column {
                name: "Selector",
                ty: "string",
                priority: 1,
                description: "A label query over pods that should match the pod count.",
                cell: &|o| selector(&o["spec"]["selector"]),
            },
        ];
        C
    }
}

fn has_condition(o: &Value, ty: &str) -> bool {
    o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == ty && c["status"] == "True")
}

fn job_status(o: &Value) -> Value {
    let s = if has_condition(o, "Complete") {
        "Complete"
    } else if has_condition(o, "Failed") {
        "Failed"
    } else if o["metadata"]["deletionTimestamp"].is_string() {
        "Terminating"
    } else if has_condition(o, "Suspended") {
        "Suspended"
    } else {
        "Running"
    };
    json!(s)
}

fn job_duration(o: &Value) -> Value {
    let ts = |p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<jiff::Timestamp>().ok())
    };
    match (ts("/status/startTime"), ts("/status/completionTime")) {
        (Some(start), end) => {
            let end = end.unwrap_or_else(jiff::Timestamp::now);
            json!(crate::table::human_duration(
                end.as_second() - start.as_second()
            ))
        }
        (None, _) => json!(""),
    }
}

pub struct CronJob;
pub static CRON_JOB: CronJob = CronJob;
impl Strategy for CronJob {
    fn tracks_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        let spec = &mut obj["spec"];
        set_default(spec, "/concurrencyPolicy", json!("Allow"));
        set_default(spec, "/suspend", json!(false));
        set_default(spec, "/successfulJobsHistoryLimit", json!(3));
        set_default(spec, "/failedJobsHistoryLimit", json!(1));
        default_pod_spec(&mut spec["jobTemplate"]["spec"]["template"]["spec"]);
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    fn validate(&self, obj: &Value, errs: &mut Vec<Cause>) {
        let schedule = obj["spec"]["schedule"].as_str().unwrap_or_default();
        let invalid = |why: String| Cause::invalid("spec.schedule", &obj["spec"]["schedule"], why);
        if schedule.is_empty() {
            errs.push(Cause::required("spec.schedule"));
        } else if schedule.contains("TZ") {
            errs.push(invalid(
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead".into(),
            ));
        } else if let Err(why) = krust_api::cron::Schedule::parse(schedule) {
            errs.push(invalid(why));
        }
        if let Some(zone) = obj["spec"]["timeZone"].as_str() {
            let why = if zone.eq_ignore_ascii_case("local") {
                Some("timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones".to_string())
            } else if zone.is_empty() || jiff::tz::TimeZone::get(zone).is_err() {
                Some(format!("unknown time zone {zone}"))
            } else {
                None
            };
            if let Some(why) = why {
                errs.push(Cause::invalid(
                    "spec.timeZone",
                    &obj["spec"]["timeZone"],
                    why,
                ));
            }
        }
        let policy = &obj["spec"]["concurrencyPolicy"];
        if let Some(p) = policy.as_str()
            && !["Allow", "Forbid", "Replace"].contains(&p)
        {
            errs.push(Cause::not_supported(
                "spec.concurrencyPolicy",
                policy,
                &["Allow", "Forbid", "Replace"],
            ));
        }
        validate_pod_spec(
            &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            "spec.jobTemplate.spec.template.spec",
            errs,
        );
    }
    fn columns(&self) -> &'static [Column] {
        static C: &[Column] = &[
            Column {
                name: "Schedule",
                ty: "string",
                priority: 0,
                description: "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
                cell: &|o| o["spec"]["schedule"].clone(),
            },
            Column {
                name: "Timezone",
                ty: "string",
                priority: 0,
                description: "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones.",
                cell: &|o| str_or_none(o, "/spec/timeZone"),
            },
            Column {
                name: "Suspend",
                ty: "boolean",
                priority: 0,
                description: "This flag tells the controller to suspend subsequent executions.",
                cell: &|o| json!(o["spec"]["suspend"].as_bool().unwrap_or(false)),
            },
            Column {
                name: "Active",
                ty: "integer",
                priority: 0,
                description: "A list of pointers to currently running jobs.",
                cell: &|o| json!(o["status"]["active"].as_array().map_or(0, Vec::len)),
            },
            Column {
                name: "Last Schedule",
                ty: "string",
                priority: 0,
                description: "Information when was the last time the job was successfully scheduled.",
                cell: &|o| match o["status"]["lastScheduleTime"] {
                    Value::String(_) => json!(crate::table::age(&o["status"]["lastScheduleTime"])),
                    _ => json!("<none>"),
                },
            },
            AGE,
            Column {
                name: "Containers",
                ty: "string",
                priority: 1,
                description: "Names of each container in the template.",
                cell: &|o| containers(o, "/spec/jobTemplate/spec/template/spec/containers"),
            },
            Column {
                name: "Images",
                ty: "string",
                priority: 1,
                description: "Images referenced by each container in the template.",
                cell: &|o| images(o, "/spec/jobTemplate/spec/template/spec/containers"),
            },
            Column {
                name: "Selector",
                ty: "string",
                priority: 1,
                description: "A label query over pods that should match the pod count.",
                cell: &|o| selector(&o["spec"]["jobTemplate"]["spec"]["selector"]),
            },
        ];
        C
    }
}
