//! Restoring an etcd snapshot into a new member's data directory, with the etcd release's
//! own tool (`etcdutl snapshot restore` from etcd 3.5, `etcdctl snapshot restore` before,
//! as Debian 12's 3.4 ships): the keyspace and its revisions come back as they were, the
//! membership is replaced by a cluster of this one member.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::EtcdError;

/// The member a snapshot is restored as.
#[derive(Debug, Clone)]
pub struct RestoredMember<'a> {
    pub name: &'a str,
    /// Where the member will keep its data; must not exist yet.
    pub data_dir: &'a Path,
    /// The peer URL the member will advertise.
    pub peer_url: &'a str,
    /// The new cluster's `--initial-cluster-token`.
    pub cluster_token: &'a str,
}

/// An executable of that name on `PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Restores `snapshot` as `member`'s data.
pub fn restore(snapshot: &Path, member: &RestoredMember<'_>) -> crate::Result<()> {
    let (tool, mut command) = match on_path("etcdutl") {
        Some(etcdutl) => ("etcdutl", Command::new(etcdutl)),
        None => {
            let etcdctl = on_path("etcdctl").ok_or(EtcdError::NoRestoreTool)?;
            let mut command = Command::new(etcdctl);
            command.env("ETCDCTL_API", "3");
            ("etcdctl", command)
        }
    };
    let output = command
        .arg("snapshot")
        .arg("restore")
        .arg(snapshot)
        .arg("--name")
        .arg(member.name)
        .arg("--data-dir")
        .arg(member.data_dir)
        .arg("--initial-cluster")
        .arg(format!("{}={}", member.name, member.peer_url))
        .arg("--initial-advertise-peer-urls")
        .arg(member.peer_url)
        .arg("--initial-cluster-token")
        .arg(member.cluster_token)
        .output()
        .map_err(|source| EtcdError::RunTool { tool, source })?;
    if !output.status.success() {
        return Err(EtcdError::Restore {
            tool,
            snapshot: snapshot.to_owned(),
            output: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        }
        .into());
    }
    Ok(())
}
