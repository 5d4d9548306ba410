//! A pod's volumes as directories on the node, bind-mounted into its containers:
//! emptyDir (disk, or tmpfs for `medium: Memory`), hostPath (with its type checks and
//! `...OrCreate`), persistentVolumeClaim (the path of the hostPath or local volume the
//! claim is bound to, or where its CSI driver published it; generic ephemeral volumes
//! through the claim made for the pod), configMap, secret, downwardAPI and projected (configMap, secret,
//! downwardAPI and serviceAccountToken sources), honouring `items`, `defaultMode` and
//! per-item `mode`.
//!
//! Content volumes are written as upstream's atomic writer does: the files go into a
//! fresh `..<timestamp>` directory, the `..data` symlink is swapped to it in one rename,
//! and each top-level name is a symlink through `..data` — so a container sees either
//! the old or the new set, never a mix, and updates show up in running containers
//! (except through `subPath` mounts, as upstream).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, Volume, VolumeMount};
use krust_cri::api::{Mount, MountPropagation};
use kube::ResourceExt;

use super::env::{ConfigError, Data, Kind, Sources, field, resource};
use super::ownership;
use crate::csi::publish;
use krust_csi::v1::volume_capability::access_mode::Mode;

/// Upstream's default file mode of configMap, secret, downwardAPI and projected files.
const DEFAULT_MODE: u32 = 0o644;
const DATA: &str = "..data";

/// Why a volume could not be set up, and in which of upstream's steps.
#[derive(Debug)]
struct MountFailure {
    /// `MountVolume.SetUp`, or `MountVolume.MountDevice` for staging.
    step: &'static str,
    why: String,
}

impl MountFailure {
    fn set_up(why: String) -> Self {
        MountFailure {
            step: "MountVolume.SetUp",
            why,
        }
    }
}

impl From<ConfigError> for MountFailure {
    fn from(ConfigError(why): ConfigError) -> Self {
        MountFailure::set_up(why)
    }
}

impl From<publish::Failure> for MountFailure {
    fn from(failure: publish::Failure) -> Self {
        match failure {
            publish::Failure::MountDevice(why) => MountFailure {
                step: "MountVolume.MountDevice",
                why,
            },
            publish::Failure::SetUp(why) => MountFailure::set_up(why),
        }
    }
}

/// Kinds whose content the kubelet writes (read-only in containers).
fn is_content(v: &Volume) -> bool {
    v.config_map.is_some()
        || v.secret.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
}

/// The files of one content volume: relative path → (bytes, mode).
type Files = BTreeMap<String, (Vec<u8>, u32)>;

fn add_items(
    files: &mut Files,
    data: &Data,
    items: Option<&Vec<KeyToPath>>,
    default_mode: u32,
    what: &str,
) -> Result<(), ConfigError> {
    match items {
        None => {
            for (k, v) in data {
                files.insert(k.clone(), (v.clone(), default_mode));
            }
        }
        Some(items) => {
            for item in items {
                let Some(v) = data.get(&item.key) else {
                    return Err(ConfigError(format!(
                        "configmap references non-existent config key: {} ({what})",
                        item.key
                    )));
                };
                let mode = item.mode.map_or(default_mode, |m| m as u32);
                files.insert(item.path.clone(), (v.clone(), mode));
            }
        }
    }
    Ok(())
}

fn downward_files(
    files: &mut Files,
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    pod_ip: &str,
    host_ip: &str,
) {
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            // Labels and annotations as a whole are written one `key="value"` per line.
            match f.field_path.as_str() {
                "metadata.labels" => Some(quoted_lines(pod.labels())),
                "metadata.annotations" => Some(quoted_lines(pod.annotations())),
                path => field(pod, path, pod_ip, host_ip),
            }
        } else if let Some(r) = &item.resource_field_ref {
            let container = pod.spec.as_ref().and_then(|s| {
                s.containers
                    .iter()
                    .find(|c| Some(&c.name) == r.container_name.as_ref())
                    .or(s.containers.first())
            });
            container
                .and_then(|c| resource(c, &r.resource, r.divisor.as_ref().map(|d| d.0.as_str())))
        } else {
            None
        };
        let mode = item.mode.map_or(default_mode, |m| m as u32);
        files.insert(
            item.path.clone(),
            (value.unwrap_or_default().into_bytes(), mode),
        );
    }
}

