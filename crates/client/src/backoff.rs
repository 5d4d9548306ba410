//! Exponential back-off of one thing that keeps failing — a container's restarts, an
//! image pull, a daemon pod's replacement: after the first failure the next try waits
//! `INITIAL` seconds, after each further one twice as long, at most `MAX` seconds
//! (client-go's `flowcontrol.Backoff`). The bounds are type parameters so that each use
//! names its own and a map of them can start entries with `Default`.

use std::time::{Duration, Instant};

#[derive(Debug, Default, Clone, Copy)]
pub struct Backoff<const INITIAL: u64, const MAX: u64> {
    delay: Option<Duration>,
    until: Option<Instant>,
}

impl<const INITIAL: u64, const MAX: u64> Backoff<INITIAL, MAX> {
    pub const MAX: Duration = Duration::from_secs(MAX);

    /// How long the next try must still wait, if it must.
    pub fn waiting(&self, now: Instant) -> Option<Duration> {
        self.until.filter(|u| *u > now).map(|u| u - now)
    }

    /// The current wait between tries (none before the first failure).
    pub fn delay(&self) -> Option<Duration> {
        self.delay
    }

    /// Whether nothing failed for twice the longest wait after the last try was due:
    /// the failures are history, and the entry can go (client-go's `hasExpired`).
    pub fn expired(&self, now: Instant) -> bool {
        self.until
            .is_none_or(|u| now.saturating_duration_since(u) > Self::MAX * 2)
    }

    /// Records a failure at `now`: returns how long the next try waits.
    pub fn fail(&mut self, now: Instant) -> Duration {
        let delay = self
            .delay
            .map_or(Duration::from_secs(INITIAL), |d| (d * 2).min(Self::MAX));
        self.delay = Some(delay);
        self.until = Some(now + delay);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_its_bound() {
        let mut b = Backoff::<10, 300>::default();
        let now = Instant::now();
        assert_eq!(b.waiting(now), None, "nothing failed yet");
        let delays: Vec<u64> = (0..7).map(|_| b.fail(now).as_secs()).collect();
        assert_eq!(delays, vec![10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.delay(), Some(Duration::from_secs(300)));
        assert!(b.waiting(now).is_some());
        assert!(b.waiting(now + Backoff::<10, 300>::MAX).is_none());
        assert!(!b.expired(now + Duration::from_secs(900)));
        assert!(b.expired(now + Duration::from_secs(901)));
    }
}
