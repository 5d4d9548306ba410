//! `WorkQueue`: the queue between informer events and a reconciler, with the guarantees
//! of client-go's rate-limited work queue:
//!
//! - a key waiting in the queue is held once, however many events name it (dedup);
//! - a key is never handed to two workers at once; an event that arrives while it is
//!   being processed re-queues it after the worker is done, so no change is lost;
//! - a key whose reconcile failed comes back after a per-key exponential delay
//!   (5 ms doubling up to 1000 s, as upstream), reset when a pass succeeds.
//!
//! Keys are `namespace/name` strings, like client-go's `MetaNamespaceKeyFunc`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use krust_api::sync::Unpoisoned;
use tokio::sync::Notify;

use crate::metrics::QueueMetrics;

const BASE_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(1000);

/// Why a pass failed, as far as the queue cares: every failure is retried with backoff,
/// but an expected race is not worth a warning.
pub trait PassError: std::fmt::Display + Send {
    /// A write lost an optimistic-concurrency race (409), retried on fresher data.
    fn is_conflict(&self) -> bool;
}

/// A controller driven by a work queue: one level-triggered pass per key.
pub trait Reconciler: Send + Sync + 'static {
    type Error: PassError;
    fn queue(&self) -> &Arc<WorkQueue>;
    /// One pass over `key`; see [`WorkQueue::run`] for what the result means.
    fn reconcile(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Duration>, Self::Error>> + Send;
}

/// Runs `workers` reconcile loops of a controller. Never returns.
pub async fn run<R: Reconciler>(controller: Arc<R>, workers: usize) {
    let queue = controller.queue().clone();
    queue
        .run(workers, move |key| {
            let controller = controller.clone();
            async move { controller.reconcile(&key).await }
        })
        .await
}

/// A deduplicating, rate-limited queue of object keys.
pub struct WorkQueue {
    name: &'static str,
    state: Mutex<State>,
    ready: Notify,
    metrics: QueueMetrics,
}

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    /// Keys waiting in `queue`, or waiting to go back in once processing ends.
    dirty: HashSet<String>,
    processing: HashSet<String>,
    failures: HashMap<String, u32>,
    /// When each key with a pending delayed add is due, so that one timer per key is
    /// enough however often it is asked to come back (e.g. every pass of a long rollout).
    delayed: HashMap<String, Instant>,
    /// When each dirty key was added, and when each key being processed was taken: the
    /// work queue metrics' two latencies.
    added_at: HashMap<String, Instant>,
    taken_at: HashMap<String, Instant>,
}

impl WorkQueue {
    pub fn new(name: &'static str) -> Arc<Self> {
        Arc::new(WorkQueue {
            name,
            state: Mutex::new(State::default()),
            ready: Notify::new(),
            metrics: QueueMetrics::of(name),
        })
    }

    /// Queues `key` unless it is already waiting.
    pub fn add(&self, key: impl Into<String>) {
        let key = key.into();
        let mut s = self.state.locked();
        if !s.dirty.insert(key.clone()) {
            return;
        }
        self.metrics.adds.inc();
        self.metrics.depth.inc();
        s.added_at.insert(key.clone(), Instant::now());
        if s.processing.contains(&key) {
            // `done` puts it back once the current pass ends.
            return;
        }
        s.queue.push_back(key);
        drop(s);
        self.ready.notify_one();
    }

    /// Queues `key` after `delay`, unless it is already due back sooner.
    pub fn add_after(self: &Arc<Self>, key: String, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let due = Instant::now() + delay;
        {
            let mut s = self.state.locked();
            match s.delayed.get(&key) {
                Some(earlier) if *earlier <= due => return,
                _ => s.delayed.insert(key.clone(), due),
            };
        }
        let queue = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep_until(due.into()).await;
            if let Some(queue) = queue.upgrade() {
                let mut s = queue.state.locked();
                // Only the timer that owns the entry clears it; a replaced (later) timer
                // still adds the key, which costs one deduplicated add.
                if s.delayed.get(&key) == Some(&due) {
                    s.delayed.remove(&key);
                }
                drop(s);
                queue.add(key);
            }
        });
    }

    /// Queues `key` after its backoff delay, which doubles with every consecutive failure.
    pub fn add_rate_limited(self: &Arc<Self>, key: String) {
        let failures = {
            let mut s = self.state.locked();
            let n = s.failures.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        self.metrics.retries.inc();
        self.add_after(key, backoff(failures));
    }

    /// Clears the failure count of `key` after a successful pass.
    pub fn forget(&self, key: &str) {
        self.state.locked().failures.remove(key);
    }

    /// Waits for the next key and marks it as being processed.
    async fn next(&self) -> String {
        loop {
            {
                let mut s = self.state.locked();
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    let now = Instant::now();
                    if let Some(added) = s.added_at.remove(&key) {
                        self.metrics.depth.dec();
                        let waited = now.duration_since(added).as_secs_f64();
                        self.metrics.queue_duration.observe(waited);
                    }
                    s.taken_at.insert(key.clone(), now);
                    if !s.queue.is_empty() {
                        // Wake another idle worker: notify_one stores a single permit.
                        self.ready.notify_one();
                    }
                    return key;
                }
            }
            self.ready.notified().await;
        }
    }

    /// Ends processing of `key`; re-queues it if an event named it meanwhile.
    fn done(&self, key: &str) {
        let mut s = self.state.locked();
        s.processing.remove(key);
        if let Some(taken) = s.taken_at.remove(key) {
            let worked = taken.elapsed().as_secs_f64();
            self.metrics.work_duration.observe(worked);
        }
        if s.dirty.contains(key) {
            s.queue.push_back(key.to_string());
            drop(s);
            self.ready.notify_one();
        }
    }

    /// Number of keys waiting (for tests and logs).
    pub fn len(&self) -> usize {
        self.state.locked().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `workers` loops that take keys and reconcile them. A pass returns
    /// `Ok(Some(delay))` to be looked at again after `delay` (e.g. when a pod becomes
    /// available after minReadySeconds), `Ok(None)` when done, or an error to be retried
    /// with backoff. Never returns.
    pub async fn run<F, Fut, E>(self: Arc<Self>, workers: usize, reconcile: F)
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<Duration>, E>> + Send,
        E: PassError,
    {
        let reconcile = Arc::new(reconcile);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..workers.max(1) {
            let queue = self.clone();
            let reconcile = reconcile.clone();
            set.spawn(async move {
                loop {
                    let key = queue.next().await;
                    // A panicking pass must not leave its key marked as processing (it
                    // would never be reconciled again) nor take the worker down.
                    let result = AssertUnwindSafe(reconcile(key.clone())).catch_unwind().await;
                    match result {
                        Err(_) => {
                            tracing::error!(controller = queue.name, %key, "reconcile panicked; retrying");
                            queue.add_rate_limited(key.clone());
                        }
                        Ok(Ok(requeue)) => {
                            queue.forget(&key);
                            if let Some(delay) = requeue {
                                queue.add_after(key.clone(), delay);
                            }
                        }
                        Ok(Err(err)) => {
                            if err.is_conflict() {
                                tracing::debug!(controller = queue.name, %key, error = %err, "conflict; retrying");
                            } else {
                                tracing::warn!(controller = queue.name, %key, error = %err, "reconcile failed; retrying");
                            }
                            queue.add_rate_limited(key.clone());
                        }
                    }
                    queue.done(&key);
                }
            });
        }
        while set.join_next().await.is_some() {}
    }
}

