//! `krust images import` and the airgap images directory: image bundles — tarballs,
//! compressed ones (gzip, zstd) and OCI layouts — go into the node's containerd (a
//! real containerd started as krust's agent would, under the data dir), and bundles
//! dropped into a running agent's `agent/images/` are imported without a restart.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use krust_cri::containerd::{Containerd, Layout, default_dir};
use krust_cri::image::{ImageBuilder, PAUSE_IMAGE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn krust_images_import_loads_a_tarball_into_the_nodes_containerd() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let containerd = Containerd::start(
        Layout::new(default_dir(&data)),
        PAUSE_IMAGE,
        &Default::default(),
        &Default::default(),
    )
    .await
    .expect("containerd starts");
    let tarball = dir.path().join("hello.tar");
    ImageBuilder::new("docker.io/library/hello:1.0")
        .dir("etc/")
        .file("etc/hello", b"hello\n".to_vec(), 0o644)
        .cmd(&["/bin/true"])
        .write(&tarball)
        .unwrap();
    // A tarball, and the other bundle kinds k3s users bring.
    let mut imported = vec![tarball];
    imported.extend(bundles(dir.path(), "imported"));
    for bundle in &imported {
        let out = crate::common::import_image(&data, bundle);
        assert!(
            out.status.success(),
            "{}: {}",
            bundle.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let listed = Command::new("ctr")
        .arg("--address")
        .arg(containerd.socket())
        .args(["-n", "k8s.io", "images", "ls", "-q"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    for name in [
        "docker.io/library/hello:1.0",
        "docker.io/library/imported-gzip:1.0",
        "docker.io/library/imported-zstd:1.0",
        "docker.io/library/imported-layout:1.0",
    ] {
        assert!(listed.contains(name), "{name} not in {listed}");
    }

    // A file that is not an image archive is refused with ctr's reason.
    let bad = dir.path().join("bad.tar");
    std::fs::write(&bad, b"not a tarball").unwrap();
    let out = crate::common::import_image(&data, &bad);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("importing"));
    containerd.stop().await;
}

/// The image `docker.io/library/<prefix>-<kind>:1.0` as a gzip tarball, a zstd tarball
/// and an OCI layout (made with skopeo) in `dir`.
fn bundles(dir: &Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let name = |kind: &str| format!("docker.io/library/{prefix}-{kind}:1.0");
    let tar = |kind: &str| {
        let path = dir.join(format!("{prefix}-{kind}.tar"));
        krust_cri::image::busybox_as(&name(kind))
            .unwrap()
            .write(&path)
            .unwrap();
        path
    };
    let gzip = dir.join(format!("{prefix}.tar.gz"));
    let gzipped = Command::new("gzip")
        .arg("-c")
        .arg(tar("gzip"))
        .output()
        .unwrap();
    std::fs::write(&gzip, gzipped.stdout).unwrap();
    let zstd = dir.join(format!("{prefix}.tar.zst"));
    let plain = std::fs::File::open(tar("zstd")).unwrap();
    let compressed =
        ruzstd::encoding::compress_to_vec(plain, ruzstd::encoding::CompressionLevel::Fastest);
    std::fs::write(&zstd, compressed).unwrap();
    let layout = dir.join(format!("{prefix}-layout"));
    let copied = Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("docker-archive:{}", tar("layout").display()))
        .arg(format!("oci:{}:{}", layout.display(), name("layout")))
        .output()
        .unwrap();
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    vec![gzip, zstd, layout]
}

/// A bundle in the images directory at start is imported before the kubelet runs, and
/// bundles copied into a running agent's directory are imported within a scan; pods
/// that never pull run from them.
#[test]
fn bundles_are_imported_at_start_and_when_dropped_into_a_running_agent() {
    let mut s = crate::common::Server::with_agent(&["--cluster-cidr=10.58.0.0/16"]);
    let node = |s: &crate::common::Server| {
        crate::common::wait_for("a node", Duration::from_secs(60), || {
            s.get_json(&["nodes"])["items"]
                .as_array()?
                .first()
                .map(|_| ())
        })
    };
    node(&s);
    let work = tempfile::tempdir().unwrap();
    let images = s.data_dir().join("agent/images");
    std::fs::create_dir_all(&images).unwrap();
    let place = |bundle: &Path| {
        // Renamed into place, as a copy should be, so no half-written file is seen.
        let name = bundle.file_name().unwrap().to_string_lossy().into_owned();
        let staged = images.join(format!(".{name}"));
        Command::new("cp")
            .arg("-r")
            .arg(bundle)
            .arg(&staged)
            .status()
            .unwrap();
        std::fs::rename(&staged, images.join(name)).unwrap();
    };
    let bundles = bundles(work.path(), "dropped");
    // The gzip bundle waits for the next start; the others come while it runs.
    s.stop();
    place(&bundles[0]);
    s.restart();
    node(&s);
    for bundle in &bundles[1..] {
        place(bundle);
    }
    for kind in ["gzip", "zstd", "layout"] {
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("from-{kind}")},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c",
                "image": format!("dropped-{kind}:1.0"), "imagePullPolicy": "Never",
                "command": ["sleep", "3600"]}]}});
        s.ok_stdin(&["create", "-f", "-"], &pod.to_string());
    }
    for kind in ["gzip", "zstd", "layout"] {
        crate::common::wait_for(
            &format!("the pod of the {kind} bundle running"),
            Duration::from_secs(60),
            || {
                let pod = s.get_json(&["pod", &format!("from-{kind}")]);
                pod["status"]["containerStatuses"][0]["state"]
                    .get("running")
                    .map(|_| ())
            },
        );
    }
    s.delete_all_pods();
}

