//! The cluster DNS's metrics, in CoreDNS's names (the server k3s ships): queries by
//! protocol and type, answers by response code, and how long answering took.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The one zone a krust DNS server answers for (everything; other names are forwarded).
const ZONE: &str = ".";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    server: String,
    zone: &'static str,
    proto: &'static str,
    family: &'static str,
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResponseLabels {
    server: String,
    zone: &'static str,
    rcode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    server: String,
    zone: &'static str,
    r#type: String,
}

pub struct Metrics {
    /// CoreDNS's `server` label: `dns://<address>`.
    server: String,
    requests: Family<RequestLabels, Counter>,
    responses: Family<ResponseLabels, Counter>,
    duration: Family<DurationLabels, Histogram>,
}

/// A DNS question as the metrics see it.
pub struct Question<'a> {
    /// `udp` or `tcp`.
    pub proto: &'static str,
    /// `A`, `AAAA`, `SRV`, ...
    pub query_type: &'a str,
}

impl Metrics {
    /// The metrics of the server listening on `listen`, and a registry that serves them.
    pub fn new(listen: std::net::SocketAddrV4) -> (Metrics, Registry) {
        let metrics = Metrics {
            server: format!("dns://{listen}"),
            requests: Family::default(),
            responses: Family::default(),
            // CoreDNS's buckets: 0.25 ms to about 8 s.
            duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.00025, 2.0, 16))
            }),
        };
        let mut registry = Registry::default();
        registry.register(
            "coredns_dns_requests",
            "Counter of DNS requests made per zone, protocol and family.",
            metrics.requests.clone(),
        );
        registry.register(
            "coredns_dns_responses",
            "Counter of response status codes.",
            metrics.responses.clone(),
        );
        registry.register(
            "coredns_dns_request_duration_seconds",
            "Histogram of the time (in seconds) each request took per zone.",
            metrics.duration.clone(),
        );
        (metrics, registry)
    }

    /// One question answered with `rcode` (a DNS response code) in `seconds`.
    pub fn answered(&self, question: &Question<'_>, rcode: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                server: self.server.clone(),
                zone: ZONE,
                proto: question.proto,
                family: "1",
                r#type: question.query_type.to_string(),
            })
            .inc();
        self.responses
            .get_or_create(&ResponseLabels {
                server: self.server.clone(),
                zone: ZONE,
                rcode: rcode_name(rcode),
            })
            .inc();
        self.duration
            .get_or_create(&DurationLabels {
                server: self.server.clone(),
                zone: ZONE,
                r#type: question.query_type.to_string(),
            })
            .observe(seconds);
    }
}

/// The mnemonic CoreDNS labels a response code with.
fn rcode_name(rcode: u16) -> String {
    match rcode {
        0 => "NOERROR".into(),
        1 => "FORMERR".into(),
        2 => "SERVFAIL".into(),
        3 => "NXDOMAIN".into(),
        4 => "NOTIMP".into(),
        5 => "REFUSED".into(),
        other => other.to_string(),
    }
}
