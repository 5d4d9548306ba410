//! Watch: the hub that publishes committed events, and the per-watcher stream.
//!
//! Modelled on etcd's `watchable_store`. The committer publishes each durable batch to a
//! bounded broadcast channel, which never blocks it. A watcher subscribes before it reads any
//! history, so the two overlap instead of leaving a gap, and it drops events below the next
//! revision it expects, so the overlap yields no duplicates. A watcher that falls so far behind
//! that the channel overwrote batches it had not read ("lagged", etcd's unsynced watchers)
//! re-reads the missed revisions from the history table and then follows the channel again;
//! if compaction removed that history, the stream ends with [`StoreError::Compacted`].

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use futures::stream;
use redb::Database;
use tokio::sync::broadcast::{self, error::RecvError};

use crate::{Event, Revision, StoreError, WatchStream};

use super::error::BackendError;
use super::history::{HistoryChunk, Snapshot};

/// Records scanned per history read, so one read transaction and one blocking task stay short.
const REPLAY_SCAN: usize = 1024;

/// One committed batch, shared by every subscriber.
type Batch = Arc<[Event]>;

/// Fans committed events out to watchers.
pub(crate) struct WatchHub {
    sender: broadcast::Sender<Batch>,
}

impl WatchHub {
    /// A hub whose channel holds `capacity` batches before slow watchers lag.
    pub(crate) fn new(capacity: usize) -> Self {
        let (sender, _) = broadcast::channel(capacity.max(1));
        WatchHub { sender }
    }

    /// Publishes a durable batch. Called by the committer, in revision order.
    pub(crate) fn publish(&self, events: Vec<Event>) {
        // An error only means nobody is watching right now.
        let _ = self.sender.send(events.into());
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Batch> {
        self.sender.subscribe()
    }
}

/// Where a watcher takes its next events from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The history table, until it has read everything committed.
    History,
    /// The hub's channel.
    Live,
}

/// A watcher's progress.
struct Watcher {
    /// Weak so that open watch streams do not keep the database file open after the store is
    /// dropped.
    db: Weak<Database>,
    prefix: Arc<str>,
    /// The lowest revision not yet delivered or skipped; everything below it is done.
    next: Revision,
    source: Source,
    live: broadcast::Receiver<Batch>,
    ready: VecDeque<Event>,
}

/// Builds the stream for a watcher that subscribed to the hub (`live`) before deciding that it
/// starts at revision `next` from `source`.
pub(crate) fn stream(
    db: Weak<Database>,
    prefix: &str,
    next: Revision,
    source: Source,
    live: broadcast::Receiver<Batch>,
) -> WatchStream {
    let watcher = Watcher {
        db,
        prefix: prefix.into(),
        next,
        source,
        live,
        ready: VecDeque::new(),
    };
    Box::pin(stream::unfold(Some(watcher), |watcher| async move {
        let mut watcher = watcher?;
        match watcher.next_event().await {
            Ok(event) => Some((Ok(event), Some(watcher))),
            // An error ends the stream: the next poll sees `None`.
            Err(err) => Some((Err(err), None)),
        }
    }))
}

impl Watcher {
    async fn next_event(&mut self) -> Result<Event, StoreError> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(event);
            }
            match self.source {
                Source::History => {
                    let chunk = self.read_history().await?;
                    self.next = chunk.next;
                    self.ready.extend(chunk.events);
                    if chunk.reached_end {
                        self.source = Source::Live;
                    }
                }
                Source::Live => match self.live.recv().await {
                    Ok(batch) => self.accept(&batch),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(
                            prefix = %self.prefix,
                            next = self.next,
                            missed,
                            "watcher lagged behind live events, catching up from history"
                        );
                        self.source = Source::History;
                    }
                    Err(RecvError::Closed) => return Err(StoreError::Closed),
                },
            }
        }
    }

    /// Queues the events of a live batch that this watcher has not seen yet.
    fn accept(&mut self, batch: &[Event]) {
        for event in batch {
            let revision = event.revision();
            if revision < self.next {
                continue;
            }
            self.next = revision + 1;
            if event.key().starts_with(&*self.prefix) {
                self.ready.push_back(event.clone());
            }
        }
    }

    /// Reads the next stretch of history on the blocking pool: redb reads block.
    async fn read_history(&self) -> Result<HistoryChunk, StoreError> {
        let db = self.db.clone();
        let prefix = Arc::clone(&self.prefix);
        let from = self.next;
        tokio::task::spawn_blocking(move || {
            let db = db.upgrade().ok_or(StoreError::Closed)?;
            Snapshot::begin(&db)?.events(&prefix, from, REPLAY_SCAN)
        })
        .await
        .map_err(BackendError::Join)?
    }
}
