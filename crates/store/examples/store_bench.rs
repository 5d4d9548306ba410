//! Benchmarks the embedded store and etcd side by side: durable txn throughput and latency at
//! 1, 16 and 64 concurrent writers, point reads, a 10k-key range and watch delivery latency.
//!
//! ```text
//! cargo run --release -p krust-store --example store_bench [-- DIR]
//! ```
//!
//! The redb file and a single-member etcd that the benchmark starts itself (the `etcd` binary
//! on `PATH`, or `KRUST_ETCD_BIN`) live in temporary directories under DIR (default: the
//! system temp dir); put them on the disk you care about, since durable writes are bound by its
//! fsync latency. Both backends run the same measurements, one after the other.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use krust_store::embedded::EmbeddedStore;
use krust_store::{Compare, Event, Op, RangeRequest, Store, Txn};
use tokio::task::JoinSet;

use krust_store::etcd::testing::EtcdCluster;

/// How long each write and read phase runs.
const PHASE: Duration = Duration::from_secs(3);
const VALUE_SIZE: usize = 256;
const RANGE_KEYS: usize = 10_000;
const WRITER_LEVELS: [usize; 3] = [1, 16, 64];
const READER_LEVELS: [usize; 2] = [1, 4];
const WATCH_WRITER_LEVELS: [usize; 2] = [1, 64];
/// Width of the embedded column.
const COLUMN: usize = 46;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> BenchResult {
    let parent = std::env::args_os()
        .nth(1)
        .map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::tempdir_in(&parent)?;
    let path = dir.path().join("bench.redb");
    // Started first, so a missing etcd fails the run before the long embedded part.
    let etcd = EtcdCluster::start_in(&parent, 1).await;
    println!("store file: {}", path.display());
    println!(
        "etcd: {} (data under {})",
        etcd.endpoint(0),
        parent.display()
    );

    let embedded = {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&path)?);
        println!("measuring the embedded store...");
        measure(&store).await?
    };
    let on_etcd = {
        let store: Arc<dyn Store> = Arc::new(etcd.store("").await);
        println!("measuring etcd...");
        measure(&store).await?
    };
    print_report(&embedded, &on_etcd);
    Ok(())
}

/// What one backend measured.
struct Figures {
    /// Per writer level: puts, elapsed time, every put's latency.
    puts: Vec<(usize, Duration, Vec<Duration>)>,
    /// Per reader level: gets per second.
    gets: Vec<f64>,
    /// Range of all keys at the latest and at a fixed revision: every run's time.
    ranges: Vec<Vec<Duration>>,
    /// Per watch writer level: every event's delivery latency.
    watches: Vec<Vec<Duration>>,
}

async fn measure(store: &Arc<dyn Store>) -> BenchResult<Figures> {
    let mut puts = Vec::new();
    for writers in WRITER_LEVELS {
        puts.push(put_phase(store, writers).await?);
    }
    populate(store, RANGE_KEYS).await?;
    let mut gets = Vec::new();
    for readers in READER_LEVELS {
        gets.push(get_phase(store, readers).await? as f64 / PHASE.as_secs_f64());
    }
    let revision = store.current_revision().await?;
    let mut ranges = Vec::new();
    for at in [0, revision] {
        let mut times = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let resp = store
                .range(RangeRequest {
                    prefix: "/range/".into(),
                    revision: at,
                    ..RangeRequest::default()
                })
                .await?;
            times.push(started.elapsed());
            assert_eq!(resp.kvs.len(), RANGE_KEYS);
        }
        ranges.push(times);
    }
    let mut watches = Vec::new();
    for writers in WATCH_WRITER_LEVELS {
        watches.push(watch_phase(store, writers).await?);
    }
    Ok(Figures {
        puts,
        gets,
        ranges,
        watches,
    })
}

fn print_report(embedded: &Figures, etcd: &Figures) {
    let row = |label: &str, left: String, right: String| {
        println!("{label:<20} {left:<COLUMN$} {right}");
    };
    let heading = |title: &str| {
        println!("\n== {title} ==");
        println!("{:<20} {:<COLUMN$} etcd", "", "embedded");
    };

    heading(&format!(
        "durable txn puts ({VALUE_SIZE} B values, {PHASE:?} per level)"
    ));
    let puts = |(count, elapsed, latencies): &(usize, Duration, Vec<Duration>)| {
        let mut latencies = latencies.clone();
        format!(
            "{:>7.0} puts/s  p50 {:>8}  p99 {:>8}",
            *count as f64 / elapsed.as_secs_f64(),
            fmt(percentile(&mut latencies, 0.50)),
            fmt(percentile(&mut latencies, 0.99)),
        )
    };
    for (i, writers) in WRITER_LEVELS.iter().enumerate() {
        row(
            &format!("{writers} writer(s)"),
            puts(&embedded.puts[i]),
            puts(&etcd.puts[i]),
        );
    }

    heading(&format!("reads over {RANGE_KEYS} keys"));
    for (i, readers) in READER_LEVELS.iter().enumerate() {
        row(
            &format!("get, {readers} reader(s)"),
            format!("{:>7.0} gets/s", embedded.gets[i]),
            format!("{:>7.0} gets/s", etcd.gets[i]),
        );
    }
    let range = |times: &Vec<Duration>| {
        let mut times = times.clone();
        format!(
            "median {:>8}  best {:>8}",
            fmt(percentile(&mut times, 0.5)),
            fmt(percentile(&mut times, 0.0)),
        )
    };
    for (i, label) in ["range at latest", "range at fixed rev"].iter().enumerate() {
        row(label, range(&embedded.ranges[i]), range(&etcd.ranges[i]));
    }

    heading("watch delivery latency (txn start -> event received)");
    let watch = |latencies: &Vec<Duration>| {
        let mut latencies = latencies.clone();
        format!(
            "p50 {:>8}  p99 {:>8}  ({} events)",
            fmt(percentile(&mut latencies, 0.50)),
            fmt(percentile(&mut latencies, 0.99)),
            latencies.len(),
        )
    };
    for (i, writers) in WATCH_WRITER_LEVELS.iter().enumerate() {
        row(
            &format!("{writers} writer(s)"),
            watch(&embedded.watches[i]),
            watch(&etcd.watches[i]),
        );
    }
}

