//! A CustomResourceDefinition whose versions convert by webhook, end to end with the
//! real kubectl against a real `krust server`, as upstream's conformance test
//! (`crd_conversion_webhook.go`) has it: v1 keeps `hostPort`, v2 `host` and `port`; an
//! HTTPS converter in the test process (the one upstream's agnhost image serves) turns
//! one into the other. Reads, lists of objects stored in both versions, watches and
//! writes all see the version they asked for; a converter's refusal fails the request
//! with upstream's message and stores nothing.

use serde_json::{Value, json};

use crate::common::Server;
use crate::https::{HttpsServer, Seen};
use crate::watch::curl_stream;

const GROUP: &str = "stable.example.com";

/// upstream's agnhost `crd-conversion-webhook`, on `/crdconvert`.
fn convert(seen: &Seen) -> (u16, Value) {
    let request = &seen.body["request"];
    let desired = request["desiredAPIVersion"].as_str().unwrap_or_default();
    let mut converted = Vec::new();
    let mut failure = None;
    for obj in request["objects"].as_array().into_iter().flatten() {
        let mut obj = obj.clone();
        let from = obj["apiVersion"].as_str().unwrap_or_default().to_string();
        match (from.rsplit('/').next(), desired.rsplit('/').next()) {
            (a, b) if a == b => {
                failure = Some(format!(
                    "conversion from a version to itself should not call the webhook: {from}"
                ));
            }
            (Some("v1"), Some("v2")) => {
                if let Some(hp) = obj["hostPort"].as_str().map(str::to_string) {
                    match hp.split(':').collect::<Vec<_>>()[..] {
                        [host, port] => {
                            obj["host"] = json!(host);
                            obj["port"] = json!(port);
                            obj.as_object_mut().unwrap().remove("hostPort");
                        }
                        _ => failure = Some(format!("invalid hostPort value `{hp}`")),
                    }
                }
            }
            (Some("v2"), Some("v1")) => {
                if obj.get("host").is_some() || obj.get("port").is_some() {
                    let part = |f: &str| obj[f].as_str().unwrap_or_default().to_string();
                    obj["hostPort"] = json!(format!("{}:{}", part("host"), part("port")));
                    let o = obj.as_object_mut().unwrap();
                    o.remove("host");
                    o.remove("port");
                }
            }
            _ => failure = Some(format!("unexpected conversion version {desired:?}")),
        }
        obj["apiVersion"] = json!(desired);
        converted.push(obj);
    }
    let response = match failure {
        Some(message) => {
            json!({"uid": request["uid"], "result": {"status": "Failure", "message": message}})
        }
        None => {
            json!({"uid": request["uid"], "convertedObjects": converted, "result": {"status": "Success"}})
        }
    };
    (
        200,
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "response": response}),
    )
}

fn definition(conversion: Value) -> String {
    let props = |p: Value| json!({"openAPIV3Schema": {"type": "object", "properties": p}});
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{GROUP}")},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "preserveUnknownFields": false,
            "versions": [
                {"name": "v1", "served": true, "storage": true,
                 "schema": {"openAPIV3Schema": {"type": "object", "required": ["hostPort"],
                     "properties": {"hostPort": {"type": "string"}}}}},
                {"name": "v2", "served": true, "storage": false,
                 "schema": props(json!({"host": {"type": "string"}, "port": {"type": "string"}}))}
            ],
            "conversion": conversion
        }
    })
    .to_string()
}

fn widget_v1(name: &str, host_port: &str) -> String {
    json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Widget",
           "metadata": {"name": name, "labels": {"app": "w"}}, "hostPort": host_port})
    .to_string()
}

