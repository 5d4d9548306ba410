//! `EventRecorder`: writes core/v1 Events (what `kubectl describe` and `kubectl get events`
//! show) as upstream's controllers do, e.g. reason `SuccessfulCreate`, message
//! `Created pod: web-7d9c5-abcde`. Events are sent from a background task through a
//! bounded channel, so a slow apiserver never holds a reconcile back; when the channel
//! is full, events are dropped (as client-go's broadcaster does). On the way out they
//! are correlated as client-go's `EventCorrelator` does:
//! - an event that repeats one already sent (same source, object, type, reason and
//!   message) raises that Event's `count` and `lastTimestamp` instead of adding another
//!   ("x5 over 2m" in `kubectl describe`);
//! - from the tenth event within ten minutes that differs from the others only in its
//!   message (a ReplicaSet's `Created pod: ...` for each pod), one Event
//!   `(combined from similar events): <latest message>` counts them all;
//! - a source may send 25 events about one object at once, then one every five
//!   minutes; the rest are dropped (so 10,000 pods created cost a few requests).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::mpsc;

const QUEUE: usize = 4096;
/// How many keys each correlation step remembers (client-go's LRU caches: 4096).
const REMEMBERED: usize = 4096;
/// client-go's `defaultAggregateMaxEvents` and `defaultAggregateIntervalInSeconds`.
const SIMILAR_EVENTS: usize = 10;
const SIMILAR_WINDOW: Duration = Duration::from_secs(600);
/// client-go's `defaultSpamBurst` and `defaultSpamQPS` (one event per 300 s).
const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL: Duration = Duration::from_secs(300);

/// A correlation key: fields of an event joined in one string (a single allocation,
/// shared by the map and the queue of [`Recent`]: thousands are remembered).
type EventKey = Arc<str>;

/// The event's source and involved object, then `more`, joined with NUL (which object
/// names, reasons and component names cannot hold).
fn joined(e: &Event, more: &[Option<&String>]) -> EventKey {
    let source = e.source.as_ref();
    let o = &e.involved_object;
    let parts = [
        source.and_then(|s| s.component.as_ref()),
        source.and_then(|s| s.host.as_ref()),
        o.kind.as_ref(),
        o.namespace.as_ref(),
        o.name.as_ref(),
        o.uid.as_ref(),
        o.api_version.as_ref(),
    ];
    let all: Vec<&str> = parts
        .iter()
        .chain(more)
        .map(|p| p.map_or("", String::as_str))
        .collect();
    all.join("\0").into()
}

/// What makes two events the same one, repeated (client-go's `getEventKey`).
fn key(e: &Event) -> EventKey {
    let o = &e.involved_object;
    joined(
        e,
        &[
            o.field_path.as_ref(),
            e.type_.as_ref(),
            e.reason.as_ref(),
            e.message.as_ref(),
        ],
    )
}

/// What makes events similar: all but the message (client-go's
/// `EventAggregatorByReasonFunc`).
fn similar_key(e: &Event) -> EventKey {
    joined(
        e,
        &[
            e.type_.as_ref(),
            e.reason.as_ref(),
            e.reporting_component.as_ref(),
            e.reporting_instance.as_ref(),
        ],
    )
}

/// At most [`REMEMBERED`] entries; the oldest added is forgotten first.
struct Recent<V> {
    entries: HashMap<EventKey, V>,
    order: VecDeque<EventKey>,
}

