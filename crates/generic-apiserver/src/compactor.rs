//! Periodic compaction, as kube-apiserver does it: every interval, compact the store up
//! to the revision it had one interval ago. Watches and paged lists can therefore resume
//! from anything younger than one interval; older resourceVersions get 410 Gone.

use std::sync::Arc;
use std::time::Duration;

use krust_store::Store;

pub async fn run(store: Arc<dyn Store>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut previous = None;
    loop {
        ticker.tick().await;
        let current = match store.current_revision().await {
            Ok(rev) => rev,
            Err(err) => {
                tracing::warn!(%err, "reading the revision to compact at");
                continue;
            }
        };
        if let Some(target) = previous.filter(|t| *t > 0) {
            match store.compact(target).await {
                Ok(()) => tracing::info!(revision = target, "compacted the store"),
                Err(err) => tracing::warn!(%err, revision = target, "compaction failed"),
            }
        }
        previous = Some(current);
    }
}
