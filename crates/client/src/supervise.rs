//! A long-running task that panics is started again after a back-off instead of being
//! lost: a panic in one pod's worker or in a component's loop is a bug to log, not a
//! reason to stop that work for good (tokio would end the task silently) or to take the
//! process down.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

/// The first restart waits this long, doubling up to [`MAX_DELAY`], as a crashing
/// container's restarts do.
const FIRST_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(300);
/// A task that ran this long before panicking starts its back-off afresh.
const RESET_AFTER: Duration = Duration::from_secs(600);

/// Runs the task that `start` makes until it returns; each panic is logged (naming
/// `what`) and a fresh task is started after the back-off.
pub async fn restart_on_panic<F, Fut>(what: impl std::fmt::Display, mut start: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut delay = FIRST_DELAY;
    loop {
        let started = Instant::now();
        let Err(payload) = AssertUnwindSafe(start()).catch_unwind().await else {
            return;
        };
        if started.elapsed() >= RESET_AFTER {
            delay = FIRST_DELAY;
        }
        tracing::error!(
            task = %what,
            panic = krust_api::panics::message(&*payload),
            restart_in = ?delay,
            "task panicked; restarting it"
        );
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_DELAY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_restarted_with_back_off_until_it_returns() {
        let runs = Arc::new(AtomicU32::new(0));
        let begun = Instant::now();
        let counted = runs.clone();
        restart_on_panic("test task", move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(n >= 3, "run {n} panics");
            }
        })
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        // Three restarts: 1 s + 2 s + 4 s of back-off.
        assert_eq!(begun.elapsed().as_secs(), 7);
    }
}
