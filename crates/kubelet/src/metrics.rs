//! The kubelet's metrics on `/metrics` of its :10250 server, in upstream's names: how
//! long pods take to start, how long a relist of the runtime takes, and every runtime
//! operation (counted by a layer under the CRI clients, [`krust_cri::metrics`]).

use std::sync::LazyLock;

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// From the kubelet first seeing a pod to all its containers running.
pub static POD_START: LazyLock<Histogram> = LazyLock::new(|| {
    Histogram::new([
        0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
        300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
    ])
});

/// One relist of the runtime's sandboxes and containers.
pub static PLEG_RELIST: LazyLock<Histogram> =
    LazyLock::new(|| Histogram::new(exponential_buckets(0.005, 2.0, 10)));

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    let mut registry = Registry::default();
    registry.register(
        "kubelet_pod_start_duration_seconds",
        "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
        POD_START.clone(),
    );
    registry.register(
        "kubelet_pleg_relist_duration_seconds",
        "Duration in seconds for relisting pods in PLEG.",
        PLEG_RELIST.clone(),
    );
    krust_cri::metrics::register(&mut registry);
    registry
});

/// The exposition text of `/metrics`.
pub fn render() -> String {
    krust_client::metrics::render(&REGISTRY)
}