fn quoted_lines(map: &BTreeMap<String, String>) -> String {
    map.iter().map(|(k, v)| format!("{k}=\"{v}\"\n")).collect()
}

/// Where a content volume's files come from.
enum Source<'a> {
    Keys {
        kind: Kind,
        name: &'a str,
        optional: bool,
        items: Option<&'a Vec<KeyToPath>>,
    },
    Downward(&'a [DownwardAPIVolumeFile]),
    /// A service-account token at `path`.
    Token {
        audience: &'a str,
        expiration: i64,
        path: &'a str,
    },
}

/// A content volume's default file mode and sources (one, or a projection's several).
fn sources_of(v: &Volume) -> (u32, Vec<Source<'_>>) {
    let mode = |m: Option<i32>| m.map_or(DEFAULT_MODE, |m| m as u32);
    let keys = |kind, name, optional: Option<bool>, items| Source::Keys {
        kind,
        name,
        optional: optional.unwrap_or(false),
        items,
    };
    if let Some(cm) = &v.config_map {
        let source = keys(
            Kind::ConfigMap,
            cm.name.as_str(),
            cm.optional,
            cm.items.as_ref(),
        );
        (mode(cm.default_mode), vec![source])
    } else if let Some(s) = &v.secret {
        let name = s.secret_name.as_deref().unwrap_or_default();
        (
            mode(s.default_mode),
            vec![keys(Kind::Secret, name, s.optional, s.items.as_ref())],
        )
    } else if let Some(d) = &v.downward_api {
        let items = d.items.as_deref().unwrap_or_default();
        (mode(d.default_mode), vec![Source::Downward(items)])
    } else if let Some(p) = &v.projected {
        let sources = p
            .sources
            .iter()
            .flatten()
            .filter_map(|s| {
                if let Some(cm) = &s.config_map {
                    Some(keys(
                        Kind::ConfigMap,
                        cm.name.as_str(),
                        cm.optional,
                        cm.items.as_ref(),
                    ))
                } else if let Some(sec) = &s.secret {
                    Some(keys(
                        Kind::Secret,
                        sec.name.as_str(),
                        sec.optional,
                        sec.items.as_ref(),
                    ))
                } else if let Some(t) = &s.service_account_token {
                    Some(Source::Token {
                        audience: t.audience.as_deref().unwrap_or_default(),
                        // Upstream's default lifetime of projected tokens.
                        expiration: t.expiration_seconds.unwrap_or(3600),
                        path: t.path.as_str(),
                    })
                } else {
                    s.downward_api
                        .as_ref()
                        .map(|d| Source::Downward(d.items.as_deref().unwrap_or_default()))
                }
            })
            .collect();
        (mode(p.default_mode), sources)
    } else {
        (DEFAULT_MODE, Vec::new())
    }
}

/// The files a content volume holds now.
async fn content(
    sources: &Sources<'_>,
    pod: &Pod,
    v: &Volume,
    pod_ip: &str,
    host_ip: &str,
) -> Result<Files, ConfigError> {
    let mut files = Files::new();
    let (mode, from) = sources_of(v);
    for source in from {
        match source {
            Source::Keys {
                kind,
                name,
                optional,
                items,
            } => {
                if let Some(data) = sources.data(kind, name, optional).await? {
                    add_items(&mut files, &data, items, mode, name)?;
                }
            }
            Source::Downward(items) => {
                downward_files(&mut files, pod, items, mode, pod_ip, host_ip);
            }
            Source::Token {
                audience,
                expiration,
                path,
            } => {
                let token = sources
                    .tokens
                    .get(sources.client, pod, audience, expiration)
                    .await?;
                files.insert(path.to_string(), (token.into_bytes(), mode));
            }
        }
    }
    Ok(files)
}