/// The reviews the converter received: (desired version, names of the objects sent).
fn reviews(hooks: &HttpsServer) -> Vec<(String, Vec<String>)> {
    hooks
        .requests()
        .into_iter()
        .map(|seen| {
            let r = &seen.body["request"];
            let names = r["objects"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| {
                    o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
                .collect();
            let desired = r["desiredAPIVersion"].as_str().unwrap_or_default();
            (desired.to_string(), names)
        })
        .collect()
}

fn names(list: &Value) -> Vec<&str> {
    let mut names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_conversion_webhook_serves_every_version_of_a_custom_resource() {
    let s = Server::apiserver(&[]);
    let hooks = HttpsServer::start(&[], None, convert);

    // A Webhook strategy needs somewhere to call and the review versions it speaks.
    let err = s.fails_stdin(
        &["create", "-f", "-"],
        &definition(json!({"strategy": "Webhook"})),
    );
    assert!(
        err.contains("spec.conversion.webhookClientConfig: Required value: required when strategy is set to Webhook")
            && err.contains("spec.conversion.conversionReviewVersions: Required value"),
        "{err}"
    );

    let url = format!("https://127.0.0.1:{}/crdconvert", hooks.port);
    s.ok_stdin(
        &["create", "-f", "-"],
        &definition(json!({"strategy": "Webhook", "webhook": {
            "clientConfig": {"url": url, "caBundle": hooks.ca_bundle()},
            "conversionReviewVersions": ["v1", "v1beta1"]
        }})),
    );
    s.ok(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/widgets.{GROUP}"),
        "--timeout=30s",
    ]);

    // Stored in v1, read in v2: converted by the webhook; in v1, as stored.
    s.ok_stdin(&["create", "-f", "-"], &widget_v1("cr-1", "localhost:8080"));
    let v2 = s.get_json(&["widgets.v2.stable.example.com", "cr-1"]);
    assert_eq!(v2["apiVersion"], format!("{GROUP}/v2"));
    assert_eq!(
        (&v2["host"], &v2["port"]),
        (&json!("localhost"), &json!("8080"))
    );
    assert!(v2.get("hostPort").is_none(), "{v2}");
    assert_eq!(v2["metadata"]["labels"]["app"], "w");
    assert!(
        reviews(&hooks).contains(&(format!("{GROUP}/v2"), vec!["cr-1".to_string()])),
        "{:?}",
        reviews(&hooks)
    );
    let v1 = s.get_json(&["widgets.v1.stable.example.com", "cr-1"]);
    assert_eq!(v1["hostPort"], "localhost:8080");
    // Written through v2, stored (and checked by the storage schema) in v1.
    s.ok_stdin(
        &["create", "-f", "-"],
        &json!({"apiVersion": format!("{GROUP}/v2"), "kind": "Widget",
                "metadata": {"name": "cr-v2"}, "host": "h", "port": "1"})
        .to_string(),
    );
    let v1 = s.get_json(&["widgets.v1.stable.example.com", "cr-v2"]);
    assert_eq!(v1["hostPort"], "h:1");
    s.ok(&["delete", "widgets.v1.stable.example.com", "cr-v2"]);

    // v2 becomes the storage version: a v1 object is converted on its way in.
    s.ok(&[
        "patch",
        "crd",
        &format!("widgets.{GROUP}"),
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/versions/0/storage","value":false},
            {"op":"replace","path":"/spec/versions/1/storage","value":true}]"#,
    ]);
    crate::common::wait_for(
        "creates to be stored in v2",
        std::time::Duration::from_secs(30),
        || {
            s.ok_stdin(&["create", "-f", "-"], &widget_v1("probe", "p:1"));
            s.ok(&["delete", "widgets.v1.stable.example.com", "probe"]);
            reviews(&hooks)
                .contains(&(format!("{GROUP}/v2"), vec!["probe".to_string()]))
                .then_some(())
        },
    );
    s.ok_stdin(&["create", "-f", "-"], &widget_v1("cr-2", "localhost:8080"));

    // A list of objects stored in both versions: only those in another version are
    // sent, all in one review.
    let before = reviews(&hooks).len();
    let list = s.get_json(&["widgets.v1.stable.example.com"]);
    assert_eq!(names(&list), ["cr-1", "cr-2"]);
    for item in list["items"].as_array().unwrap() {
        assert_eq!(item["apiVersion"], format!("{GROUP}/v1"));
        assert_eq!(item["hostPort"], "localhost:8080", "{item}");
        assert!(item.get("host").is_none(), "{item}");
    }
    assert_eq!(
        reviews(&hooks)[before..],
        [(format!("{GROUP}/v1"), vec!["cr-2".to_string()])]
    );
    let list = s.get_json(&["widgets.v2.stable.example.com"]);
    assert_eq!(names(&list), ["cr-1", "cr-2"]);
    for item in list["items"].as_array().unwrap() {
        assert_eq!(
            (&item["host"], &item["port"]),
            (&json!("localhost"), &json!("8080"))
        );
    }

    // A watch in v1 sees both in v1, and changes as they come.
    let watch = curl_stream(
        &s,
        &format!("/apis/{GROUP}/v1/namespaces/default/widgets?watch=1"),
    );
    let mut seen = Vec::new();
    for _ in 0..2 {
        let ev = watch.next_json();
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["hostPort"], "localhost:8080", "{ev}");
        seen.push(
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    seen.sort();
    assert_eq!(seen, ["cr-1", "cr-2"]);
    s.ok(&[
        "patch",
        "widgets.v2.stable.example.com",
        "cr-2",
        "--type=merge",
        "-p",
        r#"{"port":"9090"}"#,
    ]);
    let ev = watch.next_json();
    assert_eq!(ev["type"], "MODIFIED");
    assert_eq!(ev["object"]["hostPort"], "localhost:9090", "{ev}");

    // An object still stored in the old storage version, written through it: merged in
    // the new storage version, stored there.
    s.ok(&[
        "patch",
        "widgets.v1.stable.example.com",
        "cr-1",
        "--type=merge",
        "-p",
        r#"{"hostPort":"localhost:9000"}"#,
    ]);
    let v2 = s.get_json(&["widgets.v2.stable.example.com", "cr-1"]);
    assert_eq!(
        (&v2["host"], &v2["port"]),
        (&json!("localhost"), &json!("9000"))
    );
    let before = reviews(&hooks).len();
    let list = s.get_json(&["widgets.v2.stable.example.com"]);
    assert_eq!(names(&list), ["cr-1", "cr-2"]);
    assert_eq!(reviews(&hooks).len(), before, "both are stored in v2 now");

    // A converter that refuses fails the write with its message; nothing is stored.
    let err = s.fails_stdin(&["create", "-f", "-"], &widget_v1("bad", "nocolon"));
    assert!(
        err.contains(&format!(
            "conversion webhook for {GROUP}/v1, Kind=Widget failed: invalid hostPort value `nocolon`"
        )),
        "{err}"
    );
    let err = s.fails(&["get", "widgets.v1.stable.example.com", "bad"]);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
}
