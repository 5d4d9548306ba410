//! Behaviour tests every [`Store`] backend must pass.
//!
//! Each test is a `pub async fn` taking a fresh, empty store (or, for restart tests, a
//! [`Fixture`] that can reopen one). A backend's test file instantiates them all with
//! [`store_suite!`]. Tests only use revisions the store reported, never absolute numbers, and
//! keep to their own key prefix.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use krust_store::{
    Compare, Event, KeyValue, Op, RangeRequest, Revision, Store, StoreError, Txn, TxnResult,
    WatchStream,
};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// Longest a test waits for an event or a task before failing.
const TIMEOUT: Duration = Duration::from_secs(20);

/// A backend under test.
#[async_trait]
pub trait Fixture: Send + Sync {
    /// A store over this fixture's data. Called again after every store it returned was
    /// dropped, it must return a store over the same data.
    async fn open(&self) -> Arc<dyn Store>;

    /// A store over the data of `snapshot` (a file [`Store::snapshot`] wrote), apart from
    /// this fixture's, with whatever keeps it alive.
    async fn restore(&self, snapshot: &std::path::Path) -> (Arc<dyn Store>, Box<dyn Send>);
}

/// Instantiates every suite test as a `#[tokio::test]` for a backend. `$fixture` is an
/// expression evaluated once per test that yields a fresh [`Fixture`].
#[macro_export]
macro_rules! store_suite {
    ($fixture:expr) => {
        $crate::store_suite!(@store $fixture;
            revision_bumps_once_per_successful_write,
            create_mod_revision_and_version,
            compares_absent_mod_revision_always,
            delete_resets_version_and_recreate_starts_over,
            reads_at_old_revisions,
            range_paging_is_consistent_under_writes,
            prefixes_are_isolated,
            watch_replays_history_then_follows_live,
            watch_from_zero_sees_only_new_changes,
            watch_follows_many_concurrent_writers,
            compaction_drops_old_history_and_keeps_live_keys,
            future_revisions_are_rejected,
            concurrent_cas_has_one_winner_per_round,
            concurrent_creates_have_one_winner_and_cost_one_revision,
        );
        $crate::store_suite!(@fixture $fixture;
            reopen_persists_everything,
            a_snapshot_taken_while_writing_restores_one_revision,
        );
    };
    (@store $fixture:expr; $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let fixture = $fixture;
            let store = $crate::suite::Fixture::open(&fixture).await;
            $crate::suite::$name(store).await;
        }
    )*};
    (@fixture $fixture:expr; $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let fixture = $fixture;
            $crate::suite::$name(&fixture).await;
        }
    )*};
}

// ---- helpers ----

fn bytes(value: &str) -> Bytes {
    Bytes::from(value.to_owned())
}

fn txn(key: &str, compare: Compare, op: Op) -> Txn {
    Txn {
        key: key.to_owned(),
        compare,
        op,
    }
}

fn put_op(value: &str) -> Op {
    Op::Put(bytes(value))
}

/// Runs a transaction that must succeed; returns (revision, kv, prev).
async fn succeed(store: &dyn Store, txn: Txn) -> (Revision, KeyValue, Option<KeyValue>) {
    match store.txn(txn.clone()).await.expect("txn") {
        TxnResult::Succeeded { revision, kv, prev } => (revision, kv, prev),
        failed => panic!("{txn:?} should succeed, got {failed:?}"),
    }
}

/// Runs a transaction that must fail its compare; returns (revision, current).
async fn fail(store: &dyn Store, txn: Txn) -> (Revision, Option<KeyValue>) {
    match store.txn(txn.clone()).await.expect("txn") {
        TxnResult::Failed { revision, current } => (revision, current),
        succeeded => panic!("{txn:?} should fail, got {succeeded:?}"),
    }
}

async fn put(store: &dyn Store, key: &str, value: &str) -> KeyValue {
    succeed(store, txn(key, Compare::Always, put_op(value)))
        .await
        .1
}

/// Deletes an existing key; returns the delete's revision.
async fn delete(store: &dyn Store, key: &str) -> Revision {
    succeed(store, txn(key, Compare::Always, Op::Delete))
        .await
        .0
}

async fn current(store: &dyn Store) -> Revision {
    store.current_revision().await.expect("current revision")
}

