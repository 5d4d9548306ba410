//! Images without a registry: single-layer images built from files on this machine,
//! written as docker-archive tarballs (`docker save` format: `manifest.json`, the image
//! config, one `layer.tar`), and imported into containerd's `k8s.io` namespace with
//! `ctr images import` (shipped with containerd).
//!
//! Two images are built this way: the pod sandbox ([`PAUSE_IMAGE`]: a shell that waits
//! for SIGTERM, on the machine's static busybox) and [`BUSYBOX_IMAGE`] (busybox with a
//! link per applet) for tests and demos.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::Error;
use crate::bundle::Bundle;

/// The sandbox image krust builds and imports itself.
pub const PAUSE_IMAGE: &str = "krust.local/pause:3.10";
/// A busybox image from the machine's busybox-static (`busybox` in a pod spec).
pub const BUSYBOX_IMAGE: &str = "docker.io/library/busybox:latest";
/// The same image under the tag many manifests pin (`busybox:stable`, as kube-rs's
/// cluster tests do).
pub const BUSYBOX_STABLE_IMAGE: &str = "docker.io/library/busybox:stable";
/// Debian's busybox-static.
pub const BUSYBOX: &str = "/usr/bin/busybox";

/// One file of an image's only layer.
enum Entry {
    File {
        path: String,
        data: Vec<u8>,
        mode: u32,
    },
    Dir {
        path: String,
    },
    Link {
        path: String,
        target: String,
    },
}

/// A single-layer image under construction.
pub struct ImageBuilder {
    references: Vec<String>,
    entries: Vec<Entry>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: Vec<String>,
}

impl ImageBuilder {
    /// An image to be tagged `reference` (e.g. `docker.io/library/busybox:latest`).
    pub fn new(reference: &str) -> Self {
        ImageBuilder {
            references: vec![reference.to_string()],
            entries: Vec::new(),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        }
    }

    /// One more name for the same image.
    pub fn tag(mut self, reference: &str) -> Self {
        self.references.push(reference.to_string());
        self
    }

    pub fn dir(mut self, path: &str) -> Self {
        self.entries.push(Entry::Dir { path: path.into() });
        self
    }

    pub fn file(mut self, path: &str, data: Vec<u8>, mode: u32) -> Self {
        self.entries.push(Entry::File {
            path: path.into(),
            data,
            mode,
        });
        self
    }

    pub fn link(mut self, path: &str, target: &str) -> Self {
        self.entries.push(Entry::Link {
            path: path.into(),
            target: target.into(),
        });
        self
    }

    pub fn entrypoint(mut self, args: &[&str]) -> Self {
        self.entrypoint = args.iter().map(|a| a.to_string()).collect();
        self
    }

    pub fn cmd(mut self, args: &[&str]) -> Self {
        self.cmd = args.iter().map(|a| a.to_string()).collect();
        self
    }

