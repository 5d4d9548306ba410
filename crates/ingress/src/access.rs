//! The access log: one line per request in ingress-nginx's default format
//! (`upstreaminfo`), so that the tools that read its logs read krust's:
//!
//! ```text
//! $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
//! "$http_referer" "$http_user_agent" $request_length $request_time
//! [$proxy_upstream_name] [$proxy_alternative_upstream_name] $upstream_addr
//! $upstream_response_length $upstream_response_time $upstream_status $req_id
//! ```
//!
//! Lines are written by a thread of their own, so a slow disk never holds a request; if
//! it falls 16,384 lines behind, newer lines are dropped and counted.

use std::fmt::Write as _;
use std::hash::{BuildHasher, RandomState};
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

const BACKLOG: usize = 16_384;

pub struct AccessLog {
    lines: SyncSender<String>,
    dropped: AtomicU64,
    ids: RandomState,
    next_id: AtomicU64,
}

/// One request, as the log line needs it.
pub struct Entry<'a> {
    pub client: SocketAddr,
    /// `METHOD /path?query HTTP/1.1`.
    pub request: &'a str,
    pub status: u16,
    pub body_bytes: u64,
    pub referer: &'a str,
    pub user_agent: &'a str,
    /// Request line, headers and body, in bytes.
    pub request_length: u64,
    pub seconds: f64,
    /// ingress-nginx's upstream name (`namespace-service-port`) and the alternative
    /// (canary) one.
    pub upstream_name: &'a str,
    pub alternative_name: &'a str,
    /// The pod that answered and how long it took; `None` when no pod was asked.
    pub upstream: Option<(SocketAddr, f64)>,
}

impl AccessLog {
    /// Appends to `path` (`-`: standard output).
    pub fn open(path: &Path) -> std::io::Result<AccessLog> {
        let out: Box<dyn Write + Send> = if path == Path::new("-") {
            Box::new(std::io::stdout())
        } else {
            Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )
        };
        let (lines, pending) = sync_channel(BACKLOG);
        std::thread::Builder::new()
            .name("ingress-access-log".into())
            .spawn(move || write_lines(pending, out))?;
        Ok(AccessLog {
            lines,
            dropped: AtomicU64::new(0),
            ids: RandomState::new(),
            next_id: AtomicU64::new(0),
        })
    }

    pub fn record(&self, entry: &Entry<'_>) {
        let line = self.line(entry);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.lines.try_send(line)
        {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped,
                    "ingress access log lines dropped: the log falls behind"
                );
            }
        }
    }

    fn line(&self, e: &Entry<'_>) -> String {
        let time = jiff::Timestamp::now().strftime("%d/%b/%Y:%H:%M:%S +0000");
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = (self.ids.hash_one(n), self.ids.hash_one(!n));
        let mut line = format!(
            "{} - - [{time}] \"{}\" {} {} \"{}\" \"{}\" {} {:.3} [{}] [{}] ",
            e.client.ip(),
            e.request,
            e.status,
            e.body_bytes,
            or_dash(e.referer),
            or_dash(e.user_agent),
            e.request_length,
            e.seconds,
            e.upstream_name,
            e.alternative_name,
        );
        match e.upstream {
            Some((address, seconds)) => {
                let _ = write!(line, "{address} {} {seconds:.3} {}", e.body_bytes, e.status);
            }
            None => line.push_str("- - - -"),
        }
        let _ = write!(line, " {:016x}{:016x}", id.0, id.1);
        line
    }
}

fn or_dash(value: &str) -> &str {
    if value.is_empty() { "-" } else { value }
}

/// Writes lines as they come, flushing whenever none is waiting.
fn write_lines(pending: Receiver<String>, out: Box<dyn Write + Send>) {
    let mut out = std::io::BufWriter::new(out);
    while let Ok(line) = pending.recv() {
        let _ = writeln!(out, "{line}");
        while let Ok(line) = pending.try_recv() {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_ingress_nginx_s_upstreaminfo() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::open(&path).unwrap();
        let entry = Entry {
            client: "10.0.0.9:5555".parse().unwrap(),
            request: "GET /x?y=1 HTTP/1.1",
            status: 200,
            body_bytes: 12,
            referer: "",
            user_agent: "curl/7.88.1",
            request_length: 80,
            seconds: 0.0042,
            upstream_name: "default-web-80",
            alternative_name: "",
            upstream: Some(("10.42.0.5:8080".parse().unwrap(), 0.003)),
        };
        log.record(&entry);
        log.record(&Entry {
            status: 404,
            upstream_name: "upstream-default-backend",
            upstream: None,
            ..entry
        });
        let text = (0..100)
            .find_map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                (text.lines().count() == 2).then_some(text)
            })
            .expect("two lines written");
        let lines: Vec<&str> = text.lines().collect();
        let (head, rest) = lines[0].split_once(" [").unwrap();
        assert_eq!(head, "10.0.0.9 - -");
        let (time, rest) = rest.split_once("] ").unwrap();
        assert!(time.ends_with(" +0000") && time.len() == 26, "{time}");
        let (fields, id) = rest.rsplit_once(' ').unwrap();
        assert_eq!(
            fields,
            "\"GET /x?y=1 HTTP/1.1\" 200 12 \"-\" \"curl/7.88.1\" 80 0.004 [default-web-80] [] 10.42.0.5:8080 12 0.003 200"
        );
        assert_eq!(id.len(), 32);
        assert!(lines[1].contains(" 404 12 "), "{}", lines[1]);
        assert!(
            lines[1].contains("[upstream-default-backend] [] - - - - "),
            "{}",
            lines[1]
        );
    }
}
