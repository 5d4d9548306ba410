//! `EventRecorder`: writes core/v1 Events (what `kubectl describe` and `kubectl get events`
//! show) as upstream's controllers do, e.g. reason `SuccessfulCreate`, message
//! `Created pod: web-7d9c5-abcde`. Events are sent from a background task through a
//! bounded channel, so a slow apiserver never holds a reconcile back; when the channel
//! is full, events are dropped (as client-go's broadcaster does). An event that repeats
//! one already sent (same source, object, type, reason and message) raises that Event's
//! `count` and `lastTimestamp` instead of adding another, as client-go's event logger
//! does ("x5 over 2m" in `kubectl describe`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::mpsc;

const QUEUE: usize = 4096;
/// How many distinct events are remembered for counting repeats (client-go: 4096).
const REMEMBERED: usize = 4096;

/// What makes two events the same one, repeated: source, involved object, type, reason
/// and message, in one string (a single allocation, shared by the map and the queue of
/// [`Sent`]: thousands are remembered).
type EventKey = Arc<str>;

fn key(e: &Event) -> EventKey {
    let source = e.source.as_ref();
    let o = &e.involved_object;
    let parts = [
        source.and_then(|s| s.component.as_ref()),
        source.and_then(|s| s.host.as_ref()),
        o.kind.as_ref(),
        o.namespace.as_ref(),
        o.name.as_ref(),
        o.uid.as_ref(),
        e.type_.as_ref(),
        e.reason.as_ref(),
        e.message.as_ref(),
    ];
    // Joined with NUL, which object names, reasons and component names cannot hold.
    let joined: Vec<&str> = parts.iter().map(|p| p.map_or("", String::as_str)).collect();
    joined.join("\0").into()
}

/// The events sent lately: key → (namespace, name, count), oldest forgotten first.
#[derive(Default)]
struct Sent {
    events: HashMap<EventKey, (String, String, i32)>,
    order: VecDeque<EventKey>,
}

impl Sent {
    fn remember(&mut self, key: EventKey, ns: String, name: String) {
        if self.events.insert(key.clone(), (ns, name, 1)).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.events.remove(&old);
            }
        }
    }
}

/// Sends core/v1 Events, counting repeats into the Event already sent.
async fn send_events(client: Client, mut rx: mpsc::Receiver<Event>) {
    let mut sent = Sent::default();
    while let Some(event) = rx.recv().await {
        let key = key(&event);
        if let Some((ns, name, count)) = sent.events.get_mut(&key) {
            let api: Api<Event> = Api::namespaced(client.clone(), ns);
            let patch = k8s_openapi::serde_json::json!({"count": *count + 1, "lastTimestamp": event.last_timestamp});
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    *count += 1;
                    continue;
                }
                // Gone (expired, deleted): record it afresh below.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(err) => {
                    tracing::debug!(error = %err, "event count not updated");
                    continue;
                }
            }
        }
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(client.clone(), &ns);
        match api.create(&PostParams::default(), &event).await {
            Ok(created) => sent.remember(key, ns, created.name_any()),
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
        let mut sent = Sent::default();
        for i in 0..REMEMBERED + 10 {
            sent.remember(
                key(&event("R", &i.to_string())),
                "ns".into(),
                format!("e{i}"),
            );
        }
        assert_eq!(sent.events.len(), REMEMBERED);
        assert!(!sent.events.contains_key(&key(&event("R", "0"))));
        assert_eq!(
            sent.events[&key(&event("R", &(REMEMBERED + 9).to_string()))].1,
            format!("e{}", REMEMBERED + 9)
        );
    }
}
