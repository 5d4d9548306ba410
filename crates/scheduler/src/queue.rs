//! `SchedulingQueue`: the pods waiting for a node, in upstream's three sub-queues.
//!
//! - *active*: ready to be tried, highest priority first, then oldest first
//!   (the PrioritySort plugin's order);
//! - *backoff*: failed recently; each comes back to active when its backoff ends
//!   (1 s, doubling per failed attempt, at most 10 s);
//! - *unschedulable*: no node fitted. Such a pod waits for a cluster event that may
//!   change the answer (a node added or changed, a pod deleted, ...), which moves every
//!   unschedulable pod back (to backoff while its backoff lasts, else to active). A pod
//!   that has waited longer than [`MAX_UNSCHEDULABLE`] is moved back anyway, as upstream.
//!
//! A pod whose cycle failed after a cluster event happened *during* that cycle goes to
//! backoff instead of unschedulable: the event may already have made it schedulable
//! (upstream's "move request cycle").

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use krust_api::sync::Unpoisoned;
use tokio::sync::Notify;
// tokio's clock, so that tests can run the backoffs on paused time.
use tokio::time::Instant;

use crate::framework::pod_priority;

pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How long a pod may sit in unschedulable without any event before it is retried.
pub const MAX_UNSCHEDULABLE: Duration = Duration::from_secs(300);

/// A pod taken from the queue for one scheduling cycle.
#[derive(Clone, Debug)]
pub struct QueuedPod {
    pub pod: Arc<Pod>,
    pub key: String,
    /// Scheduling attempts so far, this one included.
    pub attempts: u32,
    /// When the pod first entered the queue (for latency metrics).
    pub first_queued: Instant,
    /// The queue's event count when this cycle started.
    cycle_events: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Active,
    Backoff(Instant),
    Unschedulable(Instant),
    /// Popped, its cycle not finished.
    InFlight,
}

#[derive(Debug)]
struct Entry {
    pod: Arc<Pod>,
    attempts: u32,
    first_queued: Instant,
    /// When it entered active last (ties in priority go to the oldest).
    since: Instant,
    place: Place,
    /// Bumped whenever the entry moves, so stale heap items are skipped.
    generation: u64,
}

/// An active-heap item: priority, then age.
#[derive(Debug, PartialEq, Eq)]
struct Ready {
    priority: i32,
    since: Reverse<Instant>,
    generation: u64,
    key: String,
}

impl Ord for Ready {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.priority, self.since).cmp(&(other.priority, other.since))
    }
}

impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    active: BinaryHeap<Ready>,
    backoff: BinaryHeap<Reverse<(Instant, u64, String)>>,
    generation: u64,
    /// Cluster events seen so far.
    events: u64,
}

impl Inner {
    fn activate(&mut self, key: &str, now: Instant) {
        self.generation += 1;
        let generation = self.generation;
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        e.place = Place::Active;
        e.since = now;
        e.generation = generation;
        self.active.push(Ready {
            priority: pod_priority(&e.pod),
            since: Reverse(now),
            generation,
            key: key.to_string(),
        });
    }

    fn back_off(&mut self, key: &str, until: Instant) {
        self.generation += 1;
        let generation = self.generation;
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        e.place = Place::Backoff(until);
        e.generation = generation;
        self.backoff
            .push(Reverse((until, generation, key.to_string())));
    }

    /// Back to backoff if it is still backing off, else to active.
    fn requeue(&mut self, key: &str, now: Instant) {
        let Some(e) = self.entries.get(key) else {
            return;
        };
        let until = e.since + backoff(e.attempts);
        if until > now {
            self.back_off(key, until);
        } else {
            self.activate(key, now);
        }
    }
}

