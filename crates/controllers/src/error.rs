//! The error type of every reconciler: what failed, on which object, and why. A
//! reconcile that returns an error is retried with per-key exponential backoff.

/// Why one reconcile pass (or the manager) failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the apiserver failed.
    #[error("{action} {object}: {source}")]
    Api {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    /// An object's label selector cannot be parsed.
    #[error("invalid selector on {object}: {reason}")]
    InvalidSelector { object: String, reason: String },
    /// An object's spec holds a value the controller cannot act on.
    #[error("invalid spec of {object}: {reason}")]
    InvalidSpec { object: String, reason: String },
    /// The controller manager was started with something a controller cannot use.
    #[error("configuration: {0}")]
    Config(String),
}

impl Error {
    pub(crate) fn api(
        action: &'static str,
        object: impl Into<String>,
        source: kube::Error,
    ) -> Self {
        Error::Api {
            action,
            object: object.into(),
            source,
        }
    }
}

impl krust_client::queue::PassError for Error {
    /// A write lost an optimistic-concurrency race (409): expected, and retried at once
    /// on fresher data, so not worth a warning.
    fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source, .. } if krust_client::is_status(source, 409))
    }
}
