//! Group commit: the one thread that writes.
//!
//! Every write ([`Txn`]) and compaction is a [`Request`] on a channel to a dedicated thread.
//! The thread takes everything queued, evaluates the transactions in arrival order against
//! the index plus the batch's own earlier writes (so a batch behaves exactly like the same
//! transactions run one after another), gives each successful one the next revision, and writes
//! the batch in one redb transaction with an fsync. Only then does it update the index, publish
//! the events and answer the writers. Concurrent writers thus share one fsync, which is what
//! makes durable writes fast, and nobody hears "done" before their write is on disk.
//!
//! A failed compare takes no revision and writes nothing. If the commit fails, every writer
//! in the batch gets the error and nothing of the batch becomes visible. A failed commit may
//! still have reached the disk, so the in-memory index can no longer be trusted to match it:
//! like etcd, which stops on a failed backend commit, the committer then refuses all further
//! work until the store is reopened and rebuilds its index from the file.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use redb::{Durability, Table, WriteTransaction};
use tokio::sync::oneshot;

use crate::{Compare, Event, KeyValue, Op, Revision, StoreError, Txn, TxnResult};

use super::Shared;
use super::codec::{Record, RecordKind};
use super::error::BackendError;
use super::history::{self, COMPACTED_KEY, HISTORY, META, table_key};
use super::index::{Entry, Index, IndexWrite};

/// Most transactions one batch takes, to bound the size of a redb transaction and the delay
/// of the first writer in it.
const MAX_BATCH: usize = 1024;

/// Work for the committer.
enum Request {
    Txn {
        txn: Txn,
        reply: oneshot::Sender<Result<TxnResult, StoreError>>,
    },
    Compact {
        revision: Revision,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// The store's handle on the committer thread. Dropping it lets the thread finish what is
/// queued and waits for it, so the database file is closed when the store is gone.
pub(crate) struct CommitterHandle {
    /// `None` only while dropping.
    requests: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl CommitterHandle {
    pub(crate) fn spawn(shared: Arc<Shared>) -> Result<Self, BackendError> {
        let (requests, queue) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("krust-store-committer".into())
            .spawn(move || {
                Committer {
                    shared,
                    failed: None,
                }
                .run(queue)
            })
            .map_err(BackendError::SpawnCommitter)?;
        Ok(CommitterHandle {
            requests: Some(requests),
            thread: Some(thread),
        })
    }

    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResult, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Request::Txn { txn, reply })?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    pub(crate) async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Request::Compact { revision, reply })?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    fn submit(&self, request: Request) -> Result<(), StoreError> {
        self.requests
            .as_ref()
            .ok_or(StoreError::Closed)?
            .send(request)
            .map_err(|_| StoreError::Closed)
    }
}

impl Drop for CommitterHandle {
    fn drop(&mut self) {
        // Closing the channel is the committer's signal to stop.
        self.requests.take();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the committer thread panicked");
        }
    }
}

/// A transaction waiting for its batch to commit.
struct Pending {
    txn: Txn,
    reply: oneshot::Sender<Result<TxnResult, StoreError>>,
}

struct Committer {
    shared: Arc<Shared>,
    /// Set after a commit failed: why the store stopped accepting work.
    failed: Option<String>,
}

impl Committer {
    fn run(mut self, queue: mpsc::Receiver<Request>) {
        while let Ok(first) = queue.recv() {
            let mut txns = Vec::new();
            let mut next = Some(first);
            while let Some(request) = next {
                match request {
                    Request::Txn { txn, reply } => txns.push(Pending { txn, reply }),
                    Request::Compact { revision, reply } => {
                        // Transactions queued before the compaction commit before it.
                        self.commit(std::mem::take(&mut txns));
                        let result = self.compact(revision);
                        // The caller may have stopped waiting; the compaction stands anyway.
                        let _ = reply.send(result);
                    }
                }
                next = if txns.len() < MAX_BATCH {
                    queue.try_recv().ok()
                } else {
                    None
                };
            }
            self.commit(txns);
        }
        tracing::debug!("store closed, committer stopping");
    }

