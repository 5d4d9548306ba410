//! Steady churn against the embedded store with periodic compaction, printing the file
//! size over time: with compaction the file stops growing once it holds the live data
//! plus one compaction window of history.
//!
//! ```text
//! cargo run --release -p krust-store --example churn -- [MINUTES] [OPS_PER_SEC] [WINDOW_SECS]
//! ```
//! Defaults: 10 minutes, 2,000 writes/s (creates, updates and deletes over 5,000 keys
//! with ~1 KiB values), compaction every 60 s to the revision of one window ago.

use std::time::{Duration, Instant};

use bytes::Bytes;
use krust_store::embedded::EmbeddedStore;
use krust_store::{Compare, Op, Store, Txn};

const KEYS: u64 = 5_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, default: u64| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let (minutes, rate, window) = (arg(1, 10), arg(2, 2_000), arg(3, 60));
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("churn.redb");
    let store = EmbeddedStore::open(&path)?;
    let value = Bytes::from(vec![b'x'; 1024]);
    let started = Instant::now();
    let mut next_compaction = started + Duration::from_secs(window);
    let mut previous_rev = 0;
    let mut next_report = started;
    let tick = Duration::from_millis(10);
    let per_tick = (rate / 100).max(1);
    let mut i: u64 = 0;
    println!("minute  file MiB  revision  live keys");
    while started.elapsed() < Duration::from_secs(minutes * 60) {
        let tick_start = Instant::now();
        for _ in 0..per_tick {
            i += 1;
            // Key i % KEYS: put (create or update) twice as often as delete.
            let key = format!("/registry/configmaps/churn/k{}", i % KEYS);
            let op = if i.is_multiple_of(3) {
                Op::Delete
            } else {
                Op::Put(value.clone())
            };
            store
                .txn(Txn {
                    key,
                    compare: Compare::Always,
                    op,
                })
                .await?;
        }
        if Instant::now() >= next_compaction {
            let rev = store.current_revision().await?;
            if previous_rev > 0 {
                store.compact(previous_rev).await?;
            }
            previous_rev = rev;
            next_compaction += Duration::from_secs(window);
        }
        if Instant::now() >= next_report {
            let size = std::fs::metadata(&path)?.len() as f64 / (1024.0 * 1024.0);
            let live = store
                .range(krust_store::RangeRequest {
                    prefix: "/registry/".into(),
                    ..Default::default()
                })
                .await?
                .kvs
                .len();
            println!(
                "{:>6.1}  {size:>8.1}  {:>8}  {live:>9}",
                started.elapsed().as_secs_f64() / 60.0,
                store.current_revision().await?
            );
            next_report += Duration::from_secs(30);
        }
        if let Some(rest) = tick.checked_sub(tick_start.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
    Ok(())
}
