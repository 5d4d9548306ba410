//! krust's containerd (real containerd, runc and CNI plugins, as root): started with
//! its generated configuration, the locally built images imported, and a pod run
//! through CRI — sandbox with a pod IP from the bridge network, a busybox container
//! that answers an exec, then torn down. Also: a second start adopts the running
//! containerd, and containers survive a containerd restart.

use std::collections::HashMap;
use std::path::Path;

use krust_cri::api::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, DnsConfig, ExecSyncRequest, ImageSpec, ImageStatusRequest,
    LinuxContainerConfig, LinuxPodSandboxConfig, PodSandboxConfig, PodSandboxMetadata,
    PodSandboxStatusRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopPodSandboxRequest,
};
use krust_cri::containerd::{Containerd, Layout};
use krust_cri::{Runtime, image};

/// A bridge network of its own, so the test never meets a real node's.
fn write_cni(layout: &Layout) {
    let ipam = layout.dir.join("ipam");
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "krust-test",
        "plugins": [
            {"type": "bridge", "bridge": "krusttest0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
             "ipam": {"type": "host-local", "dataDir": ipam, "ranges": [[{"subnet": "10.99.201.0/24"}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    std::fs::write(
        layout.cni_conf_dir().join("10-krust.conflist"),
        conf.to_string(),
    )
    .unwrap();
}

fn sandbox_config(dir: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "web".into(),
            uid: "uid-web".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "web".into(),
        log_directory: dir.join("logs").display().to_string(),
        dns_config: Some(DnsConfig {
            servers: vec!["10.43.0.10".into()],
            searches: vec!["default.svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        }),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: "/kubepods/besteffort/poduid-web".into(),
            ..LinuxPodSandboxConfig::default()
        }),
        ..PodSandboxConfig::default()
    }
}

/// krust's containerd on `layout`, with the default registries and runtime handlers.
async fn start(layout: &Layout) -> Containerd {
    Containerd::start(
        layout.clone(),
        image::PAUSE_IMAGE,
        &Default::default(),
        &Default::default(),
    )
    .await
    .expect("containerd starts")
}

async fn state_of(rt: &Runtime, container: &str) -> i32 {
    rt.runtime
        .clone()
        .container_status(ContainerStatusRequest {
            container_id: container.to_string(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap()
        .state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_through_cri_on_krusts_containerd() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(dir.path().join("containerd"));
    let containerd = start(&layout).await;
    assert!(containerd.is_child());
    write_cni(&layout);
    image::import_builtin(&containerd.socket(), &dir.path().join("images")).expect("images import");

    let rt = Runtime::connect(&containerd.socket().display().to_string())
        .await
        .unwrap();
    let version = rt.version().await.unwrap();
    assert_eq!(version.runtime_name, "containerd");
    // Both images are there; an image nobody imported is not.
    let status = |image: &str| {
        let mut images = rt.images.clone();
        let image = image.to_string();
        async move {
            images
                .image_status(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image,
                        ..ImageSpec::default()
                    }),
                    verbose: false,
                })
                .await
                .unwrap()
                .into_inner()
                .image
        }
    };
    assert!(status(image::PAUSE_IMAGE).await.is_some());
    assert!(
        status("busybox").await.is_some(),
        "busybox resolves to the imported image"
    );
    assert!(status("nginx:1.27").await.is_none());

    let mut runtime = rt.runtime.clone();
    let config = sandbox_config(dir.path());
    let sandbox = runtime
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("sandbox runs")
        .into_inner()
        .pod_sandbox_id;
    let status = runtime
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sandbox.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    let ip = status.network.unwrap().ip;
    assert!(ip.starts_with("10.99.201."), "pod IP {ip}");

    let container = runtime
        .create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "c".into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: image::BUSYBOX_IMAGE.into(),
                    ..ImageSpec::default()
                }),
                command: vec!["sleep".into(), "3600".into()],
                log_path: "c/0.log".into(),
                linux: Some(LinuxContainerConfig::default()),
                labels: HashMap::new(),
                ..ContainerConfig::default()
            }),
            sandbox_config: Some(config),
        })
        .await
        .expect("container created")
        .into_inner()
        .container_id;
    runtime
        .start_container(StartContainerRequest {
            container_id: container.clone(),
        })
        .await
        .expect("container starts");
    assert_eq!(
        state_of(&rt, &container).await,
        ContainerState::ContainerRunning as i32
    );
    let exec = runtime
        .exec_sync(ExecSyncRequest {
            container_id: container.clone(),
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "hostname; cat /etc/resolv.conf".into(),
            ],
            timeout: 10,
        })
        .await
        .unwrap()
        .into_inner();
    let out = String::from_utf8_lossy(&exec.stdout);
    assert_eq!(exec.exit_code, 0);
    assert!(out.starts_with("web\n"), "{out}");
    assert!(
        out.contains("nameserver 10.43.0.10") && out.contains("ndots:5"),
        "{out}"
    );

    // A second start adopts the running containerd instead of starting another.
    let again = start(&layout).await;
    assert!(!again.is_child());

    // Restarting containerd leaves the container running.
    containerd.stop().await;
    let containerd = start(&layout).await;
    assert!(containerd.is_child());
    let rt = Runtime::connect(&containerd.socket().display().to_string())
        .await
        .unwrap();
    let mut runtime = rt.runtime.clone();
    assert_eq!(
        state_of(&rt, &container).await,
        ContainerState::ContainerRunning as i32
    );

    runtime
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        })
        .await
        .unwrap();
    runtime
        .remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: sandbox,
        })
        .await
        .unwrap();
    containerd.stop().await;
    // The test's bridge goes with it.
    let _ = std::process::Command::new("ip")
        .args(["link", "del", "krusttest0"])
        .status();
}
