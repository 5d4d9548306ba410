//! Object lifecycle: uid and generation, the status split, finalizers and
//! deletionTimestamp, pod graceful deletion, binding, scale, generateName, and events
//! written through one API group read through the other.

use crate::common;
use crate::common::Server;
use serde_json::{Value, json};
use std::time::Duration;

const JSON: Option<&str> = Some("application/json");
const MERGE: Option<&str> = Some("application/merge-patch+json");

fn post(s: &Server, path: &str, body: Value) -> Value {
    let (code, out) = s.curl("POST", path, JSON, Some(body.to_string().as_bytes()));
    assert_eq!(code, 201, "{out}");
    out
}

fn patch(s: &Server, path: &str, body: Value) -> (u16, Value) {
    s.curl("PATCH", path, MERGE, Some(body.to_string().as_bytes()))
}

fn deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}}})
}

#[test]
fn status_is_only_written_through_its_subresource_and_generation_tracks_spec() {
    // The test writes Deployment status by hand: no deployment controller may race it.
    let s = Server::start_with(&["--disable-controllers"]);
    let base = "/apis/apps/v1/namespaces/default/deployments";
    let created = post(&s, base, deployment("web"));
    assert_eq!(created["metadata"]["generation"], 1);
    let uid = created["metadata"]["uid"].clone();

    // Status in a main-resource write is ignored.
    let (code, out) = patch(
        &s,
        &format!("{base}/web"),
        json!({"status": {"replicas": 7}, "metadata": {"labels": {"x": "y"}}}),
    );
    assert_eq!(code, 200, "{out}");
    assert!(out["status"].get("replicas").is_none(), "{out}");
    assert_eq!(
        out["metadata"]["generation"], 1,
        "metadata changes do not bump generation"
    );
    // A status write changes only status.
    let (code, out) = patch(
        &s,
        &format!("{base}/web/status"),
        json!({"status": {"replicas": 7}, "spec": {"replicas": 9}}),
    );
    assert_eq!(code, 200, "{out}");
    assert_eq!(out["status"]["replicas"], 7);
    assert_eq!(out["spec"]["replicas"], 2);
    assert_eq!(out["metadata"]["generation"], 1);
    // A spec write bumps generation and keeps uid.
    let (_, out) = patch(&s, &format!("{base}/web"), json!({"spec": {"replicas": 3}}));
    assert_eq!(out["metadata"]["generation"], 2);
    assert_eq!(out["metadata"]["uid"], uid);
    assert_eq!(out["status"]["replicas"], 7, "status survives a spec write");

    // The scale subresource reads and writes spec.replicas.
    let (code, scale) = s.curl("GET", &format!("{base}/web/scale"), None, None);
    assert_eq!(code, 200);
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 3);
    assert_eq!(scale["status"]["selector"], "app=web");
    s.ok(&["scale", "deployment", "web", "--replicas=5"]);
    assert_eq!(s.get_json(&["deployment", "web"])["spec"]["replicas"], 5);
}

#[test]
fn finalizers_hold_deletion_until_removed() {
    // The apiserver alone: a garbage collector would finish the foreground deletion
    // below before the test could see its finalizer.
    let s = Server::apiserver(&[]);
    let cms = "/api/v1/namespaces/default/configmaps";
    post(
        &s,
        cms,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held", "finalizers": ["example.com/hold"]}}),
    );
    let (code, out) = s.curl("DELETE", &format!("{cms}/held"), None, None);
    assert_eq!(code, 200, "{out}");
    let (code, out) = s.curl("GET", &format!("{cms}/held"), None, None);
    assert_eq!(code, 200, "still there while a finalizer remains");
    assert!(out["metadata"]["deletionTimestamp"].is_string(), "{out}");
    let (code, _) = patch(
        &s,
        &format!("{cms}/held"),
        json!({"metadata": {"finalizers": null}}),
    );
    assert_eq!(code, 200);
    assert_eq!(
        s.curl("GET", &format!("{cms}/held"), None, None).0,
        404,
        "gone once the last finalizer is removed"
    );

    // Foreground and orphan propagation add their finalizers for the garbage collector.
    post(
        &s,
        cms,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fg"}}),
    );
    let opts =
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"})
            .to_string();
    assert_eq!(
        s.curl("DELETE", &format!("{cms}/fg"), JSON, Some(opts.as_bytes()))
            .0,
        200
    );
    let (_, out) = s.curl("GET", &format!("{cms}/fg"), None, None);
    assert_eq!(out["metadata"]["finalizers"], json!(["foregroundDeletion"]));
    // A delete precondition on a wrong uid conflicts.
    post(
        &s,
        cms,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pre"}}),
    );
    let opts =
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "nope"}})
            .to_string();
    let (code, out) = s.curl("DELETE", &format!("{cms}/pre"), JSON, Some(opts.as_bytes()));
    assert_eq!(code, 409, "{out}");
    assert!(
        out["message"]
            .as_str()
            .unwrap()
            .contains("Precondition failed: UID in precondition: nope"),
        "{out}"
    );
}

