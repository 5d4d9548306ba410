//! The proxy's metrics, in kube-proxy's names where it has them: how long a sync of the
//! rules takes, when the last one succeeded, how many failed, and how many Service
//! ports the loaded rules carry.

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
        let service_ports = Gauge::default();
        registry.register(
            "krust_proxy_service_ports",
            "Service ports (cluster IP, NodePort or load balancer) in the loaded rules",
            service_ports.clone(),
        );
        let metrics = Metrics {
            sync_duration: durations.get_or_create(&IPV4).clone(),
            last_sync: last.get_or_create(&IPV4).clone(),
            failures: failures.get_or_create(&IPV4).clone(),
            service_ports,
        };
        (metrics, registry)
    }

    /// A sync that loaded `service_ports` ports in `seconds`.
    pub fn synced(&self, seconds: f64, service_ports: usize) {
        self.sync_duration.observe(seconds);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.last_sync.set(now as i64);
        self.service_ports.set(service_ports as i64);
    }

    /// A sync whose rules nft refused (it took `seconds`).
    pub fn failed(&self, seconds: f64) {
        self.sync_duration.observe(seconds);
        self.failures.inc();
    }
}
