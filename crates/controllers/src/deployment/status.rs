//! A Deployment's status from its ReplicaSets, and its conditions as upstream reports
//! them — what `kubectl rollout status` and `kubectl get deploy` read:
//!
//! - `Available`: True (`MinimumReplicasAvailable`) while at least
//!   `replicas - maxUnavailable` pods are available.
//! - `Progressing`: `NewReplicaSetCreated`, `FoundNewReplicaSet`, `ReplicaSetUpdated`
//!   while pods move, `NewReplicaSetAvailable` when complete, `ProgressDeadlineExceeded`
//!   (False) after `progressDeadlineSeconds` without progress, `DeploymentPaused` /
//!   `DeploymentResumed` (Unknown).

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// What happened in this pass that the conditions report.
pub struct Observed<'a> {
    pub all: &'a [ReplicaSet],
    pub new: Option<&'a ReplicaSet>,
    pub created_new: bool,
    pub max_unavailable: i32,
    pub now: Timestamp,
}

fn spec_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

/// `status.replicas == updated == available == spec.replicas` for the current generation.
pub fn is_complete(d: &Deployment, status: &DeploymentStatus) -> bool {
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    status.updated_replicas == Some(replicas)
        && status.replicas == Some(replicas)
        && status.available_replicas == Some(replicas)
        && status.observed_generation >= d.metadata.generation
}

pub fn progress_deadline(d: &Deployment) -> SignedDuration {
    SignedDuration::from_secs(
        d.spec
            .as_ref()
            .and_then(|s| s.progress_deadline_seconds)
            .unwrap_or(600) as i64,
    )
}

/// The status the Deployment should have.
pub fn calculate(d: &Deployment, o: &Observed<'_>) -> DeploymentStatus {
    let old = d.status.clone().unwrap_or_default();
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let sum = |f: &dyn Fn(&ReplicaSet) -> i32| o.all.iter().map(f).sum::<i32>();
    let st = |rs: &ReplicaSet| rs.status.clone().unwrap_or_default();
    let available = sum(&|rs| st(rs).available_replicas.unwrap_or(0));
    let total_spec = sum(&spec_replicas);
    let mut status = DeploymentStatus {
        replicas: Some(sum(&|rs| st(rs).replicas)),
        updated_replicas: Some(o.new.map_or(0, |rs| st(rs).replicas)),
        ready_replicas: Some(sum(&|rs| st(rs).ready_replicas.unwrap_or(0))),
        available_replicas: Some(available),
        unavailable_replicas: Some((total_spec - available).max(0)),
        observed_generation: d.metadata.generation,
        collision_count: old.collision_count,
        conditions: old.conditions.clone(),
        terminating_replicas: old.terminating_replicas,
    };
    if available >= replicas - o.max_unavailable {
        set_condition(
            &mut status,
            condition(
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
                o.now,
            ),
        );
    } else {
        set_condition(
            &mut status,
            condition(
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
                o.now,
            ),
        );
    }
    progressing(d, &old, &mut status, o);
    status
}

fn progressing(
    d: &Deployment,
    old: &DeploymentStatus,
    status: &mut DeploymentStatus,
    o: &Observed<'_>,
) {
    let paused = d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false);
    let current = get_condition(status, "Progressing").cloned();
    if paused {
        set_condition(
            status,
            condition(
                "Progressing",
                "Unknown",
                "DeploymentPaused",
                "Deployment is paused",
                o.now,
            ),
        );
        return;
    }
    if current.as_ref().and_then(|c| c.reason.as_deref()) == Some("DeploymentPaused") {
        set_condition(
            status,
            condition(
                "Progressing",
                "Unknown",
                "DeploymentResumed",
                "Deployment is resumed",
                o.now,
            ),
        );
    }
    let Some(new) = o.new else { return };
    let name = new.metadata.name.clone().unwrap_or_default();
    let current = get_condition(status, "Progressing").cloned();
    let moved = status.updated_replicas > old.updated_replicas
        || status.ready_replicas > old.ready_replicas
        || status.available_replicas > old.available_replicas
        || status.replicas.unwrap_or(0) - status.updated_replicas.unwrap_or(0)
            < old.replicas.unwrap_or(0) - old.updated_replicas.unwrap_or(0);
    if is_complete(d, status) {
        set_condition(
            status,
            condition(
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                &format!("ReplicaSet \"{name}\" has successfully progressed."),
                o.now,
            ),
        );
    } else if o.created_new {
        set_condition(
            status,
            condition(
                "Progressing",
                "True",
                "NewReplicaSetCreated",
                &format!("Created new replica set \"{name}\""),
                o.now,
            ),
        );
    } else if moved {
        // Progress refreshes lastUpdateTime even with an unchanged reason: it is what the
        // progress deadline is measured from.
        let mut c = condition(
            "Progressing",
            "True",
            "ReplicaSetUpdated",
            &format!("ReplicaSet \"{name}\" is progressing."),
            o.now,
        );
        if let Some(cur) = current.as_ref().filter(|c| c.status == "True") {
            c.last_transition_time = cur.last_transition_time.clone();
        }
        remove_condition(status, "Progressing");
        set_condition(status, c);
    } else if current.is_none() {
        set_condition(
            status,
            condition(
                "Progressing",
                "True",
                "FoundNewReplicaSet",
                &format!("Found new replica set \"{name}\""),
                o.now,
            ),
        );
    } else if timed_out(d, status, o.now) {
        set_condition(
            status,
            condition(
                "Progressing",
                "False",
                "ProgressDeadlineExceeded",
                &format!("ReplicaSet \"{name}\" has timed out progressing."),
                o.now,
            ),
        );
    }
}

