//! The image of the pod program `netexec.rs` (next to this file), shared by the network
//! policy tests and the pod network benchmark (`examples/pod_network_bench.rs` includes
//! this file).

use std::path::{Path, PathBuf};
use std::process::Command;

use krust_cri::image::ImageBuilder;

/// Compiles `netexec.rs` into a static binary in `work` (std only: `rustc` alone, no
/// cargo) and writes an image of it, named `reference`, as a tarball there: its path.
pub fn build(work: &Path, reference: &str) -> Result<PathBuf, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/network_policy/netexec.rs");
    let binary = work.join("netexec");
    let out = Command::new("rustc")
        .args([
            "--edition",
            "2021",
            "-O",
            "-C",
            "target-feature=+crt-static",
            "-o",
        ])
        .arg(&binary)
        .arg(&source)
        .output()
        .map_err(|e| format!("running rustc: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let tarball = work.join("netexec.tar");
    let program = std::fs::read(&binary).map_err(|e| e.to_string())?;
    ImageBuilder::new(reference)
        .file("netexec", program, 0o755)
        .entrypoint(&["/netexec"])
        .write(&tarball)
        .map_err(|e| e.to_string())?;
    Ok(tarball)
}
