//! `Cache`: the scheduler's view of nodes and of the pods on them, kept in one
//! [`Snapshot`] updated in place.
//!
//! A pod counts on its node from the moment the scheduler *assumes* it (picks the node,
//! before the binding is written), so the next cycle never double-books the room. The
//! watch confirming the binding turns the assumption into a fact. If the binding fails
//! the assumption is forgotten; if it succeeded but the watch never confirms it within
//! [`ASSUME_TTL`], it expires (the pod was deleted meanwhile, say).
//!
//! Pods bound to a node the cache does not know yet wait beside it and join when the
//! node arrives. Finished pods (Succeeded, Failed) take no room.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use tokio::time::Instant;

use crate::framework::{NodeInfo, PodInfo, Snapshot};

/// How long a bound but unconfirmed assumption lives (upstream's 30 s).
pub const ASSUME_TTL: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Placed {
    node: String,
    pod: Arc<PodInfo>,
    state: State,
}

/// Why a pod counts on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Seen bound on the watch.
    Bound,
    /// Picked by this scheduler, not yet seen bound; with the deadline once its
    /// binding has been written.
    Assumed { deadline: Option<Instant> },
    /// Waiting for its preemption victims to go: the room they free is held for it,
    /// so that lower-priority pods do not take it first (upstream's nominated pods).
    Nominated,
}

#[derive(Debug, Default)]
pub struct Cache {
    snapshot: Snapshot,
    /// Pod UID → where it counts.
    pods: HashMap<String, Placed>,
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// Whether a bound pod takes room on its node.
pub fn occupies(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

impl Cache {
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    pub fn snapshot_mut(&mut self) -> &mut Snapshot {
        &mut self.snapshot
    }

    pub fn node_count(&self) -> usize {
        self.snapshot.num_nodes()
    }

    /// A node was added or changed.
    pub fn upsert_node(&mut self, node: Arc<Node>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        match self.snapshot.get(&name) {
            Some(existing) => {
                let mut info = (**existing).clone();
                info.set_node(node);
                self.snapshot.upsert_node(Arc::new(info));
            }
            None => {
                let mut info = NodeInfo::new(node);
                for placed in self.pods.values().filter(|p| p.node == name) {
                    info.add_pod(placed.pod.clone());
                }
                self.snapshot.upsert_node(Arc::new(info));
            }
        }
    }

    /// A node was deleted; its pods stay known, waiting for it to come back.
    pub fn remove_node(&mut self, name: &str) {
        self.snapshot.remove_node(name);
    }

    /// A pod with a node was seen on the watch (added or changed).
    pub fn upsert_pod(&mut self, pod: Arc<Pod>) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        if !occupies(&pod) {
            self.remove_pod(&pod);
            return;
        }
        let uid = uid(&pod);
        if let Some(old) = self.pods.remove(&uid) {
            self.snapshot.remove_pod(&old.node, &old.pod.pod);
        }
        let info = Arc::new(PodInfo::new(pod));
        self.snapshot.add_pod(&node, info.clone());
        self.pods.insert(
            uid,
            Placed {
                node,
                pod: info,
                state: State::Bound,
            },
        );
    }

    /// A pod was deleted (or finished): it frees its room.
    pub fn remove_pod(&mut self, pod: &Pod) {
        if let Some(old) = self.pods.remove(&uid(pod)) {
            self.snapshot.remove_pod(&old.node, &old.pod.pod);
        }
    }

    /// The scheduler picked `node` for the pod: it counts there from now on.
    pub fn assume(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.place(pod, node, State::Assumed { deadline: None });
    }

    fn place(&mut self, pod: Arc<PodInfo>, node: &str, state: State) {
        let uid = uid(&pod.pod);
        if let Some(old) = self.pods.remove(&uid) {
            self.snapshot.remove_pod(&old.node, &old.pod.pod);
        }
        self.snapshot.add_pod(node, pod.clone());
        self.pods.insert(
            uid,
            Placed {
                node: node.to_string(),
                pod,
                state,
            },
        );
    }

    /// The binding was written; the assumption now waits for the watch, at most
    /// [`ASSUME_TTL`].
    pub fn finish_binding(&mut self, pod: &Pod) {
        if let Some(Placed {
            state: State::Assumed { deadline },
            ..
        }) = self.pods.get_mut(&uid(pod))
        {
            *deadline = Some(Instant::now() + ASSUME_TTL);
        }
    }

    /// The binding failed, or the pod is about to be scheduled again: an assumption
    /// or nomination goes (a pod seen bound stays).
    pub fn forget(&mut self, pod: &Pod) {
        let uid = uid(pod);
        if self.pods.get(&uid).is_some_and(|p| p.state != State::Bound) {
            self.remove_pod(pod);
        }
    }

    /// Drops bound assumptions the watch never confirmed in time.
    pub fn expire(&mut self, now: Instant) {
        let expired: Vec<Arc<Pod>> = self
            .pods
            .values()
            .filter(|p| matches!(p.state, State::Assumed { deadline: Some(d) } if d <= now))
            .map(|p| p.pod.pod.clone())
            .collect();
        for pod in expired {
            tracing::warn!(pod = ?pod.metadata.name, "assumed pod expired without being seen bound");
            self.remove_pod(&pod);
        }
    }

    /// Whether the pod is assumed (picked, not yet confirmed by the watch).
    pub fn is_assumed(&self, pod: &Pod) -> bool {
        self.pods
            .get(&uid(pod))
            .is_some_and(|p| matches!(p.state, State::Assumed { .. }))
    }

    /// Holds room on `node` for a pod whose preemption victims are on their way out.
    pub fn nominate(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.place(pod, node, State::Nominated);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeStatus, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                allocatable: Some(
                    [("pods".to_string(), Quantity("10".into()))]
                        .into_iter()
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
        })
    }

