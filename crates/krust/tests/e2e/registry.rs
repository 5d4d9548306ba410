//! Images from a real registry (issue 34): Debian's `docker-registry` (distribution
//! 2.8) started here with htpasswd auth and TLS from a test CA, an image pushed with
//! skopeo, and a node whose `registries.yaml` names the CA and a mirror. Pods pull
//! with the credentials of their pull secrets or their ServiceAccount's; a wrong
//! password or none ends in ErrImagePull / ImagePullBackOff with containerd's reason;
//! a mirror with node credentials serves an image under another registry's name; and a
//! public registry needs nothing at all.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Server, free_port, wait_for};
use crate::ingress::certificate;
use crate::kubelet::{container_status, event_reasons};

const DEADLINE: Duration = Duration::from_secs(60);
const USER: &str = "puller";
const PASSWORD: &str = "s3cret-pass";

fn run(command: &mut Command) -> String {
    let out = command.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A test CA and a server certificate for `localhost` and 127.0.0.1: (CA, cert, key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let path = |name: &str| dir.join(name);
    // The CA: self-signed, as the Ingress tests make theirs.
    let (ca_crt, ca_key) = certificate(dir, "registry-ca", "ca");
    // The registry's own key and request, signed by the CA for both its names.
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-subj", "/CN=localhost", "-keyout"])
        .arg(path("registry.key"))
        .arg("-out")
        .arg(path("registry.csr")));
    std::fs::write(
        path("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "1", "-CAcreateserial"])
        .args(["-CA", &ca_crt, "-CAkey", &ca_key, "-in"])
        .arg(path("registry.csr"))
        .arg("-extfile")
        .arg(path("san.ext"))
        .arg("-out")
        .arg(path("registry.crt")));
    (ca_crt.into(), path("registry.crt"), path("registry.key"))
}

/// Debian's registry on a free port of 127.0.0.1, killed on drop.
struct Registry {
    port: u16,
    child: Child,
}

/// How a registry is reached: with TLS (its certificate and key) and htpasswd, or in
/// plain HTTP for anyone.
enum Access<'a> {
    Private { cert: &'a Path, key: &'a Path },
    Public,
}

