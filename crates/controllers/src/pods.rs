//! Pod facts the workload controllers decide on: active, ready, available, and the order
//! in which a ReplicaSet gives up pods when it scales down (upstream's `ActivePods`
//! ranking: unscheduled, then pending, then not ready, then the most recently ready,
//! then the most restarted, then the newest go first).

use std::cmp::Ordering;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Counts towards a ReplicaSet: neither terminating nor finished.
pub fn is_active(pod: &Pod) -> bool {
    let phase = phase(pod);
    pod.metadata.deletion_timestamp.is_none() && phase != "Succeeded" && phase != "Failed"
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// When the pod's Ready condition became True, if it is True.
pub fn ready_since(pod: &Pod) -> Option<Option<Timestamp>> {
    let cond = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (cond.status == "True").then(|| cond.last_transition_time.as_ref().map(|t| t.0))
}

pub fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

/// Ready for at least `min_ready_seconds` at `now`.
pub fn is_available(pod: &Pod, min_ready_seconds: i32, now: Timestamp) -> bool {
    match ready_since(pod) {
        None => false,
        Some(_) if min_ready_seconds <= 0 => true,
        Some(None) => false,
        Some(Some(since)) => since + SignedDuration::from_secs(min_ready_seconds as i64) <= now,
    }
}

/// How long until a ready pod becomes available, if it is ready and not yet available.
pub fn until_available(
    pod: &Pod,
    min_ready_seconds: i32,
    now: Timestamp,
) -> Option<std::time::Duration> {
    let since = ready_since(pod)??;
    let at = since + SignedDuration::from_secs(min_ready_seconds as i64);
    (at > now).then(|| at.duration_since(now).unsigned_abs())
}

fn phase_rank(pod: &Pod) -> u8 {
    match phase(pod) {
        "Pending" | "" => 0,
        "Unknown" => 1,
        "Running" => 2,
        _ => 3,
    }
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| {
            cs.iter().map(|c| c.restart_count).max().unwrap_or(0)
        })
}

/// Orders pods so that the ones to delete first come first.
pub fn deletion_order(a: &Pod, b: &Pod) -> Ordering {
    let scheduled = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    };
    scheduled(a)
        .cmp(&scheduled(b))
        .then_with(|| phase_rank(a).cmp(&phase_rank(b)))
        .then_with(|| is_ready(a).cmp(&is_ready(b)))
        // Both ready: the one ready for less time goes first (an absent time counts as
        // "just now").
        .then_with(
            || match (ready_since(a).flatten(), ready_since(b).flatten()) {
                (Some(x), Some(y)) => y.cmp(&x),
                (None, Some(_)) if is_ready(a) => Ordering::Less,
                (Some(_), None) if is_ready(b) => Ordering::Greater,
                _ => Ordering::Equal,
            },
        )
        .then_with(|| restarts(b).cmp(&restarts(a)))
        .then_with(|| {
            let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            match (created(a), created(b)) {
                (Some(x), Some(y)) => y.cmp(&x),
                (None, Some(_)) => Ordering::Less,
                (Some(_), None) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            }
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    pub(crate) fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    /// A pod created at `created`, on `node` or unscheduled, in `phase`, ready since
    /// `ready` if given.
    pub(crate) fn pod(
        name: &str,
        created: i64,
        node: Option<&str>,
        phase: &str,
        ready: Option<i64>,
    ) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                creation_timestamp: Some(Time(ts(created))),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(Into::into),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: ready.map(|r| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(ts(r))),
                        ..Default::default()
                    }]
                }),
                container_statuses: Some(vec![ContainerStatus {
                    name: "c".into(),
                    restart_count: 0,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn order(mut pods: Vec<Pod>) -> Vec<String> {
        pods.sort_by(deletion_order);
        pods.into_iter().map(|p| p.metadata.name.unwrap()).collect()
    }

    #[test]
    fn scale_down_gives_up_unscheduled_then_pending_then_not_ready_then_newest() {
        let pods = vec![
            pod("ready-old", 0, Some("n1"), "Running", Some(10)),
            pod("ready-new", 5, Some("n1"), "Running", Some(20)),
            pod("running-not-ready", 1, Some("n1"), "Running", None),
            pod("pending", 2, Some("n1"), "Pending", None),
            pod("unscheduled", 3, None, "Pending", None),
        ];
        assert_eq!(
            order(pods),
            [
                "unscheduled",
                "pending",
                "running-not-ready",
                "ready-new",
                "ready-old"
            ]
        );
    }

    #[test]
    fn among_equals_the_newest_pod_goes_first() {
        let pods = vec![
            pod("a", 1, None, "Pending", None),
            pod("c", 3, None, "Pending", None),
            pod("b", 2, None, "Pending", None),
        ];
        assert_eq!(order(pods), ["c", "b", "a"]);
    }

    #[test]
    fn availability_waits_for_min_ready_seconds() {
        let p = pod("a", 0, None, "Running", Some(10));
        assert!(is_available(&p, 0, ts(10)));
        assert!(!is_available(&p, 5, ts(12)));
        assert!(is_available(&p, 5, ts(15)));
        assert_eq!(
            until_available(&p, 5, ts(12)),
            Some(std::time::Duration::from_secs(3))
        );
        assert!(!is_available(
            &pod("b", 0, None, "Running", None),
            0,
            ts(10)
        ));
    }

    #[test]
    fn terminating_and_finished_pods_are_not_active() {
        let mut p = pod("a", 0, None, "Running", None);
        assert!(is_active(&p));
        p.metadata.deletion_timestamp = Some(Time(ts(1)));
        assert!(!is_active(&p));
        assert!(!is_active(&pod("b", 0, None, "Succeeded", None)));
    }
}
