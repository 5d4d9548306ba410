//! The REST verbs and the watch cache, through the apiserver's own request path but in
//! process: an embedded store in a temporary directory and requests handed straight to
//! the handler (no TLS, no socket, no krust binary), so they run in milliseconds.

use std::time::Duration;

use crate::harness::Harness;
use http_body_util::BodyExt;
use krust_apiserver::serve_in_process;
use serde_json::{Value, json};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn cm(name: &str, data: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"app": name}}, "data": {"k": data}})
}

#[tokio::test]
async fn create_get_update_and_delete_with_optimistic_concurrency() {
    let h = Harness::new().await;
    let (code, created) = h.call("POST", CMS, Some(cm("a", "1"))).await;
    assert_eq!(code, 201, "{created}");
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(created["metadata"]["uid"].is_string());

    let (code, again) = h.call("POST", CMS, Some(cm("a", "1"))).await;
    assert_eq!(
        (code, again["reason"].as_str()),
        (409, Some("AlreadyExists"))
    );

    let mut update = created.clone();
    update["data"]["k"] = json!("2");
    let (code, updated) = h
        .call("PUT", &format!("{CMS}/a"), Some(update.clone()))
        .await;
    assert_eq!(code, 200, "{updated}");
    assert_ne!(updated["metadata"]["resourceVersion"], json!(rv));
    // The same update again carries the old resourceVersion: a conflict, nothing written.
    let (code, conflict) = h.call("PUT", &format!("{CMS}/a"), Some(update)).await;
    assert_eq!((code, conflict["reason"].as_str()), (409, Some("Conflict")));
    let (_, current) = h.call("GET", &format!("{CMS}/a"), None).await;
    assert_eq!(current["data"]["k"], "2");

    let (code, _) = h.call("DELETE", &format!("{CMS}/a"), None).await;
    assert_eq!(code, 200);
    let (code, gone) = h.call("GET", &format!("{CMS}/a"), None).await;
    assert_eq!((code, gone["reason"].as_str()), (404, Some("NotFound")));
}

#[tokio::test]
async fn patches_dry_run_and_label_selectors() {
    let h = Harness::new().await;
    for (name, data) in [("x", "1"), ("y", "2")] {
        assert_eq!(h.call("POST", CMS, Some(cm(name, data))).await.0, 201);
    }
    let (code, patched) = h
        .call_as(
            "PATCH",
            &format!("{CMS}/x"),
            "application/merge-patch+json",
            Some(json!({"data": {"extra": "e"}})),
        )
        .await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["data"], json!({"k": "1", "extra": "e"}));

    let (code, dry) = h
        .call("POST", &format!("{CMS}?dryRun=All"), Some(cm("z", "3")))
        .await;
    assert_eq!(code, 201, "{dry}");
    assert_eq!(h.call("GET", &format!("{CMS}/z"), None).await.0, 404);

    let (_, list) = h
        .call("GET", &format!("{CMS}?labelSelector=app%3Dy"), None)
        .await;
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["y"]);
}

#[tokio::test]
async fn lists_page_with_limit_and_continue_at_one_snapshot() {
    let h = Harness::new().await;
    for i in 0..5 {
        assert_eq!(
            h.call("POST", CMS, Some(cm(&format!("c{i}"), "v"))).await.0,
            201
        );
    }
    let (_, first) = h.call("GET", &format!("{CMS}?limit=2"), None).await;
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    // Written after the first page: not in the later pages of the same list.
    assert_eq!(h.call("POST", CMS, Some(cm("late", "v"))).await.0, 201);
    let mut seen = 2;
    let mut next = Some(token);
    while let Some(token) = next {
        let (code, page) = h
            .call("GET", &format!("{CMS}?limit=2&continue={token}"), None)
            .await;
        assert_eq!(code, 200, "{page}");
        seen += page["items"].as_array().unwrap().len();
        next = page["metadata"]["continue"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string);
    }
    assert_eq!(seen, 5);
}

