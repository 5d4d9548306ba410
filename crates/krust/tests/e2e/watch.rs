//! Watches: `kubectl get -w`, resume from a resourceVersion, selectors turning updates
//! into ADDED/DELETED, and the streaming-list bookmark.

use crate::common;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{KUBECTL, Server};
use serde_json::{Value, json};

/// Lines a child process prints, as they come.
pub struct Lines {
    child: Child,
    rx: mpsc::Receiver<String>,
}

impl Lines {
    fn spawn(mut cmd: Command) -> Lines {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { child, rx }
    }

    pub fn next(&self) -> String {
        self.rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a line within 10s")
    }

    pub fn next_json(&self) -> Value {
        serde_json::from_str(&self.next()).expect("a JSON line")
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A streaming request (a watch) with the admin certificate: the lines of its answer.
pub fn curl_stream(s: &Server, path: &str) -> Lines {
    let tls = s.data_dir().join("server/tls");
    let mut cmd = Command::new("curl");
    cmd.args(["-sSN"])
        .arg("--cacert")
        .arg(tls.join("ca.crt"))
        .arg("--cert")
        .arg(tls.join("admin.crt"))
        .arg("--key")
        .arg(tls.join("admin.key"))
        .arg(format!("https://127.0.0.1:{}{path}", s.port));
    Lines::spawn(cmd)
}

#[test]
fn kubectl_get_watch_streams_changes() {
    let s = Server::apiserver(&[]);
    let mut cmd = Command::new(KUBECTL);
    cmd.args([
        "get",
        "configmaps",
        "-w",
        "--output-watch-events",
        "-o",
        "custom-columns=EVENT:.type,NAME:.object.metadata.name,K:.object.data.k",
    ])
    .env("KUBECONFIG", s.kubeconfig());
    let watch = Lines::spawn(cmd);
    // kubectl prints the header with the first event: whether the watch sees `a` in its
    // initial list or as a change, it arrives as ADDED.
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":"1"}}"#,
    );
    assert!(watch.next().starts_with("EVENT"), "header first");
    assert_eq!(
        watch.next().split_whitespace().collect::<Vec<_>>(),
        ["ADDED", "a", "1"]
    );
    s.ok(&["patch", "configmap", "a", "-p", r#"{"data":{"k":"2"}}"#]);
    assert_eq!(
        watch.next().split_whitespace().collect::<Vec<_>>(),
        ["MODIFIED", "a", "2"]
    );
    s.ok(&["delete", "configmap", "a"]);
    assert_eq!(
        watch.next().split_whitespace().collect::<Vec<_>>(),
        ["DELETED", "a", "2"]
    );
}

#[test]
fn watch_resumes_from_a_resource_version_and_follows_selectors() {
    let s = Server::apiserver(&[]);
    let cms = "/api/v1/namespaces/default/configmaps";
    let post = |name: &str, tier: &str| {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"tier": tier}}});
        assert_eq!(
            s.curl(
                "POST",
                cms,
                Some("application/json"),
                Some(body.to_string().as_bytes())
            )
            .0,
            201
        );
    };
    post("before", "web");
    let (_, list) = s.curl("GET", cms, None, None);
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    post("after1", "web");
    post("after2", "db");

    // Resume: only what happened after the list, in order, with increasing versions.
    let watch = curl_stream(&s, &format!("{cms}?watch=1&resourceVersion={rv}"));
    let e1 = watch.next_json();
    let e2 = watch.next_json();
    assert_eq!(
        (
            e1["type"].as_str(),
            e1["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("after1"))
    );
    assert_eq!(
        (
            e2["type"].as_str(),
            e2["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("after2"))
    );
    let rv1: i64 = e1["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let rv2: i64 = e2["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv.parse::<i64>().unwrap() < rv1 && rv1 < rv2);

    // A selector watch sees an object enter and leave the selection as ADDED / DELETED.
    let selected = curl_stream(
        &s,
        &format!("{cms}?watch=1&labelSelector=tier%3Ddb&resourceVersion={rv2}"),
    );
    let relabel = |name: &str, tier: &str| {
        let patch = json!({"metadata": {"labels": {"tier": tier}}}).to_string();
        assert_eq!(
            s.curl(
                "PATCH",
                &format!("{cms}/{name}"),
                Some("application/merge-patch+json"),
                Some(patch.as_bytes())
            )
            .0,
            200
        );
    };
    relabel("after1", "db");
    let e = selected.next_json();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("after1"))
    );
    relabel("after2", "web");
    let e = selected.next_json();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("DELETED"), Some("after2"))
    );
}

/// A watch in a version whose objects are stored in another one (autoscaling/v1's
/// HorizontalPodAutoscalers are stored as v2's) sees every event in its own version.
#[test]
fn a_watch_sees_events_in_the_version_it_asked_for() {
    let s = Server::apiserver(&[]);
    s.ok(&["create", "deployment", "web", "--image=busybox"]);
    let hpas = "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers";
    let (_, list) = s.curl("GET", hpas, None, None);
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap();
    let watch = curl_stream(&s, &format!("{hpas}?watch=1&resourceVersion={rv}"));
    s.ok(&[
        "autoscale",
        "deployment",
        "web",
        "--min=1",
        "--max=3",
        "--cpu-percent=50",
    ]);
    let ev = watch.next_json();
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["apiVersion"], "autoscaling/v1", "{ev}");
    assert_eq!(
        ev["object"]["spec"]["targetCPUUtilizationPercentage"], 50,
        "{ev}"
    );
}