async fn get(store: &dyn Store, key: &str, revision: Revision) -> Option<KeyValue> {
    store.get(key, revision).await.expect("get").0
}

async fn range_at(store: &dyn Store, prefix: &str, revision: Revision) -> Vec<KeyValue> {
    let resp = store
        .range(RangeRequest {
            prefix: prefix.to_owned(),
            revision,
            ..RangeRequest::default()
        })
        .await
        .expect("range");
    assert!(!resp.more, "an unlimited range has nothing more");
    resp.kvs
}

/// Reads a whole prefix at `revision` in pages of `limit`, checking each page's metadata.
async fn page_through(
    store: &dyn Store,
    prefix: &str,
    revision: Revision,
    limit: usize,
) -> Vec<KeyValue> {
    let mut out: Vec<KeyValue> = Vec::new();
    loop {
        let resp = store
            .range(RangeRequest {
                prefix: prefix.to_owned(),
                start_after: out.last().map(|kv| kv.key.clone()),
                limit,
                revision,
            })
            .await
            .expect("range page");
        assert_eq!(
            resp.revision, revision,
            "a page is read at the requested revision"
        );
        assert!(resp.kvs.len() <= limit, "a page holds at most `limit` keys");
        out.extend(resp.kvs.iter().cloned());
        if !resp.more {
            return out;
        }
        assert_eq!(resp.kvs.len(), limit, "only a full page can have more");
    }
}

async fn next_event(stream: &mut WatchStream) -> Event {
    tokio::time::timeout(TIMEOUT, stream.next())
        .await
        .expect("timed out waiting for a watch event")
        .expect("watch stream ended")
        .expect("watch stream failed")
}

async fn events(stream: &mut WatchStream, count: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(next_event(stream).await);
    }
    out
}

/// Asserts that a call failed because `requested` is below the compacted revision.
pub fn assert_compacted<T>(result: Result<T, StoreError>, requested: Revision) {
    match result {
        Err(StoreError::Compacted { requested: got, .. }) => assert_eq!(got, requested),
        Err(other) => panic!("expected Compacted for revision {requested}, got {other:?}"),
        Ok(_) => panic!("expected Compacted for revision {requested}, got a result"),
    }
}

/// Asserts that a call failed because `requested` is one past the current revision.
fn assert_future<T>(result: Result<T, StoreError>, requested: Revision) {
    match result {
        Err(StoreError::FutureRevision {
            requested: got,
            current,
        }) => {
            assert_eq!(got, requested);
            assert_eq!(current, requested - 1);
        }
        Err(other) => panic!("expected FutureRevision for revision {requested}, got {other:?}"),
        Ok(_) => panic!("expected FutureRevision for revision {requested}, got a result"),
    }
}

async fn join_all<T: Send + 'static>(mut set: JoinSet<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(done) = tokio::time::timeout(TIMEOUT, set.join_next())
        .await
        .expect("timed out waiting for tasks")
    {
        out.push(done.expect("task panicked"));
    }
    out
}

// ---- tests ----

pub async fn revision_bumps_once_per_successful_write(store: Arc<dyn Store>) {
    let store = &*store;
    let base = current(store).await;

    let a = put(store, "/rev/a", "1").await;
    assert_eq!(a.mod_revision, base + 1);
    assert_eq!(current(store).await, base + 1);

    // Failed compares cost nothing and report the revision they read at.
    let (revision, existing) = fail(store, txn("/rev/a", Compare::Absent, put_op("x"))).await;
    assert_eq!((revision, existing), (base + 1, Some(a.clone())));
    fail(
        store,
        txn("/rev/a", Compare::ModRevision(base + 100), put_op("x")),
    )
    .await;
    let (revision, missing) = fail(store, txn("/rev/missing", Compare::Always, Op::Delete)).await;
    assert_eq!((revision, missing), (base + 1, None));
    assert_eq!(current(store).await, base + 1);

    assert_eq!(put(store, "/rev/b", "1").await.mod_revision, base + 2);
    assert_eq!(delete(store, "/rev/a").await, base + 3);
    assert_eq!(current(store).await, base + 3);
    assert_eq!(store.get("/rev/a", 0).await.unwrap(), (None, base + 3));
}

