//! Behaviour clients and upstream's own suites look at (kubectl's test-cmd, issue 39):
//! what a write stores and what a refusal says, byte for byte as kube-apiserver 1.33.

use crate::harness::Harness;
use serde_json::json;

#[tokio::test]
async fn string_data_is_merged_into_data_and_never_stored() {
    let h = Harness::new().await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
        "data": {"k1": "djE=", "k2": ""}, "stringData": {"k2": "v2", "k3": "v3"}});
    let (code, created) = h
        .call("POST", "/api/v1/namespaces/default/secrets", Some(secret))
        .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        created["data"],
        json!({"k1": "djE=", "k2": "djI=", "k3": "djM="})
    );
    assert!(created.get("stringData").is_none(), "{created}");
    // An update's stringData replaces the key's value too.
    let mut update = created.clone();
    update["stringData"] = json!({"k1": "new"});
    let (code, updated) = h
        .call("PUT", "/api/v1/namespaces/default/secrets/s", Some(update))
        .await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(updated["data"]["k1"], "bmV3");
    assert!(updated.get("stringData").is_none(), "{updated}");
}

#[tokio::test]
async fn field_refs_select_fields_of_v1_unless_they_say_otherwise() {
    let h = Harness::new().await;
    let field_ref = json!({"fieldRef": {"fieldPath": "metadata.name"}});
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
    "containers": [{"name": "c", "image": "busybox",
        "env": [{"name": "NAME", "valueFrom": field_ref}, {"name": "PLAIN", "value": "x"}]}],
    "volumes": [
        {"name": "d", "downwardAPI": {"items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        {"name": "p", "projected": {"sources": [{"downwardAPI": {"items": [
            {"path": "ns", "fieldRef": {"apiVersion": "v2", "fieldPath": "metadata.namespace"}}]}}]}},
    ]}});
    let (code, created) = h
        .call("POST", "/api/v1/namespaces/default/pods", Some(pod))
        .await;
    assert_eq!(code, 201, "{created}");
    let spec = &created["spec"];
    let env = &spec["containers"][0]["env"];
    assert_eq!(env[0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");
    assert!(env[1].get("valueFrom").is_none(), "{env}");
    assert_eq!(
        spec["volumes"][0]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"],
        "v1"
    );
    let projected = &spec["volumes"][1]["projected"]["sources"][0]["downwardAPI"]["items"][0];
    assert_eq!(projected["fieldRef"]["apiVersion"], "v2");
}

#[tokio::test]
async fn a_body_that_is_not_json_is_an_unrecognized_object() {
    let h = Harness::new().await;
    let yaml = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: valid-pod\n".to_vec();
    let (code, status) = h.call_raw("POST", "/api/v1/namespaces", yaml).await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "the object provided is unrecognized (must be of type Namespace): couldn't get version/kind; json parse error: "
        ),
        "{message}"
    );
    // The body's first 30 bytes, in hex since they do not look like JSON.
    assert!(
        message.ends_with("(61706956657273696f6e3a2076310a6b696e643a20506f640a6d65746164 ...)"),
        "{message}"
    );
}

/// The raw body of a GET with these query and User-Agent.
async fn raw_get(h: &Harness, path: &str, user_agent: &str) -> String {
    use http_body_util::BodyExt;
    let req = http::Request::get(path)
        .header("user-agent", user_agent)
        .body(bytes::Bytes::new())
        .unwrap();
    let resp = krust_apiserver::serve_in_process(&h.api, &h.admin, req).await;
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn curl_and_pretty_get_indented_json_as_upstream() {
    let h = Harness::new().await;
    let path = "/api/v1/namespaces/default";
    // Upstream's field order: kind, then apiVersion.
    let indented = "{\n  \"kind\": \"Namespace\",\n  \"apiVersion\": \"v1\",\n";
    assert!(raw_get(&h, path, "curl/7.88.1").await.starts_with(indented));
    assert!(raw_get(&h, path, "Wget/1.21").await.starts_with(indented));
    assert!(
        raw_get(&h, &format!("{path}?pretty=true"), "kubectl/v1.33.1")
            .await
            .starts_with(indented)
    );
    let compact = raw_get(&h, path, "kubectl/v1.33.1").await;
    assert!(
        compact.starts_with("{\"kind\":\"Namespace\",\"apiVersion\":\"v1\","),
        "{compact}"
    );
    let refused = raw_get(&h, &format!("{path}?pretty=false"), "curl/7.88.1").await;
    assert!(refused.starts_with("{\"kind\""), "{refused}");
}
