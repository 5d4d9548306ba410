//! The history checker: concurrent clients create, update (with resourceVersion
//! preconditions) and delete objects through the API while the server is killed with
//! SIGKILL and restarted; watchers follow along, resuming after each crash. Afterwards:
//! - every acknowledged write is present with its value, or was superseded by a later
//!   write to the same key (acknowledged, or of unknown outcome because of the crash);
//! - no write that definitely failed (a 4xx answer) ever appears, in the final state or
//!   in any watch event;
//! - each watch stream delivered strictly increasing resourceVersions, and together the
//!   streams saw every acknowledged write's resourceVersion (no gaps, no reordering).

use crate::common;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::Server;
use serde_json::{Value, json};

const NS: &str = "history";
const WORKERS: usize = 6;
const KEYS_PER_WORKER: usize = 4;

/// One watch stream's events: (resourceVersion, key, value; None for a delete).
type Stream = Vec<(i64, String, Option<String>)>;

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Acked(i64),
    Failed,
    Unknown,
}

#[derive(Debug, Clone)]
struct Write {
    key: String,
    /// The unique value written (`None` for a delete).
    value: Option<String>,
    outcome: Outcome,
}

struct Http {
    port: u16,
    tls: PathBuf,
}

impl Http {
    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-s",
            "-m",
            "5",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
            "-H",
            "Content-Type: application/json",
        ])
        .arg("--cacert")
        .arg(self.tls.join("ca.crt"))
        .arg("--cert")
        .arg(self.tls.join("admin.crt"))
        .arg("--key")
        .arg(self.tls.join("admin.key"));
        if let Some(b) = body {
            cmd.arg("-d").arg(b.to_string());
        }
        cmd.arg(format!("https://127.0.0.1:{}{path}", self.port));
        let out = match cmd.output() {
            Ok(o) => o,
            Err(_) => return (0, Value::Null),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (
            code.trim().parse().unwrap_or(0),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    }
}

