//! A pod's CSI volumes on the node, laid out as upstream's kubelet lays them out:
//! - staged once per node, if the driver stages (`STAGE_UNSTAGE_VOLUME`), into
//!   `<plugins>/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount`;
//! - published per pod into `<pod>/volumes/kubernetes.io~csi/<volume>/mount`, with a
//!   `vol_data.json` beside it saying what to unpublish (and unstage) at teardown;
//! - unstaged when the last pod of the node using the volume is gone.
//!
//! Inline volumes (`csi:` in a pod) are published only, never staged, with a handle
//! of their own per pod and volume (`csi-<sha256(pod UID + volume name)>`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use krust_csi::v1::node_service_capability::{Type as CapabilityType, rpc::Type};
use krust_csi::v1::{
    NodeGetCapabilitiesRequest, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::Drivers;
use crate::rpc_error;

/// Where a pod's CSI volumes are published.
const POD_CSI_DIR: &str = "volumes/kubernetes.io~csi";
const VOL_DATA: &str = "vol_data.json";

/// One CSI volume of a pod.
#[derive(Debug)]
pub struct Volume<'a> {
    pub driver: &'a str,
    pub handle: String,
    /// The directory under the pod's CSI volumes: the PersistentVolume's name, or the
    /// inline volume's.
    pub name: &'a str,
    pub capability: VolumeCapability,
    pub read_only: bool,
    /// What the attacher returned (ControllerPublishVolume), for staging and publishing.
    pub publish_context: HashMap<String, String>,
    pub context: HashMap<String, String>,
    /// Persistent volumes may be staged; inline ones never are.
    pub persistent: bool,
}

/// Which step failed, with upstream's names for them.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// Staging: `MountVolume.MountDevice`.
    MountDevice(String),
    /// Publishing: `MountVolume.SetUp`.
    SetUp(String),
}

fn sha256_hex(data: &str) -> String {
    format!("{:x}", Sha256::digest(data.as_bytes()))
}

/// The handle of an inline volume (upstream's `makeVolumeHandle`).
pub fn inline_handle(pod_uid: &str, volume: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{pod_uid}{volume}")))
}

/// The node-wide staging directory of a volume.
fn staging_dir(plugins: &Path, driver: &str, handle: &str) -> PathBuf {
    plugins
        .join("kubernetes.io/csi")
        .join(driver)
        .join(sha256_hex(handle))
}

/// Stages (if the driver does) and publishes a volume for the pod; the published path.
pub async fn publish(
    drivers: &Drivers,
    plugins: &Path,
    pod_dir: &Path,
    volume: Volume<'_>,
) -> Result<PathBuf, Failure> {
    let io = |e: std::io::Error| Failure::SetUp(format!("preparing the volume directory: {e}"));
    let mut driver = drivers
        .connect(volume.driver)
        .await
        .map_err(Failure::SetUp)?;
    let stages = volume.persistent
        && {
            let capabilities = driver
                .node
                .node_get_capabilities(NodeGetCapabilitiesRequest {})
                .await
                .map_err(|s| Failure::MountDevice(rpc_error(&s)))?
                .into_inner()
                .capabilities;
            capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(CapabilityType::Rpc(r)) if r.r#type == Type::StageUnstageVolume as i32)
        })
        };
    // Held until the pod's publication is recorded, so that no other pod's teardown
    // unstages the volume in between.
    let mut _staged = None;
    let staging = if stages {
        let dir = staging_dir(plugins, volume.driver, &volume.handle);
        _staged = Some(drivers.staging_lock(&dir).lock_owned().await);
        let global = dir.join("globalmount");
        std::fs::create_dir_all(&global).map_err(|e| Failure::MountDevice(e.to_string()))?;
        let data = json!({"driverName": volume.driver, "volumeHandle": volume.handle});
        std::fs::write(dir.join(VOL_DATA), data.to_string())
            .map_err(|e| Failure::MountDevice(e.to_string()))?;
        // Staged once per node: a staging path already mounted is left as it is (as
        // upstream's MountDevice; the call is idempotent for the driver anyway).
        if !krust_csi::mount::is_mounted(&global) {
            driver
                .node
                .node_stage_volume(NodeStageVolumeRequest {
                    volume_id: volume.handle.clone(),
                    staging_target_path: global.display().to_string(),
                    publish_context: volume.publish_context.clone(),
                    volume_capability: Some(volume.capability.clone()),
                    volume_context: volume.context.clone(),
                    ..Default::default()
                })
                .await
                .map_err(|s| Failure::MountDevice(rpc_error(&s)))?;
        }
        Some(global)
    } else {
        None
    };
    let dir = pod_dir.join(POD_CSI_DIR).join(volume.name);
    std::fs::create_dir_all(&dir).map_err(io)?;
    let data = json!({"driverName": volume.driver, "volumeHandle": volume.handle,
        "stagingPath": staging.as_ref().map(|p| p.display().to_string())});
    std::fs::write(dir.join(VOL_DATA), data.to_string()).map_err(io)?;
    let target = dir.join("mount");
    driver
        .node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: volume.handle,
            publish_context: volume.publish_context,
            staging_target_path: staging.map(|p| p.display().to_string()).unwrap_or_default(),
            target_path: target.display().to_string(),
            volume_capability: Some(volume.capability),
            readonly: volume.read_only,
            volume_context: volume.context,
            ..Default::default()
        })
        .await
        .map_err(|s| Failure::SetUp(rpc_error(&s)))?;
    Ok(target)
}

