//! Encryption at rest under the apiserver: upstream's rotation by re-writing — a PUT of
//! an unchanged Secret sealed with an older key stores it again with the current key
//! (a new resourceVersion); once current, an unchanged PUT writes nothing.

use std::sync::Arc;

use crate::harness::Harness;
use krust_store::Store;
use krust_store::embedded::EmbeddedStore;
use krust_store::encrypted::{EncryptedStore, Rule, Transformer};
use serde_json::json;

fn rules(transformers: Vec<Transformer>) -> Vec<Rule> {
    vec![Rule {
        prefix: "/registry/secrets/".into(),
        transformers,
    }]
}

#[tokio::test]
async fn an_unchanged_write_re_encrypts_a_secret_sealed_with_an_older_key() {
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(dir.path().join("state.redb")).unwrap());
    let old = || Transformer::new("aescbc", "old", &[1; 32]).unwrap();
    let new = || Transformer::new("secretbox", "new", &[2; 32]).unwrap();
    let before = Harness::on(
        Arc::new(EncryptedStore::new(inner.clone(), rules(vec![old()]))),
        dir,
    )
    .await;
    let path = "/api/v1/namespaces/default/secrets";
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
        "data": {"k": "dmFsdWU="}});
    assert_eq!(before.call("POST", path, Some(secret)).await.0, 201);
    let key = "/registry/secrets/default/s";
    let raw = || async { inner.get(key, 0).await.unwrap().0.unwrap().value };
    assert!(raw().await.starts_with(b"k8s:enc:aescbc:v1:old:"));

    // Another apiserver with the new key first (its start-time rewrite not run).
    let after = Harness::on(
        Arc::new(EncryptedStore::new(
            inner.clone(),
            rules(vec![new(), old()]),
        )),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let (_, stored) = after.call("GET", &format!("{path}/s"), None).await;
    let (code, replaced) = after
        .call("PUT", &format!("{path}/s"), Some(stored.clone()))
        .await;
    assert_eq!(code, 200, "{replaced}");
    assert_ne!(
        replaced["metadata"]["resourceVersion"],
        stored["metadata"]["resourceVersion"]
    );
    assert!(raw().await.starts_with(b"k8s:enc:secretbox:v1:new:"));
    assert_eq!(replaced["data"], stored["data"]);
    // Current now: the same PUT is a no-op again.
    let (_, again) = after
        .call("PUT", &format!("{path}/s"), Some(replaced.clone()))
        .await;
    assert_eq!(
        again["metadata"]["resourceVersion"],
        replaced["metadata"]["resourceVersion"]
    );
}