#[test]
fn pods_bind_once_and_delete_gracefully_when_scheduled() {
    // The test binds by hand: no scheduler to race it.
    let s = Server::start_with(&["--disable-scheduler"]);
    let pods = "/api/v1/namespaces/default/pods";
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}], "terminationGracePeriodSeconds": 20}})
    };
    post(&s, pods, pod("bound"));
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bound"}, "target": {"kind": "Node", "name": "n1"}});
    assert_eq!(
        s.curl(
            "POST",
            &format!("{pods}/bound/binding"),
            JSON,
            Some(binding.to_string().as_bytes())
        )
        .0,
        201
    );
    let (code, out) = s.curl(
        "POST",
        &format!("{pods}/bound/binding"),
        JSON,
        Some(binding.to_string().as_bytes()),
    );
    assert_eq!(code, 409, "{out}");
    assert!(
        out["message"]
            .as_str()
            .unwrap()
            .contains("is already assigned to node \"n1\""),
        "{out}"
    );
    let (_, bound) = s.curl("GET", &format!("{pods}/bound"), None, None);
    assert_eq!(bound["spec"]["nodeName"], "n1");
    let scheduled = bound["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .unwrap();
    assert_eq!(scheduled["status"], "True");
    // DefaultTolerationSeconds: five minutes on a not-ready or unreachable node.
    assert_eq!(
        bound["spec"]["tolerations"],
        json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        ])
    );
    // Defaulting adds no nulls for absent lists, and a running pod's image can change.
    assert!(bound["spec"].get("initContainers").is_none(), "{bound}");
    assert!(
        bound["spec"]["containers"][0].get("ports").is_none(),
        "{bound}"
    );
    s.ok(&["set", "image", "pod/bound", "c=busybox:1.37"]);
    assert_eq!(
        s.get_json(&["pod", "bound"])["spec"]["containers"][0]["image"],
        "busybox:1.37"
    );
    // Field selectors on pod fields.
    post(&s, pods, pod("pending"));
    let names = s.ok(&[
        "get",
        "pods",
        "--field-selector",
        "spec.nodeName=n1",
        "-o",
        "name",
    ]);
    assert_eq!(names.trim(), "pod/bound");
    let names = s.ok(&[
        "get",
        "pods",
        "--field-selector",
        "spec.nodeName=",
        "-o",
        "name",
    ]);
    assert_eq!(names.trim(), "pod/pending");

    // A scheduled pod is marked for deletion with its grace period; the kubelet's final
    // delete (grace 0) removes it. An unscheduled pod goes at once.
    let (code, out) = s.curl("DELETE", &format!("{pods}/bound"), None, None);
    assert_eq!(code, 200);
    assert_eq!(out["metadata"]["deletionGracePeriodSeconds"], 20, "{out}");
    assert_eq!(s.curl("GET", &format!("{pods}/bound"), None, None).0, 200);
    assert!(s.ok(&["get", "pod", "bound"]).contains("Terminating"));
    let now =
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}).to_string();
    assert_eq!(
        s.curl(
            "DELETE",
            &format!("{pods}/bound"),
            JSON,
            Some(now.as_bytes())
        )
        .0,
        200
    );
    assert_eq!(s.curl("GET", &format!("{pods}/bound"), None, None).0, 404);
    assert_eq!(
        s.curl("DELETE", &format!("{pods}/pending"), None, None).0,
        200
    );
    assert_eq!(s.curl("GET", &format!("{pods}/pending"), None, None).0, 404);
}

