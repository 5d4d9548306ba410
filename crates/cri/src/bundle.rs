//! Air-gap image bundles, as k3s users bring them to `<data-dir>/agent/images/`: image
//! tarballs (docker-archive or OCI, `.tar`), the same compressed (`.tar.gz`, `.tgz`,
//! `.tar.zst`), and OCI image layouts (a directory with an `oci-layout` file). Each is
//! streamed into `ctr images import -`, decompressed or tarred on the way. A
//! [`Watcher`] imports what is in the directory at start and, while the agent runs,
//! every bundle that appears or changes, without a restart.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use crate::Error;

/// What a path in the images directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bundle {
    Tar,
    Gzip,
    Zstd,
    OciLayout,
}

impl Bundle {
    /// The kind of bundle at `path`, if it is one.
    pub fn of(path: &Path) -> Option<Bundle> {
        let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
        // Hidden: a copy on its way in, renamed into place when whole.
        if name.starts_with('.') {
            return None;
        }
        if path.is_dir() {
            return path
                .join("oci-layout")
                .is_file()
                .then_some(Bundle::OciLayout);
        }
        if name.ends_with(".tar") {
            Some(Bundle::Tar)
        } else if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            Some(Bundle::Gzip)
        } else if name.ends_with(".tar.zst") {
            Some(Bundle::Zstd)
        } else {
            None
        }
    }
}

/// Imports the bundle at `path` into the containerd at `socket` (the CRI plugin's
/// `k8s.io` namespace); the names of the images it held.
pub fn import(socket: &Path, path: &Path, kind: Bundle) -> Result<Vec<String>, Error> {
    let open = || {
        std::fs::File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))
    };
    match kind {
        Bundle::Tar => ctr_import(socket, path, open()?),
        Bundle::Gzip => ctr_import(socket, path, flate2::read::GzDecoder::new(open()?)),
        Bundle::Zstd => {
            let decoder =
                ruzstd::decoding::StreamingDecoder::new(open()?).map_err(|e| Error::Import {
                    file: path.display().to_string(),
                    message: format!("not zstd: {e}"),
                })?;
            ctr_import(socket, path, decoder)
        }
        Bundle::OciLayout => {
            // The layout tarred on the fly, as `ctr` takes OCI archives.
            let (reader, mut writer) =
                std::io::pipe().map_err(|e| Error::io("making a pipe", e))?;
            let dir = path.to_path_buf();
            let index = named_index(&dir)?;
            let tarring = std::thread::spawn(move || {
                let mut archive = tar::Builder::new(&mut writer);
                archive.follow_symlinks(false);
                archive.append_path_with_name(dir.join("oci-layout"), "oci-layout")?;
                let mut header = tar::Header::new_gnu();
                header.set_size(index.len() as u64);
                header.set_mode(0o644);
                archive.append_data(&mut header, "index.json", index.as_slice())?;
                archive.append_dir_all("blobs", dir.join("blobs"))?;
                archive.into_inner()?.flush()
            });
            let imported = ctr_import(socket, path, reader);
            let tarred = tarring
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("panicked")));
            let names = imported?;
            tarred.map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            Ok(names)
        }
    }
}

/// A layout's `index.json`, each manifest whose reference name is a whole image
/// reference (`registry/repo:tag`) also named so in containerd's own annotation: `ctr
/// import` names images only from that one (a bare tag would get a made-up
/// repository, so it stays unnamed, as with `ctr`).
fn named_index(dir: &Path) -> Result<Vec<u8>, Error> {
    let path = dir.join("index.json");
    let text =
        std::fs::read(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let bad = |message: String| Error::Import {
        file: dir.display().to_string(),
        message,
    };
    let mut index: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(format!("index.json: {e}")))?;
    for manifest in index["manifests"].as_array_mut().into_iter().flatten() {
        let annotations = &mut manifest["annotations"];
        let reference = annotations[REF_NAME].as_str().map(str::to_string);
        if let Some(reference) = reference.filter(|r| r.contains('/') || r.contains(':'))
            && annotations[CONTAINERD_NAME].is_null()
        {
            annotations[CONTAINERD_NAME] = serde_json::Value::String(reference);
        }
    }
    serde_json::to_vec(&index).map_err(|e| bad(e.to_string()))
}

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const CONTAINERD_NAME: &str = "io.containerd.image.name";

/// `ctr images import -` fed from `input`; the names it unpacked.
fn ctr_import(socket: &Path, path: &Path, mut input: impl Read) -> Result<Vec<String>, Error> {
    let mut child = Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(["-n", "k8s.io", "images", "import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("running ctr (is containerd installed?)", e))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let copied = std::io::copy(&mut input, &mut stdin);
    drop(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io("waiting for ctr", e))?;
    let failed = |message: String| Error::Import {
        file: path.display().to_string(),
        message,
    };
    if !out.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    copied.map_err(|e| failed(format!("reading the bundle: {e}")))?;
    // `unpacking <name> (<digest>)...done`, a line per image.
    let names = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            line.strip_prefix("unpacking ")?
                .split_once(" (")
                .map(|(name, _)| name.to_string())
        })
        .filter(|name| !name.is_empty())
        .collect();
    Ok(names)
}

/// The bundles of one directory, each imported once per version (size and
/// modification time): a file still being copied in is imported again when it stops
/// changing, one that fails is not retried until it changes.
pub struct Watcher {
    dir: PathBuf,
    socket: PathBuf,
    seen: HashMap<PathBuf, (u64, Option<SystemTime>)>,
}

impl Watcher {
    pub fn new(socket: &Path, dir: &Path) -> Watcher {
        Watcher {
            dir: dir.to_path_buf(),
            socket: socket.to_path_buf(),
            seen: HashMap::new(),
        }
    }

    /// Imports what is new or changed since the last scan; the names of the images
    /// imported.
    pub fn scan(&mut self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut imported = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(kind) = Bundle::of(&path) else {
                continue;
            };
            let version = version(&path);
            if self.seen.get(&path) == Some(&version) {
                continue;
            }
            self.seen.insert(path.clone(), version);
            match import(&self.socket, &path, kind) {
                Ok(names) => {
                    tracing::info!(bundle = %path.display(), images = ?names, "images imported");
                    imported.extend(names);
                }
                Err(err) => {
                    tracing::warn!(bundle = %path.display(), error = %err, "image import failed")
                }
            }
        }
        imported
    }
}

/// A bundle's size and last change (a layout's: its index).
fn version(path: &Path) -> (u64, Option<SystemTime>) {
    let file = if path.is_dir() {
        path.join("index.json")
    } else {
        path.to_path_buf()
    };
    std::fs::metadata(file).map_or((0, None), |m| (m.len(), m.modified().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_are_known_by_their_names_and_layouts_by_their_marker() {
        let dir = tempfile::tempdir().unwrap();
        let kind = |name: &str| Bundle::of(&dir.path().join(name));
        assert_eq!(kind("app.tar"), Some(Bundle::Tar));
        assert_eq!(kind("app.TAR.GZ"), Some(Bundle::Gzip));
        assert_eq!(kind("app.tgz"), Some(Bundle::Gzip));
        assert_eq!(kind("app.tar.zst"), Some(Bundle::Zstd));
        assert_eq!(kind("notes.txt"), None);
        assert_eq!(kind(".app.tar.partial.tar"), None);
        let layout = dir.path().join("layout");
        std::fs::create_dir(&layout).unwrap();
        assert_eq!(Bundle::of(&layout), None);
        std::fs::write(
            layout.join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        assert_eq!(Bundle::of(&layout), Some(Bundle::OciLayout));
    }
}
