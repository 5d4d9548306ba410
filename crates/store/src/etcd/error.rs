//! Failures of the etcd backend, with the context of what was being done, and the
//! recognition of etcd's own revision errors.
//!
//! The [`Store`](crate::Store) trait reports these as [`StoreError::Backend`], except etcd's
//! "compacted" and "future revision" answers, which [`revision_error`] picks out so the store
//! can turn them into [`StoreError::Compacted`] and [`StoreError::FutureRevision`].

use std::path::PathBuf;

use crate::StoreError;
use crate::error_chain::error_chain;

#[derive(Debug, thiserror::Error)]
pub(crate) enum EtcdError {
    #[error("reading the etcd TLS {what} from {}", path.display())]
    TlsFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("setting up the etcd client for {endpoints}")]
    Client {
        endpoints: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("connecting to etcd at {endpoints}")]
    Connect {
        endpoints: String,
        #[source]
        source: Box<EtcdError>,
    },
    #[error("etcd {action}")]
    Rpc {
        action: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("etcd answered {action} without a response header")]
    NoHeader { action: &'static str },
    #[error("etcd returned the key {key:?}, which is outside the store prefix {prefix:?}")]
    OutsidePrefix { key: String, prefix: String },
    #[error("etcd returned a key that is not UTF-8: {key:?}")]
    KeyNotUtf8 { key: String },
    #[error("etcd answered the transaction on {key:?} without its {expected} response")]
    TxnResponse { key: String, expected: &'static str },
    #[error("etcd did not confirm the watch on {prefix:?}")]
    WatchNotCreated { prefix: String },
    #[error("etcd canceled the watch on {prefix:?}: {reason}")]
    WatchCanceled { prefix: String, reason: String },
    #[error("etcd sent a watch event on {prefix:?} without its key-value")]
    EventWithoutKey { prefix: String },
    #[error("etcd closed the watch stream on {prefix:?}")]
    WatchClosed { prefix: String },
    #[error("etcd answered the member add without the member it added")]
    NoMemberAdded,
    #[error("etcd member: {action}")]
    Member {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the etcd member exited ({status}); its log ends with:\n{log}")]
    MemberExited { status: String, log: String },
    #[error("the etcd member did not serve within {seconds} s; its log ends with:\n{log}")]
    MemberNotReady { seconds: u64, log: String },
    #[error("restoring an etcd snapshot needs etcdutl or etcdctl on PATH (Debian: etcd-client)")]
    NoRestoreTool,
    #[error("running {tool}")]
    RunTool {
        tool: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} could not restore {}: {output}", snapshot.display())]
    Restore {
        tool: &'static str,
        snapshot: PathBuf,
        output: String,
    },
    #[error("writing the snapshot {}", path.display())]
    SnapshotFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<EtcdError> for StoreError {
    fn from(err: EtcdError) -> Self {
        StoreError::Backend(error_chain(&err))
    }
}

/// etcd's answer to a request at a revision it cannot serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RevisionError {
    /// "required revision has been compacted": below the compacted revision.
    Compacted,
    /// "required revision is a future revision": above the current revision.
    Future,
}

/// Recognises etcd's revision errors (`rpctypes.ErrGRPCCompacted` and `ErrGRPCFutureRev`).
/// etcd sends them as gRPC status messages and they carry no numbers, so the message text is
/// all there is to match.
pub(crate) fn revision_error(err: &etcd_client::Error) -> Option<RevisionError> {
    let etcd_client::Error::GRpcStatus(status) = err else {
        return None;
    };
    match status.message() {
        "etcdserver: mvcc: required revision has been compacted" => Some(RevisionError::Compacted),
        "etcdserver: mvcc: required revision is a future revision" => Some(RevisionError::Future),
        _ => None,
    }
}
