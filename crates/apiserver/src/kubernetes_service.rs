//! The `kubernetes` Service's endpoints list every live apiserver, as upstream's lease
//! endpoint reconciler keeps them. Each apiserver holds an identity Lease in kube-system
//! (label `apiserver.kubernetes.io/identity=kube-apiserver`, renewed every interval);
//! every apiserver rewrites the `kubernetes` Endpoints and EndpointSlice from the leases
//! that are still fresh, and removes itself on a clean shutdown. Several apiservers on
//! one store therefore agree without talking to each other: only through the store.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use krust_api::status::ApiError;
use serde_json::{Value, json};

use crate::Api;
use crate::loopback::{Loopback, Resource};

const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
/// Where a lease records the address its apiserver serves on.
const ENDPOINT_ANNOTATION: &str = "krust.io/apiserver-endpoint";

const LEASES: Resource<'static> = Resource {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    namespace: Some("kube-system"),
};
const ENDPOINTS: Resource<'static> = Resource::core("endpoints", Some("default"));
const SLICES: Resource<'static> = Resource {
    group: "discovery.k8s.io",
    version: "v1",
    plural: "endpointslices",
    namespace: Some("default"),
};

pub struct EndpointReconciler {
    api: Arc<Api>,
    name: String,
    address: IpAddr,
    port: u16,
    interval: Duration,
    leaving: AtomicBool,
}

/// FNV-1a: a stable name for this apiserver's lease from its address.
fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn micro_time(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
}

impl EndpointReconciler {
    pub fn new(api: Arc<Api>, address: IpAddr, port: u16, interval: Duration) -> Arc<Self> {
        let name = format!(
            "apiserver-{:016x}",
            stable_hash(&format!("{address}:{port}"))
        );
        Arc::new(EndpointReconciler {
            api,
            name,
            address,
            port,
            interval,
            leaving: AtomicBool::new(false),
        })
    }

    /// A lease not renewed for three intervals belongs to an apiserver that is gone.
    fn validity(&self) -> Duration {
        self.interval * 3
    }

    /// Renews the lease and reconciles the endpoints once now, then every interval.
    pub async fn run(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if self.leaving.load(Ordering::Acquire) {
                return;
            }
            if let Err(err) = self.reconcile_once().await {
                tracing::warn!(%err, "reconciling the kubernetes endpoints");
            }
        }
    }

    pub async fn reconcile_once(&self) -> Result<(), ApiError> {
        self.renew().await?;
        self.reconcile().await
    }

    /// On shutdown: stop renewing, drop the lease, and take this apiserver out of the
    /// endpoints so clients stop being sent here.
    pub async fn leave(&self) {
        self.leaving.store(true, Ordering::Release);
        let client = Loopback {
            scope: &self.api.scope,
        };
        if let Err(err) = client.delete(LEASES, &self.name).await
            && err.code != 404
        {
            tracing::warn!(%err, "removing the apiserver lease");
        }
        if let Err(err) = self.reconcile().await {
            tracing::warn!(%err, "removing this apiserver from the kubernetes endpoints");
        }
    }

    async fn renew(&self) -> Result<(), ApiError> {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let lease = json!({
            "metadata": {
                "name": self.name,
                "labels": {IDENTITY_LABEL: "kube-apiserver", "kubernetes.io/hostname": hostname.trim()},
                "annotations": {ENDPOINT_ANNOTATION: format!("{}:{}", self.address, self.port)},
            },
            "spec": {
                "holderIdentity": self.name,
                "leaseDurationSeconds": self.validity().as_secs().max(1),
                "renewTime": micro_time(jiff::Timestamp::now()),
            },
        });
        Loopback {
            scope: &self.api.scope,
        }
        .upsert(LEASES, &lease)
        .await
    }

    /// Rewrites the endpoints from the fresh leases.
    async fn reconcile(&self) -> Result<(), ApiError> {
        let client = Loopback {
            scope: &self.api.scope,
        };
        let leases = client
            .list(LEASES, &format!("{IDENTITY_LABEL}%3Dkube-apiserver"))
            .await?;
        let now = jiff::Timestamp::now();
        let validity = jiff::SignedDuration::try_from(self.validity())
            .unwrap_or(jiff::SignedDuration::from_secs(45));
        // port -> addresses, sorted, so every apiserver writes the same object.
        let mut live: BTreeMap<u16, Vec<String>> = BTreeMap::new();
        for lease in &leases {
            let fresh = lease["spec"]["renewTime"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .is_some_and(|t| t + validity > now);
            let leaving_self =
                self.leaving.load(Ordering::Acquire) && lease["metadata"]["name"] == self.name;
            let endpoint = lease["metadata"]["annotations"][ENDPOINT_ANNOTATION]
                .as_str()
                .and_then(|e| e.rsplit_once(':'));
            if let (true, false, Some((ip, port))) = (fresh, leaving_self, endpoint)
                && let Ok(port) = port.parse()
            {
                live.entry(port).or_default().push(ip.to_string());
            }
        }
        for ips in live.values_mut() {
            ips.sort();
            ips.dedup();
        }
        let subsets: Vec<Value> = live
            .iter()
            .map(|(port, ips)| {
                json!({"addresses": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                       "ports": [{"name": "https", "port": port, "protocol": "TCP"}]})
            })
            .collect();
        let endpoints = json!({
            "metadata": {"name": "kubernetes", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
            "subsets": subsets,
        });
        client.upsert(ENDPOINTS, &endpoints).await?;
        // The slice carries one port: the most common one (all apiservers normally share it).
        let (port, ips) = live
            .iter()
            .max_by_key(|(_, ips)| ips.len())
            .map_or((self.port, Vec::new()), |(p, ips)| (*p, ips.clone()));
        let slice = json!({
            "metadata": {"name": "kubernetes", "labels": {"kubernetes.io/service-name": "kubernetes"}},
            "addressType": "IPv4",
            "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        });
        client.upsert(SLICES, &slice).await
    }
}
