//! Scheduler events, written as events.k8s.io/v1 Events (as kube-scheduler does):
//! `Scheduled`, `FailedScheduling` and `Preempted`, reported by `default-scheduler`.
//! Writes are queued and sent by one task, so a slow apiserver never stalls a
//! scheduling cycle; when the queue is full, events are dropped (and logged).

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

/// The controller name upstream's scheduler reports.
pub const REPORTING_CONTROLLER: &str = "default-scheduler";

#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Event>,
    instance: String,
}

impl Recorder {
    /// A recorder and the task that sends its events.
    pub fn new(client: Client, instance: String) -> (Self, impl Future<Output = ()> + Send) {
        let (tx, sender) = krust_client::events::queue::<Event>(client);
        (Recorder { tx, instance }, sender)
    }

    /// An event about a pod: `warning` for failures, with the action taken.
    pub fn pod(&self, pod: &Pod, warning: bool, reason: &str, action: &str, note: String) {
        let now = Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{:x}", pod.name_any(), now.as_nanosecond())),
                namespace: pod.namespace(),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(action.into()),
            reason: Some(reason.into()),
            note: Some(note),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                namespace: pod.namespace(),
                uid: pod.uid(),
                resource_version: pod.resource_version(),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        if self.tx.try_send(event).is_err() {
            tracing::debug!(reason, "event queue full; event dropped");
        }
    }
}
