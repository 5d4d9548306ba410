//! `EventRecorder`: writes core/v1 Events (what `kubectl describe` and `kubectl get events`
//! show) as upstream's controllers do, e.g. reason `SuccessfulCreate`, message
//! `Created pod: web-7d9c5-abcde`. Events are sent from a background task through a
//! bounded channel, so a slow apiserver never holds a reconcile back; when the channel
//! is full, events are dropped (as client-go's broadcaster does).

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::mpsc;

const QUEUE: usize = 4096;

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
        let (tx, sender) = queue::<Event>(client);
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