    fn layer(&self) -> std::io::Result<Vec<u8>> {
        let mut tar = tar::Builder::new(Vec::new());
        for entry in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_mtime(0);
            header.set_uid(0);
            header.set_gid(0);
            match entry {
                Entry::Dir { path } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    header.set_size(0);
                    tar.append_data(&mut header, path, std::io::empty())?;
                }
                Entry::File { path, data, mode } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    tar.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Link { path, target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    tar.append_link(&mut header, path, target)?;
                }
            }
        }
        tar.into_inner()
    }

    /// Writes the image as a docker-archive tarball at `out`.
    pub fn write(&self, out: &Path) -> Result<(), Error> {
        let io = |e| Error::io(format!("writing image {}", out.display()), e);
        let layer = self.layer().map_err(io)?;
        let layer_digest = format!("{:x}", Sha256::digest(&layer));
        let mut container_config = BTreeMap::new();
        container_config.insert("Env", json!(self.env));
        if !self.entrypoint.is_empty() {
            container_config.insert("Entrypoint", json!(self.entrypoint));
        }
        if !self.cmd.is_empty() {
            container_config.insert("Cmd", json!(self.cmd));
        }
        container_config.insert("WorkingDir", json!("/"));
        let config = json!({
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": container_config,
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "krust"}],
        });
        let config = serde_json::to_vec(&config).expect("image config encodes");
        let config_digest = format!("{:x}", Sha256::digest(&config));
        let manifest = json!([{
            "Config": format!("{config_digest}.json"),
            "RepoTags": self.references,
            "Layers": [format!("{layer_digest}/layer.tar")],
        }]);
        let manifest = serde_json::to_vec(&manifest).expect("manifest encodes");

        let file = std::fs::File::create(out).map_err(io)?;
        let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
        let mut add = |path: &str, data: &[u8]| -> std::io::Result<()> {
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_size(data.len() as u64);
            tar.append_data(&mut header, path, data)
        };
        add(&format!("{layer_digest}/layer.tar"), &layer).map_err(io)?;
        add(&format!("{config_digest}.json"), &config).map_err(io)?;
        add("manifest.json", &manifest).map_err(io)?;
        tar.into_inner().and_then(|mut w| w.flush()).map_err(io)
    }
}

/// The applets the machine's busybox provides.
fn busybox_applets() -> Result<Vec<String>, Error> {
    let out = Command::new(BUSYBOX).arg("--list").output().map_err(|e| {
        Error::io(
            format!("running {BUSYBOX} (is busybox-static installed?)"),
            e,
        )
    })?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|a| !a.is_empty() && a != "busybox")
        .collect())
}

fn busybox_base(reference: &str) -> Result<ImageBuilder, Error> {
    let binary = std::fs::read(BUSYBOX).map_err(|e| Error::io(format!("reading {BUSYBOX}"), e))?;
    let mut image = ImageBuilder::new(reference)
        .dir("bin/")
        .dir("etc/")
        .dir("tmp/")
        .dir("var/")
        .dir("root/")
        .file("bin/busybox", binary, 0o755)
        .file(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_vec(),
            0o644,
        )
        .file(
            "etc/group",
            b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
            0o644,
        );
    for applet in busybox_applets()? {
        image = image.link(&format!("bin/{applet}"), "busybox");
    }
    Ok(image)
}

/// The sandbox image: PID 1 of every pod, waiting until it is told to stop.
pub fn pause() -> Result<ImageBuilder, Error> {
    Ok(busybox_base(PAUSE_IMAGE)?.entrypoint(&[
        "/bin/sh",
        "-c",
        "trap 'exit 0' TERM INT; while true; do sleep 3600 & wait $!; done",
    ]))
}

/// Busybox, for tests and demos (`sh` by default, as the upstream image).
pub fn busybox() -> Result<ImageBuilder, Error> {
    Ok(busybox_as(BUSYBOX_IMAGE)?.tag(BUSYBOX_STABLE_IMAGE))
}

/// The same busybox under `reference` only.
pub fn busybox_as(reference: &str) -> Result<ImageBuilder, Error> {
    Ok(busybox_base(reference)?.cmd(&["sh"]))
}

/// Imports an image bundle (a docker-archive or OCI tarball, compressed or not, or an
/// OCI layout) into the containerd at `socket`, in the namespace the CRI plugin uses.
pub fn import(socket: &Path, bundle: &Path) -> Result<Vec<String>, Error> {
    let kind = Bundle::of(bundle).unwrap_or(Bundle::Tar);
    crate::bundle::import(socket, bundle, kind)
}

/// Builds the pause and busybox images into `dir` and imports them; their names.
pub fn import_builtin(socket: &Path, dir: &Path) -> Result<Vec<String>, Error> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let mut names = Vec::new();
    for (name, image) in [("pause.tar", pause()?), ("busybox.tar", busybox()?)] {
        let path = dir.join(name);
        image.write(&path)?;
        names.extend(import(socket, &path)?);
    }
    Ok(names)
}
