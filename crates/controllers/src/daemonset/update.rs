//! A DaemonSet's RollingUpdate, one step per pass, as upstream's `rollingUpdate`.
//!
//! Without surge, old pods are deleted (the next pass creates their replacements) while
//! at most `maxUnavailable` nodes lack an available pod; old pods that are not available
//! anyway go at once. With `maxSurge`, a new pod starts beside an old one on up to
//! `maxSurge` nodes (at once where the old one is unavailable), and the old one goes
//! when the new one is available.

use std::collections::HashMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use super::{NodePods, Placement, Plan, is_updated};
use crate::Error;
use crate::deployment::rollout::scaled_value;
use crate::owner::key_of;
use crate::pods::{CachedPod, is_available};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_surge: usize,
    pub max_unavailable: usize,
}

/// maxSurge and maxUnavailable against the number of nodes that should run the pod
/// (percentages round up; both zero means one unavailable).
pub fn limits(ds: &DaemonSet, placements: &HashMap<&str, Placement>) -> Result<Limits, Error> {
    let desired = placements.values().filter(|p| p.should_run).count() as i32;
    let rolling = ds
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    let scaled = |value: Option<&IntOrString>, default: i32| {
        value
            .map(|v| scaled_value(v, desired, true))
            .unwrap_or(Ok(default))
            .map(|n| n.max(0) as usize)
            .map_err(|reason| Error::InvalidSpec {
                object: format!("daemonset {}", key_of(&ds.metadata)),
                reason,
            })
    };
    let max_surge = scaled(rolling.and_then(|r| r.max_surge.as_ref()), 0)?;
    let mut max_unavailable = scaled(rolling.and_then(|r| r.max_unavailable.as_ref()), 1)?;
    if desired > 0 && max_surge == 0 && max_unavailable == 0 {
        max_unavailable = 1;
    }
    Ok(Limits {
        max_surge,
        max_unavailable,
    })
}

/// The one new and one old pod on a node, ignoring pods being deleted; `None` when a
/// node has two of either (the manage step sorts that out first).
fn new_and_old<'a>(
    pods: &[&'a CachedPod],
    hash: &str,
) -> Option<(Option<&'a CachedPod>, Option<&'a CachedPod>)> {
    let (mut new, mut old) = (None, None);
    for pod in pods.iter().filter(|p| !p.metadata.terminating) {
        let slot = if is_updated(pod, hash) {
            &mut new
        } else {
            &mut old
        };
        if slot.replace(*pod).is_some() {
            return None;
        }
    }
    Some((new, old))
}

