//! The proxy's metrics, in kube-proxy's names where it has them: how long a sync of the
//! rules takes (all, full and partial ones), when the last one succeeded, how many
//! failed, how long a change took from the API to the rules (network programming
//! latency), and how many Service ports the loaded rules carry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Family4 {
    ip_family: &'static str,
}

const IPV4: Family4 = Family4 { ip_family: "IPv4" };

pub struct Metrics {
    sync_duration: Histogram,
    full_sync_duration: Histogram,
    partial_sync_duration: Histogram,
    programming: Histogram,
    last_sync: Gauge,
    failures: Counter,
    service_ports: Gauge,
}

impl Metrics {
    /// The proxy's metrics, and a registry that serves them.
    pub fn new() -> (Metrics, Registry) {
        let mut registry = Registry::default();
        let durations = Family::<Family4, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 15))
        });
        let last = Family::<Family4, Gauge>::default();
        let failures = Family::<Family4, Counter>::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            durations.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            last.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            failures.clone(),
        );
        let full = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            full.clone(),
        );
        let partial = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            partial.clone(),
        );
        // Upstream's buckets (0.25 s to 5 min), with finer ones below them: a change
        // here is programmed in milliseconds.
        let programming = Histogram::new(
            [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5]
                .into_iter()
                .chain((1..60).map(f64::from))
                .chain((0..12).map(|i| 60.0 + 5.0 * f64::from(i)))
                .chain((0..7).map(|i| 120.0 + 30.0 * f64::from(i))),
        );
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            programming.clone(),
        );
        let service_ports = Gauge::default();
        registry.register(
            "krust_proxy_service_ports",
            "Service ports (cluster IP, NodePort or load balancer) in the loaded rules",
            service_ports.clone(),
        );
        let metrics = Metrics {
            sync_duration: durations.get_or_create(&IPV4).clone(),
            full_sync_duration: full,
            partial_sync_duration: partial,
            programming,
            last_sync: last.get_or_create(&IPV4).clone(),
            failures: failures.get_or_create(&IPV4).clone(),
            service_ports,
        };
        (metrics, registry)
    }

    /// A sync (full or partial) that loaded `service_ports` ports in `seconds`.
    pub fn synced(&self, seconds: f64, service_ports: usize, full: bool) {
        self.sync_duration.observe(seconds);
        if full {
            self.full_sync_duration.observe(seconds);
        } else {
            self.partial_sync_duration.observe(seconds);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.last_sync.set(now as i64);
        self.service_ports.set(service_ports as i64);
    }

    /// Changes now in the rules, each `seconds` after it reached the API.
    pub fn programmed(&self, latencies: &[f64]) {
        for seconds in latencies {
            self.programming.observe(*seconds);
        }
    }

    /// A sync whose rules nft refused (it took `seconds`).
    pub fn failed(&self, seconds: f64) {
        self.sync_duration.observe(seconds);
        self.failures.inc();
    }
}
