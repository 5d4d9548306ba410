//! The OCI runtimes containerd offers as CRI runtime handlers, which a RuntimeClass's
//! `handler` names: `runc` always, and `crun` where it is installed (Debian's `crun`
//! package), both through containerd's runc shim. One of them is the default, for pods
//! that name no RuntimeClass (k3s's `--default-runtime`).

use std::path::{Path, PathBuf};

/// A handler krust configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    Runc,
    Crun,
}

impl Handler {
    pub fn name(self) -> &'static str {
        match self {
            Handler::Runc => "runc",
            Handler::Crun => "crun",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuntimeError {
    #[error("unknown runtime {0:?}: krust configures runc and crun")]
    Unknown(String),
    #[error("the default runtime crun is not installed (Debian's crun package)")]
    CrunMissing,
}

/// The handlers of one node.
#[derive(Debug, Clone)]
pub struct Runtimes {
    default: Handler,
    /// The crun binary, when the machine has one.
    crun: Option<PathBuf>,
}

impl Runtimes {
    /// The handlers this machine has, with `default` for pods without a RuntimeClass.
    pub fn detect(default: &str) -> Result<Self, RuntimeError> {
        Self::with_crun(default, find_on_path("crun"))
    }

    fn with_crun(default: &str, crun: Option<PathBuf>) -> Result<Self, RuntimeError> {
        let default = match default {
            "runc" => Handler::Runc,
            "crun" if crun.is_some() => Handler::Crun,
            "crun" => return Err(RuntimeError::CrunMissing),
            other => return Err(RuntimeError::Unknown(other.to_string())),
        };
        Ok(Runtimes { default, crun })
    }

    /// Whether crun is among the handlers.
    pub fn has_crun(&self) -> bool {
        self.crun.is_some()
    }

    /// Every handler configured, the default first.
    pub fn handlers(&self) -> Vec<Handler> {
        let available = [
            Some(Handler::Runc),
            self.crun.as_ref().map(|_| Handler::Crun),
        ];
        let others = available
            .into_iter()
            .flatten()
            .filter(|h| *h != self.default);
        std::iter::once(self.default).chain(others).collect()
    }

    /// The CRI plugin's runtimes section of containerd's configuration (version 2),
    /// each runtime's state under `dir`.
    pub(crate) fn config(&self, dir: &Path) -> String {
        let cri = r#"[plugins."io.containerd.grpc.v1.cri".containerd"#;
        let mut out = format!("      default_runtime_name = \"{}\"\n", self.default.name());
        for handler in self.handlers() {
            let name = handler.name();
            // The runc shim runs crun as well: only the binary differs.
            let binary = match (handler, &self.crun) {
                (Handler::Crun, Some(path)) => {
                    format!("\n          BinaryName = \"{}\"", path.display())
                }
                _ => String::new(),
            };
            out.push_str(&format!(
                r#"      {cri}.runtimes.{name}]
        runtime_type = "io.containerd.runc.v2"
        {cri}.runtimes.{name}.options]{binary}
          SystemdCgroup = false
          Root = "{}/{name}"
"#,
                dir.display()
            ));
        }
        out
    }
}

impl Default for Runtimes {
    /// runc by default, crun beside it where installed.
    fn default() -> Self {
        Self::with_crun("runc", find_on_path("crun")).expect("runc is always a handler")
    }
}

/// Readies a hybrid cgroup host for crun: crun 1.8 refuses to run while the cgroup2
/// hierarchy mounted beside the v1 ones (`/sys/fs/cgroup/unified`) holds controllers,
/// which happens on hosts whose init left a controller unmounted (hugetlb, say). Each
/// such controller gets a v1 hierarchy of its own, as a systemd hybrid host mounts
/// them; runc in v1 mode manages it there as well.
pub fn ready_hybrid_cgroups() {
    let root = Path::new("/sys/fs/cgroup");
    let Ok(controllers) = std::fs::read_to_string(root.join("unified/cgroup.controllers")) else {
        return;
    };
    for controller in controllers.split_whitespace() {
        let dir = root.join(controller);
        let mounted = std::fs::create_dir_all(&dir).is_ok()
            && std::process::Command::new("mount")
                .args(["-t", "cgroup", "-o", controller, "cgroup"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
        if mounted {
            tracing::info!(
                controller,
                "moved a cgroup controller to its v1 hierarchy for crun"
            );
        } else {
            tracing::warn!(
                controller,
                "a cgroup2 controller beside the v1 hierarchies stays: crun pods will not start"
            );
        }
    }
}

/// An executable of this name in `$PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_comes_first_and_crun_only_where_installed() {
        let crun = Some(PathBuf::from("/usr/bin/crun"));
        let both = Runtimes::with_crun("crun", crun.clone()).unwrap();
        assert_eq!(both.handlers(), [Handler::Crun, Handler::Runc]);
        let config = both.config(Path::new("/d"));
        assert!(
            config.starts_with("      default_runtime_name = \"crun\"\n"),
            "{config}"
        );
        assert!(
            config.contains("runtimes.crun.options]\n          BinaryName = \"/usr/bin/crun\"\n"),
            "{config}"
        );
        assert!(config.contains("Root = \"/d/runc\""), "{config}");
        let runc_only = Runtimes::with_crun("runc", None).unwrap();
        assert_eq!(runc_only.handlers(), [Handler::Runc]);
        assert!(!runc_only.config(Path::new("/d")).contains("crun"));
        assert_eq!(
            Runtimes::with_crun("crun", None).unwrap_err(),
            RuntimeError::CrunMissing
        );
        assert_eq!(
            Runtimes::with_crun("kata", crun).unwrap_err(),
            RuntimeError::Unknown("kata".into())
        );
    }
}
