//! Giving up on a write whose leader died. A proposal that the member forwarded to a
//! leader that then died is lost, but etcd answers it only at its request timeout (5 s +
//! 2 election timeouts, 7 s with etcd's defaults). So the store follows the member's
//! raft term (a new term is a new election) and fails a write still waiting a moment
//! after the term changed: a proposal the new leader holds commits within milliseconds
//! of the election, so one still waiting then was lost with the old leader — or, rarely,
//! commits later, which is the same uncertain outcome etcd's own timeout gives.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use etcd_client::MaintenanceClient;

/// How often the term is read.
const POLL: Duration = Duration::from_millis(250);
/// How long a write may still wait after a new term was seen.
const GRACE: Duration = Duration::from_secs(1);

/// The member's raft term, kept fresh by a task that ends with the last holder.
pub(crate) struct Leadership {
    term: AtomicU64,
}

impl Leadership {
    pub(crate) fn follow(maintenance: MaintenanceClient) -> Arc<Leadership> {
        let leadership = Arc::new(Leadership {
            term: AtomicU64::new(0),
        });
        tokio::spawn(poll(Arc::downgrade(&leadership), maintenance));
        leadership
    }

    fn term(&self) -> u64 {
        self.term.load(Ordering::Relaxed)
    }

    /// Runs `write`, unless it is still waiting `GRACE` after a new term was seen.
    pub(crate) async fn bound<T>(
        &self,
        write: impl std::future::Future<Output = crate::Result<T>>,
    ) -> crate::Result<T> {
        let term = self.term();
        tokio::pin!(write);
        let mut changed: Option<Instant> = None;
        loop {
            tokio::select! {
                result = &mut write => return result,
                _ = tokio::time::sleep(POLL) => {
                    if term == 0 || self.term() == term {
                        continue;
                    }
                    let since = *changed.get_or_insert_with(Instant::now);
                    if since.elapsed() >= GRACE {
                        return Err(crate::StoreError::Backend(
                            "etcd elected a new leader while the write waited on the old one: \
                             it may or may not have been applied"
                                .into(),
                        ));
                    }
                }
            }
        }
    }
}

async fn poll(leadership: Weak<Leadership>, mut maintenance: MaintenanceClient) {
    loop {
        tokio::time::sleep(POLL).await;
        let Some(leadership) = leadership.upgrade() else {
            return;
        };
        if let Ok(Ok(status)) = tokio::time::timeout(POLL * 2, maintenance.status()).await {
            leadership
                .term
                .fetch_max(status.raft_term(), Ordering::Relaxed);
        }
    }
}
