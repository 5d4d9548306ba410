//! The in-memory key index: for every key, the revisions that wrote it.
//!
//! Like etcd's `treeIndex`, this answers "which revision holds the value of key K as of
//! revision R" without touching disk; the value itself is then one point read in the history
//! table. It also owns the store's current and compacted revisions, so a reader resolves its
//! read revision and the keys to read under one lock. The committer is its only writer; it is
//! rebuilt from the history table on open.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::{Revision, StoreError};

/// One write to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub revision: Revision,
    pub tombstone: bool,
}

/// A committed write, as the committer hands it to [`Index::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexWrite {
    pub key: String,
    pub entry: Entry,
}

/// The revision history of every key, plus the store-wide revisions.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// Per key its writes in ascending revision order. A flat list rather than etcd's
    /// generations: a tombstone entry ends one incarnation and the next put starts another.
    keys: BTreeMap<String, Vec<Entry>>,
    revision: Revision,
    compacted: Revision,
}

impl Index {
    /// An index for a store compacted at `compacted`, to be filled by [`Index::restore`].
    pub(crate) fn new(compacted: Revision) -> Self {
        Index {
            keys: BTreeMap::new(),
            revision: compacted,
            compacted,
        }
    }

    /// Adds one history record read from disk at open. Records must come in ascending
    /// revision order.
    pub(crate) fn restore(&mut self, key: &str, entry: Entry) {
        self.push(key, entry);
        self.revision = self.revision.max(entry.revision);
    }

    pub(crate) fn revision(&self) -> Revision {
        self.revision
    }

    pub(crate) fn compacted(&self) -> Revision {
        self.compacted
    }

    pub(crate) fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The revision a read asking for `requested` is served at: the latest for 0, otherwise
    /// `requested` itself if its history is still there.
    pub(crate) fn read_revision(&self, requested: Revision) -> Result<Revision, StoreError> {
        if requested == 0 {
            Ok(self.revision)
        } else if requested > self.revision {
            Err(StoreError::FutureRevision {
                requested,
                current: self.revision,
            })
        } else if requested < self.compacted {
            Err(StoreError::Compacted {
                requested,
                compacted: self.compacted,
            })
        } else {
            Ok(requested)
        }
    }

    /// The mod revision of `key`'s live value as of `at`, or `None` if it did not exist then.
    pub(crate) fn live_revision(&self, key: &str, at: Revision) -> Option<Revision> {
        live_at(self.keys.get(key)?, at)
    }

    /// The mod revision of `key`'s current value, if it exists.
    pub(crate) fn latest(&self, key: &str) -> Option<Revision> {
        self.keys
            .get(key)?
            .last()
            .filter(|entry| !entry.tombstone)
            .map(|entry| entry.revision)
    }

