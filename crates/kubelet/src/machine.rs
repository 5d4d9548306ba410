//! Facts about this machine that a Node reports: capacity (CPUs, memory, the data
//! dir's filesystem), identity (hostname, machine and boot IDs, kernel, OS image) and
//! the node's IPv4 address.

use std::net::Ipv4Addr;
use std::path::Path;

/// What the machine has and is.
#[derive(Clone, Debug)]
pub struct Machine {
    pub cpus: usize,
    pub memory_kib: u64,
    pub storage_bytes: u64,
    pub hostname: String,
    pub machine_id: String,
    pub boot_id: String,
    pub kernel: String,
    pub os_image: String,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl Machine {
    pub fn probe(data_dir: &Path) -> Machine {
        let memory_kib = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0);
        let os_image = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_else(|| "Linux".into());
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_kib,
            storage_bytes: filesystem(data_dir).map_or(0, |fs| fs.bytes),
            hostname: read("/proc/sys/kernel/hostname").to_lowercase(),
            machine_id: read("/etc/machine-id"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            kernel: read("/proc/sys/kernel/osrelease"),
            os_image,
        }
    }
}

/// Size and free space of a filesystem, for unprivileged users (as `df` shows them).
#[derive(Clone, Copy, Debug)]
pub struct Filesystem {
    pub bytes: u64,
    pub bytes_available: u64,
    pub inodes: u64,
    pub inodes_available: u64,
}

/// The filesystem holding `path`.
pub fn filesystem(path: &Path) -> Option<Filesystem> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we own; the path is NUL-terminated.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        st
    };
    let frsize = st.f_frsize as u64;
    Some(Filesystem {
        bytes: st.f_blocks as u64 * frsize,
        bytes_available: st.f_bavail as u64 * frsize,
        inodes: st.f_files as u64,
        inodes_available: st.f_favail as u64,
    })
}

/// The address other nodes reach this one on: the source address of the default
/// route (found by "connecting" a UDP socket, which sends nothing), else loopback.
pub fn node_ip() -> Ipv4Addr {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("192.0.2.1:9")?;
            s.local_addr()
        })
        .ok()
        .and_then(|a| match a.ip() {
            std::net::IpAddr::V4(ip) if !ip.is_unspecified() => Some(ip),
            _ => None,
        })
        .unwrap_or(Ipv4Addr::LOCALHOST)
}