fn classify(code: u16, body: &Value) -> Outcome {
    match code {
        200 | 201 => Outcome::Acked(
            body["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0),
        ),
        400..=499 => Outcome::Failed,
        // No answer, or a server error: the write may or may not have happened.
        _ => Outcome::Unknown,
    }
}

/// One worker: a loop of create / update / delete over its own keys, one at a time.
fn worker(w: usize, http: Arc<Http>, stop: Arc<AtomicBool>, log: Arc<Mutex<Vec<Write>>>) {
    let mut rvs: BTreeMap<String, Option<i64>> = BTreeMap::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("w{w}-k{}", n as usize % KEYS_PER_WORKER);
        n += 1;
        let value = format!("w{w}-{n}");
        let known = rvs.get(&key).cloned().flatten();
        let base = format!("/api/v1/namespaces/{NS}/configmaps");
        let (write, rv) = match (known, n % 5) {
            (None, _) => {
                let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": key}, "data": {"v": value}});
                let (code, out) = http.request("POST", &base, Some(&body));
                (
                    Write {
                        key: key.clone(),
                        value: Some(value),
                        outcome: classify(code, &out),
                    },
                    out,
                )
            }
            (Some(rv), 0) => {
                let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": rv.to_string()}});
                let (code, out) = http.request("DELETE", &format!("{base}/{key}"), Some(&body));
                // A successful delete answers with a Status, which carries no resourceVersion.
                let outcome = match classify(code, &out) {
                    Outcome::Acked(_) => Outcome::Acked(0),
                    other => other,
                };
                (
                    Write {
                        key: key.clone(),
                        value: None,
                        outcome,
                    },
                    Value::Null,
                )
            }
            (Some(rv), _) => {
                let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": key, "resourceVersion": rv.to_string()}, "data": {"v": value}});
                let (code, out) = http.request("PUT", &format!("{base}/{key}"), Some(&body));
                (
                    Write {
                        key: key.clone(),
                        value: Some(value),
                        outcome: classify(code, &out),
                    },
                    out,
                )
            }
        };
        let next = match (&write.outcome, &write.value) {
            (Outcome::Acked(_), Some(_)) => rv["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok()),
            (Outcome::Acked(_), None) => None,
            // After a failure or an unknown outcome, re-read the key to learn its state.
            _ => {
                let (code, cur) = http.request("GET", &format!("{base}/{key}"), None);
                match code {
                    200 => cur["metadata"]["resourceVersion"]
                        .as_str()
                        .and_then(|r| r.parse().ok()),
                    404 => None,
                    _ => known,
                }
            }
        };
        rvs.insert(key, next);
        log.lock().unwrap().push(write);
    }
}

/// A watcher that resumes from its last resourceVersion whenever the stream ends.
fn watcher(http: Arc<Http>, from: i64, stop: Arc<AtomicBool>, streams: Arc<Mutex<Vec<Stream>>>) {
    let mut last = from;
    while !stop.load(Ordering::Relaxed) {
        let mut events = Vec::new();
        let child = Command::new("curl")
            .args(["-sN", "-m", "30"])
            .arg("--cacert").arg(http.tls.join("ca.crt"))
            .arg("--cert").arg(http.tls.join("admin.crt"))
            .arg("--key").arg(http.tls.join("admin.key"))
            .arg(format!("https://127.0.0.1:{}/api/v1/namespaces/{NS}/configmaps?watch=1&resourceVersion={last}&timeoutSeconds=20", http.port))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let Ok(mut child) = child else { continue };
        for line in BufReader::new(child.stdout.take().unwrap())
            .lines()
            .map_while(Result::ok)
        {
            let Ok(ev) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if ev["type"] == "ERROR" {
                break;
            }
            let rv: i64 = ev["object"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            let key = ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let value = (ev["type"] != "DELETED").then(|| {
                ev["object"]["data"]["v"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            });
            events.push((rv, key, value));
            last = rv.max(last);
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        streams.lock().unwrap().push(events);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The load and its observers, running against one server until [`History::check`]:
/// writers on keys of their own in namespace `history`, and two watchers that resume
/// after every crash. Also used by the chaos test.
pub(crate) struct History {
    http: Arc<Http>,
    stop: Arc<AtomicBool>,
    watch_stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Write>>>,
    streams: Arc<Mutex<Vec<Stream>>>,
    workers: Vec<JoinHandle<()>>,
    watchers: Vec<JoinHandle<()>>,
}

impl History {
    /// Creates the namespace and starts `writers` writers and two watchers.
    pub(crate) fn start(s: &Server, writers: usize) -> History {
        s.ok(&["create", "namespace", NS]);
        let http = Arc::new(Http {
            port: s.port,
            tls: s.data_dir().join("server/tls"),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let watch_stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let streams = Arc::new(Mutex::new(Vec::new()));
        // Watchers start from a list's revision, as a reflector does, so every event they
        // see is a real change in revision order.
        let (_, empty) = http.request("GET", &format!("/api/v1/namespaces/{NS}/configmaps"), None);
        let from: i64 = empty["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let watchers = (0..2)
            .map(|_| {
                let (http, stop, streams) = (http.clone(), watch_stop.clone(), streams.clone());
                std::thread::spawn(move || watcher(http, from, stop, streams))
            })
            .collect();
        let workers = (0..writers)
            .map(|w| {
                let (http, stop, log) = (http.clone(), stop.clone(), log.clone());
                std::thread::spawn(move || worker(w, http, stop, log))
            })
            .collect();
        History {
            http,
            stop,
            watch_stop,
            log,
            streams,
            workers,
            watchers,
        }
    }

    /// How many writes the server has acknowledged so far.
    pub(crate) fn acknowledged(&self) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|w| matches!(w.outcome, Outcome::Acked(_)))
            .count()
    }

    /// Stops the writers, lets the watchers catch up, and checks the history (see the
    /// module's comment). Returns how many writes were acknowledged, and how many of
    /// those carried a resourceVersion (creates and updates).
    pub(crate) fn check(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.workers {
            t.join().unwrap();
        }
        let path = format!("/api/v1/namespaces/{NS}/configmaps");
        let list = common::wait_for("the final list", Duration::from_secs(30), || {
            let (code, list) = self.http.request("GET", &path, None);
            (code == 200).then_some(list)
        });
        let log = self.log.lock().unwrap().clone();
        // The newest configmap change: the list's own revision may be a later write to
        // another resource (the apiserver renews its lease), which these watchers never
        // see.
        let newest_item = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| {
                i["metadata"]["resourceVersion"]
                    .as_str()?
                    .parse::<i64>()
                    .ok()
            })
            .max()
            .unwrap_or(0);
        let newest_ack = log
            .iter()
            .filter_map(|w| match w.outcome {
                Outcome::Acked(rv) => Some(rv),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let final_rv = newest_item.max(newest_ack);
        common::wait_for("watchers to catch up", Duration::from_secs(30), || {
            let streams = self.streams.lock().unwrap();
            let seen = streams.iter().flatten().map(|e| e.0).max().unwrap_or(0);
            (seen >= final_rv || final_rv == 0).then_some(())
        });
        self.watch_stop.store(true, Ordering::Relaxed);
        // The watchers exit when their current stream times out.
        for t in self.watchers {
            t.join().unwrap();
        }
        let streams = self.streams.lock().unwrap();
        check_final_state(&log, &list);
        check_streams(&log, &streams);
        let acked = log
            .iter()
            .filter(|w| matches!(w.outcome, Outcome::Acked(_)))
            .count();
        let acked_rvs = log
            .iter()
            .filter(|w| matches!(w.outcome, Outcome::Acked(rv) if rv > 0))
            .count();
        (acked, acked_rvs)
    }
}

/// The values of writes that definitely failed.
fn failed_values(log: &[Write]) -> BTreeSet<String> {
    log.iter()
        .filter(|w| w.outcome == Outcome::Failed)
        .filter_map(|w| w.value.clone())
        .collect()
}

/// Per key, the last write that may have happened decides the final value, and no
/// failed write is visible.
fn check_final_state(log: &[Write], list: &Value) {
    let final_state: BTreeMap<String, String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        // Only the writers' keys: a full server's controllers add `kube-root-ca.crt`.
        .filter_map(|i| {
            Some((
                i["metadata"]["name"].as_str()?.to_string(),
                i["data"]["v"].as_str()?.to_string(),
            ))
        })
        .collect();
    let failed = failed_values(log);
    let mut by_key: BTreeMap<&str, Vec<&Write>> = BTreeMap::new();
    for w in log {
        by_key.entry(&w.key).or_default().push(w);
    }
    for (key, writes) in &by_key {
        let last_acked = writes
            .iter()
            .rposition(|w| matches!(w.outcome, Outcome::Acked(_)));
        let got = final_state.get(*key);
        if let Some(v) = got {
            assert!(
                !failed.contains(v),
                "{key}: a write that failed ({v}) is visible"
            );
        }
        let Some(i) = last_acked else { continue };
        // Candidates: the last acknowledged write, or any later write of unknown outcome.
        let candidates: Vec<Option<&String>> = writes[i..]
            .iter()
            .filter(|w| w.outcome != Outcome::Failed)
            .map(|w| w.value.as_ref())
            .collect();
        assert!(
            candidates.contains(&got),
            "{key}: final {got:?} is none of the possible {candidates:?}"
        );
    }
}

/// Each watch stream is strictly increasing, shows no failed write, and together the
/// streams saw every acknowledged write.
fn check_streams(log: &[Write], streams: &[Stream]) {
    let failed = failed_values(log);
    let mut seen = BTreeSet::new();
    for stream in streams {
        for pair in stream.windows(2) {
            assert!(pair[0].0 < pair[1].0, "watch went backwards: {pair:?}");
        }
        for (rv, _, value) in stream {
            if let Some(v) = value {
                assert!(
                    !failed.contains(v),
                    "a failed write ({v}) appeared in a watch"
                );
            }
            seen.insert(*rv);
        }
    }
    let missing: Vec<i64> = log
        .iter()
        .filter_map(|w| match w.outcome {
            Outcome::Acked(rv) if rv > 0 && !seen.contains(&rv) => Some(rv),
            _ => None,
        })
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged writes no watch saw: {missing:?}"
    );
}

/// What the checker crashes while the load runs.
enum Fault<'a> {
    /// SIGKILL and restart the (embedded-store) server.
    Server,
    /// SIGKILL and restart one member of the etcd cluster under the apiserver.
    EtcdMember(&'a mut common::Etcd),
}

#[test]
fn no_acknowledged_write_is_lost_or_reordered_across_server_crashes() {
    check_history(Server::apiserver(&[]), Fault::Server);
}

#[test]
fn no_acknowledged_write_is_lost_or_reordered_across_etcd_member_crashes() {
    let mut etcd = common::Etcd::cluster(3);
    let endpoint = etcd.endpoint();
    let s = Server::start_command("apiserver", &["--datastore-endpoint", &endpoint], None);
    check_history(s, Fault::EtcdMember(&mut etcd));
}

fn check_history(mut s: Server, mut fault: Fault<'_>) {
    let history = History::start(&s, WORKERS);
    for crash in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let target = (crash + 1) * 150;
        while history.acknowledged() < target {
            assert!(Instant::now() < deadline, "the load stalled: {}", s.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        match &mut fault {
            Fault::Server => s.restart(),
            // A different member each time, the leader among them sooner or later.
            Fault::EtcdMember(etcd) => etcd.restart(crash % 3),
        }
    }
    let (acked, acked_rvs) = history.check();
    assert!(
        acked >= 450 && acked_rvs >= 300,
        "only {acked} acknowledged writes"
    );
}
