//! Service endpoints: which pods back a Service, on which ports, and whether each is
//! ready, serving or terminating. Two controllers publish the answer:
//! - [`slice`]: EndpointSlices (discovery.k8s.io/v1), what kube-proxy-like consumers read;
//! - [`legacy`]: the core/v1 Endpoints object of the same name, for older clients.
//!
//! Both are keyed by Service (`namespace/name`) and woken by changes to the Service, to
//! pods its selector matches (before or after the change), and to what they wrote.
//! Services without a selector are left alone: their endpoints are someone else's.

pub mod legacy;
pub mod slice;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use krust_client::cache::Cache;
use kube::ResourceExt;

use crate::owner::key_of;
use crate::pods::{CachedPod, Phase};
use krust_client::informer::{EventHandler, SharedInformers};
use krust_client::queue::WorkQueue;

/// The label that says a Service is headless, on its EndpointSlices and Endpoints.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// The selector of a Service whose endpoints the controllers manage.
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()?
        .selector
        .as_ref()
        .filter(|s| !s.is_empty())
}

fn selects(selector: &BTreeMap<String, String>, pod: &CachedPod) -> bool {
    let labels = pod.labels();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The pods of the Service's namespace that its selector matches.
pub fn selected_pods(svc: &Service, pods: &Cache<CachedPod>) -> Vec<Arc<CachedPod>> {
    let Some(selector) = selector(svc) else {
        return Vec::new();
    };
    let ns = svc.metadata.namespace.as_deref();
    pods.state_filter(|p| Some(&*p.metadata.namespace) == ns && selects(selector, p))
}

/// Whether a pod belongs in a Service's endpoints at all: it has an IP and has not
/// finished (phase Succeeded or Failed); terminating pods only when
/// `include_terminating`.
pub fn should_be_in_endpoints(pod: &CachedPod, include_terminating: bool) -> bool {
    let terminal = matches!(pod.status.phase, Some(Phase::Succeeded | Phase::Failed));
    let has_ip = pod.ips().next().is_some();
    !terminal && has_ip && (include_terminating || !pod.metadata.terminating)
}

/// The pod's IP of the given family (`IPv4` or `IPv6`).
pub fn pod_ip(pod: &CachedPod, family: &str) -> Option<String> {
    pod.ips()
        .find(|ip| ip.is_ipv6() == (family == "IPv6"))
        .map(|ip| ip.to_string())
}

/// The container port a Service port reaches on this pod: the number itself, or the
/// container port with that name (`None` if the pod has none).
pub fn target_port(pod: &CachedPod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match &port.target_port {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => pod
            .spec
            .named_ports
            .iter()
            .find(|p| p.name == *name && p.protocol == protocol)
            .map(|p| p.port),
    }
}

/// The hostname a pod has in a Service's DNS records: only when its `subdomain` names
/// the Service.
pub fn hostname(pod: &CachedPod, svc: &Service) -> Option<String> {
    let spec = &pod.spec;
    (spec.subdomain.as_deref() == Some(svc.name_any().as_str()))
        .then(|| spec.hostname.clone())
        .flatten()
        .filter(|h| !h.is_empty())
}

pub fn is_headless(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

/// The labels published on a Service's endpoints: the Service's own, plus `extra`, and
/// the headless label exactly when the Service is headless.
pub fn published_labels(svc: &Service, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut labels = svc.labels().clone();
    labels.remove(HEADLESS_LABEL);
    for (k, v) in extra {
        labels.insert(k.to_string(), v.to_string());
    }
    if is_headless(svc) {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    }
    labels
}

/// Wakes `queue` for a Service when it or a pod it selects changes; returns the Service
/// and pod caches.
pub fn watch_services_and_pods(
    informers: &SharedInformers,
    queue: &Arc<WorkQueue>,
) -> (Cache<Service>, Cache<CachedPod>) {
    let services = informers.get::<Service>();
    let pods = informers.get::<CachedPod>();
    services.add_handler(Arc::new(ServiceEvents(queue.clone())));
    pods.add_handler(Arc::new(PodEvents {
        services: services.cache(),
        queue: queue.clone(),
    }));
    (services.cache(), pods.cache())
}

/// Queues a Service when it changes.
struct ServiceEvents(Arc<WorkQueue>);

impl EventHandler<Service> for ServiceEvents {
    fn on_apply(&self, _old: Option<&Service>, new: &Arc<Service>) {
        self.0.add(key_of(&new.metadata));
    }
    fn on_delete(&self, obj: &Arc<Service>) {
        self.0.add(key_of(&obj.metadata));
    }
}

/// Queues the Services that select a pod, before or after the change.
struct PodEvents {
    services: Cache<Service>,
    queue: Arc<WorkQueue>,
}

impl PodEvents {
    fn enqueue_selecting(&self, pods: &[&CachedPod]) {
        for svc in self.services.state() {
            let Some(sel) = selector(&svc) else { continue };
            if pods.iter().any(|p| {
                Some(&*p.metadata.namespace) == svc.metadata.namespace.as_deref() && selects(sel, p)
            }) {
                self.queue.add(key_of(&svc.metadata));
            }
        }
    }
}

impl EventHandler<CachedPod> for PodEvents {
    fn on_apply(&self, old: Option<&CachedPod>, new: &Arc<CachedPod>) {
        // A pod that changed only where endpoints do not look (e.g. a container
        // restart count) still costs a pass; passes that change nothing write nothing.
        match old {
            Some(old) => self.enqueue_selecting(&[old, new]),
            None => self.enqueue_selecting(&[new]),
        }
    }
    fn on_delete(&self, obj: &Arc<CachedPod>) {
        self.enqueue_selecting(&[obj]);
    }
}