#[tokio::test]
async fn a_watch_from_the_cache_sees_changes_after_its_resource_version() {
    let h = Harness::new().await;
    let (_, created) = h.call("POST", CMS, Some(cm("w", "1"))).await;
    let rv = created["metadata"]["resourceVersion"].as_str().unwrap();
    let req = Harness::request(
        "GET",
        &format!("{CMS}?watch=true&resourceVersion={rv}"),
        "application/json",
        None,
    );
    let resp = serve_in_process(&h.api, &h.admin, req).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut update = created.clone();
    update["data"]["k"] = json!("2");
    assert_eq!(
        h.call("PUT", &format!("{CMS}/w"), Some(update)).await.0,
        200
    );
    assert_eq!(h.call("DELETE", &format!("{CMS}/w"), None).await.0, 200);
    let mut events = Vec::new();
    let mut buffered = Vec::new();
    while events.len() < 2 {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("a watch event within 5 s")
            .unwrap()
            .unwrap();
        buffered.extend_from_slice(&frame.into_data().unwrap());
        while let Some(end) = buffered.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffered.drain(..=end).collect();
            let event: Value = serde_json::from_slice(&line).unwrap();
            events.push((
                event["type"].as_str().unwrap().to_string(),
                event["object"]["data"]["k"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ));
        }
    }
    assert_eq!(
        events,
        [
            ("MODIFIED".to_string(), "2".to_string()),
            ("DELETED".into(), "2".into())
        ]
    );
}

#[tokio::test]
async fn upgrades_are_refused_without_a_connection() {
    let h = Harness::new().await;
    let (code, body) = h
        .call(
            "POST",
            "/api/v1/namespaces/default/pods/p/exec?command=true",
            None,
        )
        .await;
    assert!(code == 400 || code == 404, "{code} {body}");
    assert_eq!(body["kind"], "Status");
}

/// A delete that races writes to the same object (a controller writing status while a
/// user deletes) is retried on the fresh object, as upstream's store does: it succeeds,
/// never answers 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_racing_writes_are_retried_not_refused() {
    let h = std::sync::Arc::new(Harness::new().await);
    for round in 0..30 {
        let name = format!("raced-{round}");
        let (code, created) = h.call("POST", CMS, Some(cm(&name, "0"))).await;
        assert_eq!(code, 201, "{created}");
        let path = format!("{CMS}/{name}");
        // Writes as fast as they go until the object is gone.
        let writer = tokio::spawn({
            let (h, path) = (h.clone(), path.clone());
            async move {
                for i in 0.. {
                    let patch = json!({"data": {"k": i.to_string()}});
                    let (code, _) = h
                        .call_as("PATCH", &path, "application/merge-patch+json", Some(patch))
                        .await;
                    if code == 404 {
                        break;
                    }
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
        let (code, body) = h.call("DELETE", &path, None).await;
        assert_eq!(code, 200, "round {round}: {body}");
        writer.await.unwrap();
    }
}

/// Deleting a Service answers with the Service, as upstream's service storage does
/// (the official clients decode the answer as one); other kinds answer a Status.
#[tokio::test]
async fn deleting_a_service_answers_with_the_service() {
    let h = Harness::new().await;
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"ports": [{"port": 80}]}});
    let (code, created) = h
        .call("POST", "/api/v1/namespaces/default/services", Some(svc))
        .await;
    assert_eq!(code, 201, "{created}");
    let (code, deleted) = h
        .call("DELETE", "/api/v1/namespaces/default/services/web", None)
        .await;
    assert_eq!(
        (code, deleted["kind"].as_str()),
        (200, Some("Service")),
        "{deleted}"
    );
    assert_eq!(deleted["metadata"]["uid"], created["metadata"]["uid"]);
    h.call("POST", CMS, Some(cm("c", "1"))).await;
    let (code, status) = h.call("DELETE", &format!("{CMS}/c"), None).await;
    assert_eq!(
        (code, status["kind"].as_str()),
        (200, Some("Status")),
        "{status}"
    );
}
