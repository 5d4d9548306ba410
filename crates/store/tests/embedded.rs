//! The shared behaviour suite, plus embedded-only behaviour, against [`EmbeddedStore`].

mod suite;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use krust_store::embedded::{EmbeddedOptions, EmbeddedStore};
use krust_store::{Compare, Op, Revision, Store, StoreError, Txn, TxnResult, WatchStream};
use tempfile::TempDir;

/// A store file in its own temporary directory, removed when the test ends.
struct EmbeddedFixture {
    dir: TempDir,
    options: EmbeddedOptions,
}

impl EmbeddedFixture {
    fn new() -> Self {
        Self::with_options(EmbeddedOptions::default())
    }

    fn with_options(options: EmbeddedOptions) -> Self {
        EmbeddedFixture {
            dir: tempfile::tempdir().expect("temporary directory"),
            options,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("store.redb")
    }

    fn open_embedded(&self) -> Arc<EmbeddedStore> {
        Arc::new(EmbeddedStore::open_with(self.path(), self.options.clone()).expect("open store"))
    }
}

#[async_trait]
impl suite::Fixture for EmbeddedFixture {
    async fn open(&self) -> Arc<dyn Store> {
        self.open_embedded()
    }

    /// The snapshot is a store file: opened where it lies.
    async fn restore(&self, snapshot: &std::path::Path) -> (Arc<dyn Store>, Box<dyn Send>) {
        let store = EmbeddedStore::open(snapshot).expect("opening the snapshot as a store");
        (Arc::new(store), Box::new(()))
    }
}

store_suite!(EmbeddedFixture::new());

const TIMEOUT: Duration = Duration::from_secs(20);

/// Puts a value unconditionally; returns the write's revision.
async fn put(store: &dyn Store, key: &str, value: String) -> Revision {
    let txn = Txn {
        key: key.to_owned(),
        compare: Compare::Always,
        op: Op::Put(Bytes::from(value)),
    };
    match store.txn(txn).await.expect("put") {
        TxnResult::Succeeded { revision, .. } => revision,
        failed => panic!("an unconditional put failed: {failed:?}"),
    }
}

/// A watcher that is not polled while the live channel overflows catches up from history:
/// it misses nothing and sees nothing twice, and the writers never waited for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_watcher_catches_up_from_history() {
    let fixture = EmbeddedFixture::with_options(EmbeddedOptions {
        watch_buffer: 2,
        ..Default::default()
    });
    let store = fixture.open_embedded();
    let mut stream = store.watch("/lag/", 0).await.unwrap();
    let mut written = Vec::new();
    // Sequential writes: one batch each, far more than the channel holds.
    for i in 0..50 {
        written.push(put(&*store, &format!("/lag/{}", i % 5), i.to_string()).await);
    }
    let mut seen = next_revisions(&mut stream, 25).await;
    // Fall behind again in the middle of catching up.
    for i in 0..10 {
        written.push(put(&*store, "/lag/late", i.to_string()).await);
    }
    seen.extend(next_revisions(&mut stream, written.len() - seen.len()).await);
    assert_eq!(seen, written);
    // Caught up, it waits on the channel, which still holds batches it replayed from history:
    // those are skipped. (Waiting first matters: another send would make it lag once more.)
    let (next, sentinel) = futures::join!(
        next_revisions(&mut stream, 1),
        put(&*store, "/lag/sentinel", String::new())
    );
    assert_eq!(next, [sentinel]);
}

async fn next_revisions(stream: &mut WatchStream, count: usize) -> Vec<Revision> {
    let mut out = Vec::new();
    for _ in 0..count {
        let event = tokio::time::timeout(TIMEOUT, stream.next())
            .await
            .expect("timed out")
            .expect("stream ended")
            .expect("watch failed");
        out.push(event.revision());
    }
    out
}

/// A lagging watcher whose missed history was compacted ends with `Compacted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_watcher_fails_when_history_is_compacted() {
    let fixture = EmbeddedFixture::with_options(EmbeddedOptions {
        watch_buffer: 2,
        ..Default::default()
    });
    let store = fixture.open_embedded();
    let mut stream = store.watch("/lagc/", 0).await.unwrap();
    let first = store.current_revision().await.unwrap() + 1;
    for i in 0..10 {
        put(&*store, "/lagc/k", i.to_string()).await;
    }
    let now = store.current_revision().await.unwrap();
    store.compact(now).await.unwrap();
    let item = tokio::time::timeout(TIMEOUT, stream.next())
        .await
        .expect("timed out")
        .expect("stream ended without an error");
    suite::assert_compacted(item, first);
    assert!(
        stream.next().await.is_none(),
        "the stream ends after the error"
    );
}

/// Open watch streams do not keep the file open: the store can be reopened while an old
/// stream is still around, and that stream reports the store closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_store_closes_the_file_and_its_watches() {
    let fixture = EmbeddedFixture::new();
    let store = fixture.open_embedded();
    put(&*store, "/close/a", "1".into()).await;
    let mut stream = store.watch("/close/", 0).await.unwrap();
    drop(store);

    let reopened = fixture.open_embedded();
    let item = tokio::time::timeout(TIMEOUT, stream.next())
        .await
        .expect("timed out");
    assert!(matches!(item, Some(Err(StoreError::Closed))), "{item:?}");
    assert_eq!(reopened.current_revision().await.unwrap(), 1);
    assert_eq!(put(&*reopened, "/close/a", "2".into()).await, 2);
    let kv = reopened.get("/close/a", 0).await.unwrap().0.unwrap();
    assert_eq!((kv.mod_revision, kv.version), (2, 2));
}