/// Writes `files` into `dir` atomically (see the module docs); does nothing when the
/// directory already holds exactly these files.
pub fn write_atomic(dir: &Path, files: &Files) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let current = dir.join(DATA);
    if same_content(&current, files) {
        return Ok(());
    }
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let fresh = dir.join(&stamp);
    for (path, (data, mode)) in files {
        let target = fresh.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, data)?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(*mode))?;
    }
    std::fs::create_dir_all(&fresh)?;
    let tmp_link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    std::os::unix::fs::symlink(&stamp, &tmp_link)?;
    let old = std::fs::read_link(&current).ok();
    std::fs::rename(&tmp_link, &current)?;
    // Top-level names point through ..data; names no longer present go.
    let tops: std::collections::BTreeSet<String> = files
        .keys()
        .filter_map(|p| p.split('/').next().map(str::to_string))
        .collect();
    for top in &tops {
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA).join(top), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !tops.contains(&name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

fn same_content(current: &Path, files: &Files) -> bool {
    if std::fs::read_link(current).is_err() {
        return false;
    }
    let mut found = 0;
    for (path, (data, mode)) in files {
        let p = current.join(path);
        let ok = std::fs::read(&p).is_ok_and(|d| d == *data)
            && std::fs::metadata(&p).is_ok_and(|m| m.permissions().mode() & 0o7777 == *mode);
        if !ok {
            return false;
        }
        found += 1;
    }
    count_files(current) == found
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let p = e.path();
                    if p.is_dir() { count_files(&p) } else { 1 }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Makes every volume of the pod exist on the node (and content volumes current);
/// returns each volume's host path. `first`: the pod's first setup (when fsGroup
/// ownership is applied; later passes only refresh content).
pub async fn prepare(
    sources: &Sources<'_>,
    pod_dir: &Path,
    pod: &Pod,
    addresses: (&str, &str),
    first: bool,
) -> Result<HashMap<String, PathBuf>, ConfigError> {
    let mut paths = HashMap::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        // Upstream's wording for a volume that cannot be set up.
        let failed = |MountFailure { step, why }| {
            ConfigError(format!("{step} failed for volume \"{}\" : {why}", v.name))
        };
        if let Some(path) = set_up(sources, pod_dir, pod, v, addresses, first)
            .await
            .map_err(failed)?
        {
            paths.insert(v.name.clone(), path);
        }
    }
    Ok(paths)
}

/// Makes one volume exist on the node; `None` for kinds the kubelet does not serve.
async fn set_up(
    sources: &Sources<'_>,
    pod_dir: &Path,
    pod: &Pod,
    v: &Volume,
    (pod_ip, host_ip): (&str, &str),
    first: bool,
) -> Result<Option<PathBuf>, MountFailure> {
    let io = |what: &str, e: std::io::Error| MountFailure::set_up(format!("{what}: {e}"));
    // Each kind's path, and whether the pod's fsGroup owns it (as upstream: emptyDir,
    // local volumes, CSI volumes as their driver's fsGroupPolicy says; not hostPath).
    let (path, owned) = if let Some(empty) = &v.empty_dir {
        let dir = pod_dir.join("volumes/empty-dir").join(&v.name);
        std::fs::create_dir_all(&dir).map_err(|e| io("creating emptyDir", e))?;
        if empty.medium.as_deref() == Some("Memory") {
            mount_tmpfs(&dir, empty.size_limit.as_ref().map(|q| q.0.as_str()))
                .map_err(|e| io("mounting the memory emptyDir", e))?;
        }
        (dir, true)
    } else if let Some(host) = &v.host_path {
        let path = PathBuf::from(&host.path);
        check_host_path(&path, host.type_.as_deref().unwrap_or(""))?;
        (path, false)
    } else if let Some(claim) = krust_client::volume::volume_claim(&pod.name_any(), v) {
        // An ephemeral volume's claim must be the one made for this pod.
        let owner = v.ephemeral.is_some().then(|| pod.uid().unwrap_or_default());
        let read_only = v
            .persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.read_only == Some(true));
        let pv = sources.claimed_volume(&claim, owner.as_deref()).await?;
        claimed_path(sources, pod_dir, pv, read_only).await?
    } else if let Some(csi) = &v.csi {
        publish_inline(sources, pod_dir, pod, v, csi).await?
    } else if is_content(v) {
        let dir = pod_dir.join("volumes/content").join(&v.name);
        let files = content(sources, pod, v, pod_ip, host_ip).await?;
        write_atomic(&dir, &files).map_err(|e| io("writing volume", e))?;
        (dir, false)
    } else {
        tracing::debug!(pod = %pod.name_any(), volume = %v.name, "volume type not supported; skipped");
        return Ok(None);
    };
    let security = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    if let Some(group) = security.and_then(|c| c.fs_group).filter(|_| owned && first) {
        let on_root_mismatch =
            security.and_then(|c| c.fs_group_change_policy.as_deref()) == Some("OnRootMismatch");
        ownership::apply(&path, group, on_root_mismatch)
            .map_err(|e| io(&format!("applying fsGroup {group}"), e))?;
    }
    Ok(Some(path))
}

