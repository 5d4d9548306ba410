//! Failures of the embedded backend's storage layer, with the context of what was being done.
//!
//! The [`Store`](crate::Store) trait reports these as [`StoreError::Backend`]; converting keeps
//! the whole source chain in the message, since callers only see a string.

use std::path::PathBuf;

use crate::{Revision, StoreError};

use super::codec::CodecError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum BackendError {
    #[error("opening database {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: redb::DatabaseError,
    },
    #[error("beginning a read transaction")]
    BeginRead(#[source] redb::TransactionError),
    #[error("beginning a write transaction")]
    BeginWrite(#[source] redb::TransactionError),
    #[error("requesting durable commits")]
    Durability(#[source] redb::SetDurabilityError),
    #[error("opening table {table}")]
    Table {
        table: &'static str,
        #[source]
        source: redb::TableError,
    },
    #[error("{action}")]
    Storage {
        action: &'static str,
        #[source]
        source: redb::StorageError,
    },
    #[error("committing {action}")]
    Commit {
        action: &'static str,
        #[source]
        source: redb::CommitError,
    },
    #[error("history record at revision {revision} is missing although the index refers to it")]
    MissingRecord { revision: Revision },
    #[error("history record at revision {revision} is a tombstone where a value was expected")]
    UnexpectedTombstone { revision: Revision },
    #[error("tombstone at revision {revision} does not name the value it deleted")]
    OrphanTombstone { revision: Revision },
    #[error("decoding history record at revision {revision}")]
    Corrupt {
        revision: Revision,
        #[source]
        source: CodecError,
    },
    #[error("starting the committer thread")]
    SpawnCommitter(#[source] std::io::Error),
    #[error("blocking read task failed")]
    Join(#[source] tokio::task::JoinError),
    #[error("{action}")]
    Io {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl BackendError {
    /// A closure for `map_err` that wraps a redb storage error with what was being done.
    pub(crate) fn storage(action: &'static str) -> impl FnOnce(redb::StorageError) -> Self {
        move |source| BackendError::Storage { action, source }
    }

    /// A closure for `map_err` that wraps a redb table error with the table's name.
    pub(crate) fn table(table: &'static str) -> impl FnOnce(redb::TableError) -> Self {
        move |source| BackendError::Table { table, source }
    }

    /// A closure for `map_err` that wraps a file-system error with what was being done.
    pub(crate) fn io(action: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| BackendError::Io { action, source }
    }

    /// The message with all its causes, `outer: inner: ...`.
    pub(crate) fn chain(&self) -> String {
        crate::error_chain::error_chain(self)
    }
}

impl From<BackendError> for StoreError {
    fn from(err: BackendError) -> Self {
        StoreError::Backend(err.chain())
    }
}