/// The next step of the update.
pub fn rolling_update(
    ds: &DaemonSet,
    placements: &HashMap<&str, Placement>,
    on_node: &NodePods,
    hash: &str,
    min_ready: i32,
    now: Timestamp,
) -> Result<Plan, Error> {
    let limits = limits(ds, placements)?;
    let available = |pod: &CachedPod| is_available(pod, min_ready, now);
    let mut plan = Plan::default();
    let mut nodes: Vec<(&&str, &Vec<&CachedPod>)> = on_node.iter().collect();
    nodes.sort_by_key(|(node, _)| **node);
    if limits.max_surge == 0 {
        let mut unavailable = 0;
        let mut replace_now = Vec::new();
        let mut candidates = Vec::new();
        for (_, pods) in nodes {
            match new_and_old(pods, hash) {
                None | Some((None, None)) | Some((Some(_), Some(_))) => unavailable += 1,
                Some((Some(new), None)) => {
                    if !available(new) {
                        unavailable += 1;
                    }
                }
                Some((None, Some(old))) => {
                    if !available(old) {
                        replace_now.push(old);
                    } else if unavailable < limits.max_unavailable {
                        candidates.push(old);
                    }
                }
            }
        }
        let room = limits.max_unavailable.saturating_sub(unavailable);
        for pod in replace_now
            .into_iter()
            .chain(candidates.into_iter().take(room))
        {
            plan.delete(pod);
        }
        return Ok(plan);
    }
    let mut surging = 0;
    let mut replace_now = Vec::new();
    let mut candidates = Vec::new();
    for (node, pods) in nodes {
        let should_run = placements.get(*node).is_some_and(|p| p.should_run);
        match new_and_old(pods, hash) {
            None => surging += 1,
            Some((_, None)) => {}
            Some((None, Some(old))) if !should_run => plan.delete(old),
            Some((None, Some(old))) if !available(old) => replace_now.push(node.to_string()),
            Some((None, Some(_))) => {
                if surging < limits.max_surge {
                    candidates.push(node.to_string());
                }
            }
            Some((Some(new), Some(old))) => {
                if available(new) {
                    plan.delete(old);
                } else {
                    surging += 1;
                }
            }
        }
    }
    let room = limits.max_surge.saturating_sub(surging);
    plan.create_on = replace_now
        .into_iter()
        .chain(candidates.into_iter().take(room))
        .collect();
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::REVISION_HASH;
    use crate::pods::tests::{labelled, pod, ts};
    use k8s_openapi::serde_json::{self, json};

    fn ds(rolling: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": {},
                     "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": rolling}}
        }))
        .unwrap()
    }

    const RUN: Placement = Placement {
        should_run: true,
        may_stay: true,
    };

    fn nodes(n: usize) -> (Vec<String>, Vec<CachedPod>) {
        let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        let pods = names
            .iter()
            .map(|node| {
                labelled(
                    pod(&format!("old-{node}"), 0, Some(node), "Running", Some(0)),
                    &[(REVISION_HASH, "h1")],
                )
            })
            .collect();
        (names, pods)
    }

    #[test]
    fn without_surge_old_pods_go_while_at_most_max_unavailable_nodes_lack_one() {
        let (names, pods) = nodes(5);
        let placements: HashMap<&str, Placement> =
            names.iter().map(|n| (n.as_str(), RUN)).collect();
        let on_node: NodePods = names
            .iter()
            .zip(&pods)
            .map(|(n, p)| (n.as_str(), vec![p]))
            .collect();
        let set = ds(json!({"maxUnavailable": "40%", "maxSurge": 0}));
        assert_eq!(
            limits(&set, &placements).unwrap(),
            Limits {
                max_surge: 0,
                max_unavailable: 2
            }
        );
        let plan = rolling_update(&set, &placements, &on_node, "h2", 0, ts(10)).unwrap();
        assert_eq!(plan.delete.len(), 2);
        assert!(plan.create_on.is_empty());

        // One node is already without an available pod: one more may go, and an old
        // pod that is not available goes regardless.
        let fresh = labelled(
            pod("new-n0", 9, Some("n0"), "Running", None),
            &[(REVISION_HASH, "h2")],
        );
        let broken = labelled(
            pod("old-n1", 0, Some("n1"), "Running", None),
            &[(REVISION_HASH, "h1")],
        );
        let mut on_node = on_node;
        on_node.insert("n0", vec![&fresh]);
        on_node.insert("n1", vec![&broken]);
        let plan = rolling_update(&set, &placements, &on_node, "h2", 0, ts(10)).unwrap();
        let deleted: Vec<&str> = plan.delete.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(deleted, ["old-n1", "old-n2"]);
    }

    #[test]
    fn with_surge_new_pods_start_beside_old_ones_which_go_once_the_new_are_available() {
        let (names, pods) = nodes(3);
        let placements: HashMap<&str, Placement> =
            names.iter().map(|n| (n.as_str(), RUN)).collect();
        let set = ds(json!({"maxUnavailable": 0, "maxSurge": 1}));
        let on_node: NodePods = names
            .iter()
            .zip(&pods)
            .map(|(n, p)| (n.as_str(), vec![p]))
            .collect();
        let plan = rolling_update(&set, &placements, &on_node, "h2", 0, ts(10)).unwrap();
        assert_eq!(plan.create_on, ["n0"]);
        assert!(plan.delete.is_empty());

        let starting = labelled(
            pod("new-n0", 9, Some("n0"), "Running", None),
            &[(REVISION_HASH, "h2")],
        );
        let mut on_node = on_node;
        on_node.insert("n0", vec![&pods[0], &starting]);
        let plan = rolling_update(&set, &placements, &on_node, "h2", 0, ts(10)).unwrap();
        assert!(
            plan.is_empty(),
            "the surge is used up until the new pod is available"
        );

        let ready = labelled(
            pod("new-n0", 9, Some("n0"), "Running", Some(9)),
            &[(REVISION_HASH, "h2")],
        );
        on_node.insert("n0", vec![&pods[0], &ready]);
        let plan = rolling_update(&set, &placements, &on_node, "h2", 0, ts(10)).unwrap();
        let deleted: Vec<&str> = plan.delete.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(deleted, ["old-n0"]);
        assert_eq!(plan.create_on, ["n1"]);
    }
}
