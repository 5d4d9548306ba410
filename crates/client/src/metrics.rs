//! `/metrics` and health endpoints of krust's components, and the metrics every work
//! queue keeps (client-go's `workqueue_*` names, labelled by the queue's name).
//!
//! The controller manager, the scheduler, the Service proxy, the cluster DNS and the
//! Ingress controller each serve their own registry on their own address (upstream's
//! ports by default: 10257, 10259, 10249, 9153, 10254) in the Prometheus text format,
//! with `/healthz`, `/livez` and `/readyz` beside it. The kubelet serves its metrics on
//! its own :10250 server, as upstream's does.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;

/// The content type of the Prometheus text format.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The registry rendered as Prometheus text.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// A histogram with the buckets client-go gives latencies it cannot bound in advance:
/// 10 ns to 10 s, ×10 each (work queues, runtime operations).
pub fn wide_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

/// Upstream's default latency buckets (Prometheus's `DefBuckets`): 5 ms to 10 s.
pub fn latency_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// A component's metrics endpoint: `/metrics`, `/healthz`, `/livez`, `/readyz` over
/// plain HTTP. Stops serving when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Serves `registry` on `addr` (port 0: any free port, see [`MetricsServer::addr`]).
    pub async fn start(addr: SocketAddr, registry: Registry) -> std::io::Result<MetricsServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(serve(listener, Arc::new(registry)));
        Ok(MetricsServer { addr, task })
    }

    /// Serves `registry` for `component` when an address is configured. A taken port is
    /// logged, not fatal, as kube-proxy treats its metrics port: the component's work
    /// matters more than its metrics.
    pub async fn start_if(
        component: &'static str,
        addr: Option<SocketAddr>,
        registry: Registry,
    ) -> Option<MetricsServer> {
        let addr = addr?;
        match Self::start(addr, registry).await {
            Ok(server) => {
                tracing::info!(component, addr = %server.addr, "serving metrics");
                Some(server)
            }
            Err(err) => {
                tracing::warn!(component, %addr, error = %err, "cannot serve metrics");
                None
            }
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: tokio::net::TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let registry = registry.clone();
                async move { Ok::<_, Infallible>(answer(req.uri().path(), &registry)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

fn answer(path: &str, registry: &Registry) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (StatusCode::OK, TEXT_FORMAT, render(registry)),
        "/healthz" | "/livez" | "/readyz" => (StatusCode::OK, "text/plain", "ok".to_string()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "404 page not found\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: &'static str,
}

/// The work queues' metrics, shared by every queue of the process as client-go's
/// global workqueue metrics provider is.
struct WorkQueueFamilies {
    depth: Family<QueueLabels, Gauge>,
    adds: Family<QueueLabels, Counter>,
    retries: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram>,
    work_duration: Family<QueueLabels, Histogram>,
}

static WORK_QUEUES: LazyLock<WorkQueueFamilies> = LazyLock::new(|| WorkQueueFamilies {
    depth: Family::default(),
    adds: Family::default(),
    retries: Family::default(),
    queue_duration: Family::new_with_constructor(wide_latency_histogram),
    work_duration: Family::new_with_constructor(wide_latency_histogram),
});

/// Adds the work queues' metrics to `registry`.
pub fn register_work_queues(registry: &mut Registry) {
    let q = &*WORK_QUEUES;
    registry.register(
        "workqueue_depth",
        "Current depth of workqueue",
        q.depth.clone(),
    );
    registry.register(
        "workqueue_adds",
        "Total number of adds handled by workqueue",
        q.adds.clone(),
    );
    registry.register(
        "workqueue_retries",
        "Total number of retries handled by workqueue",
        q.retries.clone(),
    );
    registry.register(
        "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested.",
        q.queue_duration.clone(),
    );
    registry.register(
        "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes.",
        q.work_duration.clone(),
    );
}

/// One queue's series.
#[derive(Clone)]
pub(crate) struct QueueMetrics {
    pub depth: Gauge,
    pub adds: Counter,
    pub retries: Counter,
    pub queue_duration: Histogram,
    pub work_duration: Histogram,
}

impl QueueMetrics {
    pub fn of(name: &'static str) -> QueueMetrics {
        let q = &*WORK_QUEUES;
        let labels = QueueLabels { name };
        QueueMetrics {
            depth: q.depth.get_or_create(&labels).clone(),
            adds: q.adds.get_or_create(&labels).clone(),
            retries: q.retries.get_or_create(&labels).clone(),
            queue_duration: q.queue_duration.get_or_create(&labels).clone(),
            work_duration: q.work_duration.get_or_create(&labels).clone(),
        }
    }
}
