//! The shared behaviour suite, plus etcd-only behaviour, against [`EtcdStore`] on real etcd
//! processes (see `krust_store::etcd::testing`). Without an etcd binary these tests fail; they never skip.

mod suite;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use krust_store::etcd::{EtcdStore, EtcdTls};
use krust_store::{
    Compare, Event, KeyValue, Op, RangeRequest, Revision, Store, StoreError, Txn, TxnResult,
};
use tokio::task::JoinSet;

use krust_store::etcd::testing::{self, EtcdCluster, ServerTls};

/// The suite's stores keep their keys under this prefix, so that it also checks that the
/// prefix is added to every key and stripped from every answer.
const PREFIX: &str = "/krust-test";
const TIMEOUT: Duration = Duration::from_secs(30);

/// A fresh single-member etcd per test: the suite checks revision deltas, which only hold
/// when nobody else writes.
struct EtcdFixture {
    cluster: EtcdCluster,
}

impl EtcdFixture {
    async fn start() -> Self {
        EtcdFixture {
            cluster: EtcdCluster::start(1).await,
        }
    }
}

#[async_trait]
impl suite::Fixture for EtcdFixture {
    /// "Reopening" is connecting again: the data lives in etcd.
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(self.cluster.store(PREFIX).await)
    }

    /// A new one-member cluster restored from the snapshot, as a server restoring does.
    async fn restore(&self, snapshot: &Path) -> (Arc<dyn Store>, Box<dyn Send>) {
        let cluster = EtcdCluster::restore(snapshot).await;
        (Arc::new(cluster.store(PREFIX).await), Box::new(cluster))
    }
}

store_suite!(EtcdFixture::start().await);

// ---- helpers ----

fn put_txn(key: &str, compare: Compare, value: impl Into<Bytes>) -> Txn {
    Txn {
        key: key.to_owned(),
        compare,
        op: Op::Put(value.into()),
    }
}

/// Puts a value unconditionally; returns the key-value written.
async fn put(store: &dyn Store, key: &str, value: &str) -> KeyValue {
    let txn = put_txn(key, Compare::Always, value.to_owned());
    match store.txn(txn).await.expect("put") {
        TxnResult::Succeeded { kv, .. } => kv,
        failed => panic!("an unconditional put failed: {failed:?}"),
    }
}

async fn range(store: &dyn Store, prefix: &str) -> Vec<KeyValue> {
    let resp = store
        .range(RangeRequest {
            prefix: prefix.to_owned(),
            ..RangeRequest::default()
        })
        .await
        .expect("range");
    resp.kvs
}

