//! Container logs from the CRI log files containerd writes ([`crate::logfile`]). Options as upstream's `PodLogOptions`: `follow` (until
//! the container stops), `previous`, `timestamps`, `tailLines`, `sinceSeconds` /
//! `sinceTime` and `limitBytes`.

use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use k8s_openapi::jiff::Timestamp;
use krust_api::status::ApiError;
use krust_cri::Runtime;
use krust_cri::api::{ContainerState, ContainerStatusRequest};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;

use super::{Body, containers};
use crate::logfile::{self, Record};

/// How often a followed log file is read again.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// How often, while nothing new arrives, a followed container is checked for having
/// stopped.
const RUNNING_CHECK: Duration = Duration::from_secs(1);

#[derive(Debug, Default, PartialEq)]
pub struct Options {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
    pub since: Option<Timestamp>,
}

impl Options {
    pub fn parse(query: Option<&str>) -> Result<Options, ApiError> {
        let mut o = Options::default();
        for (k, v) in krust_httpstream::params::pairs(query) {
            let flag = krust_httpstream::params::flag(&v);
            let number = |name: &str| {
                v.parse::<i64>()
                    .ok()
                    .filter(|n| *n >= 0)
                    .ok_or_else(|| ApiError::bad_request(format!("invalid {name}: {v:?}")))
            };
            match k.as_str() {
                "follow" => o.follow = flag,
                "previous" => o.previous = flag,
                "timestamps" => o.timestamps = flag,
                "tailLines" => o.tail_lines = Some(number(&k)? as usize),
                "limitBytes" => o.limit_bytes = Some(number(&k)? as usize),
                "sinceSeconds" => {
                    let ago = Duration::from_secs(number(&k)? as u64);
                    o.since = Timestamp::now().checked_sub(ago).ok();
                }
                "sinceTime" => {
                    o.since =
                        Some(v.parse().map_err(|_| {
                            ApiError::bad_request(format!("invalid sinceTime: {v:?}"))
                        })?)
                }
                _ => {}
            }
        }
        Ok(o)
    }
}

pub async fn serve(
    runtime: &Runtime,
    ns: &str,
    pod: &str,
    container: &str,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let options = Options::parse(query)?;
    let found = containers(runtime, ns, pod, container).await?;
    let chosen = if options.previous {
        found.get(1).ok_or_else(|| {
            ApiError::bad_request(format!(
                "previous terminated container \"{container}\" in pod \"{pod}\" not found"
            ))
        })?
    } else {
        found.first().ok_or_else(|| {
            ApiError::bad_request(format!(
                "container \"{container}\" in pod \"{pod}\" is waiting to start: ContainerCreating"
            ))
        })?
    };
    let status = runtime
        .runtime
        .clone()
        .container_status(ContainerStatusRequest {
            container_id: chosen.id.clone(),
            verbose: false,
        })
        .await
        .map_err(|e| ApiError::internal(format!("container status: {}", e.message())))?
        .into_inner()
        .status
        .ok_or_else(|| ApiError::internal("the runtime returned no container status"))?;
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let runtime = runtime.clone();
    let id = chosen.id.clone();
    tokio::spawn(async move {
        let path = std::path::PathBuf::from(&status.log_path);
        if let Err(err) = copy(&path, options, tx, runtime, id).await {
            tracing::debug!(path = %path.display(), %err, "streaming a log ended");
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::io::Error>(Frame::data(chunk)), rx))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    Ok(resp)
}

/// Renders records to the client: the existing ones (after `tailLines` and the time
/// bound), then, when following, new ones as they are written until the container
/// stops. Stops early at `limitBytes` or when the client goes away.
async fn copy(
    path: &std::path::Path,
    options: Options,
    tx: mpsc::Sender<Bytes>,
    runtime: Runtime,
    container_id: String,
) -> std::io::Result<()> {
    let mut file = tokio::fs::File::open(path).await?;
    let mut pending = Vec::new();
    file.read_to_end(&mut pending).await?;
    let mut offset = pending.len() as u64;
    let complete = pending
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let rest = pending.split_off(complete);
    let records: Vec<&[u8]> = logfile::lines(&pending).collect();
    let skip = options
        .tail_lines
        .map_or(0, |n| records.len().saturating_sub(n));
    let mut budget = options.limit_bytes.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    for record in &records[skip..] {
        render(record, &options, &mut out);
    }
    if !send(&tx, &mut out, &mut budget).await || !options.follow {
        return Ok(());
    }
    pending = rest;
    let mut last_check = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(FOLLOW_POLL).await;
        file.seek(std::io::SeekFrom::Start(offset)).await?;
        let read = file.read_to_end(&mut pending).await?;
        offset += read as u64;
        if let Some(end) = pending.iter().rposition(|b| *b == b'\n') {
            let rest = pending.split_off(end + 1);
            for record in logfile::lines(&pending) {
                render(record, &options, &mut out);
            }
            pending = rest;
            if !send(&tx, &mut out, &mut budget).await {
                return Ok(());
            }
        }
        if read == 0 && last_check.elapsed() >= RUNNING_CHECK {
            last_check = tokio::time::Instant::now();
            if tx.is_closed() || !running(&runtime, &container_id).await {
                return Ok(());
            }
        }
    }
}

