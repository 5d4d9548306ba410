//! The scheduler's metrics, in upstream's names: scheduling attempts and their latency
//! by result and profile, and the pods waiting in each sub-queue.

use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use krust_api::sync::Unpoisoned;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::queue::SchedulingQueue;

/// How a scheduling attempt ended (upstream's `result` label).
#[derive(Clone, Copy, Debug)]
pub enum Outcome {
    /// The pod was bound to a node.
    Scheduled,
    /// No node fits it.
    Unschedulable,
    /// Something failed (a plugin, the binding).
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Scheduled => "scheduled",
            Outcome::Unschedulable => "unschedulable",
            Outcome::Error => "error",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    result: &'static str,
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: &'static str,
}

/// The scheduler's metrics; they outlive each leadership term's scheduling queue.
pub struct Metrics {
    attempts: Family<AttemptLabels, Counter>,
    attempt_duration: Family<AttemptLabels, Histogram>,
    /// The queue of the scheduler running now, if any.
    queue: Mutex<Weak<SchedulingQueue>>,
}

impl Metrics {
    /// New metrics, registered in `registry`.
    pub fn new(registry: &mut Registry) -> Arc<Metrics> {
        let metrics = Arc::new(Metrics {
            attempts: Family::default(),
            // Upstream's buckets: 1 ms to about 16 s.
            attempt_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 15))
            }),
            queue: Mutex::new(Weak::new()),
        });
        registry.register(
            "scheduler_schedule_attempts",
            "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be scheduled, while 'error' means an internal scheduler problem.",
            metrics.attempts.clone(),
        );
        registry.register(
            "scheduler_scheduling_attempt_duration_seconds",
            "Scheduling attempt latency in seconds (scheduling algorithm + binding)",
            metrics.attempt_duration.clone(),
        );
        registry.register_collector(Box::new(PendingPods(metrics.clone())));
        metrics
    }

    /// Counts one attempt that began at `started`.
    pub(crate) fn attempt(&self, profile: &str, outcome: Outcome, started: Instant) {
        let labels = AttemptLabels {
            result: outcome.label(),
            profile: profile.to_string(),
        };
        self.attempts.get_or_create(&labels).inc();
        self.attempt_duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }

    /// Reports `queue`'s pending pods from now on.
    pub(crate) fn watch(&self, queue: &Arc<SchedulingQueue>) {
        *self.queue.locked() = Arc::downgrade(queue);
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// `scheduler_pending_pods`, read from the queue at each scrape.
#[derive(Debug)]
struct PendingPods(Arc<Metrics>);

impl Collector for PendingPods {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(queue) = self.0.queue.locked().upgrade() else {
            return Ok(());
        };
        let (active, backoff, unschedulable) = queue.counts();
        let family = Family::<QueueLabels, Gauge>::default();
        for (name, n) in [
            ("active", active),
            ("backoff", backoff),
            ("unschedulable", unschedulable),
        ] {
            family
                .get_or_create(&QueueLabels { queue: name })
                .set(n as i64);
        }
        let metric = encoder.encode_descriptor(
            "scheduler_pending_pods",
            "Number of pending pods, by the queue type. 'active' means number of pods in activeQ; 'backoff' means number of pods in backoffQ; 'unschedulable' means number of pods in unschedulablePods.",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}