/// No progress for `progressDeadlineSeconds` since the Progressing condition last moved.
pub fn timed_out(d: &Deployment, status: &DeploymentStatus, now: Timestamp) -> bool {
    let Some(c) = get_condition(status, "Progressing") else {
        return false;
    };
    if matches!(
        c.reason.as_deref(),
        Some("NewReplicaSetAvailable" | "ProgressDeadlineExceeded" | "DeploymentPaused")
    ) {
        return false;
    }
    c.last_update_time
        .as_ref()
        .is_some_and(|t| t.0 + progress_deadline(d) < now)
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

pub fn get_condition<'a>(
    status: &'a DeploymentStatus,
    type_: &str,
) -> Option<&'a DeploymentCondition> {
    status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(cs) = status.conditions.as_mut() {
        cs.retain(|c| c.type_ != type_);
    }
}

/// Upstream's `SetDeploymentCondition`: an unchanged status and reason keeps the existing
/// condition (and its times); an unchanged status keeps lastTransitionTime.
fn set_condition(status: &mut DeploymentStatus, mut new: DeploymentCondition) {
    if let Some(cur) = get_condition(status, &new.type_) {
        if cur.status == new.status && cur.reason == new.reason {
            return;
        }
        if cur.status == new.status {
            new.last_transition_time = cur.last_transition_time.clone();
        }
    }
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(slot) => *slot = new,
        None => conditions.push(new),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, ReplicaSetSpec, ReplicaSetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn deployment(replicas: i32, generation: i64) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                generation: Some(generation),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn rs(name: &str, spec: i32, pods: i32, available: i32) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(spec),
                ..Default::default()
            }),
            status: Some(ReplicaSetStatus {
                replicas: pods,
                ready_replicas: Some(available),
                available_replicas: Some(available),
                ..Default::default()
            }),
        }
    }

    fn observe(d: &Deployment, all: &[ReplicaSet], new: usize) -> DeploymentStatus {
        calculate(
            d,
            &Observed {
                all,
                new: all.get(new),
                created_new: false,
                max_unavailable: 0,
                now: Timestamp::now(),
            },
        )
    }

    #[test]
    fn a_finished_rollout_reports_new_replicaset_available() {
        let d = deployment(3, 2);
        let all = [rs("web-new", 3, 3, 3), rs("web-old", 0, 0, 0)];
        let s = observe(&d, &all, 0);
        assert_eq!(
            (
                s.replicas,
                s.updated_replicas,
                s.available_replicas,
                s.unavailable_replicas
            ),
            (Some(3), Some(3), Some(3), Some(0))
        );
        assert_eq!(s.observed_generation, Some(2));
        let p = get_condition(&s, "Progressing").unwrap();
        assert_eq!(p.reason.as_deref(), Some("NewReplicaSetAvailable"));
        assert_eq!(
            p.message.as_deref(),
            Some("ReplicaSet \"web-new\" has successfully progressed.")
        );
        assert_eq!(get_condition(&s, "Available").unwrap().status, "True");
    }

    #[test]
    fn a_rollout_in_flight_is_progressing_and_counts_unavailable_pods() {
        let mut d = deployment(3, 2);
        d.status = Some(DeploymentStatus {
            replicas: Some(3),
            updated_replicas: Some(0),
            ..Default::default()
        });
        let all = [rs("web-new", 1, 1, 0), rs("web-old", 3, 3, 3)];
        let s = observe(&d, &all, 0);
        assert_eq!(
            (s.replicas, s.updated_replicas, s.unavailable_replicas),
            (Some(4), Some(1), Some(1))
        );
        assert_eq!(
            get_condition(&s, "Progressing").unwrap().reason.as_deref(),
            Some("ReplicaSetUpdated")
        );
    }

    #[test]
    fn no_progress_past_the_deadline_is_reported() {
        let mut d = deployment(3, 1);
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(10);
        let long_ago = Timestamp::now() - SignedDuration::from_secs(60);
        d.status = Some(DeploymentStatus {
            replicas: Some(1),
            updated_replicas: Some(1),
            ready_replicas: Some(0),
            available_replicas: Some(0),
            conditions: Some(vec![condition(
                "Progressing",
                "True",
                "ReplicaSetUpdated",
                "x",
                long_ago,
            )]),
            ..Default::default()
        });
        let all = [rs("web-new", 3, 1, 0)];
        let s = observe(&d, &all, 0);
        let p = get_condition(&s, "Progressing").unwrap();
        assert_eq!(
            (p.status.as_str(), p.reason.as_deref()),
            ("False", Some("ProgressDeadlineExceeded"))
        );
    }
}