/// Sends what is rendered, within the byte budget; false when the stream is done.
async fn send(tx: &mpsc::Sender<Bytes>, out: &mut Vec<u8>, budget: &mut usize) -> bool {
    if out.is_empty() {
        return *budget > 0;
    }
    out.truncate(*budget);
    *budget -= out.len();
    let chunk = Bytes::from(std::mem::take(out));
    tx.send(chunk).await.is_ok() && *budget > 0
}

async fn running(runtime: &Runtime, id: &str) -> bool {
    let status = runtime
        .runtime
        .clone()
        .container_status(ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        })
        .await;
    status.is_ok_and(|s| {
        s.into_inner()
            .status
            .is_some_and(|s| s.state() == ContainerState::ContainerRunning)
    })
}

/// Appends one CRI log record as the client sees it; records before `since` and
/// malformed ones are left out.
fn render(line: &[u8], options: &Options, out: &mut Vec<u8>) {
    let Some(record) = Record::parse(line) else {
        return;
    };
    if let Some(since) = options.since
        && record.time.parse::<Timestamp>().is_ok_and(|t| t < since)
    {
        return;
    }
    record.write_to(options.timestamps, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(records: &[&str], options: &Options) -> String {
        let mut out = Vec::new();
        for r in records {
            render(r.as_bytes(), options, &mut out);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn joins_partial_lines_and_adds_newlines() {
        let records = [
            "2026-11-30T10:00:00.1Z stdout P hello ",
            "2026-11-30T10:00:00.2Z stdout F world",
            "2026-11-30T10:00:01Z stderr F oops",
            "2026-11-30T10:00:02Z stdout F ",
        ];
        assert_eq!(
            rendered(&records, &Options::default()),
            "hello world\noops\n\n"
        );
    }

    #[test]
    fn timestamps_and_since() {
        let records = [
            "2026-11-30T10:00:00Z stdout F old",
            "2026-11-30T10:00:05.5Z stdout F new",
        ];
        let options = Options {
            timestamps: true,
            since: Some("2026-11-30T10:00:03Z".parse().unwrap()),
            ..Options::default()
        };
        assert_eq!(rendered(&records, &options), "2026-11-30T10:00:05.5Z new\n");
    }

    #[test]
    fn parses_upstream_parameters() {
        let o = Options::parse(Some(
            "follow=true&tailLines=3&limitBytes=10&timestamps=1&sinceTime=2026-11-30T10%3A00%3A00Z",
        ))
        .unwrap();
        assert!(o.follow && o.timestamps && !o.previous);
        assert_eq!((o.tail_lines, o.limit_bytes), (Some(3), Some(10)));
        assert_eq!(o.since, Some("2026-11-30T10:00:00Z".parse().unwrap()));
        assert_eq!(Options::parse(Some("tailLines=-1")).unwrap_err().code, 400);
    }
}
