//! Watch: one etcd watch (over the prefix's range, from the start revision, with previous
//! values) per store watch, turned into a stream of store events.
//!
//! Opening waits for etcd to confirm the watcher. Errors then come from [`open`] rather than
//! from the stream, and a watch from 0 ("after now") has its start fixed by etcd before
//! `open` returns, so any write acknowledged afterwards is delivered.
//!
//! The stream ends with [`StoreError::Compacted`] when etcd cancels the watch for compaction
//! (a response with `compact_revision` set), and also when an event arrives without the
//! previous value it must have had: etcd looks that value up when sending the event and
//! silently leaves it out if it was compacted in the meantime. Anything else that ends etcd's
//! stream (a cancel, a lost connection) ends it with a backend error; the caller watches again
//! from the revision after its last event.

use std::collections::VecDeque;
use std::sync::Arc;

use etcd_client::{EventType, WatchClient, WatchOptions, WatchResponse};
use futures::stream;

use crate::{Event, Revision, StoreError, WatchStream};

use super::error::EtcdError;
use super::kv::Kv;

/// Starts watching `prefix` from revision `from` (0: changes after now). The caller has
/// checked `from` against the compacted revision.
pub(crate) async fn open(
    kv: Arc<Kv>,
    mut client: WatchClient,
    prefix: &str,
    from: Revision,
) -> Result<WatchStream, StoreError> {
    let (start, end) = kv.keys().range(prefix, None);
    let mut options = WatchOptions::new().with_range(end).with_prev_key();
    if from > 0 {
        options = options.with_start_revision(from);
    }
    let rpc = |source| EtcdError::Rpc {
        action: format!("watch on {prefix:?}"),
        source,
    };
    let mut etcd = client.watch(start, Some(options)).await.map_err(rpc)?;
    // etcd answers a watch request with a "created" response before any event.
    let created = etcd
        .message()
        .await
        .map_err(rpc)?
        .filter(WatchResponse::created)
        .ok_or_else(|| EtcdError::WatchNotCreated {
            prefix: prefix.to_owned(),
        })?;
    let next = if from > 0 {
        from
    } else {
        // The header holds the revision the watcher was created at; it sees what follows.
        created.header().map_or(0, |header| header.revision()) + 1
    };
    let watcher = Watcher {
        kv,
        prefix: prefix.to_owned(),
        etcd,
        next,
        ready: VecDeque::new(),
    };
    if created.canceled() {
        return Err(watcher.canceled(&created));
    }
    tracing::debug!(prefix, from, next, "watching etcd");
    Ok(Box::pin(stream::unfold(
        Some(watcher),
        |watcher| async move {
            let mut watcher = watcher?;
            match watcher.next_event().await {
                Ok(event) => Some((Ok(event), Some(watcher))),
                // An error ends the stream: the next poll sees `None`.
                Err(err) => Some((Err(err), None)),
            }
        },
    )))
}

/// One store watch over one etcd watch.
struct Watcher {
    kv: Arc<Kv>,
    prefix: String,
    etcd: etcd_client::WatchStream,
    /// The lowest revision not delivered yet: what the watcher misses if it fails now.
    next: Revision,
    /// Events of the last etcd response not delivered yet, converted one at a time so that
    /// those before a failing one are still delivered.
    ready: VecDeque<etcd_client::Event>,
}

impl Watcher {
    async fn next_event(&mut self) -> Result<Event, StoreError> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                let event = self.event(event).await?;
                self.next = event.revision() + 1;
                return Ok(event);
            }
            let resp = self
                .etcd
                .message()
                .await
                .map_err(|source| EtcdError::Rpc {
                    action: format!("watch on {:?}: receiving events", self.prefix),
                    source,
                })?
                .ok_or_else(|| EtcdError::WatchClosed {
                    prefix: self.prefix.clone(),
                })?;
            if resp.canceled() || resp.compact_revision() != 0 {
                return Err(self.canceled(&resp));
            }
            // Responses without events are progress notifications.
            self.ready.extend(resp.events().iter().cloned());
        }
    }

    async fn event(&self, event: etcd_client::Event) -> Result<Event, StoreError> {
        let keys = self.kv.keys();
        let (Some(kv), prev) = (event.kv().cloned(), event.prev_kv().cloned()) else {
            return Err(EtcdError::EventWithoutKey {
                prefix: self.prefix.clone(),
            }
            .into());
        };
        let prev = prev.map(|prev| keys.key_value(prev)).transpose()?;
        match event.event_type() {
            EventType::Put => {
                let kv = keys.key_value(kv)?;
                // Version 1 is a create; any later version had a value before.
                if prev.is_none() && kv.version > 1 {
                    return Err(self.prev_compacted(kv.mod_revision).await);
                }
                Ok(Event::Put { kv, prev })
            }
            EventType::Delete => {
                let revision = kv.mod_revision();
                match prev {
                    Some(prev) => Ok(Event::Delete { prev, revision }),
                    None => Err(self.prev_compacted(revision).await),
                }
            }
        }
    }

    /// The error for an event at `revision` whose previous value etcd had already compacted.
    async fn prev_compacted(&self, revision: Revision) -> StoreError {
        match self.kv.compacted_revision().await {
            Ok(compacted) => StoreError::Compacted {
                requested: revision,
                compacted,
            },
            Err(err) => err,
        }
    }

    /// The error for a response that cancels the watch.
    fn canceled(&self, resp: &WatchResponse) -> StoreError {
        let compacted = resp.compact_revision();
        if compacted != 0 {
            self.kv.compaction().observe(compacted);
            tracing::debug!(prefix = %self.prefix, next = self.next, compacted, "watch compacted");
            return StoreError::Compacted {
                requested: self.next,
                compacted,
            };
        }
        let reason = resp.cancel_reason().to_owned();
        tracing::warn!(prefix = %self.prefix, %reason, "etcd canceled a watch");
        EtcdError::WatchCanceled {
            prefix: self.prefix.clone(),
            reason,
        }
        .into()
    }
}
