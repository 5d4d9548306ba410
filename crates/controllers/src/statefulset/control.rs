//! What a StatefulSet pass does next, as upstream's `updateStatefulSet`, decided on the
//! cached pods without writing anything:
//! 1. every ordinal in range gets its pod (finished pods are deleted first and made
//!    again on a later pass); under OrderedReady one step at a time, waiting until the
//!    lower pods are Running, Ready and available;
//! 2. pods beyond the range go, highest ordinal first (OrderedReady: one at a time,
//!    only once the rest are healthy);
//! 3. a RollingUpdate then deletes pods of older revisions from the highest ordinal
//!    down to `partition`, at most `maxUnavailable` unavailable at once; the pass
//!    after recreates them from the update revision. OnDelete leaves that to the user.
//!
//! `maxUnavailable` is honoured always; upstream 1.33 reads it only with the alpha
//! `MaxUnavailableStatefulSet` gate on, and otherwise updates one pod at a time — which
//! is what the default (unset: 1) does here too.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use crate::history::REVISION_HASH;
use crate::pods::{CachedPod, Phase, is_available, is_ready};

/// One write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create the pod of this ordinal, from the update revision (else the current one).
    Create {
        ordinal: i32,
        update: bool,
    },
    Delete {
        ordinal: i32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Pods from `partition` (an index from the first ordinal) up are updated, at most
    /// `max_unavailable` unavailable at a time.
    RollingUpdate {
        partition: i32,
        max_unavailable: usize,
    },
    OnDelete,
}

/// What the plan is made from.
pub struct Inputs<'a> {
    /// The first ordinal and how many pods there should be.
    pub start: i32,
    pub replicas: i32,
    /// The set's pods by ordinal.
    pub pods: &'a BTreeMap<i32, &'a CachedPod>,
    pub update_revision: &'a str,
    /// OrderedReady (else Parallel).
    pub ordered: bool,
    pub strategy: Strategy,
    pub min_ready: i32,
    pub now: Timestamp,
}

impl Inputs<'_> {
    fn healthy(&self, pod: &CachedPod) -> bool {
        running_and_ready(pod) && !pod.metadata.terminating
    }

    /// Healthy for `minReadySeconds`: a pod on its way out is not available.
    fn available(&self, pod: &CachedPod) -> bool {
        self.healthy(pod) && is_available(pod, self.min_ready, self.now)
    }

    /// Where a missing pod's template comes from: below the partition, the current
    /// revision (a partitioned update leaves those pods as they were).
    fn made_from_update(&self, ordinal: i32) -> bool {
        match self.strategy {
            Strategy::RollingUpdate { partition, .. } => ordinal >= self.start + partition,
            Strategy::OnDelete => true,
        }
    }
}

pub fn running_and_ready(pod: &CachedPod) -> bool {
    pod.status.phase == Some(Phase::Running) && is_ready(pod)
}