    /// Fails if an earlier commit failed: see the module docs.
    fn ensure_running(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(reason) => Err(StoreError::Backend(reason.clone())),
            None => Ok(()),
        }
    }

    /// Commits `write` durably. If that fails, whether it reached the disk is unknown, so the
    /// committer stops taking work.
    fn commit_durably(
        &mut self,
        write: WriteTransaction,
        action: &'static str,
    ) -> Result<(), BackendError> {
        write.commit().map_err(|source| {
            let err = BackendError::Commit { action, source };
            let reason = err.chain();
            tracing::error!(error = %reason, "commit failed, refusing all work until reopened");
            self.failed = Some(format!("store stopped after a failed commit: {reason}"));
            err
        })
    }

    /// Commits one batch and answers its writers.
    fn commit(&mut self, pending: Vec<Pending>) {
        if pending.is_empty() {
            return;
        }
        let (txns, replies): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .map(|pending| (pending.txn, pending.reply))
            .unzip();
        let count = txns.len();
        let result = self
            .ensure_running()
            .and_then(|()| Ok(self.write_batch(txns)?));
        match result {
            Ok(batch) => {
                if !batch.writes.is_empty() {
                    tracing::trace!(
                        txns = count,
                        writes = batch.writes.len(),
                        revision = batch.revision,
                        "committed batch"
                    );
                    self.shared
                        .write_index()
                        .apply(batch.writes, batch.revision);
                    self.shared.hub.publish(batch.events);
                }
                for (reply, result) in replies.into_iter().zip(batch.results) {
                    // A writer that stopped waiting still had its write applied.
                    let _ = reply.send(Ok(result));
                }
            }
            Err(err) => {
                tracing::error!(txns = count, error = %err, "batch failed");
                let message = err.to_string();
                for reply in replies {
                    let _ = reply.send(Err(StoreError::Backend(message.clone())));
                }
            }
        }
    }

    /// Evaluates and durably writes a batch, without touching the index or watchers.
    fn write_batch(&mut self, txns: Vec<Txn>) -> Result<Batch, BackendError> {
        let write = self.begin_durable_write()?;
        let batch = {
            let mut table = write
                .open_table(HISTORY)
                .map_err(BackendError::table("history"))?;
            let index = self.shared.read_index();
            let mut evaluator = Evaluator {
                table: &mut table,
                index: &index,
                pending: HashMap::new(),
                batch: Batch {
                    revision: index.revision(),
                    ..Batch::default()
                },
            };
            for txn in txns {
                let result = evaluator.apply(txn)?;
                evaluator.batch.results.push(result);
            }
            evaluator.batch
        };
        if batch.writes.is_empty() {
            // Nothing to make durable: skip the fsync.
            write
                .abort()
                .map_err(BackendError::storage("aborting a read-only batch"))?;
        } else {
            self.commit_durably(write, "a batch of writes")?;
        }
        Ok(batch)
    }

    /// Compacts history at `revision`: removes the records [`Index::compaction_plan`] names
    /// and persists the compacted revision, then updates the index.
    fn compact(&mut self, revision: Revision) -> Result<(), StoreError> {
        self.ensure_running()?;
        let removed = {
            let index = self.shared.read_index();
            index.check_compaction(revision)?;
            index.compaction_plan(revision)
        };
        let write = self.begin_durable_write()?;
        {
            let mut table = write
                .open_table(HISTORY)
                .map_err(BackendError::table("history"))?;
            for &old in &removed {
                table
                    .remove(table_key(old))
                    .map_err(BackendError::storage("removing compacted history"))?;
            }
            let mut meta = write
                .open_table(META)
                .map_err(BackendError::table("meta"))?;
            meta.insert(COMPACTED_KEY, table_key(revision))
                .map_err(BackendError::storage("recording the compacted revision"))?;
        }
        self.commit_durably(write, "a compaction")?;
        self.shared.write_index().compact(revision);
        tracing::info!(revision, removed = removed.len(), "compacted history");
        Ok(())
    }

    /// A redb write transaction whose commit returns only once it is on disk (fsync).
    fn begin_durable_write(&self) -> Result<WriteTransaction, BackendError> {
        let mut write = self
            .shared
            .db
            .begin_write()
            .map_err(BackendError::BeginWrite)?;
        write
            .set_durability(Durability::Immediate)
            .map_err(BackendError::Durability)?;
        Ok(write)
    }
}