pub async fn create_mod_revision_and_version(store: Arc<dyn Store>) {
    let store = &*store;
    let (r1, v1, prev) = succeed(store, txn("/meta/k", Compare::Always, put_op("1"))).await;
    assert_eq!(prev, None);
    assert_eq!(
        v1,
        KeyValue {
            key: "/meta/k".into(),
            value: bytes("1"),
            create_revision: r1,
            mod_revision: r1,
            version: 1,
        }
    );
    // A write to another key moves the store revision but not this key's metadata.
    let other = put(store, "/meta/other", "x").await;
    assert_eq!(get(store, "/meta/k", 0).await, Some(v1.clone()));

    let (r2, v2, prev) = succeed(store, txn("/meta/k", Compare::Always, put_op("2"))).await;
    assert_eq!(r2, other.mod_revision + 1);
    assert_eq!(prev, Some(v1.clone()));
    assert_eq!(
        (v2.create_revision, v2.mod_revision, v2.version),
        (r1, r2, 2)
    );

    let (r3, v3, prev) = succeed(store, txn("/meta/k", Compare::Always, put_op("3"))).await;
    assert_eq!(prev, Some(v2));
    assert_eq!(
        (v3.create_revision, v3.mod_revision, v3.version),
        (r1, r3, 3)
    );
    assert_eq!(&v3.value[..], b"3");
    assert_eq!(store.get("/meta/k", 0).await.unwrap(), (Some(v3), r3));
}

pub async fn compares_absent_mod_revision_always(store: Arc<dyn Store>) {
    let store = &*store;
    let key = "/cmp/k";

    let (_, created, _) = succeed(store, txn(key, Compare::Absent, put_op("1"))).await;
    let (_, current_kv) = fail(store, txn(key, Compare::Absent, put_op("2"))).await;
    assert_eq!(current_kv, Some(created.clone()));

    let (_, updated, _) = succeed(
        store,
        txn(key, Compare::ModRevision(created.mod_revision), put_op("2")),
    )
    .await;
    // The old mod revision is now stale, for puts and deletes alike.
    let (_, current_kv) = fail(
        store,
        txn(key, Compare::ModRevision(created.mod_revision), put_op("3")),
    )
    .await;
    assert_eq!(current_kv, Some(updated.clone()));
    fail(
        store,
        txn(key, Compare::ModRevision(created.mod_revision), Op::Delete),
    )
    .await;
    assert_eq!(get(store, key, 0).await, Some(updated.clone()));

    // ModRevision on a missing key never holds.
    let (_, missing) = fail(
        store,
        txn(
            "/cmp/missing",
            Compare::ModRevision(updated.mod_revision),
            put_op("x"),
        ),
    )
    .await;
    assert_eq!(missing, None);
    // Absent with a delete of a missing key: nothing to delete.
    fail(store, txn("/cmp/missing", Compare::Absent, Op::Delete)).await;

    let (_, always, prev) = succeed(store, txn(key, Compare::Always, put_op("4"))).await;
    assert_eq!(prev, Some(updated));
    assert_eq!(always.version, 3);
    let (_, fresh, prev) = succeed(store, txn("/cmp/new", Compare::Always, put_op("x"))).await;
    assert_eq!((fresh.version, prev), (1, None));

    succeed(
        store,
        txn(key, Compare::ModRevision(always.mod_revision), Op::Delete),
    )
    .await;
    assert_eq!(get(store, key, 0).await, None);
}

pub async fn delete_resets_version_and_recreate_starts_over(store: Arc<dyn Store>) {
    let store = &*store;
    let key = "/del/k";
    let v1 = put(store, key, "1").await;
    let v2 = put(store, key, "2").await;

    let (revision, kv, prev) = succeed(store, txn(key, Compare::Always, Op::Delete)).await;
    assert_eq!(revision, v2.mod_revision + 1);
    assert_eq!(prev, Some(v2.clone()));
    assert_eq!(
        kv,
        KeyValue {
            mod_revision: revision,
            ..v2.clone()
        },
        "a delete reports the deleted value at the delete's revision"
    );
    assert_eq!(store.get(key, 0).await.unwrap(), (None, revision));
    assert!(range_at(store, "/del/", 0).await.is_empty());
    let (_, gone) = fail(store, txn(key, Compare::Always, Op::Delete)).await;
    assert_eq!(gone, None);

    let (recreated_at, recreated, prev) =
        succeed(store, txn(key, Compare::Absent, put_op("3"))).await;
    assert_eq!(prev, None, "a recreated key has no previous value");
    assert_eq!(
        (recreated.create_revision, recreated.version),
        (recreated_at, 1)
    );
    assert_ne!(recreated.create_revision, v1.create_revision);
    let again = put(store, key, "4").await;
    assert_eq!((again.create_revision, again.version), (recreated_at, 2));

    // The old incarnation is still readable at old revisions.
    assert_eq!(get(store, key, revision - 1).await, Some(v2));
    assert_eq!(get(store, key, revision).await, None);
}

