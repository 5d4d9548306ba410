//! The Ingress controller's metrics, in ingress-nginx's names: requests by Ingress,
//! Service, method and status, and how long the upstream pod took to answer.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::routes::Backend;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    controller_class: String,
    ingress: String,
    namespace: String,
    service: String,
    method: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    controller_class: String,
    ingress: String,
    namespace: String,
    service: String,
}

pub struct Metrics {
    class: String,
    requests: Family<RequestLabels, Counter>,
    response_duration: Family<UpstreamLabels, Histogram>,
}

impl Metrics {
    /// The metrics of the controller serving IngressClass `class`, and their registry.
    pub fn new(class: &str) -> (Metrics, Registry) {
        let metrics = Metrics {
            class: class.to_string(),
            requests: Family::default(),
            response_duration: Family::new_with_constructor(
                krust_client::metrics::latency_histogram,
            ),
        };
        let mut registry = Registry::default();
        registry.register(
            "nginx_ingress_controller_requests",
            "The total number of client requests",
            metrics.requests.clone(),
        );
        registry.register(
            "nginx_ingress_controller_response_duration_seconds",
            "The time spent on receiving the response from the upstream server in seconds.",
            metrics.response_duration.clone(),
        );
        (metrics, registry)
    }

    /// A request answered with `status`, routed to `backend` if a rule matched;
    /// `upstream` is how long the pod took, when one was asked.
    pub fn request(
        &self,
        backend: Option<&Backend>,
        method: &str,
        status: u16,
        upstream: Option<f64>,
    ) {
        let part = |f: fn(&Backend) -> &String| backend.map(f).cloned().unwrap_or_default();
        self.requests
            .get_or_create(&RequestLabels {
                controller_class: self.class.clone(),
                ingress: part(|b| &b.ingress),
                namespace: part(|b| &b.namespace),
                service: part(|b| &b.service),
                method: method.to_string(),
                status: status.to_string(),
            })
            .inc();
        if let (Some(backend), Some(seconds)) = (backend, upstream) {
            self.response_duration
                .get_or_create(&UpstreamLabels {
                    controller_class: self.class.clone(),
                    ingress: backend.ingress.clone(),
                    namespace: backend.namespace.clone(),
                    service: backend.service.clone(),
                })
                .observe(seconds);
        }
    }
}
