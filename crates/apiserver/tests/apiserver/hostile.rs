//! Hostile request bodies get upstream's Status errors, write nothing, and leave the
//! apiserver serving: too large, nested too deep, not UTF-8, numbers out of range, and
//! an object with 10,000 labels (valid, and stored).

use crate::harness::Harness;
use serde_json::{Value, json};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

/// The apiserver still answers, and holds exactly `n` ConfigMaps in `default`.
async fn still_serving_with(h: &Harness, n: usize) {
    let (code, list) = h.call("GET", CMS, None).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["items"].as_array().unwrap().len(), n, "{list}");
}

fn assert_status(got: &(u16, Value), code: u16, reason: &str) {
    let (status, body) = got;
    assert_eq!(*status, code, "{body}");
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["reason"], reason, "{body}");
}

#[tokio::test]
async fn a_body_over_3_mib_is_413() {
    let h = Harness::new().await;
    let big = "x".repeat(3 * 1024 * 1024);
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"k": big}});
    let got = h.call_raw("POST", CMS, body.to_string().into_bytes()).await;
    assert_status(&got, 413, "RequestEntityTooLarge");
    still_serving_with(&h, 0).await;
}

#[tokio::test]
async fn json_nested_10000_deep_is_a_bad_request_not_a_stack_overflow() {
    let h = Harness::new().await;
    let depth = 10_000;
    let deep = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"deep"}},"data":{{"k":{}{}}}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let got = h.call_raw("POST", CMS, deep.into_bytes()).await;
    assert_status(&got, 400, "BadRequest");
    // The same in YAML flow style.
    let deep_yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: deep}}\ndata: {{k: {}{}}}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let got = h
        .call_raw_as("POST", CMS, "application/yaml", deep_yaml.into_bytes())
        .await;
    assert_status(&got, 400, "BadRequest");
    still_serving_with(&h, 0).await;
}

#[tokio::test]
async fn invalid_utf8_and_out_of_range_numbers_are_bad_requests() {
    let h = Harness::new().await;
    let mut body =
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bytes"},"data":{"k":""#
            .to_vec();
    body.extend_from_slice(&[0xff, 0xfe, 0xc3]);
    body.extend_from_slice(br#""}}"#);
    assert_status(&h.call_raw("POST", CMS, body).await, 400, "BadRequest");

    // A float beyond f64 fails to parse at all; an integer beyond i32 parses as a number
    // that the typed decoding then refuses.
    for (replicas, codes) in [
        ("1e400", &[400][..]),
        ("99999999999999999999999", &[400, 422]),
    ] {
        let body = format!(
            r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"huge"}},"spec":{{"replicas":{replicas}}}}}"#
        );
        let got = h
            .call_raw(
                "POST",
                "/apis/apps/v1/namespaces/default/deployments",
                body.into_bytes(),
            )
            .await;
        assert!(codes.contains(&got.0), "{replicas}: {got:?}");
        assert_eq!(got.1["kind"], "Status", "{got:?}");
    }
    let (_, list) = h
        .call("GET", "/apis/apps/v1/namespaces/default/deployments", None)
        .await;
    assert_eq!(list["items"].as_array().unwrap().len(), 0, "{list}");
    still_serving_with(&h, 0).await;
}

#[tokio::test]
async fn ten_thousand_labels_are_stored_and_read_back() {
    let h = Harness::new().await;
    let labels: serde_json::Map<String, Value> = (0..10_000)
        .map(|i| (format!("label-{i}"), json!(format!("v{i}"))))
        .collect();
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "labelled", "labels": labels}});
    let (code, created) = h.call("POST", CMS, Some(body)).await;
    assert_eq!(code, 201, "{}", created["message"]);
    let (code, got) = h
        .call(
            "GET",
            &format!("{CMS}?labelSelector=label-9999%3Dv9999"),
            None,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(
        got["items"][0]["metadata"]["labels"]
            .as_object()
            .unwrap()
            .len(),
        10_000
    );
    still_serving_with(&h, 1).await;
}

/// Found by fuzzing (`apiserver_request`, optimized campaign): an apply whose YAML
/// `metadata` is a string (`name:1 a` without a space) made the create path index into
/// it and panic; it is a 400, and nothing is written.
#[tokio::test]
async fn an_apply_whose_metadata_is_not_a_map_is_a_bad_request() {
    let h = Harness::new().await;
    for metadata in ["name:1 a", "[a, b]"] {
        let body =
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {metadata}\ndata:\n  k: v\n");
        let got = h
            .call_raw_as(
                "PATCH",
                &format!("{CMS}/a?fieldManager=fuzz&force=true"),
                "application/apply-patch+yaml",
                body.into_bytes(),
            )
            .await;
        assert_status(&got, 400, "BadRequest");
        assert!(
            got.1["message"]
                .as_str()
                .unwrap()
                .contains(".metadata: expected map"),
            "{}",
            got.1
        );
    }
    still_serving_with(&h, 0).await;
}