/// Waits until `counter` reaches `target`, failing after [`TIMEOUT`].
async fn wait_for(counter: &AtomicUsize, target: usize, what: &str) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while counter.load(Ordering::Relaxed) < target {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {} of {target} writes acknowledged",
            counter.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---- etcd-only tests ----

/// Writers keep creating keys through a 3-member cluster while its leader is killed with
/// SIGKILL and restarted. Every write that was acknowledged must then be readable, with the
/// metadata it was acknowledged with, through the restarted member alone (a linearizable read
/// there needs it to have caught up). Writes that failed may or may not have happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_every_acknowledged_write_across_a_member_restart() {
    const WRITERS: usize = 8;
    const STEP: usize = 200;
    let mut cluster = EtcdCluster::start(3).await;
    let store: Arc<dyn Store> = Arc::new(cluster.store("").await);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));

    let mut writers = JoinSet::new();
    for writer in 0..WRITERS {
        let (store, stop, acked, failed) = (
            Arc::clone(&store),
            Arc::clone(&stop),
            Arc::clone(&acked),
            Arc::clone(&failed),
        );
        writers.spawn(async move {
            let mut written = Vec::new();
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // A fresh key each time, so a write that failed but did happen never makes a
                // later one fail its compare.
                let key = format!("/ha/{writer}/{i:06}");
                match store
                    .txn(put_txn(&key, Compare::Absent, i.to_string()))
                    .await
                {
                    Ok(TxnResult::Succeeded { kv, .. }) => {
                        written.push(kv);
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(TxnResult::Failed { current, .. }) => {
                        panic!("creating the fresh key {key} failed, it holds {current:?}")
                    }
                    Err(err) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        // Shown with the output of a failing test.
                        eprintln!("write of {key} failed: {err}");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            written
        });
    }

    wait_for(&acked, STEP, "before the kill").await;
    let victim = cluster.leader().await;
    cluster.kill(victim);
    let at_kill = acked.load(Ordering::Relaxed);
    wait_for(&acked, at_kill + STEP, "with the leader killed").await;
    cluster.restart(victim).await;
    let at_restart = acked.load(Ordering::Relaxed);
    wait_for(&acked, at_restart + STEP, "after the restart").await;
    stop.store(true, Ordering::Relaxed);

    let mut written = BTreeMap::new();
    while let Some(done) = writers.join_next().await {
        for kv in done.expect("writer panicked") {
            written.insert(kv.key.clone(), kv);
        }
    }
    eprintln!(
        "{} writes acknowledged, {} failed; member {victim} (the leader) killed after {at_kill}, \
         restarted after {at_restart}",
        written.len(),
        failed.load(Ordering::Relaxed)
    );

    let restarted = EtcdStore::connect(&[cluster.endpoint(victim)], "", None)
        .await
        .expect("connecting to the restarted member");
    let stored: BTreeMap<String, KeyValue> = range(&restarted, "/ha/")
        .await
        .into_iter()
        .map(|kv| (kv.key.clone(), kv))
        .collect();
    for (key, kv) in &written {
        assert_eq!(stored.get(key), Some(kv), "acknowledged write of {key}");
    }
    // Through the whole cluster, the same.
    assert_eq!(
        range(&*store, "/ha/").await,
        stored.into_values().collect::<Vec<_>>()
    );
}

/// Stores with different prefixes share one etcd without seeing each other; the keys are in
/// etcd under the prefixes, with the same revisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_under_different_prefixes_share_one_etcd() {
    let cluster = EtcdCluster::start(1).await;
    let a = cluster.store("/a").await;
    let b = cluster.store("/b").await;
    let raw = cluster.store("").await;

    let mut b_watch = b.watch("/registry/", 0).await.unwrap();
    let from_a = put(&a, "/registry/x", "from a").await;
    let from_b = put(&b, "/registry/x", "from b").await;
    assert_eq!(from_a.key, "/registry/x");
    assert_eq!(from_b.mod_revision, from_a.mod_revision + 1);
    assert_eq!(
        a.get("/registry/x", 0).await.unwrap().0,
        Some(from_a.clone())
    );
    assert_eq!(range(&b, "/registry/").await, vec![from_b.clone()]);

    let keys: Vec<String> = range(&raw, "").await.into_iter().map(|kv| kv.key).collect();
    assert_eq!(keys, ["/a/registry/x", "/b/registry/x"]);
    let (raw_a, _) = raw.get("/a/registry/x", 0).await.unwrap();
    assert_eq!(
        raw_a,
        Some(KeyValue {
            key: "/a/registry/x".into(),
            ..from_a
        })
    );

    let event = tokio::time::timeout(TIMEOUT, b_watch.next())
        .await
        .expect("timed out")
        .expect("stream ended")
        .expect("watch failed");
    assert_eq!(
        event,
        Event::Put {
            kv: from_b,
            prev: None
        }
    );
}

/// Another store (another apiserver) compacting is seen: the compacted revision is etcd's, not
/// this process's memory of its own compactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_by_another_store_is_seen() {
    let cluster = EtcdCluster::start(1).await;
    let compactor = cluster.store(PREFIX).await;
    let observer = cluster.store(PREFIX).await;
    let mut revisions = Vec::new();
    for i in 0..20 {
        revisions.push(
            put(&compactor, "/other/k", &i.to_string())
                .await
                .mod_revision,
        );
    }
    assert_eq!(observer.compacted_revision().await.unwrap(), 0);

    for at in [revisions[9], revisions[12], revisions[19]] {
        compactor.compact(at).await.unwrap();
        assert_eq!(observer.compacted_revision().await.unwrap(), at);
        match observer.get("/other/k", at - 1).await {
            Err(StoreError::Compacted {
                requested,
                compacted,
            }) => assert_eq!((requested, compacted), (at - 1, at)),
            other => panic!("expected Compacted below {at}, got {other:?}"),
        }
        suite::assert_compacted(observer.watch("/other/", at).await, at);
        let (kv, _) = observer.get("/other/k", at).await.unwrap();
        assert_eq!(kv.map(|kv| kv.mod_revision), Some(at));
    }
}

