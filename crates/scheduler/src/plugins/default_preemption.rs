//! DefaultPreemption: when a pod fits nowhere, find a node where evicting
//! lower-priority pods would make it fit, and the smallest set of such victims.
//!
//! For each node that failed with a resolvable status, all lower-priority pods
//! are removed (from a copy of the node and of the cycle state); if the pod then
//! fits, the victims are "reprieved" one by one, most important first, keeping
//! each one the pod can still fit beside. Among the nodes that work, upstream's
//! order picks one: lowest highest-victim priority, then smallest sum of victim
//! priorities, then fewest victims, then the latest start time of the
//! highest-priority victims. (PodDisruptionBudgets are not considered: the
//! "fewest PDB violations" criterion is a tie everywhere.)
//!
//! The plugin does not evict anything. It returns the nominated node and the
//! victims; the caller marks each victim with a `DisruptionTarget` condition
//! (reason `PreemptionByScheduler`), deletes it, clears the nominations of
//! lower-priority pods nominated to that node, and sets the preemptor's
//! `status.nominatedNodeName`. When it returns no result, the caller should
//! clear the preemptor's nomination.

use std::cmp::Ordering;
use std::sync::Arc;

use jiff::Timestamp;
use serde::Deserialize;

use crate::framework::{
    Code, CycleState, Diagnosis, FitError, Framework, NodeInfo, NodeToStatus, Plugin, PodInfo,
    PostFilterPlugin, PostFilterResult, Snapshot, Status, pod_start_time,
};

pub const NAME: &str = "DefaultPreemption";
pub const NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
pub const NO_VICTIMS: &str = "No preemption victims found for incoming pod";
pub const NEVER_POLICY: &str = "not eligible due to preemptionPolicy=Never.";
pub const TERMINATING_ON_NOMINATED: &str =
    "not eligible due to a terminating pod on the nominated node.";

/// `DefaultPreemptionArgs`: how many candidate nodes to find before choosing.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultPreemptionArgs {
    #[serde(default = "default_percentage")]
    pub min_candidate_nodes_percentage: i32,
    #[serde(default = "default_absolute")]
    pub min_candidate_nodes_absolute: i32,
}

fn default_percentage() -> i32 {
    10
}

fn default_absolute() -> i32 {
    100
}

impl Default for DefaultPreemptionArgs {
    fn default() -> Self {
        DefaultPreemptionArgs {
            min_candidate_nodes_percentage: default_percentage(),
            min_candidate_nodes_absolute: default_absolute(),
        }
    }
}

pub struct DefaultPreemption {
    args: DefaultPreemptionArgs,
}

impl DefaultPreemption {
    pub fn new(args: DefaultPreemptionArgs) -> Result<Self, String> {
        if !(0..=100).contains(&args.min_candidate_nodes_percentage) {
            return Err(format!(
                "minCandidateNodesPercentage {} is not within [0, 100]",
                args.min_candidate_nodes_percentage
            ));
        }
        if args.min_candidate_nodes_absolute < 0 {
            return Err(format!(
                "minCandidateNodesAbsolute {} must not be negative",
                args.min_candidate_nodes_absolute
            ));
        }
        if args.min_candidate_nodes_percentage == 0 && args.min_candidate_nodes_absolute == 0 {
            return Err(
                "minCandidateNodesPercentage and minCandidateNodesAbsolute cannot both be zero"
                    .into(),
            );
        }
        Ok(DefaultPreemption { args })
    }

    /// How many candidate nodes to collect before picking: a share of the
    /// potential nodes, at least an absolute number, at most all of them.
    fn num_candidates(&self, num_nodes: usize) -> usize {
        let share = num_nodes * self.args.min_candidate_nodes_percentage as usize / 100;
        share
            .max(self.args.min_candidate_nodes_absolute as usize)
            .min(num_nodes)
    }

    fn eligibility(
        &self,
        pod: &PodInfo,
        snapshot: &Snapshot,
        statuses: &NodeToStatus,
    ) -> Result<(), &'static str> {
        let spec = pod.pod.spec.as_ref();
        if spec.and_then(|s| s.preemption_policy.as_deref()) == Some("Never") {
            return Err(NEVER_POLICY);
        }
        // Victims of an earlier preemption are still terminating: wait for them
        // rather than preempting more.
        let nominated = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref());
        let Some(nominated) = nominated.filter(|n| !n.is_empty()) else {
            return Ok(());
        };
        if statuses.get(nominated).code() == Code::UnschedulableAndUnresolvable {
            return Ok(());
        }
        let Some(node) = snapshot.get(nominated) else {
            return Ok(());
        };
        let priority = pod.priority();
        if node
            .pods()
            .iter()
            .any(|p| p.priority() < priority && terminating_by_preemption(p))
        {
            return Err(TERMINATING_ON_NOMINATED);
        }
        Ok(())
    }
}

