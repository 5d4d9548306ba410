//! A cold image pull through krust against containerd alone, on one node and one
//! registry, in one run (issue 34): Debian's `docker-registry` on localhost, images of
//! busybox plus a layer of random bytes (so nothing is cached), and per round
//!
//! - containerd alone: one CRI `PullImage` to the node's containerd, timed;
//! - krust: a pod of another such image bound to the node, timed from its create to
//!   its container seen running on a watch (sandbox, pull, create, start), and the
//!   pull time the kubelet itself reports in its `Pulled` event.
//!
//! ```text
//! cargo build --release -p krust --bins --examples
//! ./target/release/examples/pull_bench [layer MiB=128] [rounds=3]
//! ```

mod support;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use krust_cri::api::{ImageSpec, PullImageRequest};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::{Cluster, Result, free_port, percentile, wait};

/// `docker-registry` serving plain HTTP on 127.0.0.1 (containerd's default for
/// localhost), killed on drop.
struct Registry(std::process::Child);

impl Registry {
    async fn start(dir: &Path, port: u16) -> Result<Registry> {
        let config = json!({"version": 0.1, "log": {"level": "error"},
            "storage": {"filesystem": {"rootdirectory": dir.join("data")}},
            "http": {"addr": format!("127.0.0.1:{port}")}});
        let path = dir.join("registry.yml");
        std::fs::write(&path, config.to_string())?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        wait("the registry", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await?;
        Ok(Registry(child))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Random bytes (xorshift), so that no two images share a layer.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Builds `reference` (busybox and `mib` MiB of noise) and pushes it with skopeo.
fn push(dir: &Path, reference: &str, seed: u64, mib: usize) -> Result {
    let tarball = dir.join("image.tar");
    krust_cri::image::busybox_as(reference)?
        .file("noise", noise(seed, mib << 20), 0o644)
        .write(&tarball)?;
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("docker-archive:{}", tarball.display()))
        .arg(format!("docker://{reference}"))
        .output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    std::fs::remove_file(tarball)?;
    Ok(())
}

fn running(pod: &Pod) -> bool {
    (pod.status.as_ref())
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

/// The pull time in the kubelet's `Successfully pulled image "…" in 1.234s` event.
fn reported_pull(events: &[Event], pod: &str) -> Option<Duration> {
    let message = events
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .find_map(|e| {
            e.message
                .as_deref()?
                .strip_prefix("Successfully pulled image ")
        })?;
    let seconds = message.rsplit_once(" in ")?.1.strip_suffix('s')?;
    seconds.parse().ok().map(Duration::from_secs_f64)
}

#[tokio::main]
async fn main() -> Result {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<std::result::Result<_, _>>()?;
    let mib = args.first().copied().unwrap_or(128);
    let rounds = args.get(1).copied().unwrap_or(3);
    let work = tempfile::tempdir()?;
    let port = free_port();
    let _registry = Registry::start(work.path(), port).await?;
    let cluster = Cluster::start_server(&[
        "--cluster-cidr=10.46.0.0/16",
        "--disable-scheduler",
        "--kubelet-port=0",
        "--eviction-hard=memory.available<100Mi",
        "--image-gc-high-threshold=100",
        // Services are not measured: no nftables table left behind.
        "--disable-kube-proxy",
    ])
    .await?;
    let client = cluster.client().await?;
    let node = Cluster::node(&client).await?;
    let socket = krust_cri::containerd::Layout::new(krust_cri::containerd::default_dir(
        &cluster.dir.path().join("data"),
    ))
    .socket();
    let mut runtime = krust_cri::Runtime::connect(&socket.display().to_string()).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client, "default");
    let (mut alone, mut through_krust, mut reported) = (Vec::new(), Vec::new(), Vec::new());
    println!("image: busybox + {mib} MiB of random bytes, pulled from 127.0.0.1:{port}");
    for round in 0..rounds {
        let direct = format!("127.0.0.1:{port}/bench/direct-{round}:1");
        let via_pod = format!("127.0.0.1:{port}/bench/pod-{round}:1");
        push(work.path(), &direct, 2 * round as u64 + 1, mib)?;
        push(work.path(), &via_pod, 2 * round as u64 + 2, mib)?;

        let started = Instant::now();
        runtime
            .images
            .pull_image(PullImageRequest {
                image: Some(ImageSpec {
                    image: direct.clone(),
                    ..ImageSpec::default()
                }),
                ..PullImageRequest::default()
            })
            .await?;
        alone.push(started.elapsed());

        let name = format!("pull-{round}");
        let watch = watcher::watcher(
            pods.clone(),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        );
        let mut watch = watch.boxed();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": via_pod, "command": ["sleep", "3600"]}]}}))?;
        let created = Instant::now();
        pods.create(&PostParams::default(), &pod).await?;
        let deadline = created + Duration::from_secs(600);
        loop {
            let event = tokio::time::timeout_at(deadline.into(), watch.next())
                .await
                .map_err(|_| "the pod did not start")?;
            if let Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))) = event
                && running(&p)
            {
                break;
            }
        }
        through_krust.push(created.elapsed());
        let listed = events.list(&ListParams::default()).await?.items;
        reported.extend(reported_pull(&listed, &name));
        println!(
            "round {round}: containerd PullImage {:>8.2?}   krust pod created → running {:>8.2?}   kubelet's pull {:>8.2?}",
            alone[round],
            through_krust[round],
            reported.last().copied().unwrap_or_default()
        );
        let _ = std::io::stdout().flush();
        pods.delete(&name, &Default::default()).await?;
    }
    for list in [&mut alone, &mut through_krust, &mut reported] {
        list.sort();
    }
    let (a, k, r) = (
        percentile(&alone, 0.5),
        percentile(&through_krust, 0.5),
        percentile(&reported, 0.5),
    );
    println!(
        "p50: containerd alone {a:.2?}, krust pod {k:.2?} ({:.3}×, +{:.0?}), the kubelet's pull {r:.2?} ({:.3}×)",
        k.as_secs_f64() / a.as_secs_f64(),
        k.saturating_sub(a),
        r.as_secs_f64() / a.as_secs_f64()
    );
    for _ in 0..1200 {
        if pods.list(&ListParams::default()).await?.items.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.stop();
    Ok(())
}
