//! Bind mounts, as a CSI driver publishes a volume and as the kubelet sees them, and
//! the free space of a filesystem.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Whether `target` is a mount point (listed in this process's mountinfo).
pub fn is_mounted(target: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = target.to_string_lossy();
    // Field 5 is the mount point, with spaces and the like escaped as octal.
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m.replace("\\040", " ") == target)
}

/// Bind-mounts `source` on `target` (a directory that must exist), read-only if asked.
/// Mounting what is already mounted there does nothing.
pub fn bind(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    if is_mounted(target) {
        return Ok(());
    }
    let (src, dst) = (c_path(source)?, c_path(target)?);
    // SAFETY: both paths are valid NUL-terminated strings; no filesystem type or data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if read_only {
        // A bind mount takes its flags only on a remount.
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        // SAFETY: as above.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                dst.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            let err = io::Error::last_os_error();
            let _ = unmount(target);
            return Err(err);
        }
    }
    Ok(())
}

/// What the filesystem holding `path` has free for unprivileged users (statvfs).
pub fn available_bytes(path: &Path) -> io::Result<u64> {
    let p = c_path(path)?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a valid NUL-terminated path and a buffer statvfs fills on success.
    if unsafe { libc::statvfs(p.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the buffer.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.f_bavail * stat.f_frsize)
}

/// Unmounts `target` if it is mounted.
pub fn unmount(target: &Path) -> io::Result<()> {
    if !is_mounted(target) {
        return Ok(());
    }
    let dst = c_path(target)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