/// The writes of this pass.
pub fn plan(i: &Inputs) -> Vec<Action> {
    let mut actions = Vec::new();
    let end = i.start + i.replicas.max(0);
    let in_range = i.start..end;

    for ordinal in in_range.clone() {
        match i.pods.get(&ordinal) {
            None => {
                actions.push(Action::Create {
                    ordinal,
                    update: i.made_from_update(ordinal),
                });
                if i.ordered {
                    return actions;
                }
            }
            Some(pod) if pod.is_finished() => {
                if !pod.metadata.terminating {
                    actions.push(Action::Delete { ordinal });
                }
                if i.ordered {
                    return actions;
                }
            }
            Some(pod) => {
                if i.ordered && !i.available(pod) {
                    return actions;
                }
            }
        }
    }

    let first_unhealthy = i
        .pods
        .iter()
        .filter(|(o, _)| in_range.contains(o))
        .chain(i.pods.iter().filter(|(o, _)| !in_range.contains(o)))
        .find(|(_, p)| !i.healthy(p))
        .map(|(o, _)| *o);
    let condemned: Vec<(i32, &CachedPod)> = i
        .pods
        .iter()
        .rev()
        .filter(|(o, _)| !in_range.contains(o))
        .map(|(o, p)| (*o, *p))
        .collect();
    for (ordinal, pod) in &condemned {
        if pod.metadata.terminating {
            if i.ordered {
                return actions;
            }
            continue;
        }
        if i.ordered && !i.available(pod) && first_unhealthy != Some(*ordinal) {
            return actions;
        }
        actions.push(Action::Delete { ordinal: *ordinal });
        if i.ordered {
            return actions;
        }
    }
    if !condemned.is_empty() || !actions.is_empty() {
        return actions;
    }

    let Strategy::RollingUpdate {
        partition,
        max_unavailable,
    } = i.strategy
    else {
        return actions;
    };
    let mut unavailable = in_range
        .clone()
        .filter(|o| i.pods.get(o).is_none_or(|p| !i.available(p)))
        .count();
    for ordinal in in_range.rev().take_while(|o| *o >= i.start + partition) {
        let Some(pod) = i.pods.get(&ordinal) else {
            continue;
        };
        let revision = pod.labels().get(REVISION_HASH).map(String::as_str);
        if revision != Some(i.update_revision) && !pod.metadata.terminating {
            // An old pod that is unavailable anyway costs nothing more.
            let counted = i.available(pod);
            if counted && unavailable >= max_unavailable.max(1) {
                break;
            }
            actions.push(Action::Delete { ordinal });
            if counted {
                unavailable += 1;
            }
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::tests::{labelled, pod, ts};

    fn member(ordinal: i32, revision: &str, ready: bool) -> CachedPod {
        labelled(
            pod(
                &format!("web-{ordinal}"),
                0,
                Some("n"),
                "Running",
                ready.then_some(0),
            ),
            &[(REVISION_HASH, revision)],
        )
    }

    fn run(pods: &[CachedPod], replicas: i32, ordered: bool, strategy: Strategy) -> Vec<Action> {
        let by_ordinal: BTreeMap<i32, &CachedPod> = pods
            .iter()
            .map(|p| (p.metadata.name[4..].parse().unwrap(), p))
            .collect();
        plan(&Inputs {
            start: 0,
            replicas,
            pods: &by_ordinal,
            update_revision: "web-2",
            ordered,
            strategy,
            min_ready: 0,
            now: ts(100),
        })
    }

    const ROLLING: Strategy = Strategy::RollingUpdate {
        partition: 0,
        max_unavailable: 1,
    };

    #[test]
    fn ordered_pods_come_one_at_a_time_once_the_lower_ones_are_ready() {
        assert_eq!(
            run(&[], 3, true, ROLLING),
            [Action::Create {
                ordinal: 0,
                update: true
            }]
        );
        let not_ready = [member(0, "web-2", false)];
        assert!(
            run(&not_ready, 3, true, ROLLING).is_empty(),
            "waits for web-0"
        );
        let ready = [member(0, "web-2", true)];
        assert_eq!(
            run(&ready, 3, true, ROLLING),
            [Action::Create {
                ordinal: 1,
                update: true
            }]
        );
        // Parallel: every missing pod at once.
        assert_eq!(run(&not_ready, 3, false, ROLLING).len(), 2);
    }

    #[test]
    fn scale_down_goes_from_the_highest_ordinal_one_at_a_time() {
        let pods: Vec<CachedPod> = (0..4).map(|o| member(o, "web-2", true)).collect();
        assert_eq!(
            run(&pods, 2, true, ROLLING),
            [Action::Delete { ordinal: 3 }]
        );
        assert_eq!(
            run(&pods, 2, false, ROLLING),
            [Action::Delete { ordinal: 3 }, Action::Delete { ordinal: 2 }]
        );
        let mut blocked = pods.clone();
        blocked[1] = member(1, "web-2", false);
        assert!(
            run(&blocked, 2, true, ROLLING).is_empty(),
            "web-1 is not ready"
        );
    }

    #[test]
    fn rolling_updates_go_down_to_the_partition_within_max_unavailable() {
        let pods: Vec<CachedPod> = (0..4).map(|o| member(o, "web-1", true)).collect();
        assert_eq!(
            run(&pods, 4, true, ROLLING),
            [Action::Delete { ordinal: 3 }]
        );
        let two = Strategy::RollingUpdate {
            partition: 0,
            max_unavailable: 2,
        };
        assert_eq!(
            run(&pods, 4, false, two),
            [Action::Delete { ordinal: 3 }, Action::Delete { ordinal: 2 }]
        );
        let partitioned = Strategy::RollingUpdate {
            partition: 3,
            max_unavailable: 1,
        };
        let mut updated = pods.clone();
        updated[3] = member(3, "web-2", true);
        assert!(
            run(&updated, 4, true, partitioned).is_empty(),
            "0-2 stay below the partition"
        );
        // A missing pod below the partition comes back at the current revision.
        assert_eq!(
            run(&updated[1..], 4, true, partitioned),
            [Action::Create {
                ordinal: 0,
                update: false
            }]
        );
        assert!(run(&pods, 4, true, Strategy::OnDelete).is_empty());
    }

    #[test]
    fn finished_pods_are_deleted_to_be_made_again() {
        let failed = labelled(
            pod("web-0", 0, Some("n"), "Failed", None),
            &[(REVISION_HASH, "web-2")],
        );
        assert_eq!(
            run(&[failed], 2, true, ROLLING),
            [Action::Delete { ordinal: 0 }]
        );
    }
}
