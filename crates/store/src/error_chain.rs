//! Flattening an error and its causes into one message.
//!
//! [`StoreError::Backend`](crate::StoreError::Backend) carries a string, so a backend's
//! structured error is turned into `outer: inner: ...` to keep its whole context.

use std::error::Error;

/// The message of `err` followed by those of all its sources, joined by `": "`.
pub(crate) fn error_chain(err: &(dyn Error + 'static)) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
