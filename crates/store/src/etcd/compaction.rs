//! The compacted revision, which etcd keeps but does not report.
//!
//! etcd answers a read at revision `r` with "required revision has been compacted" exactly
//! when `r` is below its compacted revision, so that revision is the smallest one it still
//! reads at. The tracker remembers a lower bound (the highest compacted revision this process
//! has seen) and checks it with one count-only read per call: if etcd still reads there, it is
//! the answer; otherwise someone else compacted since, and a binary search between the bound and
//! the current revision finds the new one. The answer is thus etcd's own, not this process's
//! idea of it, which matters when several apiservers share one etcd and any of them compacts.
//!
//! Storing the revision in a meta key, as Kubernetes' compactor does, would cost a write and so
//! a revision, while the [`Store`](crate::Store) contract is that only txns advance it.
//!
//! One blind spot: etcd reads at revision 1 whether it was compacted at 1 or never, so a
//! compaction at revision 1 is reported as 0. Nothing below revision 1 exists, so no read or
//! watch is answered differently because of it.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::{Result, Revision};

use super::kv::Kv;

/// What this process knows of etcd's compacted revision.
#[derive(Debug, Default)]
pub(crate) struct CompactionTracker {
    /// etcd's compacted revision is at least this: compaction only moves forward.
    known: AtomicI64,
}

impl CompactionTracker {
    /// Records that etcd has been compacted at `revision` (by this process, or as a watch
    /// cancellation reported).
    pub(crate) fn observe(&self, revision: Revision) {
        self.known.fetch_max(revision, Ordering::Relaxed);
    }

    /// etcd's compacted revision as of some moment during the call.
    pub(crate) async fn compacted(&self, kv: &Kv) -> Result<Revision> {
        let known = self.known.load(Ordering::Relaxed);
        // Revision 0 means "latest" to etcd, so the check for "never compacted" reads at 1.
        let mut unreadable = known.max(1);
        if kv.readable(unreadable).await? {
            return Ok(known);
        }
        // Invariant: etcd refuses reads at `unreadable` and serves them at `readable`. It
        // always serves the current revision: it refuses to compact beyond it.
        let mut readable = kv.current_revision().await?;
        while readable - unreadable > 1 {
            let middle = unreadable + (readable - unreadable) / 2;
            if kv.readable(middle).await? {
                readable = middle;
            } else {
                unreadable = middle;
            }
        }
        tracing::debug!(
            previous = known,
            compacted = readable,
            "etcd was compacted elsewhere"
        );
        self.observe(readable);
        Ok(readable)
    }
}
