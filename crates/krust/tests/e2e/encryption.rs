//! Secrets encrypted at rest, checked where they rest: the embedded store's file (read
//! with the server stopped) and etcd's keys (read with `etcdctl`). `--secrets-encryption`
//! (k3s's flag) generates a key; `--encryption-provider-config` (upstream's) takes an
//! EncryptionConfiguration, and a restart with a new key listed first re-encrypts
//! everything with it.

use std::process::Command;

use crate::common::{Etcd, Server};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use krust_store::Store;
use krust_store::embedded::EmbeddedStore;

const PASSWORD_B64: &str = "aHVudGVyMg=="; // "hunter2"

/// The stored bytes of a key in a stopped server's embedded store.
fn raw_embedded(s: &Server, key: &str) -> Vec<u8> {
    let path = s.data_dir().join("server/db/state.redb");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = EmbeddedStore::open(&path).expect("opening the store");
        let kv = store.get(key, 0).await.expect("reading").0;
        kv.expect("key stored").value.to_vec()
    })
}

fn assert_sealed(raw: &[u8], prefix: &str) {
    assert!(
        raw.starts_with(prefix.as_bytes()),
        "expected {prefix}…, found {:?}",
        String::from_utf8_lossy(&raw[..raw.len().min(60)])
    );
    for plain in [PASSWORD_B64.as_bytes(), b"hunter2", b"\"kind\":\"Secret\""] {
        assert!(!raw.windows(plain.len()).any(|w| w == plain));
    }
}

fn create_secret(s: &Server, name: &str) {
    s.ok(&[
        "create",
        "secret",
        "generic",
        name,
        "--from-literal=password=hunter2",
    ]);
}

fn password(s: &Server, name: &str) -> String {
    s.ok(&["get", "secret", name, "-o", "jsonpath={.data.password}"])
}

fn config(providers: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n{providers}"
    )
}

fn key(name: &str, provider: &str, byte: u8) -> String {
    format!(
        "  - {provider}:\n      keys:\n      - name: {name}\n        secret: {}\n",
        STANDARD.encode([byte; 32])
    )
}

#[test]
fn secrets_encryption_keeps_only_ciphertext_in_the_embedded_store() {
    let mut s = Server::apiserver(&["--secrets-encryption"]);
    create_secret(&s, "db");
    s.ok(&["create", "configmap", "plain", "--from-literal=k=v"]);
    assert_eq!(password(&s, "db"), PASSWORD_B64);
    assert!(
        s.data_dir()
            .join("server/cred/encryption-config.json")
            .exists()
    );
    s.stop();
    assert_sealed(
        &raw_embedded(&s, "/registry/secrets/default/db"),
        "k8s:enc:aescbc:v1:aescbckey:",
    );
    // Only Secrets: a ConfigMap stays readable JSON.
    let cm = raw_embedded(&s, "/registry/configmaps/default/plain");
    assert!(cm.starts_with(b"{"));
    // The generated key is kept: after a restart the Secret reads as before.
    s.restart();
    assert_eq!(password(&s, "db"), PASSWORD_B64);
}

#[test]
fn a_restart_with_a_new_first_key_rotates_every_secret() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("encryption.yaml");
    let write = |text: String| std::fs::write(&path, text).expect("writing the config");
    // Before encryption: stored as plaintext.
    write(config("  - identity: {}\n"));
    let flag = format!("--encryption-provider-config={}", path.display());
    let mut s = Server::apiserver(&[&flag]);
    create_secret(&s, "before");
    s.stop();
    assert!(raw_embedded(&s, "/registry/secrets/default/before").starts_with(b"{"));

    // aesgcm first: the existing Secret is re-encrypted at start, new ones too.
    write(config(&(key("key1", "aesgcm", 1) + "  - identity: {}\n")));
    s.restart();
    create_secret(&s, "during");
    s.stop();
    for name in ["before", "during"] {
        assert_sealed(
            &raw_embedded(&s, &format!("/registry/secrets/default/{name}")),
            "k8s:enc:aesgcm:v1:key1:",
        );
    }

    // Rotation: the new key first, the old one still listed to read with.
    write(config(
        &(key("key2", "secretbox", 2) + &key("key1", "aesgcm", 1)),
    ));
    s.restart();
    assert_eq!(password(&s, "during"), PASSWORD_B64);
    s.stop();
    for name in ["before", "during"] {
        assert_sealed(
            &raw_embedded(&s, &format!("/registry/secrets/default/{name}")),
            "k8s:enc:secretbox:v1:key2:",
        );
    }
    // The old key can go.
    write(config(&key("key2", "secretbox", 2)));
    s.restart();
    assert_eq!(password(&s, "before"), PASSWORD_B64);
    assert_eq!(password(&s, "during"), PASSWORD_B64);
}

#[test]
fn secrets_in_etcd_are_ciphertext_to_etcdctl() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("encryption.yaml");
    std::fs::write(&path, config(&key("key1", "aescbc", 9))).expect("writing the config");
    let endpoint = etcd.endpoint();
    let flag = format!("--encryption-provider-config={}", path.display());
    let s = Server::apiserver(&["--datastore-endpoint", &endpoint, &flag]);
    create_secret(&s, "db");
    assert_eq!(password(&s, "db"), PASSWORD_B64);
    let client = endpoint
        .trim_start_matches("etcd://")
        .replace("127.", "http://127.");
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &client,
            "get",
            "/registry/secrets/default/db",
            "--print-value-only",
        ])
        .output()
        .expect("running etcdctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_sealed(&out.stdout, "k8s:enc:aescbc:v1:key1:");
}