    fn pod(name: &str, node: Option<&str>, phase: &str) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
        })
    }

    fn pods_on(cache: &Cache, node: &str) -> usize {
        cache
            .snapshot()
            .get(node)
            .map(|n| n.pods().len())
            .unwrap_or(0)
    }

    #[test]
    fn an_assumed_pod_counts_until_confirmed_or_forgotten() {
        let mut c = Cache::default();
        c.upsert_node(node("n1"));
        let p = pod("p", None, "Pending");
        c.assume(Arc::new(PodInfo::new(p.clone())), "n1");
        assert_eq!(pods_on(&c, "n1"), 1);
        assert!(c.is_assumed(&p));
        c.forget(&p);
        assert_eq!(pods_on(&c, "n1"), 0);

        c.assume(Arc::new(PodInfo::new(p.clone())), "n1");
        c.upsert_pod(pod("p", Some("n1"), "Pending"));
        assert!(!c.is_assumed(&p), "the watch confirmed it");
        assert_eq!(pods_on(&c, "n1"), 1);
        // Confirmed pods are not forgotten by a late binding failure.
        c.forget(&p);
        assert_eq!(pods_on(&c, "n1"), 1);
    }

    #[test]
    fn a_nomination_holds_room_until_its_pod_is_scheduled_again() {
        let mut c = Cache::default();
        c.upsert_node(node("n1"));
        let p = pod("preemptor", None, "Pending");
        c.nominate(Arc::new(PodInfo::new(p.clone())), "n1");
        assert_eq!(pods_on(&c, "n1"), 1);
        assert!(!c.is_assumed(&p));
        c.forget(&p);
        assert_eq!(pods_on(&c, "n1"), 0);
    }

    #[test]
    fn an_unconfirmed_binding_expires() {
        let mut c = Cache::default();
        c.upsert_node(node("n1"));
        let p = pod("p", None, "Pending");
        c.assume(Arc::new(PodInfo::new(p.clone())), "n1");
        c.expire(Instant::now() + ASSUME_TTL * 2);
        assert_eq!(pods_on(&c, "n1"), 1, "not bound yet: no deadline");
        c.finish_binding(&p);
        c.expire(Instant::now() + ASSUME_TTL * 2);
        assert_eq!(pods_on(&c, "n1"), 0);
    }

    #[test]
    fn pods_wait_for_their_node_and_finished_pods_take_no_room() {
        let mut c = Cache::default();
        c.upsert_pod(pod("early", Some("n2"), "Running"));
        c.upsert_pod(pod("done", Some("n2"), "Succeeded"));
        c.upsert_node(node("n2"));
        assert_eq!(pods_on(&c, "n2"), 1);
        c.upsert_pod(pod("early", Some("n2"), "Failed"));
        assert_eq!(pods_on(&c, "n2"), 0);
    }
}