/// A watcher that does not read while thousands of events pile up falls behind: etcd stops
/// sending to it, and once the history it still needs is compacted it cancels the watch. The
/// stream delivers what reached it, in order and without gaps, then ends with `Compacted` for
/// the first revision it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_watcher_ends_with_compacted_for_the_first_missed_revision() {
    const WRITERS: usize = 16;
    const WRITES: usize = 125;
    // Large values fill the HTTP/2 window and etcd's send buffer with few events.
    let value = Bytes::from(vec![b'v'; 4096]);
    let cluster = EtcdCluster::start(1).await;
    let store: Arc<dyn Store> = Arc::new(cluster.store(PREFIX).await);
    let mut stream = store.watch("/lagc/", 0).await.unwrap();
    let first = store.current_revision().await.unwrap() + 1;

    let mut writers = JoinSet::new();
    for writer in 0..WRITERS {
        let (store, value) = (Arc::clone(&store), value.clone());
        writers.spawn(async move {
            for i in 0..WRITES {
                let key = format!("/lagc/{writer}/{}", i % 4);
                store
                    .txn(put_txn(&key, Compare::Always, value.clone()))
                    .await
                    .expect("put");
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("writer panicked");
    }
    let now = store.current_revision().await.unwrap();
    assert_eq!(now - first + 1, (WRITERS * WRITES) as Revision);
    store.compact(now).await.unwrap();

    let mut next = first;
    let failure = loop {
        let item = tokio::time::timeout(TIMEOUT, stream.next())
            .await
            .expect("timed out: the watcher never fell behind")
            .expect("stream ended without an error");
        match item {
            Ok(event) => {
                assert_eq!(event.revision(), next, "events arrive without gaps");
                next += 1;
            }
            Err(err) => break err,
        }
    };
    match failure {
        StoreError::Compacted {
            requested,
            compacted,
        } => assert_eq!((requested, compacted), (next, now)),
        other => panic!("expected Compacted, got {other:?}"),
    }
    assert!(next <= now, "the watcher missed something");
    assert!(
        stream.next().await.is_none(),
        "the stream ends after the error"
    );
}

/// An etcd that requires TLS client certificates: the store connects with its CA, certificate
/// and key, and a client certificate from another CA is refused when connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates() {
    let certs = tempfile::tempdir().unwrap();
    let (server, client) = tls_files(certs.path(), "trusted");
    let cluster = EtcdCluster::start_with_tls(1, server, client).await;
    assert!(cluster.endpoint(0).starts_with("https://"));

    let store = cluster.store(PREFIX).await;
    let kv = put(&store, "/tls/k", "secret").await;
    assert_eq!(store.get("/tls/k", 0).await.unwrap().0, Some(kv));

    let (_, stranger) = tls_files(certs.path(), "stranger");
    let refused = EtcdStore::connect(&cluster.endpoints(), PREFIX, Some(stranger)).await;
    match refused {
        Err(StoreError::Backend(message)) => {
            assert!(message.contains("connecting to etcd"), "{message}")
        }
        Err(other) => panic!("expected a connection error, got {other:?}"),
        Ok(_) => panic!("a client certificate from another CA was accepted"),
    }
}

/// Writes a CA, a serving certificate for 127.0.0.1 and a client certificate, all named after
/// `name`, under `dir`.
fn tls_files(dir: &Path, name: &str) -> (ServerTls, EtcdTls) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let write = |file: &str, pem: String| {
        let path = dir.join(format!("{name}-{file}.pem"));
        std::fs::write(&path, pem).unwrap();
        path
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, &ca_key);
    let ca = write("ca", ca_cert.pem());

    let leaf = |sans: Vec<String>, usage| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(sans).unwrap();
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (cert, key) = leaf(
        vec!["127.0.0.1".into(), "localhost".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let server = ServerTls {
        ca: ca.clone(),
        cert: write("server", cert),
        key: write("server-key", key),
    };
    let (cert, key) = leaf(Vec::new(), ExtendedKeyUsagePurpose::ClientAuth);
    let client = EtcdTls {
        ca,
        cert: write("client", cert),
        key: write("client-key", key),
    };
    (server, client)
}

/// An endpoint nobody listens on fails `connect` with the endpoint in the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_fails_clearly() {
    let endpoint = format!("http://127.0.0.1:{}", testing::free_port());
    let result = tokio::time::timeout(
        TIMEOUT,
        EtcdStore::connect(std::slice::from_ref(&endpoint), "", None),
    )
    .await
    .expect("connect gave up in time");
    match result {
        Err(StoreError::Backend(message)) => assert!(
            message.contains(&format!("connecting to etcd at {endpoint}")),
            "{message}"
        ),
        Err(other) => panic!("expected a connection error, got {other:?}"),
        Ok(_) => panic!("connected to nothing"),
    }
}
