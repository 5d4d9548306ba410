//! Snapshot files appear whole or not at all: a backend writes `<dest>.partial`, makes it
//! durable, and [`commit`] renames it into place and syncs the directory, so a crash
//! leaves either no snapshot or a complete one, never a truncated file under the name.

use std::path::{Path, PathBuf};

/// Where a snapshot is written before it is complete.
pub(crate) fn partial(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Renames the durable `partial` to `dest`, syncs the directory and returns the size.
pub(crate) fn commit(partial: &Path, dest: &Path) -> std::io::Result<u64> {
    std::fs::rename(partial, dest)?;
    if let Some(dir) = dest.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(std::fs::metadata(dest)?.len())
}