pub async fn reads_at_old_revisions(store: Arc<dyn Store>) {
    let store = &*store;
    let a1 = put(store, "/old/a", "1").await;
    let b1 = put(store, "/old/b", "1").await;
    let a2 = put(store, "/old/a", "2").await;
    let b_deleted = delete(store, "/old/b").await;
    let c1 = put(store, "/old/c", "1").await;
    let (r1, r2, r3, r5) = (
        a1.mod_revision,
        b1.mod_revision,
        a2.mod_revision,
        c1.mod_revision,
    );

    for (at, expected) in [(r1, &a1), (r2, &a1), (r3, &a2), (r5, &a2)] {
        assert_eq!(
            store.get("/old/a", at).await.unwrap(),
            (Some(expected.clone()), at)
        );
    }
    assert_eq!(get(store, "/old/b", r1).await, None, "not yet created");
    assert_eq!(get(store, "/old/b", r3).await, Some(b1.clone()));
    assert_eq!(get(store, "/old/b", b_deleted).await, None);

    assert_eq!(range_at(store, "/old/", r1).await, vec![a1.clone()]);
    assert_eq!(range_at(store, "/old/", r2).await, vec![a1, b1.clone()]);
    assert_eq!(range_at(store, "/old/", r3).await, vec![a2.clone(), b1]);
    assert_eq!(range_at(store, "/old/", b_deleted).await, vec![a2.clone()]);
    assert_eq!(range_at(store, "/old/", 0).await, vec![a2, c1]);

    let latest = store
        .range(RangeRequest {
            prefix: "/old/".into(),
            ..RangeRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(
        latest.revision, r5,
        "revision 0 reads at the latest revision"
    );
}

pub async fn range_paging_is_consistent_under_writes(store: Arc<dyn Store>) {
    for i in 0..40 {
        put(&*store, &format!("/page/{i:03}"), &format!("v0-{i}")).await;
    }
    let at = current(&*store).await;
    let expected = range_at(&*store, "/page/", at).await;
    assert_eq!(expected.len(), 40);

    let writer = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            for i in 0..40 {
                let key = format!("/page/{i:03}");
                match i % 3 {
                    0 => {
                        put(&*store, &key, "v1").await;
                    }
                    1 => {
                        delete(&*store, &key).await;
                    }
                    _ => {
                        put(&*store, &format!("{key}-new"), "v1").await;
                    }
                }
            }
        })
    };
    // Page through the fixed revision again and again while the writer runs.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        assert!(tokio::time::Instant::now() < deadline, "writer is stuck");
        let finished = writer.is_finished();
        assert_eq!(page_through(&*store, "/page/", at, 7).await, expected);
        if finished {
            break;
        }
    }
    tokio::time::timeout(TIMEOUT, writer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(page_through(&*store, "/page/", at, 7).await, expected);
    assert_eq!(page_through(&*store, "/page/", at, 8).await, expected);
    let now = current(&*store).await;
    let latest = page_through(&*store, "/page/", now, 7).await;
    assert_eq!(latest, range_at(&*store, "/page/", 0).await);
    assert_ne!(latest, expected, "the writes did change the latest view");

    // `more` is exact: a limit equal to the key count leaves nothing more.
    let page = |limit| RangeRequest {
        prefix: "/page/".into(),
        limit,
        revision: at,
        ..RangeRequest::default()
    };
    assert!(!store.range(page(40)).await.unwrap().more);
    let short = store.range(page(39)).await.unwrap();
    assert!(short.more);
    assert_eq!(short.kvs[..], expected[..39]);
}