/// Makes a hostPath exist as its type asks (`DirectoryOrCreate`, `FileOrCreate`) or
/// checks that it is what its type says.
fn check_host_path(path: &Path, type_: &str) -> Result<(), ConfigError> {
    let io = |e: std::io::Error| ConfigError(format!("creating hostPath: {e}"));
    let shown = path.display();
    match type_ {
        "DirectoryOrCreate" => std::fs::create_dir_all(path).map_err(io)?,
        "FileOrCreate" if !path.exists() => std::fs::write(path, b"").map_err(io)?,
        "Directory" if !path.is_dir() => {
            return Err(ConfigError(format!(
                "hostPath type check failed: {shown} is not a directory"
            )));
        }
        "File" if !path.is_file() => {
            return Err(ConfigError(format!(
                "hostPath type check failed: {shown} is not a file"
            )));
        }
        _ => {}
    }
    Ok(())
}

/// The node path of the volume a claim is bound to: a `hostPath` or `local`
/// PersistentVolume's path, or where its CSI driver published it; and whether the
/// pod's fsGroup owns it.
async fn claimed_path(
    sources: &Sources<'_>,
    pod_dir: &Path,
    pv: k8s_openapi::api::core::v1::PersistentVolume,
    read_only: bool,
) -> Result<(PathBuf, bool), MountFailure> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.unwrap_or_default();
    if let Some(csi) = &spec.csi {
        let read_only = read_only || csi.read_only == Some(true);
        let modes = spec.access_modes.as_deref().unwrap_or_default();
        let driver = sources.csi_driver(&csi.driver).await?;
        // Without a CSIDriver, a driver is taken to need attaching (upstream's default).
        let attach = driver
            .as_ref()
            .is_none_or(|d| d.spec.attach_required != Some(false));
        let publish_context = if attach {
            sources
                .attachment(&csi.volume_handle, &csi.driver)
                .await
                .map_err(|ConfigError(why)| MountFailure {
                    step: "MountVolume.WaitForAttach",
                    why,
                })?
        } else {
            BTreeMap::new()
        };
        let policy = driver.and_then(|d| d.spec.fs_group_policy);
        // Upstream's default policy: only a volume with a filesystem type that one
        // node writes.
        let owned = !read_only
            && match policy.as_deref() {
                Some("File") => true,
                Some("None") => false,
                _ => {
                    csi.fs_type.as_deref().is_some_and(|t| !t.is_empty())
                        && modes.iter().any(|m| m == "ReadWriteOnce")
                }
            };
        let access = (csi_access_mode(modes), read_only);
        let path =
            publish_persistent(sources, pod_dir, &name, csi, access, publish_context).await?;
        Ok((path, owned))
    } else if let Some(host) = &spec.host_path {
        let path = PathBuf::from(&host.path);
        check_host_path(&path, host.type_.as_deref().unwrap_or(""))?;
        Ok((path, false))
    } else if let Some(local) = &spec.local {
        let path = PathBuf::from(&local.path);
        if !path.exists() {
            return Err(MountFailure::set_up(format!(
                "path \"{}\" does not exist",
                local.path
            )));
        }
        Ok((path, !read_only))
    } else {
        Err(MountFailure::set_up(format!(
            "volume \"{}\" has a source this kubelet does not mount (hostPath and local are supported)",
            name
        )))
    }
}