/// The backoff after `attempts` failed attempts, counted from the last failure.
fn backoff(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    (INITIAL_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

#[derive(Default)]
pub struct SchedulingQueue {
    inner: Mutex<Inner>,
    ready: Notify,
}

impl SchedulingQueue {
    pub fn new() -> Arc<Self> {
        Arc::new(SchedulingQueue::default())
    }

    /// A pod that needs a node, new or changed. A changed pod waiting as
    /// unschedulable is tried again (its change may be what it needed).
    pub fn add(&self, pod: Arc<Pod>) {
        let key = pod_key(&pod);
        let now = Instant::now();
        let mut inner = self.inner.locked();
        match inner.entries.get_mut(&key) {
            Some(e) => {
                let changed =
                    e.pod.spec != pod.spec || e.pod.metadata.labels != pod.metadata.labels;
                e.pod = pod;
                if changed && matches!(e.place, Place::Unschedulable(_)) {
                    inner.requeue(&key, now);
                    self.ready.notify_one();
                }
            }
            None => {
                inner.entries.insert(
                    key.clone(),
                    Entry {
                        pod,
                        attempts: 0,
                        first_queued: now,
                        since: now,
                        place: Place::Active,
                        generation: 0,
                    },
                );
                inner.activate(&key, now);
                self.ready.notify_one();
            }
        }
    }

    /// The pod is gone or has a node: forget it.
    pub fn delete(&self, key: &str) {
        self.inner.locked().entries.remove(key);
    }

    pub fn len(&self) -> usize {
        self.inner.locked().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many pods wait in each sub-queue: (active, backoff, unschedulable).
    pub fn counts(&self) -> (usize, usize, usize) {
        let inner = self.inner.locked();
        let mut counts = (0, 0, 0);
        for e in inner.entries.values() {
            match e.place {
                Place::Active => counts.0 += 1,
                Place::Backoff(_) => counts.1 += 1,
                Place::Unschedulable(_) => counts.2 += 1,
                Place::InFlight => {}
            }
        }
        counts
    }

    /// Waits for the next pod to schedule.
    pub async fn pop(&self) -> QueuedPod {
        loop {
            let notified = self.ready.notified();
            let wait = {
                let mut inner = self.inner.locked();
                let now = Instant::now();
                self.flush(&mut inner, now);
                while let Some(top) = inner.active.pop() {
                    let events = inner.events;
                    let Some(e) = inner.entries.get_mut(&top.key) else {
                        continue;
                    };
                    if e.generation != top.generation || e.place != Place::Active {
                        continue;
                    }
                    e.place = Place::InFlight;
                    e.attempts += 1;
                    return QueuedPod {
                        pod: e.pod.clone(),
                        key: top.key,
                        attempts: e.attempts,
                        first_queued: e.first_queued,
                        cycle_events: events,
                    };
                }
                inner
                    .backoff
                    .peek()
                    .map(|Reverse((until, _, _))| until.saturating_duration_since(now))
                    .unwrap_or(Duration::from_secs(1))
            };
            let _ = tokio::time::timeout(wait, notified).await;
        }
    }

    /// Moves ended backoffs to active, and pods unschedulable for too long to backoff.
    fn flush(&self, inner: &mut Inner, now: Instant) {
        while let Some(Reverse((until, generation, key))) = inner.backoff.peek().cloned() {
            if until > now {
                break;
            }
            inner.backoff.pop();
            let current = inner.entries.get(&key).is_some_and(|e| {
                e.generation == generation && matches!(e.place, Place::Backoff(_))
            });
            if current {
                inner.activate(&key, now);
            }
        }
        let stale: Vec<String> = inner
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.place, Place::Unschedulable(at) if now - at > MAX_UNSCHEDULABLE))
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            inner.requeue(&key, now);
        }
    }

    /// No node fitted the pod in its cycle.
    pub fn unschedulable(&self, popped: &QueuedPod) {
        let now = Instant::now();
        let mut inner = self.inner.locked();
        let events = inner.events;
        let Some(e) = inner.entries.get_mut(&popped.key) else {
            return;
        };
        if e.place != Place::InFlight {
            return;
        }
        e.since = now;
        if events > popped.cycle_events {
            // Something changed while it was being scheduled: try again soon.
            inner.requeue(&popped.key, now);
            self.ready.notify_one();
        } else {
            e.place = Place::Unschedulable(now);
        }
    }

    /// The cycle or the binding failed for another reason: retry after the backoff.
    pub fn retry(&self, popped: &QueuedPod) {
        let now = Instant::now();
        let mut inner = self.inner.locked();
        let Some(e) = inner.entries.get_mut(&popped.key) else {
            return;
        };
        e.since = now;
        inner.requeue(&popped.key, now);
        self.ready.notify_one();
    }

    /// The pod was bound: it leaves the queue.
    pub fn done(&self, popped: &QueuedPod) {
        self.delete(&popped.key);
    }

    /// A cluster event that may make unschedulable pods schedulable.
    pub fn move_all_to_active_or_backoff(&self) {
        let now = Instant::now();
        let mut inner = self.inner.locked();
        inner.events += 1;
        let waiting: Vec<String> = inner
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.place, Place::Unschedulable(_)))
            .map(|(k, _)| k.clone())
            .collect();
        if waiting.is_empty() {
            return;
        }
        for key in waiting {
            inner.requeue(&key, now);
        }
        self.ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, priority: i32) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                priority: Some(priority),
                ..PodSpec::default()
            }),
            status: None,
        })
    }

    fn name(q: &QueuedPod) -> &str {
        q.pod.metadata.name.as_deref().unwrap()
    }

    #[tokio::test]
    async fn higher_priority_first_then_oldest() {
        let q = SchedulingQueue::new();
        q.add(pod("low", 0));
        q.add(pod("high", 10));
        q.add(pod("low2", 0));
        assert_eq!(name(&q.pop().await), "high");
        assert_eq!(name(&q.pop().await), "low");
        assert_eq!(name(&q.pop().await), "low2");
    }

    #[test]
    fn backoff_doubles_from_one_second_to_ten() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(5), Duration::from_secs(10));
        assert_eq!(backoff(50), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unschedulable_pod_waits_for_an_event_and_then_its_backoff() {
        let q = SchedulingQueue::new();
        q.add(pod("p", 0));
        let popped = q.pop().await;
        q.unschedulable(&popped);
        assert_eq!(q.counts(), (0, 0, 1));
        // Nothing happens without an event.
        let waited = tokio::time::timeout(Duration::from_secs(30), q.pop()).await;
        assert!(
            waited.is_err(),
            "an unschedulable pod came back without an event"
        );
        // An event moves it; it comes back once its 1 s backoff has passed.
        q.move_all_to_active_or_backoff();
        let again = q.pop().await;
        assert_eq!(again.attempts, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_during_the_cycle_sends_a_failed_pod_to_backoff() {
        let q = SchedulingQueue::new();
        q.add(pod("p", 0));
        let popped = q.pop().await;
        q.move_all_to_active_or_backoff();
        q.unschedulable(&popped);
        let (active, backoff, unschedulable) = q.counts();
        assert_eq!(unschedulable, 0);
        assert_eq!(active + backoff, 1);
        let start = tokio::time::Instant::now();
        q.pop().await;
        assert!(start.elapsed() <= INITIAL_BACKOFF + Duration::from_millis(10));
    }

    #[tokio::test]
    async fn a_deleted_pod_is_never_popped() {
        let q = SchedulingQueue::new();
        q.add(pod("gone", 10));
        q.add(pod("kept", 0));
        q.delete("default/gone");
        assert_eq!(name(&q.pop().await), "kept");
        assert!(q.counts() == (0, 0, 0));
    }
}