/// The retry delay after `failures` consecutive failures: 5 ms · 2^(failures-1), capped.
fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    BASE_DELAY
        .checked_mul(1u32 << exp)
        .map_or(MAX_DELAY, |d| d.min(MAX_DELAY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct TestError;

    impl std::fmt::Display for TestError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("test error")
        }
    }

    impl PassError for TestError {
        fn is_conflict(&self) -> bool {
            false
        }
    }

    #[tokio::test]
    async fn a_key_queued_twice_is_processed_once() {
        let q = WorkQueue::new("test");
        q.add("ns/a");
        q.add("ns/a");
        q.add("ns/b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, "ns/a");
        assert_eq!(q.next().await, "ns/b");
    }

    #[tokio::test]
    async fn an_event_during_processing_requeues_the_key_after_done() {
        let q = WorkQueue::new("test");
        q.add("ns/a");
        let key = q.next().await;
        q.add("ns/a");
        assert!(
            q.is_empty(),
            "not handed to a second worker while processing"
        );
        q.done(&key);
        assert_eq!(q.next().await, "ns/a");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_asked_back_later_comes_back_once_at_the_soonest_time() {
        let q = WorkQueue::new("test");
        q.add_after("ns/a".into(), Duration::from_secs(60));
        q.add_after("ns/a".into(), Duration::from_secs(600));
        q.add_after("ns/a".into(), Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.next().await, "ns/a");
        q.done("ns/a");
        tokio::time::sleep(Duration::from_secs(1000)).await;
        assert_eq!(
            q.len(),
            1,
            "the 60 s timer still fires; the 600 s one was never set"
        );
    }

    #[tokio::test]
    async fn a_panicking_pass_is_retried_and_the_worker_survives() {
        let q = WorkQueue::new("test");
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let runner = {
            let calls = calls.clone();
            tokio::spawn(q.clone().run(1, move |key| {
                let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let done_tx = done_tx.clone();
                async move {
                    assert!(n > 0, "first pass of {key} panics");
                    let _ = done_tx.send(key);
                    Ok::<_, TestError>(None)
                }
            }))
        };
        q.add("ns/a");
        let key = tokio::time::timeout(Duration::from_secs(5), done_rx.recv())
            .await
            .unwrap();
        assert_eq!(key.as_deref(), Some("ns/a"));
        // The same single worker takes the next key.
        q.add("ns/b");
        let key = tokio::time::timeout(Duration::from_secs(5), done_rx.recv())
            .await
            .unwrap();
        assert_eq!(key.as_deref(), Some("ns/b"));
        runner.abort();
    }

    #[test]
    fn backoff_doubles_from_5ms_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(5));
        assert_eq!(backoff(2), Duration::from_millis(10));
        assert_eq!(backoff(5), Duration::from_millis(80));
        assert_eq!(backoff(40), MAX_DELAY);
    }

    #[tokio::test]
    async fn the_queue_counts_adds_depth_retries_and_latencies() {
        let q = WorkQueue::new("metrics-test");
        q.add("ns/a");
        q.add("ns/a");
        q.add("ns/b");
        let key = q.next().await;
        q.add_rate_limited("ns/c".into());
        q.done(&key);
        let mut registry = prometheus_client::registry::Registry::default();
        crate::metrics::register_work_queues(&mut registry);
        let text = crate::metrics::render(&registry);
        for line in [
            r#"workqueue_adds_total{name="metrics-test"} 2"#,
            r#"workqueue_depth{name="metrics-test"} 1"#,
            r#"workqueue_retries_total{name="metrics-test"} 1"#,
            r#"workqueue_queue_duration_seconds_count{name="metrics-test"} 1"#,
            r#"workqueue_work_duration_seconds_count{name="metrics-test"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }
}