impl Registry {
    fn start(dir: &Path, access: Access) -> Registry {
        std::fs::create_dir_all(dir).unwrap();
        let port = free_port();
        let mut config = json!({
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": dir.join("data")}},
            "http": {"addr": format!("127.0.0.1:{port}")},
        });
        if let Access::Private { cert, key } = access {
            let htpasswd = run(Command::new("htpasswd").args(["-Bbn", USER, PASSWORD]));
            std::fs::write(dir.join("htpasswd"), htpasswd).unwrap();
            config["http"]["tls"] = json!({"certificate": cert, "key": key});
            config["auth"] =
                json!({"htpasswd": {"realm": "krust-test", "path": dir.join("htpasswd")}});
        }
        // YAML is a superset of JSON.
        let path = dir.join("registry.yml");
        std::fs::write(&path, config.to_string()).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log")).unwrap())
            .spawn()
            .expect("docker-registry (scripts/deps.sh installs it)");
        wait_for("the registry", DEADLINE, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        Registry { port, child }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pushes a busybox image, built here, as each of `references` (skopeo: to a private
/// registry with its credentials and the test CA, to a public one in plain HTTP).
fn push(dir: &Path, ca: Option<&Path>, references: &[String]) {
    let tarball = dir.join("busybox.tar");
    krust_cri::image::busybox()
        .unwrap()
        .write(&tarball)
        .unwrap();
    let certs = dir.join("skopeo-certs");
    std::fs::create_dir_all(&certs).unwrap();
    for reference in references {
        let mut copy = Command::new("skopeo");
        copy.args(["copy", "--quiet"]);
        match ca {
            Some(ca) => {
                std::fs::copy(ca, certs.join("ca.crt")).unwrap();
                copy.args([
                    "--dest-creds",
                    &format!("{USER}:{PASSWORD}"),
                    "--dest-cert-dir",
                ])
                .arg(&certs);
            }
            None => {
                copy.arg("--dest-tls-verify=false");
            }
        }
        run(copy
            .arg(format!("docker-archive:{}", tarball.display()))
            .arg(format!("docker://{reference}")));
    }
}

fn pull_secret(s: &Server, name: &str, registry: &str, password: &str) {
    s.ok(&[
        "create",
        "secret",
        "docker-registry",
        name,
        &format!("--docker-server={registry}"),
        &format!("--docker-username={USER}"),
        &format!("--docker-password={password}"),
    ]);
}

fn pod(name: &str, image: &str, extra: Value) -> Value {
    let mut spec = json!({"terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": image, "imagePullPolicy": "Always",
                        "command": ["sleep", "3600"]}]});
    for (k, v) in extra.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

fn running(s: &Server, name: &str) {
    let deadline = std::time::Instant::now() + DEADLINE;
    while container_status(s, name)["state"].get("running").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "pod {name} not running: {}; events {:?}",
            container_status(s, name),
            event_reasons(s, name)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The waiting reason once the pull failed, and the pull's failure event.
fn pull_failure(s: &Server, name: &str) -> (String, String) {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let reason = container_status(s, name)["state"]["waiting"]["reason"].clone();
        let events = event_reasons(s, name);
        let failed = (events.iter()).find(|(reason, message)| {
            reason == "Failed" && message.starts_with("Failed to pull image")
        });
        if let (Some(reason @ ("ErrImagePull" | "ImagePullBackOff")), Some((_, event))) =
            (reason.as_str(), failed)
        {
            return (reason.to_string(), event.clone());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pod {name} did not fail to pull: {reason}; events {events:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn pods_pull_from_a_private_registry_with_their_secrets_and_the_nodes_mirrors() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(dir.path());
    let registry = Registry::start(
        &dir.path().join("private"),
        Access::Private {
            cert: &cert,
            key: &key,
        },
    );
    let public = Registry::start(&dir.path().join("public"), Access::Public);
    let port = registry.port;
    // The same registry under two names: 127.0.0.1 (credentials from pods) and
    // localhost (the node's mirror for `registry.test`, with the node's credentials).
    let direct = format!("127.0.0.1:{port}");
    let mirror = format!("localhost:{port}");
    // A tag per case: an image already on the node is used when a pull fails.
    let image = |tag: &str| format!("{direct}/team/busybox:{tag}");
    push(
        dir.path(),
        Some(&ca),
        &[image("1"), image("wrong"), image("anonymous")],
    );
    let open_image = format!("127.0.0.1:{}/public/busybox:1", public.port);
    push(dir.path(), None, std::slice::from_ref(&open_image));
    let registries = dir.path().join("registries.yaml");
    let ca = ca.display();
    std::fs::write(
        &registries,
        format!(
            r#"mirrors:
  registry.test:
    endpoint: ["https://{mirror}"]
configs:
  "{direct}":
    tls: {{ca_file: "{ca}"}}
  "{mirror}":
    auth: {{username: {USER}, password: {PASSWORD}}}
    tls: {{ca_file: "{ca}"}}
"#
        ),
    )
    .unwrap();
    let s = Server::with_agent(&[
        "--cluster-cidr=10.55.0.0/16",
        &format!("--private-registry={}", registries.display()),
    ]);
    let (wrong_image, anonymous_image, image) = (image("wrong"), image("anonymous"), image("1"));

    // A public registry: no credentials, no configuration (plain HTTP on localhost).
    s.ok_stdin(
        &["create", "-f", "-"],
        &pod("public", &open_image, json!({})).to_string(),
    );
    running(&s, "public");

    // A pod's own pull secret.
    pull_secret(&s, "registry-creds", &direct, PASSWORD);
    let with_secret = json!({"imagePullSecrets": [{"name": "registry-creds"}]});
    s.ok_stdin(
        &["create", "-f", "-"],
        &pod("with-secret", &image, with_secret).to_string(),
    );
    running(&s, "with-secret");
    let pulled = event_reasons(&s, "with-secret");
    assert!(
        pulled.iter().any(|(r, m)| r == "Pulled"
            && m.starts_with(&format!("Successfully pulled image \"{image}\""))),
        "{pulled:?}"
    );

    // The ServiceAccount's pull secrets, copied to its pods by admission.
    s.ok(&["create", "serviceaccount", "puller"]);
    s.ok(&[
        "patch",
        "serviceaccount",
        "puller",
        "-p",
        r#"{"imagePullSecrets":[{"name":"registry-creds"}]}"#,
    ]);
    let by_account = json!({"serviceAccountName": "puller"});
    s.ok_stdin(
        &["create", "-f", "-"],
        &pod("by-account", &image, by_account).to_string(),
    );
    assert_eq!(
        s.get_json(&["pod", "by-account"])["spec"]["imagePullSecrets"],
        json!([{"name": "registry-creds"}])
    );
    running(&s, "by-account");

    // A wrong password: the registry's refusal in the event.
    pull_secret(&s, "wrong-creds", &direct, "not-the-password");
    let wrong = json!({"imagePullSecrets": [{"name": "wrong-creds"}]});
    s.ok_stdin(
        &["create", "-f", "-"],
        &pod("wrong", &wrong_image, wrong).to_string(),
    );
    let (_, event) = pull_failure(&s, "wrong");
    assert!(event.contains("401 Unauthorized"), "{event}");
    assert!(
        event.starts_with(&format!(
            "Failed to pull image \"{wrong_image}\": rpc error: code = "
        )),
        "{event}"
    );

    // No credentials at all, and a secret that does not exist: refused, then backed off.
    let missing = json!({"imagePullSecrets": [{"name": "nowhere"}]});
    s.ok_stdin(
        &["create", "-f", "-"],
        &pod("anonymous", &anonymous_image, missing).to_string(),
    );
    let (_, event) = pull_failure(&s, "anonymous");
    assert!(event.contains("401 Unauthorized"), "{event}");
    let warned = event_reasons(&s, "anonymous");
    assert!(
        warned.contains(&(
            "FailedToRetrieveImagePullSecret".to_string(),
            "Unable to retrieve some image pull secrets (nowhere); attempting to pull the image may not succeed.".to_string()
        )),
        "{warned:?}"
    );
    wait_for("ImagePullBackOff", DEADLINE, || {
        (container_status(&s, "anonymous")["state"]["waiting"]["reason"] == "ImagePullBackOff")
            .then_some(())
    });
    let backoff = event_reasons(&s, "anonymous");
    assert!(
        backoff.contains(&(
            "BackOff".to_string(),
            format!("Back-off pulling image \"{anonymous_image}\"")
        )),
        "{backoff:?}"
    );

    // The node's mirror: `registry.test` does not exist; its images come from the
    // mirror, with the node's credentials and the test CA.
    s.ok_stdin(
        &["create", "-f", "-"],
        &pod("mirrored", "registry.test/team/busybox:1", json!({})).to_string(),
    );
    running(&s, "mirrored");

    s.delete_all_pods();
    drop((registry, public));
}