pub async fn prefixes_are_isolated(store: Arc<dyn Store>) {
    let store = &*store;
    let start = current(store).await + 1;
    for key in ["/p/a/1", "/p/ab", "/p/a", "/p/a/2", "/p/b/1"] {
        put(store, key, key).await;
    }
    let keys = |kvs: Vec<KeyValue>| kvs.into_iter().map(|kv| kv.key).collect::<Vec<_>>();
    assert_eq!(
        keys(range_at(store, "/p/a/", 0).await),
        ["/p/a/1", "/p/a/2"]
    );
    assert_eq!(
        keys(range_at(store, "/p/a", 0).await),
        ["/p/a", "/p/a/1", "/p/a/2", "/p/ab"]
    );
    assert_eq!(keys(range_at(store, "/p/b/", 0).await), ["/p/b/1"]);
    assert!(range_at(store, "/p/c", 0).await.is_empty());
    assert_eq!(get(store, "/p/a/", 0).await, None, "a prefix is not a key");

    // Replayed history is filtered too...
    let mut replay = store.watch("/p/a/", start).await.unwrap();
    let replayed: Vec<_> = events(&mut replay, 2).await;
    let replayed: Vec<_> = replayed.iter().map(Event::key).collect();
    assert_eq!(replayed, ["/p/a/1", "/p/a/2"]);
    // ...and so are live events: neighbours of the prefix are skipped.
    let mut live = store.watch("/p/a/", 0).await.unwrap();
    put(store, "/p/ab", "2").await;
    put(store, "/p/a", "2").await;
    put(store, "/p/b/1", "2").await;
    let inside = put(store, "/p/a/3", "1").await;
    for stream in [&mut replay, &mut live] {
        match next_event(stream).await {
            Event::Put { kv, prev: None } => assert_eq!(kv, inside),
            other => panic!("expected the put of /p/a/3, got {other:?}"),
        }
    }
}

pub async fn watch_replays_history_then_follows_live(store: Arc<dyn Store>) {
    let store = &*store;
    let a1 = put(store, "/w/a", "1").await;
    let a2 = put(store, "/w/a", "2").await;
    let a_deleted = delete(store, "/w/a").await;
    let b1 = put(store, "/w/b", "1").await;

    let mut stream = store.watch("/w/", a2.mod_revision).await.unwrap();
    assert_eq!(
        events(&mut stream, 3).await,
        [
            Event::Put {
                kv: a2.clone(),
                prev: Some(a1),
            },
            Event::Delete {
                prev: a2,
                revision: a_deleted,
            },
            Event::Put {
                kv: b1.clone(),
                prev: None,
            },
        ]
    );
    let b2 = put(store, "/w/b", "2").await;
    let a_again = put(store, "/w/a", "3").await;
    assert_eq!(
        events(&mut stream, 2).await,
        [
            Event::Put {
                kv: b2,
                prev: Some(b1),
            },
            Event::Put {
                kv: a_again,
                prev: None,
            },
        ]
    );
}

pub async fn watch_from_zero_sees_only_new_changes(store: Arc<dyn Store>) {
    let store = &*store;
    let a1 = put(store, "/wz/a", "1").await;
    let mut stream = store.watch("/wz/", 0).await.unwrap();
    let a2 = put(store, "/wz/a", "2").await;
    let deleted = delete(store, "/wz/a").await;
    let b1 = put(store, "/wz/b", "1").await;
    let first = next_event(&mut stream).await;
    assert_eq!(
        first,
        Event::Put {
            kv: a2.clone(),
            prev: Some(a1),
        },
        "the write before the watch is not delivered"
    );
    assert_eq!(
        events(&mut stream, 2).await,
        [
            Event::Delete {
                prev: a2,
                revision: deleted,
            },
            Event::Put { kv: b1, prev: None },
        ]
    );
}