#[test]
fn generate_name_unknown_field_warnings_and_event_versions() {
    let s = Server::start();
    let cms = "/api/v1/namespaces/default/configmaps";
    let a = post(
        &s,
        cms,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}}),
    );
    let b = post(
        &s,
        cms,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}}),
    );
    let (na, nb) = (
        a["metadata"]["name"].as_str().unwrap(),
        b["metadata"]["name"].as_str().unwrap(),
    );
    assert!(
        na.starts_with("gen-") && na.len() == 9 && na != nb,
        "{na} {nb}"
    );

    // fieldValidation=Warn keeps going and says what it dropped.
    let out = s.kubectl_with(common::KUBECTL, &["apply", "--validate=warn", "-f", "-"], Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"w"},"data":{"a":"1"},"bogus":1}"#));
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(r#"unknown field "bogus""#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An events.k8s.io/v1 Event is a core/v1 Event too, and the other way round.
    post(
        &s,
        "/apis/events.k8s.io/v1/namespaces/default/events",
        json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "krust/test", "reportingInstance": "t",
        "action": "Testing", "reason": "Tested", "type": "Normal", "note": "hello",
        "regarding": {"kind": "Pod", "namespace": "default", "name": "p"}}),
    );
    let (_, core) = s.curl("GET", "/api/v1/namespaces/default/events/e1", None, None);
    assert_eq!(core["apiVersion"], "v1");
    assert_eq!(core["message"], "hello");
    assert_eq!(core["involvedObject"]["name"], "p");
    let (_, v1) = s.curl(
        "GET",
        "/apis/events.k8s.io/v1/namespaces/default/events/e1",
        None,
        None,
    );
    assert_eq!(v1["apiVersion"], "events.k8s.io/v1");
    assert_eq!(v1["note"], "hello");
    let out = s.ok(&["get", "events", "--field-selector", "involvedObject.name=p"]);
    assert!(
        out.contains("Tested") && out.contains("pod/p") && out.contains("hello"),
        "{out}"
    );
}

#[test]
fn a_deleted_namespace_waits_for_its_spec_finalizers() {
    let s = Server::start_with(&["--disable-controllers"]);
    s.ok(&["create", "namespace", "doomed"]);
    let (code, out) = s.curl("DELETE", "/api/v1/namespaces/doomed", None, None);
    assert_eq!(code, 200, "{out}");
    let (_, ns) = s.curl("GET", "/api/v1/namespaces/doomed", None, None);
    assert_eq!(ns["status"]["phase"], "Terminating");
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
    // Other writes leave it Terminating; creating content in it is refused.
    let (code, _) = patch(
        &s,
        "/api/v1/namespaces/doomed",
        json!({"metadata": {"labels": {"x": "y"}}}),
    );
    assert_eq!(code, 200);
    assert_eq!(
        s.curl("GET", "/api/v1/namespaces/doomed", None, None).0,
        200
    );
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}});
    let (code, out) = s.curl(
        "POST",
        "/api/v1/namespaces/doomed/configmaps",
        JSON,
        Some(cm.to_string().as_bytes()),
    );
    assert_eq!(code, 403, "{out}");
    // Removing the last spec finalizer through /finalize removes the namespace.
    let (_, mut fin) = s.curl("GET", "/api/v1/namespaces/doomed", None, None);
    fin["spec"]["finalizers"] = json!([]);
    let (code, out) = s.curl(
        "PUT",
        "/api/v1/namespaces/doomed/finalize",
        JSON,
        Some(fin.to_string().as_bytes()),
    );
    assert_eq!(code, 200, "{out}");
    assert_eq!(
        s.curl("GET", "/api/v1/namespaces/doomed", None, None).0,
        404
    );
}

#[test]
fn events_expire_after_the_event_ttl_from_their_last_write() {
    let s = Server::apiserver(&["--event-ttl", "4s"]);
    let event = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
            "reason": "Tested", "message": "hello", "type": "Normal",
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "p"}})
    };
    post(&s, "/api/v1/namespaces/default/events", event("old"));
    let started = std::time::Instant::now();
    // A second Event kept busy: each write renews its lease, as upstream's.
    post(&s, "/api/v1/namespaces/default/events", event("busy"));
    let path = |name: &str| format!("/api/v1/namespaces/default/events/{name}");
    common::wait_for("the first Event to expire", Duration::from_secs(30), || {
        let (code, _) = patch(
            &s,
            &path("busy"),
            json!({"count": started.elapsed().as_millis() as u64}),
        );
        assert_eq!(
            code, 200,
            "the busy Event expired although written just now"
        );
        (s.curl("GET", &path("old"), None, None).0 == 404).then_some(())
    });
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "expired early: {:?}",
        started.elapsed()
    );
    let cm = s.ok(&["create", "configmap", "kept"]);
    assert!(cm.contains("created"), "{cm}");
    // Once left alone the busy one goes too; other kinds are not touched.
    common::wait_for("the busy Event to expire", Duration::from_secs(30), || {
        (s.curl("GET", &path("busy"), None, None).0 == 404).then_some(())
    });
    assert_eq!(
        s.curl(
            "GET",
            "/api/v1/namespaces/default/configmaps/kept",
            None,
            None
        )
        .0,
        200
    );
}