fn terminating_by_preemption(p: &PodInfo) -> bool {
    p.pod.metadata.deletion_timestamp.is_some()
        && p.pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget")
            .is_some_and(|c| {
                c.status == "True" && c.reason.as_deref() == Some("PreemptionByScheduler")
            })
}

/// Higher priority first; among equals, the one running longer (pods not yet
/// started count as starting now).
fn more_important_first(now: Timestamp) -> impl Fn(&Arc<PodInfo>, &Arc<PodInfo>) -> Ordering {
    move |a, b| {
        b.priority().cmp(&a.priority()).then_with(|| {
            let start = |p: &PodInfo| pod_start_time(&p.pod).unwrap_or(now);
            start(a).cmp(&start(b))
        })
    }
}

/// A node where preemption works, with its victims (most important first).
struct Candidate<'s> {
    node: &'s NodeInfo,
    victims: Vec<Arc<PodInfo>>,
}

/// Finds the victims on one node, or why there are none.
fn select_victims_on_node(
    framework: &Framework,
    state: &CycleState,
    pod: &PodInfo,
    node: &NodeInfo,
    now: Timestamp,
) -> Result<Vec<Arc<PodInfo>>, Status> {
    let mut node = node.clone();
    let mut state = state.clone();
    let priority = pod.priority();
    let mut potential: Vec<Arc<PodInfo>> = node
        .pods()
        .iter()
        .filter(|p| p.priority() < priority)
        .cloned()
        .collect();
    if potential.is_empty() {
        return Err(Status::unresolvable(NO_VICTIMS));
    }
    for victim in &potential {
        node.remove_pod(&victim.pod);
        let status = framework.run_pre_filter_extension_remove_pod(&mut state, pod, victim, &node);
        if !status.is_success() {
            return Err(status);
        }
    }
    // If it does not fit even with every lower-priority pod gone, this node is out.
    let status = framework.run_filter_plugins(&state, pod, &node);
    if !status.is_success() {
        return Err(status);
    }
    potential.sort_by(more_important_first(now));
    let mut victims = Vec::new();
    for candidate in potential {
        node.add_pod(candidate.clone());
        let status = framework.run_pre_filter_extension_add_pod(&mut state, pod, &candidate, &node);
        if !status.is_success() {
            return Err(status);
        }
        if !framework
            .run_filter_plugins(&state, pod, &node)
            .is_success()
        {
            node.remove_pod(&candidate.pod);
            let status =
                framework.run_pre_filter_extension_remove_pod(&mut state, pod, &candidate, &node);
            if !status.is_success() {
                return Err(status);
            }
            victims.push(candidate);
        }
    }
    Ok(victims)
}

/// Picks the candidate by upstream's ordered criteria; each criterion only
/// breaks the ties left by the previous ones.
fn pick_candidate<'c, 's>(candidates: &'c [Candidate<'s>], now: Timestamp) -> &'c Candidate<'s> {
    // Shift priorities to be non-negative so that a node with a few
    // negative-priority victims does not beat one with fewer of them.
    let shifted = |p: &PodInfo| i64::from(p.priority()) + i64::from(i32::MAX) + 1;
    let criteria: [&dyn Fn(&Candidate) -> i128; 4] = [
        &|c| -i128::from(c.victims[0].priority()),
        &|c| -i128::from(c.victims.iter().map(|v| shifted(v)).sum::<i64>()),
        &|c| -(c.victims.len() as i128),
        // The earliest start among the highest-priority victims: later is better.
        &|c| {
            let top = c.victims[0].priority();
            c.victims
                .iter()
                .filter(|v| v.priority() == top)
                .map(|v| pod_start_time(&v.pod).unwrap_or(now).as_nanosecond())
                .min()
                .unwrap_or(i128::MIN)
        },
    ];
    let mut remaining: Vec<&Candidate> = candidates.iter().collect();
    for criterion in criteria {
        let best = remaining
            .iter()
            .map(|c| criterion(c))
            .max()
            .unwrap_or(i128::MIN);
        remaining.retain(|c| criterion(c) == best);
        if remaining.len() == 1 {
            break;
        }
    }
    remaining[0]
}

