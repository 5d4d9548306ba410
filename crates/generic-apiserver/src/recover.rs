//! Panics stay inside the request that caused them, as upstream's panic-recovery filter
//! keeps them: the handler (or watch stream) is abandoned, the client gets a 500
//! `InternalError` Status, the request line and the panic's message go to the log, and
//! `apiserver_request_panics_total` counts it. The server, and every other request on
//! the same connection, go on.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use krust_api::status::ApiError;

use crate::metrics::Metrics;

/// Upstream's words for a request that panicked.
pub const MESSAGE: &str = "This request caused apiserver to panic. Look in the logs for details.";

/// The Status a client gets for a request that panicked.
pub fn error() -> ApiError {
    ApiError::new(500, "InternalError", MESSAGE)
}

/// Runs `work`; if it panics, logs the panic against `request` (e.g. `GET /api/v1/pods`),
/// counts it, and returns `None`.
pub async fn catch<T>(
    metrics: &Metrics,
    request: impl FnOnce() -> String,
    work: impl Future<Output = T>,
) -> Option<T> {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(value) => Some(value),
        Err(payload) => {
            metrics.panics.inc();
            tracing::error!(request = %request(), panic = krust_api::panics::message(&*payload), "request handler panicked");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_caught_counted_and_reported_as_none() {
        let metrics = Metrics::new();
        let caught = catch(&metrics, || "GET /x".into(), async {
            let cut = "é";
            cut[..1].len()
        })
        .await;
        assert_eq!(caught, None);
        assert_eq!(metrics.panics.get(), 1);
        let fine = catch(&metrics, || "GET /y".into(), async { 7 }).await;
        assert_eq!(fine, Some(7));
        assert_eq!(metrics.panics.get(), 1);
        assert!(
            metrics
                .render((0, 0))
                .contains("apiserver_request_panics_total 1")
        );
    }
}
