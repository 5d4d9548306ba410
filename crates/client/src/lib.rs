//! What krust's components share on top of kube-rs, as client-go's `tools` packages
//! are shared by upstream's:
//! - [`connect`]: the HTTP/2 API client; [`certificate`]: a client or serving
//!   certificate replaced while in use (rotation); [`csr`]: certificates through the
//!   CertificateSigningRequest API;
//! - the one way to watch, read top to bottom: [`informer`] (a list+watch of a kind
//!   feeding a [`cache`] and event handlers, shared per kind), [`queue`] (the
//!   deduplicating, rate-limited work queue between handlers and reconcilers);
//! - [`endpoints`]: EndpointSlices as the data plane reads them;
//! - [`events`]: recording core/v1 Events; [`leader`]: active/standby through a
//!   coordination.k8s.io Lease;
//! - [`metrics`]: each component's `/metrics` and health endpoints, and the work
//!   queues' metrics;
//! - [`supervise`]: long-running tasks restarted with back-off when they panic;
//! - [`selector`]: label selectors, node selector terms and tolerations, evaluated as
//!   the scheduler does; [`volume`]: which PersistentVolume fits a claim.
//!
//! Components depend on this crate, never on each other.

pub mod backoff;
pub mod cache;
pub mod certificate;
pub mod connect;
pub mod csr;
pub mod endpoints;
pub mod events;
pub mod informer;
pub mod leader;
pub mod loadbalancer;
pub mod metrics;
pub mod queue;
pub mod selector;
pub mod supervise;
pub mod volume;

/// A Lease could not be acquired or renewed.
#[derive(Debug, thiserror::Error)]
#[error("leader election on {lease}: {source}")]
pub struct LeaderElectionError {
    pub lease: String,
    #[source]
    pub source: kube::Error,
}

/// True when the apiserver answered with this HTTP status code.
pub fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}