pub async fn watch_follows_many_concurrent_writers(store: Arc<dyn Store>) {
    const WRITERS: usize = 8;
    const WRITES: usize = 30;
    let start = current(&*store).await + 1;
    let mut live = store.watch("/cw/", 0).await.unwrap();

    let mut set = JoinSet::new();
    for writer in 0..WRITERS {
        let store = Arc::clone(&store);
        set.spawn(async move {
            let mut acked = Vec::new();
            for i in 0..WRITES {
                // Every fourth write deletes the key written just before.
                let (key, op) = if i % 4 == 3 {
                    (format!("/cw/{writer}/{}", (i - 1) % 3), Op::Delete)
                } else {
                    (format!("/cw/{writer}/{}", i % 3), put_op(&i.to_string()))
                };
                let (revision, _, _) = succeed(&*store, txn(&key, Compare::Always, op)).await;
                acked.push((revision, key));
            }
            acked
        });
    }
    {
        // Writes outside the prefix interleave but must not show up.
        let store = Arc::clone(&store);
        set.spawn(async move {
            for i in 0..WRITES {
                put(&*store, &format!("/cx/{i}"), "noise").await;
            }
            Vec::new()
        });
    }
    // A watcher that starts from the past while the writers are busy: its history replay
    // overlaps the live events it subscribed to, and must not deliver those twice.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while current(&*store).await < start + 40 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "writers made no progress"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut midway = store.watch("/cw/", start).await.unwrap();

    let expected: BTreeMap<Revision, String> = join_all(set).await.into_iter().flatten().collect();
    assert_eq!(expected.len(), WRITERS * WRITES);

    let seen = events(&mut live, expected.len()).await;
    let revisions: Vec<Revision> = seen.iter().map(Event::revision).collect();
    assert!(
        revisions.windows(2).all(|pair| pair[0] < pair[1]),
        "revisions strictly increase"
    );
    let got: BTreeMap<Revision, String> = seen
        .iter()
        .map(|event| (event.revision(), event.key().to_owned()))
        .collect();
    assert_eq!(got, expected, "exactly the acknowledged writes, no gaps");

    // Each event's prev is the key's previous event in the stream.
    let mut last: HashMap<&str, &Event> = HashMap::new();
    for event in &seen {
        let prev = match event {
            Event::Put { prev, .. } => prev.as_ref(),
            Event::Delete { prev, .. } => Some(prev),
        };
        match last.insert(event.key(), event) {
            Some(Event::Put { kv, .. }) => assert_eq!(prev, Some(kv)),
            Some(Event::Delete { .. }) | None => assert_eq!(prev, None),
        }
    }

    // The midway watcher replays what it missed, then skips the live events it replayed.
    assert_eq!(events(&mut midway, seen.len()).await, seen);

    // Nothing else arrives: the next event is a sentinel written now.
    let sentinel = put(&*store, "/cw/sentinel", "end").await;
    assert_eq!(
        next_event(&mut live).await.revision(),
        sentinel.mod_revision
    );
    assert_eq!(
        next_event(&mut midway).await.revision(),
        sentinel.mod_revision
    );

    // Replaying the same revisions from history yields the very same events.
    let mut replay = store.watch("/cw/", start).await.unwrap();
    assert_eq!(events(&mut replay, seen.len()).await, seen);
    assert_eq!(
        next_event(&mut replay).await.revision(),
        sentinel.mod_revision
    );
}

pub async fn compaction_drops_old_history_and_keeps_live_keys(store: Arc<dyn Store>) {
    let store = &*store;
    let a1 = put(store, "/c/a", "1").await;
    let a2 = put(store, "/c/a", "2").await;
    put(store, "/c/b", "1").await;
    let b_deleted = delete(store, "/c/b").await;
    let c1 = put(store, "/c/c", "1").await;
    let at = c1.mod_revision;
    let a3 = put(store, "/c/a", "3").await;

    store.compact(at).await.unwrap();
    assert_eq!(store.compacted_revision().await.unwrap(), at);

    // Below the compacted revision: gone.
    assert_compacted(store.get("/c/a", at - 1).await, at - 1);
    assert_compacted(store.get("/c/a", a1.mod_revision).await, a1.mod_revision);
    let old_range = store
        .range(RangeRequest {
            prefix: "/c/".into(),
            revision: b_deleted,
            ..RangeRequest::default()
        })
        .await;
    assert_compacted(old_range, b_deleted);
    assert_compacted(store.watch("/c/", at).await, at);
    assert_compacted(store.watch("/c/", a1.mod_revision).await, a1.mod_revision);

    // At the compacted revision: the newest value of each key is still there.
    assert_eq!(
        range_at(store, "/c/", at).await,
        vec![a2.clone(), c1.clone()]
    );
    assert_eq!(get(store, "/c/b", at).await, None);
    assert_eq!(range_at(store, "/c/", 0).await, vec![a3.clone(), c1]);

    // Watching from just after it works and still knows the previous value.
    let mut stream = store.watch("/c/", at + 1).await.unwrap();
    assert_eq!(
        next_event(&mut stream).await,
        Event::Put {
            kv: a3.clone(),
            prev: Some(a2),
        }
    );

    // Compacting again at or below, or in the future, is refused.
    assert_compacted(store.compact(at).await, at);
    let next = current(store).await + 1;
    assert_future(store.compact(next).await, next);

    // Writes carry on, on top of the surviving history.
    let a4 = put(store, "/c/a", "4").await;
    assert_eq!((a4.create_revision, a4.version), (a1.create_revision, 4));
    assert_eq!(a4.mod_revision, a3.mod_revision + 1);
    match next_event(&mut stream).await {
        Event::Put { kv, prev } => assert_eq!((kv, prev), (a4, Some(a3))),
        other => panic!("expected the put of /c/a, got {other:?}"),
    }
}