/// The CSI access mode of a PersistentVolume's access modes.
fn csi_access_mode(modes: &[String]) -> Mode {
    let has = |m: &str| modes.iter().any(|x| x == m);
    if has("ReadWriteMany") {
        Mode::MultiNodeMultiWriter
    } else if has("ReadOnlyMany") && !has("ReadWriteOnce") {
        Mode::MultiNodeReaderOnly
    } else if has("ReadWriteOncePod") {
        Mode::SingleNodeSingleWriter
    } else {
        Mode::SingleNodeWriter
    }
}

/// Publishes a CSI PersistentVolume for the pod (staged first if its driver stages).
async fn publish_persistent(
    sources: &Sources<'_>,
    pod_dir: &Path,
    pv: &str,
    csi: &k8s_openapi::api::core::v1::CSIPersistentVolumeSource,
    (access_mode, read_only): (Mode, bool),
    publish_context: BTreeMap<String, String>,
) -> Result<PathBuf, MountFailure> {
    let volume = publish::Volume {
        driver: &csi.driver,
        handle: csi.volume_handle.clone(),
        name: pv,
        capability: krust_csi::mount_capability(
            csi.fs_type.as_deref().unwrap_or_default(),
            access_mode,
        ),
        read_only,
        publish_context: publish_context.into_iter().collect(),
        context: csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        persistent: true,
    };
    publish::publish(sources.csi, &sources.csi_plugins, pod_dir, volume)
        .await
        .map_err(MountFailure::from)
}

/// Publishes an inline CSI volume (`csi:` in the pod), if its driver takes ephemeral
/// volumes, with the pod's identity in the volume context if the driver asks for it.
async fn publish_inline(
    sources: &Sources<'_>,
    pod_dir: &Path,
    pod: &Pod,
    v: &Volume,
    csi: &k8s_openapi::api::core::v1::CSIVolumeSource,
) -> Result<(PathBuf, bool), MountFailure> {
    let driver = sources.csi_driver(&csi.driver).await?;
    let spec = driver.map(|d| d.spec).unwrap_or_default();
    let modes = spec
        .volume_lifecycle_modes
        .clone()
        .unwrap_or_else(|| vec!["Persistent".to_string()]);
    if !modes.iter().any(|m| m == "Ephemeral") {
        return Err(MountFailure::set_up(format!(
            "volume mode \"Ephemeral\" not supported by driver {} (only supports {modes:?})",
            csi.driver
        )));
    }
    let mut context: HashMap<String, String> = csi
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    if spec.pod_info_on_mount == Some(true) {
        let pod_spec = pod.spec.as_ref();
        for (key, value) in [
            ("csi.storage.k8s.io/pod.name", pod.name_any()),
            (
                "csi.storage.k8s.io/pod.namespace",
                pod.namespace().unwrap_or_default(),
            ),
            ("csi.storage.k8s.io/pod.uid", pod.uid().unwrap_or_default()),
            (
                "csi.storage.k8s.io/serviceAccount.name",
                pod_spec
                    .and_then(|s| s.service_account_name.clone())
                    .unwrap_or_default(),
            ),
            ("csi.storage.k8s.io/ephemeral", "true".to_string()),
        ] {
            context.insert(key.to_string(), value);
        }
    }
    let volume = publish::Volume {
        driver: &csi.driver,
        handle: publish::inline_handle(&pod.uid().unwrap_or_default(), &v.name),
        name: &v.name,
        capability: krust_csi::mount_capability(
            csi.fs_type.as_deref().unwrap_or_default(),
            Mode::SingleNodeWriter,
        ),
        read_only: csi.read_only == Some(true),
        publish_context: HashMap::new(),
        context,
        persistent: false,
    };
    let owned = csi.read_only != Some(true) && spec.fs_group_policy.as_deref() == Some("File");
    let path = publish::publish(sources.csi, &sources.csi_plugins, pod_dir, volume).await?;
    Ok((path, owned))
}

