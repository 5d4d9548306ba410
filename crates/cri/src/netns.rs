//! `/run/netns`, where containerd keeps each pod's network namespace as a bind mount,
//! made a shared mount of itself before the first namespace is mounted there, as
//! iproute2's `ip netns` makes it. Otherwise the first `ip netns add` on the machine
//! (an operator, a CNI plugin, a test) mounts the directory over itself and hides
//! every namespace mounted before: containerd can then neither unmount nor remove
//! them, and they stay until the machine reboots.

use std::ffi::CString;
use std::path::Path;

use crate::Error;

const DIR: &str = "/run/netns";

/// Makes [`DIR`] its own shared mount unless it is one, or namespaces are mounted in
/// it already (a mount over them would hide them: they are left as they are).
pub fn share_namespace_dir() -> Result<(), Error> {
    std::fs::create_dir_all(DIR).map_err(|e| Error::io(format!("creating {DIR}"), e))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::io("reading /proc/self/mountinfo", e))?;
    let points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .collect();
    if points.contains(&DIR) {
        return Ok(());
    }
    let inside = Path::new(DIR);
    if points.iter().any(|p| Path::new(p).starts_with(inside)) {
        tracing::warn!(
            "network namespaces are mounted in {DIR}, which is not a mount of its own; leaving it"
        );
        return Ok(());
    }
    mount(Some(DIR), libc::MS_BIND | libc::MS_REC)?;
    mount(None, libc::MS_SHARED | libc::MS_REC)
}

/// `mount(source, DIR, NULL, flags, NULL)`.
fn mount(source: Option<&str>, flags: libc::c_ulong) -> Result<(), Error> {
    let target = CString::new(DIR).expect("no NUL");
    let source = source.map(|s| CString::new(s).expect("no NUL"));
    let none = CString::new("none").expect("no NUL");
    let source_ptr = source.as_ref().unwrap_or(&none).as_ptr();
    // SAFETY: every pointer is a NUL-terminated string that outlives the call; a null
    // filesystem type and data are allowed for bind and propagation changes.
    let rc = unsafe {
        libc::mount(
            source_ptr,
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::io(
            format!("making {DIR} a shared mount"),
            std::io::Error::last_os_error(),
        ))
    }
}
