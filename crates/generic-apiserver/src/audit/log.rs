//! The audit log backend: events go through a bounded queue to a thread of their own
//! that writes them as JSON lines, so a slow disk never slows a request (a full queue
//! drops events and counts them, as upstream's batch backend does). The file rotates
//! as upstream's (lumberjack): past `max_size_mb` it is renamed to
//! `<name>-<UTC time>.<ext>` and a new one begun; backups beyond `max_backups` or
//! older than `max_age_days` are removed (0 keeps them all).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime};

use serde_json::Value;

/// Events queued before new ones are dropped (upstream's `--audit-log-batch-buffer-size`).
const QUEUE: usize = 10_000;

/// Where and how the log is written.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// The file, or `-` for standard output.
    pub path: PathBuf,
    pub max_size_mb: u64,
    pub max_backups: usize,
    pub max_age_days: u64,
}

/// The request side of the backend.
pub struct Sink {
    queue: SyncSender<Value>,
    dropped: Arc<AtomicU64>,
}

impl Sink {
    /// Opens the log (creating its directory) and starts the writer thread.
    pub fn start(config: LogConfig) -> std::io::Result<Sink> {
        let out = Output::open(&config)?;
        let (queue, events) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || write_all(events, out, &config))?;
        Ok(Sink {
            queue,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Queues an event without waiting.
    pub fn send(&self, event: Value) {
        match self.queue.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed);
                if n.is_power_of_two() {
                    tracing::warn!(dropped = n + 1, "audit log queue full; events dropped");
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

enum Output {
    Stdout,
    File {
        path: PathBuf,
        writer: BufWriter<File>,
        size: u64,
    },
}

impl Output {
    fn open(config: &LogConfig) -> std::io::Result<Output> {
        if config.path.as_os_str() == "-" {
            return Ok(Output::Stdout);
        }
        if let Some(dir) = config.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&config.path)?;
        let size = file.metadata()?.len();
        Ok(Output::File {
            path: config.path.clone(),
            writer: BufWriter::new(file),
            size,
        })
    }

    fn write_line(&mut self, line: &[u8], config: &LogConfig) -> std::io::Result<()> {
        match self {
            Output::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(line)?;
                out.write_all(b"\n")
            }
            Output::File { path, writer, size } => {
                let limit = config.max_size_mb * 1024 * 1024;
                if limit > 0 && *size > 0 && *size + line.len() as u64 + 1 > limit {
                    writer.flush()?;
                    rotate(path, config)?;
                    *writer =
                        BufWriter::new(OpenOptions::new().create(true).append(true).open(&*path)?);
                    *size = 0;
                }
                writer.write_all(line)?;
                writer.write_all(b"\n")?;
                *size += line.len() as u64 + 1;
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::Stdout => std::io::stdout().flush(),
            Output::File { writer, .. } => writer.flush(),
        }
    }
}

/// How long the writer lets events gather after the first of a batch: it then wakes
/// some hundred times a second under load instead of once per request, which would cost
/// every request a wake-up of this thread.
const BATCH_WAIT: Duration = Duration::from_millis(10);

/// The writer thread: takes what is queued, writes it, flushes, waits for more.
fn write_all(events: Receiver<Value>, mut out: Output, config: &LogConfig) {
    while let Ok(first) = events.recv() {
        std::thread::sleep(BATCH_WAIT);
        for event in std::iter::once(first).chain(events.try_iter()) {
            let line = serde_json::to_vec(&event).unwrap_or_default();
            if let Err(err) = out.write_line(&line, config) {
                tracing::error!(%err, "writing the audit log");
            }
        }
        if let Err(err) = out.flush() {
            tracing::error!(%err, "flushing the audit log");
        }
    }
}

/// `audit.log` → (`audit`, `.log`).
fn stem_and_ext(path: &Path) -> (String, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.rfind('.') {
        Some(i) if i > 0 => (name[..i].to_string(), name[i..].to_string()),
        _ => (name, String::new()),
    }
}

/// Moves the full log aside and removes backups past the limits.
fn rotate(path: &Path, config: &LogConfig) -> std::io::Result<()> {
    let (stem, ext) = stem_and_ext(path);
    let dir = path.parent().unwrap_or(Path::new("."));
    let stamp = jiff::Timestamp::now().strftime("%Y-%m-%dT%H-%M-%S%.3f");
    std::fs::rename(path, dir.join(format!("{stem}-{stamp}{ext}")))?;
    let mut backups: Vec<(PathBuf, SystemTime)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&format!("{stem}-")) && name.ends_with(&ext)
        })
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
        .collect();
    // Newest first: backup names sort by their time.
    backups.sort_by(|a, b| b.0.cmp(&a.0));
    let max_age = Duration::from_secs(config.max_age_days * 24 * 3600);
    for (i, (backup, modified)) in backups.iter().enumerate() {
        let too_many = config.max_backups > 0 && i >= config.max_backups;
        let too_old = config.max_age_days > 0 && modified.elapsed().is_ok_and(|age| age > max_age);
        if too_many || too_old {
            std::fs::remove_file(backup)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_rotates_past_its_size_and_keeps_so_many_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let config = LogConfig {
            path: path.clone(),
            max_size_mb: 1,
            max_backups: 2,
            max_age_days: 0,
        };
        let mut out = Output::open(&config).unwrap();
        let line = vec![b'x'; 300 * 1024];
        for _ in 0..12 {
            out.write_line(&line, &config).unwrap();
            // Backups are named to the millisecond.
            std::thread::sleep(Duration::from_millis(2));
        }
        out.flush().unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(
            names
                .iter()
                .all(|n| n.starts_with("audit") && n.ends_with(".log"))
        );
        assert!(std::fs::metadata(&path).unwrap().len() <= 1024 * 1024);
        for backup in names.iter().filter(|n| *n != "audit.log") {
            assert!(backup.starts_with("audit-20"), "{backup}");
            let size = std::fs::metadata(dir.path().join(backup)).unwrap().len();
            assert_eq!(size, 3 * (300 * 1024 + 1));
        }
    }
}