/// Image garbage collection with the thresholds below the disk's usage: images no
/// container uses go once older than the minimum age, the image a pod runs and the
/// pinned ones (sandbox, built-in) stay, and `FreeDiskSpaceFailed` says the goal was
/// out of reach; `node.status.images` follows.
#[test]
fn unused_images_are_collected_and_images_in_use_stay() {
    let s = crate::common::Server::with_agent(&[
        "--cluster-cidr=10.48.0.0/16",
        "--image-gc-high-threshold=1",
        "--image-gc-low-threshold=0",
        "--image-minimum-gc-age=15s",
        "--image-gc-interval=2s",
    ]);
    let node = crate::common::wait_for("a node", Duration::from_secs(60), || {
        let nodes = s.get_json(&["nodes"]);
        nodes["items"].as_array()?.first()?["metadata"]["name"]
            .as_str()
            .map(str::to_string)
    });
    let work = tempfile::tempdir().unwrap();
    for name in ["in-use", "unused"] {
        let tarball = work.path().join(format!("{name}.tar"));
        // Content of its own: two tags of one image would be one image.
        krust_cri::image::busybox_as(&format!("docker.io/library/{name}:1.0"))
            .unwrap()
            .file("image-name", name.as_bytes().to_vec(), 0o644)
            .write(&tarball)
            .unwrap();
        let out = crate::common::import_image(&s.data_dir(), &tarball);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "user"},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c",
            "image": "in-use:1.0", "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}});
    s.ok_stdin(&["create", "-f", "-"], &pod.to_string());
    let names = |s: &crate::common::Server| -> Vec<String> {
        let node = s.get_json(&["node", &node]);
        (node["status"]["images"].as_array().into_iter().flatten())
            .flat_map(|i| i["names"].as_array().cloned().unwrap_or_default())
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect()
    };
    crate::common::wait_for(
        "both images in the node's status",
        Duration::from_secs(30),
        || {
            let names = names(&s);
            names
                .contains(&"docker.io/library/unused:1.0".to_string())
                .then_some(())
        },
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let left = loop {
        let names = names(&s);
        if !names.contains(&"docker.io/library/unused:1.0".to_string()) {
            break names;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the unused image was not collected: {names:?}; the kubelet said: {}",
            (s.log().lines())
                .filter(|l| l.contains("image"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    for kept in [
        "docker.io/library/in-use:1.0",
        "docker.io/library/busybox:latest",
        "krust.local/pause:3.10",
    ] {
        assert!(left.contains(&kept.to_string()), "{kept} not in {left:?}");
    }
    let pod = s.get_json(&["pod", "user"]);
    assert!(
        pod["status"]["containerStatuses"][0]["state"]["running"].is_object(),
        "{pod}"
    );
    let failed = s.event_messages(&node, "FreeDiskSpaceFailed");
    assert!(
        failed.iter().any(|m| m.starts_with(
            "Failed to garbage collect required amount of images. Attempted to free "
        )),
        "{failed:?}"
    );
    s.delete_all_pods();
}