pub async fn future_revisions_are_rejected(store: Arc<dyn Store>) {
    let store = &*store;
    let kv = put(store, "/fut/a", "1").await;
    let now = current(store).await;
    assert_eq!(now, kv.mod_revision);
    assert_future(store.get("/fut/a", now + 1).await, now + 1);
    let range = store
        .range(RangeRequest {
            prefix: "/fut/".into(),
            revision: now + 1,
            ..RangeRequest::default()
        })
        .await;
    assert_future(range, now + 1);
    assert_eq!(get(store, "/fut/a", now).await, Some(kv));
}

pub async fn concurrent_cas_has_one_winner_per_round(store: Arc<dyn Store>) {
    const CONTENDERS: usize = 8;
    let key = "/cas/k";
    let mut latest = put(&*store, key, "start").await;
    for round in 0..8 {
        let before = current(&*store).await;
        let barrier = Arc::new(Barrier::new(CONTENDERS));
        let mut set = JoinSet::new();
        for contender in 0..CONTENDERS {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            let seen = latest.mod_revision;
            set.spawn(async move {
                barrier.wait().await;
                let value = format!("{round}-{contender}");
                store
                    .txn(txn(key, Compare::ModRevision(seen), put_op(&value)))
                    .await
                    .expect("txn")
            });
        }
        let results = join_all(set).await;
        let winners: Vec<KeyValue> = results
            .iter()
            .filter_map(|result| match result {
                TxnResult::Succeeded { kv, .. } => Some(kv.clone()),
                TxnResult::Failed { .. } => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let winner = winners[0].clone();
        for result in &results {
            if let TxnResult::Failed { current, .. } = result {
                assert_eq!(current.as_ref(), Some(&winner), "losers see the winner");
            }
        }
        assert_eq!(winner.version, latest.version + 1);
        assert_eq!(current(&*store).await, before + 1, "one revision per round");
        assert_eq!(get(&*store, key, 0).await, Some(winner.clone()));
        latest = winner;
    }
}

pub async fn concurrent_creates_have_one_winner_and_cost_one_revision(store: Arc<dyn Store>) {
    const CONTENDERS: usize = 16;
    let before = current(&*store).await;
    let barrier = Arc::new(Barrier::new(CONTENDERS));
    let mut set = JoinSet::new();
    for contender in 0..CONTENDERS {
        let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
        set.spawn(async move {
            barrier.wait().await;
            let value = contender.to_string();
            store
                .txn(txn("/race/k", Compare::Absent, put_op(&value)))
                .await
                .expect("txn")
        });
    }
    let results = join_all(set).await;
    let created: Vec<&KeyValue> = results
        .iter()
        .filter_map(|result| match result {
            TxnResult::Succeeded { kv, .. } => Some(kv),
            TxnResult::Failed { .. } => None,
        })
        .collect();
    assert_eq!(created.len(), 1, "{results:?}");
    assert_eq!(created[0].mod_revision, before + 1);
    assert_eq!(current(&*store).await, before + 1);
    for result in &results {
        if let TxnResult::Failed { revision, current } = result {
            assert_eq!(
                (*revision, current.as_ref()),
                (before + 1, Some(created[0]))
            );
        }
    }
}

pub async fn reopen_persists_everything(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let a1 = put(&*store, "/re/a", "1").await;
    put(&*store, "/re/b", "1").await;
    put(&*store, "/re/a", "2").await;
    let b_deleted = delete(&*store, "/re/b").await;
    let c1 = put(&*store, "/re/c", "1").await;
    store.compact(a1.mod_revision + 2).await.unwrap();
    put(&*store, "/re/a", "3").await;
    delete(&*store, "/re/c").await;

    let revision = current(&*store).await;
    let compacted = store.compacted_revision().await.unwrap();
    let latest = range_at(&*store, "/re/", 0).await;
    let at_compacted = range_at(&*store, "/re/", compacted).await;
    let at_c1 = range_at(&*store, "/re/", c1.mod_revision).await;
    let mut stream = store.watch("/re/", b_deleted).await.unwrap();
    let history = events(&mut stream, 4).await;
    drop(stream);
    drop(store);

    let store = fixture.open().await;
    assert_eq!(current(&*store).await, revision);
    assert_eq!(store.compacted_revision().await.unwrap(), compacted);
    assert_eq!(range_at(&*store, "/re/", 0).await, latest);
    assert_eq!(range_at(&*store, "/re/", compacted).await, at_compacted);
    assert_eq!(range_at(&*store, "/re/", c1.mod_revision).await, at_c1);
    assert_compacted(store.get("/re/a", compacted - 1).await, compacted - 1);
    assert_compacted(store.watch("/re/", compacted).await, compacted);
    let mut stream = store.watch("/re/", b_deleted).await.unwrap();
    assert_eq!(events(&mut stream, 4).await, history);

    // Writing continues where it left off, with each key's metadata intact.
    let a4 = put(&*store, "/re/a", "4").await;
    assert_eq!(
        (a4.mod_revision, a4.create_revision, a4.version),
        (revision + 1, a1.create_revision, 4)
    );
    assert_eq!(next_event(&mut stream).await.revision(), a4.mod_revision);

    // Compacting away everything, including a tombstone at the newest revision, keeps the
    // revision across a restart.
    delete(&*store, "/re/a").await;
    let revision = current(&*store).await;
    store.compact(revision).await.unwrap();
    drop(stream);
    drop(store);
    let store = fixture.open().await;
    assert_eq!(current(&*store).await, revision);
    assert_eq!(store.compacted_revision().await.unwrap(), revision);
    assert!(range_at(&*store, "/re/a", 0).await.is_empty());
    assert_eq!(put(&*store, "/re/a", "5").await.mod_revision, revision + 1);
}

/// A snapshot taken while writers write and delete is the store as of one revision: the
/// restored store's revision is one the original passed, its keys are exactly the
/// original's at that revision (with their metadata), and writing goes on from there.
pub async fn a_snapshot_taken_while_writing_restores_one_revision(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("snapshot");
    let before = put(&*store, "/snap/before", "1").await;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for i in 0..150 {
                    let key = format!("/snap/w{w}/{}", i % 40);
                    if i % 7 == 6 {
                        let _ = store.txn(txn(&key, Compare::Always, Op::Delete)).await;
                    } else {
                        put(&*store, &key, &format!("{i}")).await;
                    }
                }
            })
        })
        .collect();
    // Once the writers are under way.
    while current(&*store).await < before.mod_revision + 50 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let size = store.snapshot(&path).await.expect("snapshot");
    assert_eq!(
        size,
        std::fs::metadata(&path).expect("the snapshot file").len()
    );
    for writer in writers {
        writer.await.expect("writer");
    }
    let last = current(&*store).await;

    let (restored, _keep) = fixture.restore(&path).await;
    let revision = current(&*restored).await;
    // The snapshot was taken once the store had reached `before + 50`.
    assert!(
        revision >= before.mod_revision + 50 && revision <= last,
        "restored at {revision}, outside [{}, {last}]",
        before.mod_revision + 50
    );
    assert_eq!(
        range_at(&*restored, "/snap/", 0).await,
        range_at(&*store, "/snap/", revision).await,
        "the restored keys are the original's at revision {revision}"
    );
    let next = put(&*restored, "/snap/after", "1").await;
    assert_eq!(next.mod_revision, revision + 1);
    assert!(
        get(&*store, "/snap/after", 0).await.is_none(),
        "the copies are apart"
    );
}
