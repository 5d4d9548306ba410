//! Durability under `kill -9`: every write acknowledged before the process died survives.
//!
//! The test re-executes its own binary as a child process (the `crash_child` test, which does
//! nothing unless the environment variable [`CHILD_ENV`] names a store file). The child runs
//! concurrent writers, each performing the deterministic sequence of writes [`step`] describes,
//! and prints `ack <writer> <step>` the moment a step's txn returns. The parent kills it with
//! SIGKILL mid-load, reopens the store and checks that each writer's keys hold exactly the
//! state its acknowledged steps produced.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use krust_store::embedded::EmbeddedStore;
use krust_store::{Compare, Op, Store, Txn, TxnResult};

/// Set in the child's environment to the store file it writes.
const CHILD_ENV: &str = "KRUST_STORE_CRASH_CHILD_DB";
/// Concurrent writer tasks in the child.
const WRITERS: usize = 32;
/// Acknowledged writes the parent waits for before killing the child.
const ACKS_BEFORE_KILL: usize = 3000;
const DEADLINE: Duration = Duration::from_secs(120);
/// Marks the child's acknowledgement lines among the test harness's own output.
const ACK: &str = "ack ";

/// One write of a writer's sequence.
#[derive(Debug)]
enum Step {
    /// Create a fresh key.
    Put { key: String, value: String },
    /// Delete the key the previous step created.
    Delete { key: String },
    /// Set the writer's counter key, by compare-and-swap on its last mod revision.
    Count { key: String, value: String },
}

/// Step `i` of writer `writer`: fresh puts, every fifth step deleting the previous key, and a
/// counter update in between.
fn step(writer: usize, i: u64) -> Step {
    match i % 5 {
        4 => Step::Delete {
            key: format!("/crash/{writer}/{}", i - 1),
        },
        2 => Step::Count {
            key: format!("/crash/counter/{writer}"),
            value: i.to_string(),
        },
        _ => Step::Put {
            key: format!("/crash/{writer}/{i}"),
            value: format!("v{i}"),
        },
    }
}

/// What a writer's keys hold after its steps `0..steps`.
fn model(writer: usize, steps: u64) -> BTreeMap<String, Option<String>> {
    let mut state = BTreeMap::new();
    for i in 0..steps {
        match step(writer, i) {
            Step::Put { key, value } | Step::Count { key, value } => {
                state.insert(key, Some(value));
            }
            Step::Delete { key } => {
                state.insert(key, None);
            }
        }
    }
    state
}

/// Kills the child if the parent fails before it does.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Already dead after a normal run; then both calls fail harmlessly.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The acknowledgements the parent has read.
#[derive(Default)]
struct Acks {
    /// Per writer, how many of its steps were acknowledged.
    steps_done: HashMap<usize, u64>,
    total: usize,
}

impl Acks {
    fn record(&mut self, writer: usize, step: u64) {
        let done = self.steps_done.entry(writer).or_default();
        assert_eq!(
            step, *done,
            "writer {writer} acknowledges its steps in order"
        );
        *done += 1;
        self.total += 1;
    }
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("store.redb");
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().expect("test binary path"))
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child"),
    );

    // Read the child's lines on a thread so the parent can wait with a deadline.
    let stdout = child.0.stdout.take().expect("child stdout");
    let (lines, received) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        // A line cut short by the kill has no newline and is not an acknowledgement.
        while stdout.read_line(&mut line).is_ok_and(|n| n > 0) && line.ends_with('\n') {
            // The harness may print its own text on the same line, before the marker.
            let ack = line.rfind(ACK).map(|at| &line[at + ACK.len()..]);
            let mut fields = ack
                .unwrap_or_default()
                .split_whitespace()
                .map(str::parse::<u64>);
            if let (Some(Ok(writer)), Some(Ok(step)), None) =
                (fields.next(), fields.next(), fields.next())
            {
                // The receiver only goes away once the parent has all it needs.
                let _ = lines.send((writer as usize, step));
            }
            line.clear();
        }
    });

    let mut acks = Acks::default();
    let started = Instant::now();
    while acks.total < ACKS_BEFORE_KILL {
        let left = DEADLINE.saturating_sub(started.elapsed());
        match received.recv_timeout(left) {
            Ok((writer, step)) => acks.record(writer, step),
            Err(err) => panic!(
                "child gave {} acknowledgements, then {err}; see its stderr",
                acks.total
            ),
        }
    }
    child.0.kill().expect("kill -9 the child");
    let status = child.0.wait().expect("wait for child");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "the child died of SIGKILL: {status}"
        );
    }
    reader.join().expect("reader thread");
    // Everything the child printed before it died.
    for (writer, step) in received.try_iter() {
        acks.record(writer, step);
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = EmbeddedStore::open(&path).expect("reopen after the crash");
        let revision = store.current_revision().await.unwrap();
        assert!(
            revision >= acks.total as i64,
            "{} acknowledged writes, revision {revision}",
            acks.total
        );
        for (&writer, &done) in &acks.steps_done {
            // The child may have died after a step committed but before it printed it, so
            // the writer's next step may be there too; nothing beyond it can be.
            let acknowledged = model(writer, done);
            let with_next = model(writer, done + 1);
            let mut stored = BTreeMap::new();
            for key in with_next.keys() {
                let kv = store.get(key, 0).await.unwrap().0;
                let value = kv.map(|kv| String::from_utf8(kv.value.to_vec()).unwrap());
                stored.insert(key.clone(), value);
            }
            let acknowledged_only = acknowledged
                .iter()
                .all(|(key, value)| stored.get(key) == Some(value))
                && with_next
                    .keys()
                    .all(|key| acknowledged.contains_key(key) || stored[key].is_none());
            assert!(
                acknowledged_only || stored == with_next,
                "writer {writer} acknowledged {done} steps, but the store holds {stored:?}"
            );
        }
        eprintln!(
            "{} acknowledged writes survived kill -9 (revision {revision})",
            acks.total
        );
    });
}

/// The child side of [`acknowledged_writes_survive_kill_9`]; a no-op in a normal test run.
#[test]
fn crash_child() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(path).expect("open store"));
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| tokio::spawn(write_forever(Arc::clone(&store), writer)))
            .collect();
        for writer in writers {
            writer.await.expect("writer task");
        }
    });
}

/// Performs the writer's steps until the process is killed, printing each once acknowledged.
async fn write_forever(store: Arc<dyn Store>, writer: usize) {
    let mut counter_revision = None;
    for i in 0u64.. {
        let (key, compare, op) = match step(writer, i) {
            Step::Put { key, value } => (key, Compare::Always, Op::Put(Bytes::from(value))),
            Step::Delete { key } => (key, Compare::Always, Op::Delete),
            Step::Count { key, value } => {
                let compare = counter_revision.map_or(Compare::Absent, Compare::ModRevision);
                (key, compare, Op::Put(Bytes::from(value)))
            }
        };
        let counts = matches!(compare, Compare::Absent | Compare::ModRevision(_));
        match store.txn(Txn { key, compare, op }).await.expect("txn") {
            TxnResult::Succeeded { kv, .. } => {
                if counts {
                    counter_revision = Some(kv.mod_revision);
                }
                println!("{ACK}{writer} {i}");
            }
            failed => panic!("writer {writer} step {i} failed: {failed:?}"),
        }
    }
}
