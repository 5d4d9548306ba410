//! The redb tables and reads of the on-disk history.
//!
//! `history` maps each revision to the [`Record`] it wrote; it is the only copy of the data,
//! everything in memory is derived from it. `meta` holds the compacted revision. Reads go
//! through a [`Snapshot`], one redb read transaction, so a reader sees one consistent state of
//! both tables even while the committer writes or compacts.

use redb::{Database, ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition};

use crate::{Event, KeyValue, Revision, StoreError};

use super::codec::Record;
use super::error::BackendError;
use super::index::{Entry, Index};

pub(crate) const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(crate) const COMPACTED_KEY: &str = "compacted_revision";

/// The history table's key for a revision. Revisions stored are assigned by the committer
/// or checked against the index first, so they are never negative.
pub(crate) fn table_key(revision: Revision) -> u64 {
    revision as u64
}

fn revision_of(key: u64) -> Revision {
    key as Revision
}

/// Creates the tables if the file is new, so readers can always open them.
pub(crate) fn create_tables(db: &Database) -> Result<(), BackendError> {
    let txn = db.begin_write().map_err(BackendError::BeginWrite)?;
    txn.open_table(HISTORY)
        .map_err(BackendError::table("history"))?;
    txn.open_table(META).map_err(BackendError::table("meta"))?;
    txn.commit().map_err(|source| BackendError::Commit {
        action: "table creation",
        source,
    })
}

/// The value written at `revision`, read from any view of the history table (the committer
/// reads through its write transaction, so it sees its own batch).
pub(crate) fn key_value(
    table: &impl ReadableTable<u64, &'static [u8]>,
    revision: Revision,
) -> Result<KeyValue, BackendError> {
    let guard = table
        .get(table_key(revision))
        .map_err(BackendError::storage("reading a history record"))?
        .ok_or(BackendError::MissingRecord { revision })?;
    decode(revision, guard.value())?
        .key_value(revision)
        .ok_or(BackendError::UnexpectedTombstone { revision })
}

fn decode(revision: Revision, bytes: &[u8]) -> Result<Record<'_>, BackendError> {
    Record::decode(bytes).map_err(|source| BackendError::Corrupt { revision, source })
}

/// Events replayed from history for one watcher, up to a scan limit.
#[derive(Debug)]
pub(crate) struct HistoryChunk {
    /// Events under the watcher's prefix, in revision order.
    pub events: Vec<Event>,
    /// The first revision not yet scanned.
    pub next: Revision,
    /// True when the scan reached the newest record of the snapshot.
    pub reached_end: bool,
}

/// A consistent read-only view of the history and the compacted revision.
pub(crate) struct Snapshot {
    history: ReadOnlyTable<u64, &'static [u8]>,
    compacted: Revision,
}

impl Snapshot {
    pub(crate) fn begin(db: &Database) -> Result<Self, BackendError> {
        let txn = db.begin_read().map_err(BackendError::BeginRead)?;
        let history = txn
            .open_table(HISTORY)
            .map_err(BackendError::table("history"))?;
        let meta = txn.open_table(META).map_err(BackendError::table("meta"))?;
        let compacted = meta
            .get(COMPACTED_KEY)
            .map_err(BackendError::storage("reading the compacted revision"))?
            .map_or(0, |guard| revision_of(guard.value()));
        Ok(Snapshot { history, compacted })
    }

    /// Fails with [`StoreError::Compacted`] if a compaction committed after the caller looked
    /// up `revision` in the index removed the history a read at `revision` needs.
    pub(crate) fn ensure_readable(&self, revision: Revision) -> Result<(), StoreError> {
        if revision < self.compacted {
            return Err(StoreError::Compacted {
                requested: revision,
                compacted: self.compacted,
            });
        }
        Ok(())
    }

    pub(crate) fn key_value(&self, revision: Revision) -> Result<KeyValue, BackendError> {
        key_value(&self.history, revision)
    }

    /// Rebuilds the key index from every record, for open.
    pub(crate) fn build_index(&self) -> Result<Index, BackendError> {
        let mut index = Index::new(self.compacted);
        let records = self
            .history
            .iter()
            .map_err(BackendError::storage("scanning history"))?;
        for item in records {
            let (key, value) = item.map_err(BackendError::storage("scanning history"))?;
            let revision = revision_of(key.value());
            let record = decode(revision, value.value())?;
            let entry = Entry {
                revision,
                tombstone: record.is_tombstone(),
            };
            index.restore(record.key, entry);
        }
        Ok(index)
    }

    /// Events for keys under `prefix` at revisions `from` and later, scanning at most
    /// `max_scan` records so one call stays short however much history there is.
    pub(crate) fn events(
        &self,
        prefix: &str,
        from: Revision,
        max_scan: usize,
    ) -> Result<HistoryChunk, StoreError> {
        // Both a tombstone at the compacted revision and anything older may be gone.
        if from <= self.compacted {
            return Err(StoreError::Compacted {
                requested: from,
                compacted: self.compacted,
            });
        }
        let mut records = self
            .history
            .range(table_key(from)..)
            .map_err(BackendError::storage("scanning history"))?;
        let mut chunk = HistoryChunk {
            events: Vec::new(),
            next: from,
            reached_end: false,
        };
        for _ in 0..max_scan {
            let Some(item) = records.next() else {
                chunk.reached_end = true;
                return Ok(chunk);
            };
            let (key, value) = item.map_err(BackendError::storage("scanning history"))?;
            let revision = revision_of(key.value());
            chunk.next = revision + 1;
            let record = decode(revision, value.value())?;
            if record.key.starts_with(prefix) {
                chunk.events.push(self.event(revision, &record)?);
            }
        }
        chunk.reached_end = records.next().is_none();
        Ok(chunk)
    }

    /// The watch event for a record. Its `prev` is the record it replaced, which compaction
    /// never removes while this record is above the compacted revision: it is either above
    /// it too, or the key's newest live value at it.
    fn event(&self, revision: Revision, record: &Record<'_>) -> Result<Event, BackendError> {
        let prev = match record.prev_revision {
            0 => None,
            prev_revision => Some(self.key_value(prev_revision)?),
        };
        match (record.key_value(revision), prev) {
            (Some(kv), prev) => Ok(Event::Put { kv, prev }),
            (None, Some(prev)) => Ok(Event::Delete { prev, revision }),
            (None, None) => Err(BackendError::OrphanTombstone { revision }),
        }
    }
}
