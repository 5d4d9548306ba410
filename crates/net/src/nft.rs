//! nftables through the `nft` tool: rulesets are loaded with `nft -f -`, each in one
//! atomic transaction, so a reader never sees half a table.

use std::fmt;
use std::io::Write;
use std::process::{Command, Stdio};

/// A transport protocol as Kubernetes names it (`TCP`, `UDP`, `SCTP`) and nftables
/// matches it (`meta l4proto tcp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// An API object's protocol field; absent means TCP, as upstream defaults it.
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    /// nftables' name of the protocol.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("running nft: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("nft rejected the ruleset: {0}")]
    Rejected(String),
}

/// Loads `ruleset` with `nft -f -` (one atomic transaction).
pub fn apply(ruleset: &str) -> Result<(), NftError> {
    run(&["-f", "-"], ruleset)
}

/// Has the kernel parse and validate `ruleset` without committing it (`nft -c`).
pub fn check(ruleset: &str) -> Result<(), NftError> {
    run(&["-c", "-f", "-"], ruleset)
}

/// Removes the table, if there is one.
pub fn delete_table(table: &str) -> Result<(), NftError> {
    run(
        &["-f", "-"],
        &format!("table ip {table}\ndelete table ip {table}\n"),
    )
}

/// Whether the table exists (`nft list tables ip`).
pub fn table_exists(table: &str) -> Result<bool, NftError> {
    let output = Command::new("nft")
        .args(["list", "tables", "ip"])
        .output()
        .map_err(NftError::Spawn)?;
    if !output.status.success() {
        return Err(NftError::Rejected(
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ));
    }
    let wanted = format!("table ip {table}");
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .any(|l| l.trim() == wanted))
}

fn run(args: &[&str], input: &str) -> Result<(), NftError> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::Spawn)?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input.as_bytes())
        .map_err(NftError::Spawn)?;
    let output = child.wait_with_output().map_err(NftError::Spawn)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(NftError::Rejected(
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ))
    }
}