impl Plugin for DefaultPreemption {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PostFilterPlugin for DefaultPreemption {
    fn post_filter(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        statuses: &NodeToStatus,
        framework: &Framework,
    ) -> (Option<PostFilterResult>, Status) {
        if let Err(reason) = self.eligibility(pod, snapshot, statuses) {
            return (None, Status::unschedulable(format!("preemption: {reason}")));
        }
        let now = Timestamp::now();
        // Nodes rejected as unresolvable cannot be fixed by evicting pods.
        let potential: Vec<&NodeInfo> = snapshot
            .nodes()
            .iter()
            .map(|n| &**n)
            .filter(|n| statuses.get(n.name()).code() != Code::UnschedulableAndUnresolvable)
            .collect();
        let mut node_statuses = NodeToStatus::default();
        node_statuses.set_absent(Status::unresolvable(NOT_HELPFUL));
        let mut candidates = Vec::new();
        if !potential.is_empty() {
            let wanted = self.num_candidates(potential.len());
            let offset = framework.random_below(potential.len());
            for i in 0..potential.len() {
                let node = potential[(offset + i) % potential.len()];
                match select_victims_on_node(framework, state, pod, node, now) {
                    Ok(victims) if !victims.is_empty() => {
                        candidates.push(Candidate { node, victims });
                        if candidates.len() >= wanted {
                            break;
                        }
                    }
                    Ok(_) => node_statuses.set(
                        node.name(),
                        Status::error(format!(
                            "expected at least one victim pod on node {:?}",
                            node.name()
                        )),
                    ),
                    Err(status) => node_statuses.set(node.name(), status),
                }
            }
        }
        if candidates.is_empty() {
            let fit_error = FitError {
                num_all_nodes: snapshot.num_nodes(),
                diagnosis: Diagnosis {
                    node_to_status: node_statuses,
                    ..Default::default()
                },
            };
            return (
                None,
                Status::unschedulable(format!("preemption: {fit_error}")),
            );
        }
        let chosen = pick_candidate(&candidates, now);
        tracing::debug!(
            pod = ?pod.pod.metadata.name,
            node = chosen.node.name(),
            victims = chosen.victims.len(),
            "preemption candidate chosen"
        );
        let result = PostFilterResult {
            nominated_node_name: chosen.node.name().to_string(),
            victims: chosen.victims.iter().map(|v| v.pod.clone()).collect(),
        };
        (Some(result), Status::success())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Profile;
    use crate::framework::ScheduleError;
    use crate::testing::{PodBuilder, node, node_with, pod, snapshot};

    fn framework() -> Framework {
        Framework::new(&Profile::default_profile(), None).unwrap()
    }

    fn schedule(
        snap: &Snapshot,
        p: PodBuilder,
    ) -> Result<String, (String, Option<PostFilterResult>)> {
        match framework().schedule_pod(snap, Arc::new(p.build())) {
            Ok(r) => Ok(r.suggested_host),
            Err(ScheduleError::Unschedulable {
                fit_error,
                preemption,
            }) => Err((fit_error.to_string(), preemption)),
            Err(other) => panic!("unexpected error: {other}"),
        }
    }

    fn victim_names(result: &PostFilterResult) -> Vec<&str> {
        result
            .victims
            .iter()
            .map(|v| v.metadata.name.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn evicts_the_fewest_lowest_priority_pods() {
        let snap = snapshot(vec![node_with(
            node("n1").capacity("4", "8Gi"),
            vec![
                pod("low-old").priority(1).req("1", "1Gi").start_time(100),
                pod("low-new").priority(1).req("1", "1Gi").start_time(200),
                pod("mid").priority(5).req("1", "1Gi"),
                pod("high").priority(100).req("1", "1Gi"),
            ],
        )]);
        let (message, result) = schedule(&snap, pod("p").priority(10).req("1", "1Gi")).unwrap_err();
        assert_eq!(message, "0/1 nodes are available: 1 Insufficient cpu.");
        let result = result.expect("a preemption result");
        assert_eq!(result.nominated_node_name, "n1");
        // One cpu is needed: reprieving most important first keeps mid and the
        // older low pod, so only the newest lowest-priority pod goes.
        assert_eq!(victim_names(&result), ["low-new"]);

        let (_, result) = schedule(&snap, pod("p").priority(10).req("3", "1Gi")).unwrap_err();
        let result = result.unwrap();
        assert_eq!(victim_names(&result), ["mid", "low-old", "low-new"]);
    }

    #[test]
    fn picks_the_node_with_lowest_priority_victims() {
        let snap = snapshot(vec![
            node_with(
                node("a").capacity("2", "8Gi"),
                vec![pod("a1").priority(50).req("2", "1Gi")],
            ),
            node_with(
                node("b").capacity("2", "8Gi"),
                vec![pod("b1").priority(5).req("2", "1Gi")],
            ),
            node_with(
                node("c").capacity("2", "8Gi"),
                vec![
                    pod("c1").priority(5).req("1", "1Gi"),
                    pod("c2").priority(5).req("1", "1Gi"),
                ],
            ),
        ]);
        let (_, result) = schedule(&snap, pod("p").priority(100).req("2", "1Gi")).unwrap_err();
        let result = result.unwrap();
        // b and c tie on the highest victim priority (5); b's victims sum lower.
        assert_eq!(result.nominated_node_name, "b");
        assert_eq!(victim_names(&result), ["b1"]);
    }

    #[test]
    fn latest_start_time_breaks_remaining_ties() {
        let snap = snapshot(vec![
            node_with(
                node("a").capacity("1", "8Gi"),
                vec![pod("old").priority(1).req("1", "1Gi").start_time(10)],
            ),
            node_with(
                node("b").capacity("1", "8Gi"),
                vec![pod("new").priority(1).req("1", "1Gi").start_time(99)],
            ),
        ]);
        let (_, result) = schedule(&snap, pod("p").priority(2).req("1", "1Gi")).unwrap_err();
        assert_eq!(result.unwrap().nominated_node_name, "b");
    }

    #[test]
    fn not_helpful_and_no_victims_messages() {
        let snap = snapshot(vec![
            node_with(
                node("tainted")
                    .capacity("4", "8Gi")
                    .taint("node-role", "x", "NoSchedule"),
                vec![],
            ),
            node_with(
                node("full").capacity("1", "8Gi"),
                vec![pod("peer").priority(10).req("1", "1Gi")],
            ),
            node_with(
                node("full2").capacity("1", "8Gi"),
                vec![pod("boss").priority(99).req("1", "1Gi")],
            ),
        ]);
        let (message, result) = schedule(&snap, pod("p").priority(10).req("1", "1Gi")).unwrap_err();
        assert!(result.is_none());
        assert_eq!(
            message,
            "0/3 nodes are available: 1 node(s) had untolerated taint {node-role: x}, 2 Insufficient cpu. \
             preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, \
             2 No preemption victims found for incoming pod.."
        );

        let only_tainted = snapshot(vec![node_with(
            node("t")
                .capacity("4", "8Gi")
                .taint("node-role", "x", "NoSchedule"),
            vec![],
        )]);
        let (message, _) =
            schedule(&only_tainted, pod("p").priority(10).req("1", "1Gi")).unwrap_err();
        assert_eq!(
            message,
            "0/1 nodes are available: 1 node(s) had untolerated taint {node-role: x}. \
             preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.."
        );
    }

    #[test]
    fn victims_that_do_not_free_enough_are_not_candidates() {
        // Evicting the low pod frees memory but the pod alone needs more cpu than remains.
        let snap = snapshot(vec![node_with(
            node("n").capacity("2", "8Gi"),
            vec![
                pod("low").priority(1).req("100m", "1Gi"),
                pod("high").priority(100).req("1900m", "1Gi"),
            ],
        )]);
        let (message, result) = schedule(&snap, pod("p").priority(10).req("1", "1Gi")).unwrap_err();
        assert!(result.is_none());
        assert!(
            message.ends_with("preemption: 0/1 nodes are available: 1 Insufficient cpu.."),
            "{message}"
        );
    }

    #[test]
    fn preemption_policy_never() {
        let snap = snapshot(vec![node_with(
            node("n").capacity("1", "8Gi"),
            vec![pod("low").priority(1).req("1", "1Gi")],
        )]);
        let (message, result) = schedule(
            &snap,
            pod("p").priority(10).preemption_never().req("1", "1Gi"),
        )
        .unwrap_err();
        assert!(result.is_none());
        assert_eq!(
            message,
            "0/1 nodes are available: 1 Insufficient cpu. preemption: not eligible due to preemptionPolicy=Never.."
        );
    }

    #[test]
    fn anti_affinity_victims_are_found_through_prefilter_extensions() {
        const ZONE: &str = "topology.kubernetes.io/zone";
        let snap = snapshot(vec![node_with(
            node("n").capacity("4", "8Gi").label(ZONE, "z1"),
            vec![
                pod("blocker")
                    .priority(1)
                    .label("app", "web")
                    .req("100m", "100Mi"),
            ],
        )]);
        let p = pod("p")
            .priority(10)
            .label("app", "web")
            .pod_anti_affinity_required("app", "web", ZONE)
            .req("100m", "100Mi");
        let (message, result) = schedule(&snap, p).unwrap_err();
        assert_eq!(
            message,
            "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."
        );
        assert_eq!(victim_names(&result.unwrap()), ["blocker"]);
    }

    #[test]
    fn candidate_count_follows_args() {
        let p = DefaultPreemption::new(DefaultPreemptionArgs::default()).unwrap();
        assert_eq!(p.num_candidates(50), 50);
        assert_eq!(p.num_candidates(5000), 500);
        assert_eq!(p.num_candidates(1500), 150);
        assert!(
            DefaultPreemption::new(DefaultPreemptionArgs {
                min_candidate_nodes_percentage: 0,
                min_candidate_nodes_absolute: 0
            })
            .is_err()
        );
    }
}
