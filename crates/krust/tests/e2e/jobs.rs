//! Jobs through the real kubectl: on a real node (containerd + runc) a Job's pods run
//! and exit — completions with parallelism, an Indexed Job whose pods see their index,
//! a failing Job stopped at its backoff limit, a finished Job deleted after its TTL;
//! without nodes, suspension and the active deadline.

use crate::common;
use std::time::Duration;

use crate::common::Server;
use serde_json::{Value, json};

fn job(name: &str, spec: Value, script: &str) -> String {
    let mut spec = spec;
    spec["template"] = json!({"spec": {"restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
        "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", script]}]}});
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec})
        .to_string()
}

fn condition<'a>(job: &'a Value, ty: &str) -> Option<&'a Value> {
    job["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty && c["status"] == "True")
}

fn job_pods(s: &Server, job: &str) -> Vec<Value> {
    let list = s.get_json(&["pods", "-l", &format!("batch.kubernetes.io/job-name={job}")]);
    list["items"].as_array().cloned().unwrap_or_default()
}

#[test]
fn jobs_run_their_pods_to_completion_on_a_real_node() {
    let s = Server::with_agent(&["--cluster-cidr=10.81.0.0/16"]);
    s.ok_stdin(
        &["create", "-f", "-"],
        &job(
            "five",
            json!({"completions": 5, "parallelism": 2}),
            "echo done",
        ),
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &job(
            "idx",
            json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed"}),
            "echo index=$JOB_COMPLETION_INDEX host=$(hostname)",
        ),
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &job("short", json!({"ttlSecondsAfterFinished": 0}), "true"),
    );
    s.ok(&[
        "wait",
        "--for=condition=complete",
        "job/five",
        "job/idx",
        "--timeout=120s",
    ]);

    let five = s.get_json(&["job", "five"]);
    assert_eq!(five["status"]["succeeded"], 5, "{five}");
    assert_eq!(five["status"]["active"], 0);
    assert!(five["status"]["completionTime"].is_string());
    for ty in ["SuccessCriteriaMet", "Complete"] {
        let c = condition(&five, ty).unwrap_or_else(|| panic!("{ty} in {five}"));
        assert_eq!(c["reason"], "CompletionsReached");
        assert_eq!(c["message"], "Reached expected number of succeeded pods");
    }
    let pods = job_pods(&s, "five");
    assert_eq!(pods.len(), 5);
    for pod in &pods {
        assert_eq!(pod["status"]["phase"], "Succeeded");
        // Counted, so released: no job-tracking finalizer is left.
        assert!(pod["metadata"]["finalizers"].is_null(), "{pod}");
    }
    let events = s.ok(&["get", "events", "--field-selector=involvedObject.name=five"]);
    assert!(
        events.contains("SuccessfulCreate") && events.contains("Completed"),
        "{events}"
    );

    // Indexed: one pod per index, which it sees in its environment and hostname.
    let idx = s.get_json(&["job", "idx"]);
    assert_eq!(idx["status"]["completedIndexes"], "0-2", "{idx}");
    let mut seen = Vec::new();
    for pod in job_pods(&s, "idx") {
        let index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            .as_str()
            .expect("an index")
            .to_string();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let log = s.ok(&["logs", name]);
        assert_eq!(log.trim(), format!("index={index} host=idx-{index}"));
        seen.push(index);
    }
    seen.sort();
    assert_eq!(seen, ["0", "1", "2"]);

    // ttlSecondsAfterFinished: 0 — gone as soon as it finished, pods and all.
    s.ok(&["wait", "--for=delete", "job/short", "--timeout=60s"]);
    common::wait_for("short's pods gone", Duration::from_secs(30), || {
        job_pods(&s, "short").is_empty().then_some(())
    });

    // A podFailurePolicy FailJob rule ends the Job at the first matching exit code.
    let mut doomed: Value =
        serde_json::from_str(&job("doomed", json!({"backoffLimit": 6}), "exit 42")).unwrap();
    doomed["spec"]["podFailurePolicy"] = json!({"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]});
    s.ok_stdin(&["create", "-f", "-"], &doomed.to_string());
    s.ok(&[
        "wait",
        "--for=condition=failed",
        "job/doomed",
        "--timeout=60s",
    ]);
    let doomed = s.get_json(&["job", "doomed"]);
    let failed = condition(&doomed, "Failed").expect("Failed");
    assert_eq!(failed["reason"], "PodFailurePolicy");
    // One pod, failed by its exit code (what each pod ended with, should there be more).
    let pods = job_pods(&s, "doomed");
    let ends: Vec<String> = pods
        .iter()
        .map(|p| {
            let state = &p["status"]["containerStatuses"][0]["state"];
            format!("{} {} {state}", p["metadata"]["name"], p["status"]["phase"])
        })
        .collect();
    assert_eq!(doomed["status"]["failed"], 1, "{doomed}\n{ends:#?}");
    let pod = pods.last().expect("its pod");
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    assert_eq!(
        failed["message"],
        format!(
            "Container c for pod default/{pod_name} failed with exit code 42 matching FailJob rule at index 0"
        )
    );

    // backoffLimitPerIndex: index 1 fails twice and is given up; the others complete.
    s.ok_stdin(
        &["create", "-f", "-"],
        &job(
            "per-index",
            json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
                "backoffLimitPerIndex": 1}),
            r#"[ "$JOB_COMPLETION_INDEX" = 1 ] && exit 1; exit 0"#,
        ),
    );
    s.ok(&[
        "wait",
        "--for=condition=failed",
        "job/per-index",
        "--timeout=90s",
    ]);
    let per_index = s.get_json(&["job", "per-index"]);
    let failed = condition(&per_index, "Failed").expect("Failed");
    assert_eq!(failed["reason"], "FailedIndexes");
    assert_eq!(failed["message"], "Job has failed indexes");
    assert_eq!(per_index["status"]["failedIndexes"], "1", "{per_index}");
    assert_eq!(per_index["status"]["completedIndexes"], "0,2");
    assert_eq!(per_index["status"]["failed"], 2);
    let counts: Vec<String> = job_pods(&s, "per-index")
        .iter()
        .filter(|p| p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
        .map(|p| {
            p["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(counts.len(), 2);
    assert!(
        counts.contains(&"0".to_string()) && counts.contains(&"1".to_string()),
        "{counts:?}"
    );

    // A Job whose pods fail stops after backoffLimit + 1 failures (10 s apart).
    s.ok_stdin(
        &["create", "-f", "-"],
        &job("fail", json!({"backoffLimit": 1}), "exit 3"),
    );
    s.ok(&[
        "wait",
        "--for=condition=failed",
        "job/fail",
        "--timeout=90s",
    ]);
    let fail = s.get_json(&["job", "fail"]);
    assert_eq!(fail["status"]["failed"], 2, "{fail}");
    let failed = condition(&fail, "Failed").expect("Failed");
    assert_eq!(failed["reason"], "BackoffLimitExceeded");
    assert_eq!(
        failed["message"],
        "Job has reached the specified backoff limit"
    );
    assert!(condition(&fail, "FailureTarget").is_some());
    assert_eq!(job_pods(&s, "fail").len(), 2);
}

#[test]
fn suspended_jobs_run_nothing_and_deadlines_stop_jobs() {
    // No node: the pods stay Pending, which is all these need.
    let s = Server::start();
    s.ok_stdin(
        &["create", "-f", "-"],
        &job(
            "paused",
            json!({"suspend": true, "parallelism": 2, "completions": 4}),
            "true",
        ),
    );
    let suspended = common::wait_for("Suspended", Duration::from_secs(20), || {
        let j = s.get_json(&["job", "paused"]);
        condition(&j, "Suspended").cloned()
    });
    assert_eq!(suspended["reason"], "JobSuspended");
    assert!(job_pods(&s, "paused").is_empty());
    assert!(s.get_json(&["job", "paused"])["status"]["startTime"].is_null());

    s.ok(&[
        "patch",
        "job",
        "paused",
        "-p",
        r#"{"spec":{"suspend":false}}"#,
    ]);
    common::wait_for("two pods", Duration::from_secs(20), || {
        (job_pods(&s, "paused").len() == 2).then_some(())
    });
    let resumed = s.get_json(&["job", "paused"]);
    let c = resumed["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Suspended").cloned())
        .expect("the Suspended condition");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("JobResumed"))
    );
    assert!(resumed["status"]["startTime"].is_string());
    common::wait_for("active 2", Duration::from_secs(20), || {
        (s.get_json(&["job", "paused"])["status"]["active"] == 2).then_some(())
    });
    // Suspending again deletes the running pods.
    s.ok(&[
        "patch",
        "job",
        "paused",
        "-p",
        r#"{"spec":{"suspend":true}}"#,
    ]);
    common::wait_for("pods deleted", Duration::from_secs(20), || {
        job_pods(&s, "paused").is_empty().then_some(())
    });
    // Pods the Job itself removes (suspended, or beyond a lowered parallelism) are let
    // go first, as upstream: they are not failures, even under backoffLimit 0.
    let paused = s.get_json(&["job", "paused"]);
    assert!(
        paused["status"]["failed"].as_i64().unwrap_or(0) == 0,
        "{paused}"
    );
    s.ok_stdin(
        &["create", "-f", "-"],
        &job(
            "narrowed",
            json!({"backoffLimit": 0, "parallelism": 3, "completions": 3}),
            "true",
        ),
    );
    common::wait_for("three pods", Duration::from_secs(20), || {
        (job_pods(&s, "narrowed").len() == 3).then_some(())
    });
    s.ok(&[
        "patch",
        "job",
        "narrowed",
        "-p",
        r#"{"spec":{"parallelism":1}}"#,
    ]);
    let narrowed = common::wait_for("one pod left", Duration::from_secs(20), || {
        let j = s.get_json(&["job", "narrowed"]);
        (job_pods(&s, "narrowed").len() == 1 && j["status"]["active"] == 1).then_some(j)
    });
    assert!(
        narrowed["status"]["failed"].as_i64().unwrap_or(0) == 0,
        "{narrowed}"
    );
    assert!(
        condition(&narrowed, "FailureTarget").is_none(),
        "{narrowed}"
    );

    s.ok_stdin(
        &["create", "-f", "-"],
        &job(
            "late",
            json!({"activeDeadlineSeconds": 2, "parallelism": 2, "completions": 4}),
            "true",
        ),
    );
    s.ok(&[
        "wait",
        "--for=condition=failed",
        "job/late",
        "--timeout=30s",
    ]);
    let late = s.get_json(&["job", "late"]);
    let failed = condition(&late, "Failed").expect("Failed");
    assert_eq!(failed["reason"], "DeadlineExceeded");
    assert_eq!(
        failed["message"],
        "Job was active longer than specified deadline"
    );
    assert_eq!(late["status"]["active"], 0);
    assert_eq!(late["status"]["failed"], 2, "{late}");
    common::wait_for("late's pods gone", Duration::from_secs(20), || {
        job_pods(&s, "late").is_empty().then_some(())
    });
}

#[test]
fn cronjobs_start_jobs_on_schedule_and_keep_their_history_limit() {
    let s = Server::with_agent(&["--cluster-cidr=10.82.0.0/16"]);
    let template = json!({"spec": {"template": {"spec": {"restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
        "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}}});
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tick"},
            "spec": {"schedule": "* * * * *", "successfulJobsHistoryLimit": 1,
                "jobTemplate": template}})
        .to_string(),
    );
    // Schedules and time zones are validated as upstream.
    let refused = s.fails(&[
        "create",
        "cronjob",
        "bad",
        "--image=busybox",
        "--schedule=61 * * * *",
    ]);
    assert!(
        refused.contains(r#"spec.schedule: Invalid value: "61 * * * *": end of range (61) above maximum (59): 61"#),
        "{refused}"
    );
    let mut zoned = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "zoned"},
        "spec": {"schedule": "0 0 29 2 *", "timeZone": "Mars/Olympus", "jobTemplate": template}});
    let refused = s.fails_stdin(&["create", "-f", "-"], &zoned.to_string());
    assert!(
        refused.contains(
            r#"spec.timeZone: Invalid value: "Mars/Olympus": unknown time zone Mars/Olympus"#
        ),
        "{refused}"
    );
    zoned["spec"]["timeZone"] = json!("Europe/Berlin");
    s.ok_stdin(&["create", "-f", "-"], &zoned.to_string());
    // A date that never comes is valid, and the controller says why nothing runs.
    s.ok(&[
        "create",
        "cronjob",
        "never",
        "--image=busybox",
        "--schedule=59 23 31 2 *",
    ]);
    let said = common::wait_for(
        "the never-firing schedule reported",
        Duration::from_secs(20),
        || {
            let messages = s.event_messages("never", "InvalidSchedule");
            (!messages.is_empty()).then_some(messages)
        },
    );
    assert_eq!(
        said[0],
        "invalid schedule: 59 23 31 2 * : time difference between two schedules is less than 1 second"
    );
    // kubectl's own way to run one now.
    s.ok(&["create", "job", "now", "--from=cronjob/tick"]);
    s.ok(&[
        "wait",
        "--for=condition=complete",
        "job/now",
        "--timeout=60s",
    ]);

    // Two scheduled runs (a minute apart): the first is deleted once the second has
    // completed, as the history limit of 1 says.
    let scheduled = |s: &Server| -> Vec<Value> {
        let jobs = s.get_json(&["jobs"]);
        jobs["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| {
                j["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
                    .is_string()
            })
            .cloned()
            .collect()
    };
    let first = common::wait_for("a scheduled job", Duration::from_secs(90), || {
        scheduled(&s).first().cloned()
    });
    let first_name = first["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let minutes: i64 = first_name
        .trim_start_matches("tick-")
        .parse()
        .expect("minutes in the name");
    let stamp = first["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
        .as_str()
        .unwrap_or_default();
    let at: jiff::Timestamp = stamp.parse().expect("an RFC 3339 time");
    assert_eq!(at.as_second(), minutes * 60, "{stamp}");
    assert_eq!(first["metadata"]["ownerReferences"][0]["kind"], "CronJob");
    common::wait_for(
        "the first run replaced by the second",
        Duration::from_secs(150),
        || {
            let jobs = scheduled(&s);
            let done = |j: &Value| condition(j, "Complete").is_some();
            (jobs.len() == 1
                && jobs[0]["metadata"]["name"] != first_name.as_str()
                && done(&jobs[0]))
            .then_some(())
        },
    );
    let tick = s.get_json(&["cronjob", "tick"]);
    assert!(tick["status"]["lastScheduleTime"].is_string(), "{tick}");
    assert!(tick["status"]["lastSuccessfulTime"].is_string(), "{tick}");
    let events = s.ok(&["get", "events", "--field-selector=involvedObject.name=tick"]);
    for reason in ["SuccessfulCreate", "SawCompletedJob", "SuccessfulDelete"] {
        assert!(events.contains(reason), "{reason} in {events}");
    }
}