/// The outcome of evaluating a batch.
#[derive(Default)]
struct Batch {
    /// One per transaction, in order.
    results: Vec<TxnResult>,
    writes: Vec<IndexWrite>,
    events: Vec<Event>,
    /// The revision after the last successful write (the store's revision if none).
    revision: Revision,
}

/// Evaluates a batch's transactions in order inside its redb write transaction.
struct Evaluator<'a, 'txn> {
    table: &'a mut Table<'txn, u64, &'static [u8]>,
    index: &'a Index,
    /// Keys written earlier in this batch, with their value now (`None`: deleted). They take
    /// precedence over the index, which only knows committed batches.
    pending: HashMap<String, Option<KeyValue>>,
    batch: Batch,
}

impl Evaluator<'_, '_> {
    fn apply(&mut self, txn: Txn) -> Result<TxnResult, BackendError> {
        let current = self.current(&txn.key)?;
        let holds = match txn.compare {
            Compare::Always => true,
            Compare::Absent => current.is_none(),
            Compare::ModRevision(revision) => current
                .as_ref()
                .is_some_and(|kv| kv.mod_revision == revision),
        };
        match (holds, txn.op, current) {
            (true, Op::Put(value), current) => self.put(txn.key, value, current),
            (true, Op::Delete, Some(current)) => self.delete(current),
            (_, _, current) => Ok(TxnResult::Failed {
                revision: self.batch.revision,
                current,
            }),
        }
    }

    /// The key's value as of the batch's last write.
    fn current(&self, key: &str) -> Result<Option<KeyValue>, BackendError> {
        if let Some(value) = self.pending.get(key) {
            return Ok(value.clone());
        }
        self.index
            .latest(key)
            .map(|revision| history::key_value(&*self.table, revision))
            .transpose()
    }

    fn put(
        &mut self,
        key: String,
        value: bytes::Bytes,
        prev: Option<KeyValue>,
    ) -> Result<TxnResult, BackendError> {
        let revision = self.batch.revision + 1;
        let (create_revision, version) = match &prev {
            Some(prev) => (prev.create_revision, prev.version + 1),
            None => (revision, 1),
        };
        let record = Record {
            key: &key,
            prev_revision: prev.as_ref().map_or(0, |prev| prev.mod_revision),
            kind: RecordKind::Put {
                value: &value,
                create_revision,
                version,
            },
        };
        self.insert(revision, &record)?;
        let kv = KeyValue {
            key,
            value,
            create_revision,
            mod_revision: revision,
            version,
        };
        self.record_write(&kv.key, revision, Some(kv.clone()));
        self.batch.events.push(Event::Put {
            kv: kv.clone(),
            prev: prev.clone(),
        });
        Ok(TxnResult::Succeeded { revision, kv, prev })
    }

    fn delete(&mut self, prev: KeyValue) -> Result<TxnResult, BackendError> {
        let revision = self.batch.revision + 1;
        let record = Record {
            key: &prev.key,
            prev_revision: prev.mod_revision,
            kind: RecordKind::Tombstone,
        };
        self.insert(revision, &record)?;
        self.record_write(&prev.key, revision, None);
        self.batch.events.push(Event::Delete {
            prev: prev.clone(),
            revision,
        });
        let kv = KeyValue {
            mod_revision: revision,
            ..prev.clone()
        };
        Ok(TxnResult::Succeeded {
            revision,
            kv,
            prev: Some(prev),
        })
    }

    fn insert(&mut self, revision: Revision, record: &Record<'_>) -> Result<(), BackendError> {
        self.table
            .insert(table_key(revision), record.encode().as_slice())
            .map_err(BackendError::storage("writing a history record"))?;
        Ok(())
    }

    /// Makes a successful write visible to the rest of the batch and queues it for the index.
    fn record_write(&mut self, key: &str, revision: Revision, value: Option<KeyValue>) {
        let entry = Entry {
            revision,
            tombstone: value.is_none(),
        };
        self.pending.insert(key.to_owned(), value);
        self.batch.writes.push(IndexWrite {
            key: key.to_owned(),
            entry,
        });
        self.batch.revision = revision;
    }
}