fn put(key: String, value: Bytes) -> Txn {
    Txn {
        key,
        compare: Compare::Always,
        op: Op::Put(value),
    }
}

/// Runs `writers` tasks putting fresh keys for [`PHASE`]; returns the number of puts, the
/// elapsed time and every put's latency.
async fn put_phase(
    store: &Arc<dyn Store>,
    writers: usize,
) -> BenchResult<(usize, Duration, Vec<Duration>)> {
    let value = Bytes::from(vec![b'x'; VALUE_SIZE]);
    let started = Instant::now();
    let deadline = started + PHASE;
    let mut set = JoinSet::new();
    for writer in 0..writers {
        let (store, value) = (Arc::clone(store), value.clone());
        set.spawn(async move {
            let mut latencies = Vec::new();
            for i in 0.. {
                let begun = Instant::now();
                if begun >= deadline {
                    break;
                }
                let key = format!("/bench/{writers}/{writer}/{i}");
                store.txn(put(key, value.clone())).await?;
                latencies.push(begun.elapsed());
            }
            BenchResult::Ok(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = set.join_next().await {
        latencies.extend(done??);
    }
    Ok((latencies.len(), started.elapsed(), latencies))
}

/// Writes `/range/00000` .. with 64 concurrent writers.
async fn populate(store: &Arc<dyn Store>, keys: usize) -> BenchResult {
    let value = Bytes::from(vec![b'r'; VALUE_SIZE]);
    let mut set = JoinSet::new();
    for writer in 0..64 {
        let (store, value) = (Arc::clone(store), value.clone());
        set.spawn(async move {
            for i in (writer..keys).step_by(64) {
                store
                    .txn(put(format!("/range/{i:05}"), value.clone()))
                    .await?;
            }
            BenchResult::Ok(())
        });
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok(())
}

/// Runs `readers` tasks doing point gets of the populated keys for [`PHASE`].
async fn get_phase(store: &Arc<dyn Store>, readers: usize) -> BenchResult<usize> {
    let deadline = Instant::now() + PHASE;
    let mut set = JoinSet::new();
    for reader in 0..readers {
        let store = Arc::clone(store);
        set.spawn(async move {
            let mut count = 0;
            // A cheap deterministic spread over the keys.
            let mut next = reader * 7919;
            while Instant::now() < deadline {
                next = (next + 7919) % RANGE_KEYS;
                let (kv, _) = store.get(&format!("/range/{next:05}"), 0).await?;
                assert!(kv.is_some());
                count += 1;
            }
            BenchResult::Ok(count)
        });
    }
    let mut total = 0;
    while let Some(done) = set.join_next().await {
        total += done??;
    }
    Ok(total)
}

/// Measures how long after a txn starts its event reaches a watcher, with `writers`
/// concurrent writers. The value carries the start time as nanoseconds since `epoch`.
async fn watch_phase(store: &Arc<dyn Store>, writers: usize) -> BenchResult<Vec<Duration>> {
    const PER_WRITER: usize = 200;
    let epoch = Instant::now();
    let prefix = format!("/watch/{writers}/");
    let mut stream = store.watch(&prefix, 0).await?;
    let expected = writers * PER_WRITER;
    let watcher = tokio::spawn(async move {
        let mut latencies = Vec::with_capacity(expected);
        while latencies.len() < expected {
            let event = stream.next().await.ok_or("watch ended")??;
            let received = epoch.elapsed();
            if let Event::Put { kv, .. } = event {
                let sent: u64 = std::str::from_utf8(&kv.value)?.parse()?;
                latencies.push(received.saturating_sub(Duration::from_nanos(sent)));
            }
        }
        BenchResult::Ok(latencies)
    });
    let mut set = JoinSet::new();
    for writer in 0..writers {
        let (store, prefix) = (Arc::clone(store), prefix.clone());
        set.spawn(async move {
            for i in 0..PER_WRITER {
                let sent = epoch.elapsed().as_nanos().to_string();
                store
                    .txn(put(format!("{prefix}{writer}/{i}"), Bytes::from(sent)))
                    .await?;
            }
            BenchResult::Ok(())
        });
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    watcher.await?
}

/// The `p` quantile (0..=1) of `samples`.
fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let last = samples.len().saturating_sub(1);
    samples
        .get((last as f64 * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

fn fmt(duration: Duration) -> String {
    if duration >= Duration::from_millis(1) {
        format!("{:.2}ms", duration.as_secs_f64() * 1e3)
    } else {
        format!("{:.1}µs", duration.as_secs_f64() * 1e6)
    }
}
