//! The kubelet's runtime operation metrics (upstream's `kubelet_runtime_operations_*`,
//! labelled by `operation_type`), kept by a layer under the CRI clients so that every
//! call is counted however the kubelet makes it.

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tonic::transport::Channel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation_type: String,
}

struct Families {
    operations: Family<OperationLabels, Counter>,
    errors: Family<OperationLabels, Counter>,
    duration: Family<OperationLabels, Histogram>,
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| Families {
    operations: Family::default(),
    errors: Family::default(),
    // Upstream's buckets for runtime operations: 5 ms to about 2 minutes.
    duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.005, 2.5, 14))),
});

/// Adds the runtime operation metrics to `registry`.
pub fn register(registry: &mut Registry) {
    let f = &*FAMILIES;
    registry.register(
        "kubelet_runtime_operations",
        "Cumulative number of runtime operations by operation type.",
        f.operations.clone(),
    );
    registry.register(
        "kubelet_runtime_operations_errors",
        "Cumulative number of runtime operation errors by operation type.",
        f.errors.clone(),
    );
    registry.register(
        "kubelet_runtime_operations_duration_seconds",
        "Duration in seconds of runtime operations. Broken down by operation type.",
        f.duration.clone(),
    );
}

/// upstream's name of a CRI method: `/runtime.v1.RuntimeService/RunPodSandbox` is
/// `run_podsandbox`, `ContainerStatus` is `container_status`.
fn operation_type(path: &str) -> String {
    let method = path.rsplit('/').next().unwrap_or(path);
    let mut name = String::with_capacity(method.len() + 4);
    for (i, c) in method
        .replace("PodSandbox", "Podsandbox")
        .chars()
        .enumerate()
    {
        if c.is_ascii_uppercase() {
            if i > 0 {
                name.push('_');
            }
            name.push(c.to_ascii_lowercase());
        } else {
            name.push(c);
        }
    }
    name
}

/// A CRI channel that counts and times every call.
#[derive(Clone, Debug)]
pub struct Instrumented {
    inner: Channel,
}

impl Instrumented {
    pub fn new(inner: Channel) -> Self {
        Instrumented { inner }
    }
}

type Response = http::Response<tonic::body::Body>;

impl tower::Service<http::Request<tonic::body::Body>> for Instrumented {
    type Response = Response;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let labels = OperationLabels {
            operation_type: operation_type(request.uri().path()),
        };
        let started = Instant::now();
        let call = self.inner.call(request);
        Box::pin(async move {
            let result = call.await;
            let f = &*FAMILIES;
            f.operations.get_or_create(&labels).inc();
            f.duration
                .get_or_create(&labels)
                .observe(started.elapsed().as_secs_f64());
            // A failed call answers with its grpc-status in the headers (a
            // trailers-only response), a successful one in trailers.
            let failed = match &result {
                Err(_) => true,
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .is_some_and(|status| status != "0"),
            };
            if failed {
                f.errors.get_or_create(&labels).inc();
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_types_are_upstreams_names() {
        assert_eq!(
            operation_type("/runtime.v1.RuntimeService/RunPodSandbox"),
            "run_podsandbox"
        );
        assert_eq!(
            operation_type("/runtime.v1.RuntimeService/ListPodSandbox"),
            "list_podsandbox"
        );
        assert_eq!(
            operation_type("/runtime.v1.RuntimeService/ContainerStatus"),
            "container_status"
        );
        assert_eq!(
            operation_type("/runtime.v1.ImageService/PullImage"),
            "pull_image"
        );
    }
}
