//! Prometheus metrics of the apiserver: requests by verb, resource and code, request
//! latency and requests in flight, in the text exposition format on `/metrics`; and the
//! process's resident memory, open files and live tasks (the Prometheus process
//! collector's names; `tokio_alive_tasks` stands where Go programs report
//! `go_goroutines`), which the soak test samples.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub resource: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub verb: String,
    pub resource: String,
}

/// Upstream's `request_kind` values: the two max-in-flight budgets.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InflightLabels {
    pub request_kind: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<LatencyLabels, Histogram>,
    inflight: Family<InflightLabels, Gauge>,
    /// Requests and watch streams abandoned because their handler panicked.
    pub panics: Counter,
    process: ProcessGauges,
    store: StoreGauges,
}

/// The store's size and revisions, read when the metrics are rendered: upstream's
/// `apiserver_storage_size_bytes`, and etcd's own revision gauges (the embedded store
/// stands where etcd does).
#[derive(Default)]
struct StoreGauges {
    size: Gauge,
    current_revision: Gauge,
    compacted_revision: Gauge,
}

impl StoreGauges {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "apiserver_storage_size_bytes",
            "Size of the storage database file physically allocated in bytes.",
            self.size.clone(),
        );
        registry.register(
            "etcd_debugging_mvcc_current_revision",
            "The current revision of the store.",
            self.current_revision.clone(),
        );
        registry.register(
            "etcd_debugging_mvcc_compact_revision",
            "The revision of the last compaction in the store.",
            self.compacted_revision.clone(),
        );
    }
}

/// The process's gauges, read when the metrics are rendered.
#[derive(Default)]
struct ProcessGauges {
    resident_memory: Gauge,
    open_fds: Gauge,
    alive_tasks: Gauge,
}

impl ProcessGauges {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            self.resident_memory.clone(),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors.",
            self.open_fds.clone(),
        );
        registry.register(
            "tokio_alive_tasks",
            "Tasks alive in the process's async runtime.",
            self.alive_tasks.clone(),
        );
    }

    fn read(&self) {
        let rss_kib = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
            });
        if let Some(kib) = rss_kib {
            self.resident_memory.set(kib * 1024);
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(fds.count() as i64);
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.alive_tasks
                .set(runtime.metrics().num_alive_tasks() as i64);
        }
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ])
        });
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out by verb, resource and HTTP response code.",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb and resource.",
            latency.clone(),
        );
        let inflight = Family::<InflightLabels, Gauge>::default();
        registry.register(
            "apiserver_current_inflight_requests",
            "Requests holding a slot of the max-in-flight budget of their kind.",
            inflight.clone(),
        );
        let panics = Counter::default();
        registry.register(
            "apiserver_request_panics",
            "Requests and watch streams whose handler panicked; each was answered with a 500 InternalError.",
            panics.clone(),
        );
        let process = ProcessGauges::default();
        process.register(&mut registry);
        let store = StoreGauges::default();
        store.register(&mut registry);
        Metrics {
            registry,
            requests,
            latency,
            inflight,
            panics,
            process,
            store,
        }
    }

    pub fn observe(&self, verb: &str, resource: &str, code: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.into(),
                resource: resource.into(),
                code: code.to_string(),
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                verb: verb.into(),
                resource: resource.into(),
            })
            .observe(seconds);
    }

    /// Reads the store's size and revisions into their gauges (a store that fails to
    /// answer leaves them as they were).
    pub async fn read_store(&self, store: &dyn krust_store::Store) {
        if let Ok(size) = store.size().await {
            self.store.size.set(i64::try_from(size).unwrap_or(i64::MAX));
        }
        if let Ok(revision) = store.current_revision().await {
            self.store.current_revision.set(revision);
        }
        if let Ok(revision) = store.compacted_revision().await {
            self.store.compacted_revision.set(revision);
        }
    }

    /// The exposition text, with the in-flight gauges read at this moment as
    /// (read-only, mutating) requests holding a slot.
    pub fn render(&self, inflight: (usize, usize)) -> String {
        for (kind, n) in [("readOnly", inflight.0), ("mutating", inflight.1)] {
            self.inflight
                .get_or_create(&InflightLabels { request_kind: kind })
                .set(n as i64);
        }
        self.process.read();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
