//! The kernel's routing, neighbour and forwarding tables, through iproute2 (`ip` and
//! `bridge`, present on every machine krust runs on): reads with `-j` (JSON), writes
//! as one `-batch` per tool so a sync costs two processes however many nodes there are.

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum IpError {
    #[error("running {tool}: {source}")]
    Spawn {
        tool: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} {args}: {stderr}")]
    Failed {
        tool: &'static str,
        args: String,
        stderr: String,
    },
    #[error("{tool} printed JSON that does not parse: {0}", tool = "ip")]
    Json(#[from] serde_json::Error),
}

/// Runs `tool args` (with `input` on stdin) and returns its stdout.
fn run(tool: &'static str, args: &[&str], input: Option<&str>) -> Result<String, IpError> {
    let spawn = |source| IpError::Spawn { tool, source };
    let mut child = Command::new(tool)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(input.as_bytes()).map_err(spawn)?;
    }
    let output = child.wait_with_output().map_err(spawn)?;
    if !output.status.success() {
        return Err(IpError::Failed {
            tool,
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `ip -j <args>` as JSON (an empty list when it prints nothing).
pub fn ip_json(args: &[&str]) -> Result<Vec<Value>, IpError> {
    let mut all = vec!["-j"];
    all.extend(args);
    let out = run("ip", &all, None)?;
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    Ok(serde_json::from_str(&out)?)
}

/// `bridge -j <args>` as JSON.
pub fn bridge_json(args: &[&str]) -> Result<Vec<Value>, IpError> {
    let mut all = vec!["-j"];
    all.extend(args);
    let out = run("bridge", &all, None)?;
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    Ok(serde_json::from_str(&out)?)
}

/// `ip` commands, one per line, in one process (`-force`: a failing line does not stop
/// the others; the error still says which failed).
pub fn ip_batch(lines: &[String]) -> Result<(), IpError> {
    batch("ip", lines)
}

/// `bridge` commands, one per line, in one process.
pub fn bridge_batch(lines: &[String]) -> Result<(), IpError> {
    batch("bridge", lines)
}

fn batch(tool: &'static str, lines: &[String]) -> Result<(), IpError> {
    if lines.is_empty() {
        return Ok(());
    }
    run(
        tool,
        &["-force", "-batch", "-"],
        Some(&(lines.join("\n") + "\n")),
    )
    .map(drop)
}

/// The interface that holds `addr`, with its MTU.
pub fn interface_of(addr: Ipv4Addr) -> Result<Option<(String, u32)>, IpError> {
    let wanted = addr.to_string();
    Ok(ip_json(&["-4", "addr", "show"])?
        .into_iter()
        .find_map(|link| {
            let holds = link["addr_info"]
                .as_array()?
                .iter()
                .any(|a| a["local"] == wanted.as_str());
            holds.then(|| {
                (
                    link["ifname"].as_str().unwrap_or_default().to_string(),
                    link["mtu"].as_u64().unwrap_or(1500) as u32,
                )
            })
        }))
}

/// The MAC address of a link, if it exists (asked of the kernel: under `nsenter --net`
/// /sys still shows the host's links).
pub fn link_mac(name: &str) -> Option<String> {
    let link = ip_json(&["link", "show", "dev", name])
        .ok()?
        .into_iter()
        .next()?;
    link["address"].as_str().map(str::to_string)
}
