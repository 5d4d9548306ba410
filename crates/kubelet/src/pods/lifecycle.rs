//! Container lifecycle hooks and termination messages, as upstream's kubelet runs them:
//! - postStart runs right after the container starts; if it fails the container is
//!   killed (event FailedPostStartHook, waiting reason PostStartHookError) and
//!   restarted under its policy;
//! - preStop runs before the container is stopped, within the grace period; what it
//!   leaves of the period goes to SIGTERM (at least [`MIN_STOP_GRACE`]);
//! - handlers are exec, httpGet or sleep (tcpSocket is accepted and does nothing);
//! - the termination message is the file at `terminationMessagePath` (a host file
//!   mounted there, at most [`MAX_MESSAGE`] bytes), or with `FallbackToLogsOnError` the
//!   end of the log of a failed container.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use krust_cri::Runtime;
use krust_cri::api::Mount;

use super::probe;
use super::spec::pod_dir;
use crate::Config;
use crate::logfile::{self, Record};

/// How long a postStart hook may take (upstream waits without a bound; a hook that
/// hangs would hold the pod worker forever).
pub const POST_START_TIMEOUT: Duration = Duration::from_secs(120);
/// Upstream's minimum grace left for SIGTERM after a preStop hook.
pub const MIN_STOP_GRACE: i64 = 2;
/// Upstream's bound on a termination message.
const MAX_MESSAGE: usize = 4096;
/// With FallbackToLogsOnError: upstream's last 80 lines, at most 2 KiB.
const FALLBACK_LINES: usize = 80;
const FALLBACK_BYTES: usize = 2048;

/// Runs one hook handler against the container `id`.
pub async fn run(
    runtime: &Runtime,
    id: &str,
    container: &Container,
    handler: &LifecycleHandler,
    pod_ip: &str,
    timeout: Duration,
) -> Result<(), String> {
    if let Some(action) = &handler.exec {
        return probe::exec(runtime, id, action, timeout).await;
    }
    if let Some(action) = &handler.http_get {
        return probe::http_get(container, action, pod_ip, timeout).await;
    }
    if let Some(action) = &handler.sleep {
        let seconds = Duration::from_secs(action.seconds.max(0) as u64);
        tokio::time::sleep(seconds.min(timeout)).await;
    }
    Ok(())
}

/// The host file behind one container instance's termination message.
pub fn message_file(config: &Config, pod: &Pod, container: &str, attempt: u32) -> PathBuf {
    pod_dir(config, pod)
        .join("containers")
        .join(container)
        .join(format!("{attempt}.termination-log"))
}

/// Creates the (empty, world-writable: the container may run as any user) message file
/// and returns its mount at `terminationMessagePath`.
pub fn message_mount(path: &Path, container: &Container) -> std::io::Result<Mount> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, b"")?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(Mount {
        container_path: container
            .termination_message_path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/dev/termination-log".into()),
        host_path: path.display().to_string(),
        ..Mount::default()
    })
}

/// The termination message of an exited instance: its message file, else (with
/// `FallbackToLogsOnError` and a failure) the end of its log.
pub fn message(file: &Path, log: &Path, container: &Container, exit_code: i32) -> String {
    let written = std::fs::read(file).unwrap_or_default();
    if !written.is_empty() {
        return String::from_utf8_lossy(&written[..written.len().min(MAX_MESSAGE)]).into_owned();
    }
    let fallback = container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
    if !fallback || exit_code == 0 {
        return String::new();
    }
    let log = std::fs::read(log).unwrap_or_default();
    let mut text = Vec::new();
    let lines: Vec<&[u8]> = logfile::lines(&log).collect();
    for line in &lines[lines.len().saturating_sub(FALLBACK_LINES)..] {
        if let Some(record) = Record::parse(line) {
            record.write_to(false, &mut text);
        }
    }
    let start = text.len().saturating_sub(FALLBACK_BYTES);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::{from_value, json};

    #[test]
    fn termination_message_from_the_file_or_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (file, log) = (dir.path().join("msg"), dir.path().join("0.log"));
        let plain: Container = from_value(json!({"name": "c"})).unwrap();
        let fallback: Container =
            from_value(json!({"name": "c", "terminationMessagePolicy": "FallbackToLogsOnError"}))
                .unwrap();
        let mount = message_mount(&file, &plain).unwrap();
        assert_eq!(mount.container_path, "/dev/termination-log");
        std::fs::write(
            &log,
            "2026-11-30T10:00:00Z stdout F first\n2026-11-30T10:00:01Z stderr F boom\n",
        )
        .unwrap();
        assert_eq!(message(&file, &log, &plain, 1), "");
        assert_eq!(message(&file, &log, &fallback, 1), "first\nboom\n");
        assert_eq!(
            message(&file, &log, &fallback, 0),
            "",
            "only failures fall back"
        );
        std::fs::write(&file, "x".repeat(5000)).unwrap();
        assert_eq!(message(&file, &log, &fallback, 1).len(), MAX_MESSAGE);
    }
}