/// Volumes mounted read-only in every container: content the kubelet writes, and
/// claims the pod asks for read-only.
fn read_only_volume(v: &Volume) -> bool {
    is_content(v)
        || v.persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.read_only == Some(true))
}

/// Whether the pod has volumes whose content can change (and so are refreshed).
pub fn has_content(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(is_content)
}

fn mount_tmpfs(dir: &Path, size: Option<&str>) -> std::io::Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    let target = dir.display().to_string();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(target.as_str()))
    {
        return Ok(());
    }
    let mut cmd = std::process::Command::new("mount");
    cmd.args(["-t", "tmpfs"]);
    if let Some(size) = size {
        cmd.args(["-o", &format!("size={size}")]);
    }
    let status = cmd.arg("tmpfs").arg(dir).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "mount tmpfs on {target} failed"
        )))
    }
}

/// Unmounts memory-backed emptyDirs before the pod's directory is removed.
pub fn unmount_all(pod_dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return;
    };
    let prefix = pod_dir.display().to_string();
    for target in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
        if target.starts_with(&prefix) {
            let _ = std::process::Command::new("umount").arg(target).status();
        }
    }
}

/// A volumeMount's `mountPropagation` in CRI's terms (a CSI driver's node plugin
/// mounts `Bidirectional` so that the volumes it publishes reach the host).
fn propagation(mode: Option<&str>) -> MountPropagation {
    match mode {
        Some("HostToContainer") => MountPropagation::PropagationHostToContainer,
        Some("Bidirectional") => MountPropagation::PropagationBidirectional,
        _ => MountPropagation::PropagationPrivate,
    }
}

/// The CRI mounts of a container's volumeMounts.
pub fn mounts(
    pod: &Pod,
    mounts: Option<&Vec<VolumeMount>>,
    paths: &HashMap<String, PathBuf>,
) -> Vec<Mount> {
    let volumes: HashMap<&str, &Volume> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| (v.name.as_str(), v))
        .collect();
    mounts
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let base = paths.get(&m.name)?;
            let host = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => {
                    let p = base.join(sub);
                    // subPath of an emptyDir or hostPath dir is created on demand.
                    if !p.exists() && !volumes.get(m.name.as_str()).is_some_and(|v| is_content(v)) {
                        let _ = std::fs::create_dir_all(&p);
                    }
                    p
                }
                None => base.clone(),
            };
            let read_only = volumes
                .get(m.name.as_str())
                .is_some_and(|v| read_only_volume(v));
            Some(Mount {
                container_path: m.mount_path.clone(),
                host_path: host.display().to_string(),
                readonly: m.read_only.unwrap_or(false) || read_only,
                propagation: propagation(m.mount_propagation.as_deref()) as i32,
                ..Mount::default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str, u32)]) -> Files {
        pairs
            .iter()
            .map(|(p, d, m)| (p.to_string(), (d.as_bytes().to_vec(), *m)))
            .collect()
    }

    #[test]
    fn atomic_writes_swap_the_data_link_and_drop_stale_names() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_atomic(d, &files(&[("a", "1", 0o644), ("sub/b", "2", 0o600)])).unwrap();
        assert_eq!(std::fs::read_to_string(d.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(d.join("sub/b")).unwrap(), "2");
        assert_eq!(
            std::fs::metadata(d.join("sub/b"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        let first = std::fs::read_link(d.join(DATA)).unwrap();
        // The same content writes nothing.
        write_atomic(d, &files(&[("a", "1", 0o644), ("sub/b", "2", 0o600)])).unwrap();
        assert_eq!(std::fs::read_link(d.join(DATA)).unwrap(), first);
        // New content: a new directory, the old one gone, a removed key's link gone.
        write_atomic(d, &files(&[("a", "updated", 0o644)])).unwrap();
        assert_ne!(std::fs::read_link(d.join(DATA)).unwrap(), first);
        assert_eq!(std::fs::read_to_string(d.join("a")).unwrap(), "updated");
        assert!(std::fs::symlink_metadata(d.join("sub")).is_err());
        assert!(!d.join(&first).exists());
    }
}