    /// Mod revisions of the keys under `prefix` (and after `start_after`) that were live at
    /// `at`, in key order, at most `limit` of them (0: all), and whether more remain.
    pub(crate) fn range(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        at: Revision,
        limit: usize,
    ) -> (Vec<Revision>, bool) {
        let lower = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let live = self
            .keys
            .range::<str, _>((lower, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .filter_map(|(_, entries)| live_at(entries, at));
        let mut revisions = Vec::new();
        for revision in live {
            if limit != 0 && revisions.len() == limit {
                return (revisions, true);
            }
            revisions.push(revision);
        }
        (revisions, false)
    }

    /// Records a committed batch whose last revision is `revision`.
    pub(crate) fn apply(&mut self, writes: Vec<IndexWrite>, revision: Revision) {
        for write in writes {
            self.push(&write.key, write.entry);
        }
        self.revision = revision;
    }

    /// Checks that history can be compacted at `at`: not in the future, not already done.
    pub(crate) fn check_compaction(&self, at: Revision) -> Result<(), StoreError> {
        if at > self.revision {
            Err(StoreError::FutureRevision {
                requested: at,
                current: self.revision,
            })
        } else if at <= self.compacted {
            Err(StoreError::Compacted {
                requested: at,
                compacted: self.compacted,
            })
        } else {
            Ok(())
        }
    }

    /// The revisions whose records compacting at `at` removes: every write at or below `at`
    /// except each key's newest one there when it is a live value.
    pub(crate) fn compaction_plan(&self, at: Revision) -> Vec<Revision> {
        self.keys
            .values()
            .flat_map(|entries| entries[..compaction_cut(entries, at)].iter())
            .map(|entry| entry.revision)
            .collect()
    }

    /// Drops what [`Index::compaction_plan`] listed for `at` and records the compaction.
    pub(crate) fn compact(&mut self, at: Revision) {
        self.keys.retain(|_, entries| {
            entries.drain(..compaction_cut(entries, at));
            !entries.is_empty()
        });
        self.compacted = at;
    }

    fn push(&mut self, key: &str, entry: Entry) {
        match self.keys.get_mut(key) {
            Some(entries) => entries.push(entry),
            None => {
                self.keys.insert(key.to_owned(), vec![entry]);
            }
        }
    }
}

/// The revision of the live value in `entries` as of `at`.
fn live_at(entries: &[Entry], at: Revision) -> Option<Revision> {
    let written = entries.partition_point(|entry| entry.revision <= at);
    let newest = entries[..written].last()?;
    (!newest.tombstone).then_some(newest.revision)
}

/// How many leading entries compaction at `at` removes: all at or below `at` but the newest
/// of those, which stays if it is a live value (it is still the key's value at `at`).
fn compaction_cut(entries: &[Entry], at: Revision) -> usize {
    let written = entries.partition_point(|entry| entry.revision <= at);
    match written.checked_sub(1).map(|newest| entries[newest]) {
        Some(newest) if !newest.tombstone => written - 1,
        _ => written,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(revision: Revision) -> Entry {
        Entry {
            revision,
            tombstone: false,
        }
    }

    fn delete(revision: Revision) -> Entry {
        Entry {
            revision,
            tombstone: true,
        }
    }

    /// a: put 1, put 2, delete 4, put 6;  b: put 3;  ab: put 5, delete 7
    fn sample() -> Index {
        let mut index = Index::new(0);
        for (key, entry) in [
            ("a", put(1)),
            ("a", put(2)),
            ("b", put(3)),
            ("a", delete(4)),
            ("ab", put(5)),
            ("a", put(6)),
            ("ab", delete(7)),
        ] {
            index.restore(key, entry);
        }
        index
    }

    #[test]
    fn live_revision_follows_incarnations() {
        let index = sample();
        let a: Vec<_> = (0..=7).map(|at| index.live_revision("a", at)).collect();
        assert_eq!(
            a,
            [
                None,
                Some(1),
                Some(2),
                Some(2),
                None,
                None,
                Some(6),
                Some(6)
            ]
        );
        assert_eq!(index.latest("a"), Some(6));
        assert_eq!(index.latest("ab"), None);
        assert_eq!(index.latest("missing"), None);
        assert_eq!(index.revision(), 7);
    }

    #[test]
    fn range_respects_prefix_start_and_limit() {
        let index = sample();
        assert_eq!(index.range("a", None, 5, 0), (vec![5], false));
        assert_eq!(index.range("a", None, 6, 0), (vec![6, 5], false));
        assert_eq!(index.range("", None, 6, 2), (vec![6, 5], true));
        assert_eq!(index.range("", Some("ab"), 6, 2), (vec![3], false));
        // A start key before the prefix does not widen the range.
        assert_eq!(index.range("b", Some("a"), 7, 0), (vec![3], false));
        // Exactly `limit` keys left: no more.
        assert_eq!(index.range("", None, 6, 3), (vec![6, 5, 3], false));
    }

    #[test]
    fn compaction_keeps_newest_live_value() {
        let mut index = sample();
        let mut plan = index.compaction_plan(5);
        plan.sort_unstable();
        // a: 1, 2 and the tombstone 4 go; b keeps 3; ab keeps 5.
        assert_eq!(plan, vec![1, 2, 4]);
        index.compact(5);
        assert_eq!(index.compacted(), 5);
        assert_eq!(index.live_revision("b", 5), Some(3));
        assert_eq!(index.live_revision("ab", 5), Some(5));
        assert_eq!(index.live_revision("a", 5), None);
        assert_eq!(index.live_revision("a", 6), Some(6));

        // Compacting past ab's tombstone removes the key entirely.
        assert_eq!(index.compaction_plan(7), vec![5, 7]);
        index.compact(7);
        assert_eq!(index.key_count(), 2);
    }

    #[test]
    fn read_revision_validates() {
        let mut index = sample();
        index.compact(3);
        assert_eq!(index.read_revision(0).unwrap(), 7);
        assert_eq!(index.read_revision(3).unwrap(), 3);
        assert!(matches!(
            index.read_revision(2),
            Err(StoreError::Compacted {
                requested: 2,
                compacted: 3
            })
        ));
        assert!(matches!(
            index.read_revision(8),
            Err(StoreError::FutureRevision {
                requested: 8,
                current: 7
            })
        ));
        assert!(index.check_compaction(3).is_err());
        assert!(index.check_compaction(8).is_err());
        assert!(index.check_compaction(4).is_ok());
    }
}