impl<V> Default for Recent<V> {
    fn default() -> Self {
        Recent {
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<V> Recent<V> {
    fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.entries.get_mut(key)
    }

    fn insert(&mut self, key: EventKey, value: V) -> &mut V {
        if self.entries.insert(key.clone(), value).is_none() {
            self.order.push_back(key.clone());
        }
        while self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
        self.entries.get_mut(&key).expect("just inserted")
    }

    fn get_or_insert(&mut self, key: EventKey, value: impl FnOnce() -> V) -> &mut V {
        if self.entries.contains_key(&key) {
            return self.entries.get_mut(&key).expect("present");
        }
        self.insert(key, value())
    }
}

/// The messages of similar events seen lately and when the last came.
type SimilarRecord = (HashSet<String>, Instant);

/// client-go's `EventAggregator`: the event to send for `event` and its key — itself,
/// or once [`SIMILAR_EVENTS`] distinct messages came within [`SIMILAR_WINDOW`], the
/// combined event, whose key is the same for all of them.
fn combine(
    similar: &mut Recent<SimilarRecord>,
    mut event: Event,
    now: Instant,
) -> (Event, EventKey) {
    let group = similar_key(&event);
    let (messages, last) = similar.get_or_insert(group.clone(), || (HashSet::new(), now));
    if now.duration_since(*last) > SIMILAR_WINDOW {
        messages.clear();
    }
    *last = now;
    messages.insert(event.message.clone().unwrap_or_default());
    if messages.len() < SIMILAR_EVENTS {
        let key = key(&event);
        return (event, key);
    }
    // Not larger than the threshold: any one may go.
    if let Some(any) = messages.iter().next().cloned() {
        messages.remove(&any);
    }
    let message = event.message.take().unwrap_or_default();
    event.message = Some(format!("(combined from similar events): {message}"));
    (event, format!("combined\0{group}").into())
}

/// client-go's `EventSourceObjectSpamFilter`: whether the event's source may send one
/// more about its object — a token bucket per source and object.
fn allowed(buckets: &mut Recent<(f64, Instant)>, event: &Event, now: Instant) -> bool {
    let (tokens, last) = buckets.get_or_insert(joined(event, &[]), || (SPAM_BURST, now));
    let refilled = now.duration_since(*last).as_secs_f64() / SPAM_REFILL.as_secs_f64();
    *tokens = (*tokens + refilled).min(SPAM_BURST);
    *last = now;
    if *tokens >= 1.0 {
        *tokens -= 1.0;
        true
    } else {
        false
    }
}

/// Sends core/v1 Events, correlated as the module says.
async fn send_events(client: Client, mut rx: mpsc::Receiver<Event>) {
    // Events created: key → (namespace, name, count).
    let mut sent: Recent<(String, String, i32)> = Recent::default();
    let mut similar: Recent<SimilarRecord> = Recent::default();
    let mut buckets: Recent<(f64, Instant)> = Recent::default();
    while let Some(event) = rx.recv().await {
        let now = Instant::now();
        let (mut event, key) = combine(&mut similar, event, now);
        let send = allowed(&mut buckets, &event, now);
        if let Some((ns, name, count)) = sent.get_mut(&key) {
            // Counted even when not sent, as client-go does: the next update says all.
            *count += 1;
            if !send {
                continue;
            }
            let api: Api<Event> = Api::namespaced(client.clone(), ns);
            let patch = k8s_openapi::serde_json::json!({"count": *count,
                "lastTimestamp": event.last_timestamp, "message": event.message});
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => continue,
                // Gone (expired, deleted): recorded afresh below, with the count so far.
                Err(kube::Error::Api(s)) if s.code == 404 => event.count = Some(*count),
                Err(err) => {
                    tracing::debug!(error = %err, "event count not updated");
                    continue;
                }
            }
        } else if !send {
            continue;
        }
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(client.clone(), &ns);
        match api.create(&PostParams::default(), &event).await {
            Ok(created) => {
                let count = created.count.unwrap_or(1);
                sent.insert(key, (ns, created.name_any(), count));
            }
            Err(err) => tracing::debug!(error = %err, "event not recorded"),
        }
    }
}

/// Normal or Warning, as in `Event.type`.
#[derive(Clone, Copy, Debug)]
pub enum EventType {
    Normal,
    Warning,
}

#[derive(Clone)]
pub struct EventRecorder {
    component: &'static str,
    /// The node the reporter runs on (the kubelet's events say which node).
    host: Option<String>,
    tx: mpsc::Sender<Event>,
}

/// A bounded queue of objects (Events of either API group) and the task that creates
/// each in its namespace, in order. Creation failures are logged, not retried: an
/// event is an explanation, not state.
pub fn queue<E>(
    client: Client,
) -> (
    mpsc::Sender<E>,
    impl std::future::Future<Output = ()> + Send,
)
where
    E: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (tx, mut rx) = mpsc::channel::<E>(QUEUE);
    let sender = async move {
        while let Some(event) = rx.recv().await {
            let ns = event.meta().namespace.clone().unwrap_or_default();
            let api: Api<E> = Api::namespaced(client.clone(), &ns);
            if let Err(err) = api.create(&PostParams::default(), &event).await {
                tracing::debug!(error = %err, "event not recorded");
            }
        }
    };
    (tx, sender)
}

impl EventRecorder {
    /// A recorder for `component` (e.g. `replicaset-controller`) and the task that sends
    /// its events.
    pub fn new(
        client: Client,
        component: &'static str,
    ) -> (Self, impl std::future::Future<Output = ()> + Send) {
        let (tx, rx) = mpsc::channel::<Event>(QUEUE);
        let sender = send_events(client, rx);
        (
            EventRecorder {
                component,
                host: None,
                tx,
            },
            sender,
        )
    }

