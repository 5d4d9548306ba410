//! The storage interface: revisions, key-values, transactions, watch events and errors.

use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

/// A store-wide logical clock. Every successful write advances it by one; 0 means "never
/// written" (and as a read revision, "the latest").
pub type Revision = i64;

/// A key with its value and MVCC metadata, as etcd's `mvccpb.KeyValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    /// Revision of the write that created this incarnation of the key.
    pub create_revision: Revision,
    /// Revision of the last write to the key.
    pub mod_revision: Revision,
    /// Number of writes since creation (1 after create); reset by delete.
    pub version: i64,
}

/// The condition a transaction checks on its key before writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// Write unconditionally.
    Always,
    /// The key must not exist (etcd: `version == 0`; create and mod revision are 0 as well).
    Absent,
    /// The key must exist with exactly this mod revision.
    ModRevision(Revision),
}

/// What a transaction writes when its compare holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(Bytes),
    Delete,
}

/// A single-key conditional write: etcd's `Txn(If(compare)).Then(op).Else(Get(key))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txn {
    pub key: String,
    pub compare: Compare,
    pub op: Op,
}

/// The outcome of a [`Txn`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnResult {
    /// The compare held and the op was applied at `revision`. `kv` is the key after the
    /// write (for a delete: the deleted value, with `mod_revision` set to the delete's
    /// revision); `prev` is the key before the write, if it existed.
    Succeeded {
        revision: Revision,
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
    /// The compare failed (or a delete found no key); nothing was written. `current` is the
    /// key as it is now; `revision` the store revision at which it was read.
    Failed {
        revision: Revision,
        current: Option<KeyValue>,
    },
}

/// A range read over all keys that start with `prefix`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeRequest {
    pub prefix: String,
    /// Only keys strictly greater than this one (continuation of a paged read).
    pub start_after: Option<String>,
    /// At most this many keys; 0 means no limit.
    pub limit: usize,
    /// Read the keyspace as of this revision; 0 means the latest.
    pub revision: Revision,
}

/// The result of a [`RangeRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeResponse {
    /// Keys in ascending order.
    pub kvs: Vec<KeyValue>,
    /// True when keys beyond `limit` remain.
    pub more: bool,
    /// The revision the range was read at (the latest when the request said 0).
    pub revision: Revision,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The key was created or updated; `prev` is its value before, if any.
    Put {
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
    /// The key was deleted; `prev` is the value it had. `revision` is the delete's revision.
    Delete { prev: KeyValue, revision: Revision },
}

impl Event {
    /// The revision at which this change happened.
    pub fn revision(&self) -> Revision {
        match self {
            Event::Put { kv, .. } => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
        }
    }

    pub fn key(&self) -> &str {
        match self {
            Event::Put { kv, .. } => &kv.key,
            Event::Delete { prev, .. } => &prev.key,
        }
    }
}

/// A stream of events in strictly increasing revision order. The stream ends with an error
/// item if the watch can no longer be served (for example the watcher fell behind and the
/// history it needs was compacted).
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<Event, StoreError>> + Send>>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The requested revision is older than the compacted revision.
    #[error("required revision {requested} has been compacted (compacted revision {compacted})")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    /// The requested revision is newer than the store's current revision.
    #[error("required revision {requested} is a future revision (current revision {current})")]
    FutureRevision {
        requested: Revision,
        current: Revision,
    },
    #[error("storage backend: {0}")]
    Backend(String),
    #[error("store is closed")]
    Closed,
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// An MVCC key-value store with etcd v3 semantics. See the crate docs.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The key as of `revision` (0: latest), with the revision it was read at.
    async fn get(&self, key: &str, revision: Revision) -> Result<(Option<KeyValue>, Revision)>;

    /// Keys under a prefix, in key order, at one revision.
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse>;

    /// One conditional write. Concurrent transactions are serialised; each successful one
    /// gets its own revision and is durable when this returns.
    async fn txn(&self, txn: Txn) -> Result<TxnResult>;

    /// Events for keys under `prefix` with revision greater than or equal to `from`
    /// (0: only changes after now).
    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream>;

    /// Forget history before `revision`: reads and watches at older revisions then fail
    /// with [`StoreError::Compacted`]. The latest value of every live key is kept.
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// The store's current revision.
    async fn current_revision(&self) -> Result<Revision>;

    /// The revision up to which history has been compacted (0 if never).
    async fn compacted_revision(&self) -> Result<Revision>;

    /// The size of the database in bytes, as etcd reports `dbSize`: what the disk holds
    /// and a backup copies, free pages included.
    async fn size(&self) -> Result<u64>;

    /// Writes a consistent copy of the whole database to `dest` while serving, in the
    /// backend's own format (a redb file; etcd's snapshot, which `etcdctl snapshot
    /// restore` reads), and returns its size in bytes. `dest` appears complete or not at
    /// all: the copy is written beside it and renamed.
    async fn snapshot(&self, dest: &std::path::Path) -> Result<u64>;

    /// Whether the key's stored value should be written again even when it does not
    /// change: an encrypting store says so for values sealed with an older key, which
    /// is how a write of an unchanged object (`kubectl replace`) rotates it.
    async fn stale(&self, _key: &str) -> Result<bool> {
        Ok(false)
    }
}