/// What a `vol_data.json` says.
struct Published {
    driver: String,
    handle: String,
    staging: Option<String>,
}

fn read_vol_data(dir: &Path) -> Option<Published> {
    let data: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(VOL_DATA)).ok()?).ok()?;
    Some(Published {
        driver: data["driverName"].as_str()?.to_string(),
        handle: data["volumeHandle"].as_str()?.to_string(),
        staging: data["stagingPath"].as_str().map(str::to_string),
    })
}

/// The CSI volumes published in a pod's directory.
fn published_in(pod_dir: &Path) -> Vec<(PathBuf, Published)> {
    std::fs::read_dir(pod_dir.join(POD_CSI_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| read_vol_data(&e.path()).map(|p| (e.path(), p)))
        .collect()
}

/// Unpublishes every CSI volume of a pod, and unstages those no other pod of the node
/// (`pods`: the directory of all pods' directories) still has published. A driver that
/// cannot be reached leaves its mounts to the pod directory's unmounting.
pub async fn unpublish_all(drivers: &Drivers, pods: &Path, pod_dir: &Path) {
    for (dir, published) in published_in(pod_dir) {
        let Published {
            driver: name,
            handle,
            staging,
        } = published;
        let mut driver = match drivers.connect(&name).await {
            Ok(d) => d,
            Err(err) => {
                tracing::warn!(volume = handle, driver = name, error = %err, "cannot unpublish");
                continue;
            }
        };
        let unpublished = driver
            .node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: handle.clone(),
                target_path: dir.join("mount").display().to_string(),
            })
            .await;
        if let Err(status) = unpublished {
            tracing::warn!(volume = handle, driver = name, error = %rpc_error(&status), "NodeUnpublishVolume failed");
            continue;
        }
        let _ = std::fs::remove_dir_all(&dir);
        let Some(staging) = staging else { continue };
        let lock = Path::new(&staging)
            .parent()
            .map(|dir| drivers.staging_lock(dir));
        let _staging = match &lock {
            Some(lock) => Some(lock.lock().await),
            None => None,
        };
        let still_used = std::fs::read_dir(pods)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path() != pod_dir)
            .flat_map(|e| published_in(&e.path()))
            .any(|(_, p)| p.staging.as_deref() == Some(staging.as_str()));
        if still_used {
            continue;
        }
        let unstaged = driver
            .node
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: handle.clone(),
                staging_target_path: staging.clone(),
            })
            .await;
        match unstaged {
            Ok(_) => {
                if let Some(parent) = Path::new(&staging).parent() {
                    let _ = std::fs::remove_dir_all(parent);
                }
            }
            Err(status) => {
                tracing::warn!(volume = handle, driver = name, error = %rpc_error(&status), "NodeUnstageVolume failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_handles_are_per_pod_and_volume() {
        let a = inline_handle("uid-1", "scratch");
        assert!(a.starts_with("csi-") && a.len() == 4 + 64, "{a}");
        assert_eq!(a, inline_handle("uid-1", "scratch"));
        assert_ne!(a, inline_handle("uid-2", "scratch"));
    }

    #[test]
    fn grpc_errors_read_as_upstream_kubelet_words_them() {
        let status = tonic::Status::internal("disk on fire");
        assert_eq!(
            rpc_error(&status),
            "rpc error: code = Internal desc = disk on fire"
        );
    }
}