    /// The same recorder, reporting from node `host` (`source.host`, and the reporting
    /// instance).
    pub fn on_host(mut self, host: &str) -> Self {
        self.host = Some(host.to_string());
        self
    }

    /// Records an event about `obj`.
    pub fn record<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        kind: EventType,
        reason: &str,
        message: String,
    ) {
        let now = Timestamp::now();
        let involved = ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: Some(obj.name_any()),
            namespace: obj.namespace(),
            uid: obj.uid(),
            resource_version: obj.resource_version(),
            ..Default::default()
        };
        let event = Event {
            metadata: ObjectMeta {
                // `<object>.<unix nanos in hex>`, as client-go names events.
                name: Some(format!("{}.{:x}", obj.name_any(), now.as_nanosecond())),
                // Events about cluster-scoped objects (Nodes) live in `default`.
                namespace: Some(obj.namespace().unwrap_or_else(|| "default".into())),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(reason.to_string()),
            message: Some(message),
            type_: Some(
                match kind {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_string(),
            ),
            source: Some(EventSource {
                component: Some(self.component.to_string()),
                host: self.host.clone(),
            }),
            reporting_component: Some(self.component.to_string()),
            reporting_instance: Some(
                self.host
                    .clone()
                    .unwrap_or_else(|| self.component.to_string()),
            ),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            ..Default::default()
        };
        if self.tx.try_send(event).is_err() {
            tracing::debug!(reason, "event queue full; event dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str, message: &str) -> Event {
        Event {
            involved_object: ObjectReference {
                kind: Some("Pod".into()),
                name: Some("p".into()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            ..Default::default()
        }
    }

    #[test]
    fn repeats_share_a_key_and_old_events_are_forgotten() {
        assert_eq!(key(&event("Unhealthy", "m")), key(&event("Unhealthy", "m")));
        assert_ne!(key(&event("Unhealthy", "m")), key(&event("Unhealthy", "n")));
        let mut sent = Recent::default();
        for i in 0..REMEMBERED + 10 {
            sent.insert(key(&event("R", &i.to_string())), format!("e{i}"));
        }
        assert_eq!(sent.entries.len(), REMEMBERED);
        assert!(sent.get_mut(&key(&event("R", "0"))).is_none());
        assert_eq!(
            sent.get_mut(&key(&event("R", &(REMEMBERED + 9).to_string()))),
            Some(&mut format!("e{}", REMEMBERED + 9))
        );
    }

    #[test]
    fn the_tenth_similar_event_and_later_ones_are_combined() {
        let mut similar = Recent::default();
        let start = Instant::now();
        let mut keys = HashSet::new();
        for i in 0..9 {
            let (e, k) = combine(
                &mut similar,
                event("SuccessfulCreate", &format!("Created pod: p{i}")),
                start,
            );
            assert_eq!(
                e.message.as_deref(),
                Some(format!("Created pod: p{i}").as_str())
            );
            keys.insert(k);
        }
        assert_eq!(keys.len(), 9, "each its own event");
        let (tenth, combined) = combine(
            &mut similar,
            event("SuccessfulCreate", "Created pod: p9"),
            start,
        );
        assert_eq!(
            tenth.message.as_deref(),
            Some("(combined from similar events): Created pod: p9")
        );
        let (_, again) = combine(
            &mut similar,
            event("SuccessfulCreate", "Created pod: p10"),
            start,
        );
        assert_eq!(again, combined, "one event counts the rest");
        // Another reason is not similar; after ten quiet minutes the count starts over.
        let (other, _) = combine(
            &mut similar,
            event("SuccessfulDelete", "Deleted pod: p0"),
            start,
        );
        assert_eq!(other.message.as_deref(), Some("Deleted pod: p0"));
        let later = start + SIMILAR_WINDOW + Duration::from_secs(1);
        let (fresh, _) = combine(
            &mut similar,
            event("SuccessfulCreate", "Created pod: p11"),
            later,
        );
        assert_eq!(fresh.message.as_deref(), Some("Created pod: p11"));
    }

    #[test]
    fn a_source_sends_25_events_about_an_object_then_one_every_five_minutes() {
        let mut buckets = Recent::default();
        let start = Instant::now();
        let e = event("Unhealthy", "m");
        let sent = (0..30).filter(|_| allowed(&mut buckets, &e, start)).count();
        assert_eq!(sent, 25);
        let mut other = event("Unhealthy", "m");
        other.involved_object.name = Some("q".into());
        assert!(
            allowed(&mut buckets, &other, start),
            "another object has its own"
        );
        assert!(!allowed(&mut buckets, &e, start + Duration::from_secs(299)));
        assert!(allowed(&mut buckets, &e, start + Duration::from_secs(600)));
    }
}