#[test]
fn streaming_list_ends_initial_events_with_a_bookmark() {
    let s = Server::apiserver(&[]);
    let watch = curl_stream(
        &s,
        "/api/v1/namespaces?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan",
    );
    let mut names = Vec::new();
    let bookmark = loop {
        let e = watch.next_json();
        if e["type"] == "BOOKMARK" {
            break e;
        }
        assert_eq!(e["type"], "ADDED");
        names.push(
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    };
    names.sort();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
    assert_eq!(
        bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert!(
        bookmark["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
            > 0
    );
}

#[test]
fn paged_lists_are_one_consistent_snapshot() {
    let s = Server::apiserver(&[]);
    let cms = "/api/v1/namespaces/default/configmaps";
    for i in 0..7 {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm{i}")}});
        assert_eq!(
            s.curl(
                "POST",
                cms,
                Some("application/json"),
                Some(body.to_string().as_bytes())
            )
            .0,
            201
        );
    }
    let (_, page1) = s.curl("GET", &format!("{cms}?limit=3"), None, None);
    let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
    let rv = page1["metadata"]["resourceVersion"].clone();
    // A write between pages is not seen by the rest of the list.
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm9"}});
    assert_eq!(
        s.curl(
            "POST",
            cms,
            Some("application/json"),
            Some(body.to_string().as_bytes())
        )
        .0,
        201
    );
    let (_, page2) = s.curl(
        "GET",
        &format!("{cms}?limit=3&continue={token}"),
        None,
        None,
    );
    let (_, page3) = s.curl(
        "GET",
        &format!(
            "{cms}?limit=3&continue={}",
            page2["metadata"]["continue"].as_str().unwrap()
        ),
        None,
        None,
    );
    assert!(page3["metadata"].get("continue").is_none(), "{page3}");
    let names: Vec<String> = [&page1, &page2, &page3]
        .iter()
        .flat_map(|p| {
            p["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(names, ["cm0", "cm1", "cm2", "cm3", "cm4", "cm5", "cm6"]);
    assert_eq!(page2["metadata"]["resourceVersion"], rv);
    // kubectl pages with limit=500 and gets everything.
    assert_eq!(
        s.ok(&["get", "cm", "-o", "name", "--chunk-size=2"])
            .lines()
            .count(),
        8
    );
}

/// A selective paged list: pages of `limit` matching objects however sparse they are
/// among the stored ones (the store is read in growing pages), each object once, in
/// key order, and the last page without a continue token.
#[test]
fn paged_lists_with_a_selector_page_by_matches() {
    let s = Server::apiserver(&[]);
    let cms = "/api/v1/namespaces/default/configmaps";
    let picked = [3, 17, 18, 40];
    for i in 0..45 {
        let labels = if picked.contains(&i) {
            json!({"pick": "yes"})
        } else {
            json!({})
        };
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("cm{i:02}"), "labels": labels}});
        let (code, _) = s.curl(
            "POST",
            cms,
            Some("application/json"),
            Some(body.to_string().as_bytes()),
        );
        assert_eq!(code, 201);
    }
    let mut names = Vec::new();
    let mut pages = 0;
    let mut query = format!("{cms}?labelSelector=pick%3Dyes&limit=2");
    loop {
        let (_, page) = s.curl("GET", &query, None, None);
        pages += 1;
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 2, "{page}");
        names.extend(
            items
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string()),
        );
        match page["metadata"]["continue"].as_str() {
            Some(token) => {
                query = format!("{cms}?labelSelector=pick%3Dyes&limit=2&continue={token}")
            }
            None => break,
        }
    }
    assert_eq!(names, ["cm03", "cm17", "cm18", "cm40"]);
    assert!(pages <= 3, "{pages} pages");
}

#[test]
fn continue_tokens_expire_with_compaction() {
    let s = Server::apiserver(&["--etcd-compaction-interval", "1s"]);
    let cms = "/api/v1/namespaces/default/configmaps";
    let create = |name: &str| {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
        assert_eq!(
            s.curl(
                "POST",
                cms,
                Some("application/json"),
                Some(body.to_string().as_bytes())
            )
            .0,
            201
        );
    };
    create("a");
    create("b");
    let (_, page) = s.curl("GET", &format!("{cms}?limit=1"), None, None);
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    // Two compactions later the token's revision is history.
    create("c");
    let (code, body) = common::wait_for(
        "the continue token to expire",
        Duration::from_secs(15),
        || {
            let r = s.curl(
                "GET",
                &format!("{cms}?limit=1&continue={token}"),
                None,
                None,
            );
            (r.0 != 200).then_some(r)
        },
    );
    assert_eq!(code, 410, "{body}");
    assert_eq!(body["reason"], "Expired");
    // The latest state is still all there.
    let (_, list) = s.curl("GET", cms, None, None);
    assert_eq!(list["items"].as_array().unwrap().len(), 3);
}
