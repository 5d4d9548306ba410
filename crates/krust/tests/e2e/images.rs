//! `krust images import`: tarballs go into the node's containerd (a real containerd
//! started as krust's agent would, under the data dir).

use std::process::Command;

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
    let out = crate::common::import_image(&data, &tarball);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = Command::new("ctr")
        .arg("--address")
        .arg(containerd.socket())
        .args(["-n", "k8s.io", "images", "ls", "-q"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("docker.io/library/hello:1.0"), "{listed}");

    // A file that is not an image archive is refused with ctr's reason.
    let bad = dir.path().join("bad.tar");
    std::fs::write(&bad, b"not a tarball").unwrap();
    let out = crate::common::import_image(&data, &bad);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("importing"));
    containerd.stop().await;
}
