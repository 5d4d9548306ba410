//! A pod's `fsGroup` on its volumes, as upstream's kubelet applies it: every file and
//! directory gets the group and group read/write, directories also group search and
//! the setgid bit (so that new files inherit the group). With `fsGroupChangePolicy:
//! OnRootMismatch` the walk is skipped when the volume's root already has them.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt, lchown};
use std::path::Path;

const GROUP_RW: u32 = 0o060;
const GROUP_X: u32 = 0o010;

/// The mode a path must have: group read/write, and for directories search + setgid.
fn wanted(mode: u32, dir: bool) -> u32 {
    if dir {
        mode | GROUP_RW | GROUP_X | libc::S_ISGID
    } else {
        mode | GROUP_RW
    }
}

/// Gives everything under `root` to group `gid`.
pub fn apply(root: &Path, gid: i64, on_root_mismatch: bool) -> io::Result<()> {
    let gid = u32::try_from(gid).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    if on_root_mismatch {
        let meta = std::fs::metadata(root)?;
        let mode = meta.permissions().mode();
        if meta.gid() == gid && wanted(mode, meta.is_dir()) == mode {
            return Ok(());
        }
    }
    walk(root, gid)
}

/// Symlinks get the group but keep their mode, and are not followed (as upstream's
/// walk).
fn walk(path: &Path, gid: u32) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    lchown(path, None, Some(gid))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode();
    let want = wanted(mode, meta.is_dir());
    if want != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(want))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            walk(&entry?.path(), gid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_directories_get_the_group_its_rights_and_setgid() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vol");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/file"), "x").unwrap();
        std::fs::set_permissions(
            root.join("sub/file"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("link")).unwrap();
        apply(&root, 2000, false).unwrap();
        for (path, mode) in [
            (root.clone(), 0o2070),
            (root.join("sub"), 0o2070),
            (root.join("sub/file"), 0o060),
        ] {
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(meta.gid(), 2000, "{}", path.display());
            assert_eq!(meta.permissions().mode() & mode, mode, "{}", path.display());
        }
        assert_eq!(
            std::fs::symlink_metadata(root.join("link")).unwrap().gid(),
            2000
        );
        assert_ne!(std::fs::metadata("/etc/hostname").unwrap().gid(), 2000);

        // OnRootMismatch: a root that already matches is left alone (a file added
        // since keeps its group).
        std::fs::write(root.join("late"), "y").unwrap();
        lchown(root.join("late"), None, Some(0)).unwrap();
        apply(&root, 2000, true).unwrap();
        assert_eq!(std::fs::metadata(root.join("late")).unwrap().gid(), 0);
        apply(&root, 3000, true).unwrap();
        assert_eq!(std::fs::metadata(root.join("late")).unwrap().gid(), 3000);
    }
}
