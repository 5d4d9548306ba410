//! Protobuf answers (`application/vnd.kubernetes.protobuf`), as upstream writes them.
//! kubectl's generators are client-go typed clients that put protobuf first in their
//! Accept header, so the real kubectl decodes krust's protobuf objects and errors; a
//! client that accepts only protobuf gets objects, lists, watch events, metadata views
//! and errors in it, and 406 for custom resources, which have no protobuf form.

use std::time::Duration;

use krust_apimachinery::protobuf::decode;
use serde_json::{Value, json};

use crate::common::{self, Server};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
const ONLY_PROTOBUF: &str = "Accept: application/vnd.kubernetes.protobuf";

/// An object as kubectl prints it: without managedFields.
fn without_managed_fields(mut object: Value) -> Value {
    if let Some(meta) = object["metadata"].as_object_mut() {
        meta.remove("managedFields");
    }
    object
}

/// The Content-Type of the last answer in kubectl's `-v=8` log (the write; discovery
/// comes first).
fn answer_content_type(log: &str) -> &str {
    let Some((_, answer)) = log.rsplit_once("\"Response\" status=") else {
        return "";
    };
    answer
        .lines()
        .find_map(|l| l.trim().strip_prefix("Content-Type: "))
        .unwrap_or_default()
}

#[test]
fn kubectl_reads_protobuf_objects_and_errors() {
    let s = Server::apiserver(&[]);
    let ns = "/api/v1/namespaces/default";
    let cases: &[(&[&str], String)] = &[
        (
            &[
                "create",
                "configmap",
                "cm",
                "--from-literal=a=b",
                "--from-literal=empty=",
            ],
            format!("{ns}/configmaps/cm"),
        ),
        (
            &["create", "secret", "generic", "sec", "--from-literal=k=v"],
            format!("{ns}/secrets/sec"),
        ),
        (
            &["create", "service", "nodeport", "svc", "--tcp=80:8080"],
            format!("{ns}/services/svc"),
        ),
        (
            &[
                "create",
                "deployment",
                "web",
                "--image=busybox",
                "--replicas=3",
                "--port=80",
            ],
            "/apis/apps/v1/namespaces/default/deployments/web".into(),
        ),
        (
            &[
                "create",
                "cronjob",
                "often",
                "--image=busybox",
                "--schedule=*/5 * * * *",
            ],
            "/apis/batch/v1/namespaces/default/cronjobs/often".into(),
        ),
        (
            &[
                "create",
                "role",
                "reader",
                "--verb=get,list",
                "--resource=pods",
            ],
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/reader".into(),
        ),
        (
            &[
                "create",
                "pdb",
                "budget",
                "--selector=app=web",
                "--min-available=50%",
            ],
            "/apis/policy/v1/namespaces/default/poddisruptionbudgets/budget".into(),
        ),
        (
            &["create", "ingress", "site", "--rule=example.com/*=web:80"],
            "/apis/networking.k8s.io/v1/namespaces/default/ingresses/site".into(),
        ),
    ];
    for (args, path) in cases {
        let out = s.kubectl(&[args, &["-o", "json", "-v=8"][..]].concat());
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubectl {args:?}: {log}");
        assert_eq!(answer_content_type(&log), PROTOBUF, "kubectl {args:?}");
        // What kubectl decoded from the protobuf answer is the object as stored.
        let printed: Value = serde_json::from_slice(&out.stdout).expect("kubectl prints JSON");
        let (code, stored) = s.curl("GET", path, None, None);
        assert_eq!(code, 200, "{stored}");
        assert_eq!(printed, without_managed_fields(stored), "kubectl {args:?}");
    }

    // An error in protobuf: kubectl reads its message from the Status.
    let out = s.kubectl(&["create", "configmap", "cm", "-v=8"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(answer_content_type(&log), PROTOBUF);
    assert!(
        log.contains(r#"error: failed to create configmap: configmaps "cm" already exists"#),
        "{log}"
    );
}

#[test]
fn protobuf_only_clients_get_objects_lists_watches_and_errors_in_protobuf() {
    let s = Server::apiserver(&[]);
    let cms = "/api/v1/namespaces/default/configmaps";
    for name in ["one", "two"] {
        let (code, body) = s.curl(
            "POST",
            cms,
            Some("application/json"),
            Some(
                json!({"metadata": {"name": name}, "data": {"k": name}})
                    .to_string()
                    .as_bytes(),
            ),
        );
        assert_eq!(code, 201, "{body}");
    }
    let protobuf = |path: &str, accept: &str| {
        let (code, content_type, bytes) = s.curl_bytes(path, &[accept]);
        assert!(bytes.starts_with(b"k8s\0"), "{path}: {code} {content_type}");
        (
            code,
            content_type,
            decode(&bytes).expect("krust's protobuf decodes"),
        )
    };

    // One object, the same as its JSON.
    let (code, content_type, object) = protobuf(&format!("{cms}/one"), ONLY_PROTOBUF);
    assert_eq!((code, content_type.as_str()), (200, PROTOBUF));
    let (_, json_object) = s.curl("GET", &format!("{cms}/one"), None, None);
    assert_eq!(object, json_object);

    // A list: ListMeta and every item.
    let (code, _, list) = protobuf(cms, ONLY_PROTOBUF);
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "ConfigMapList");
    assert!(
        list["metadata"]["resourceVersion"].as_str().is_some(),
        "{list}"
    );
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"one") && names.contains(&"two"),
        "{names:?}"
    );
    assert_eq!(
        list["items"][0]["data"]["k"],
        list["items"][0]["metadata"]["name"]
    );

    // The metadata-only view that client-go metadata informers ask for.
    let metadata = "Accept: application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    let (code, content_type, partial) = protobuf(cms, metadata);
    assert_eq!((code, content_type.as_str()), (200, PROTOBUF));
    assert_eq!(partial["kind"], "PartialObjectMetadataList");
    assert_eq!(partial["items"].as_array().unwrap().len(), names.len());
    assert!(partial["items"][0].get("data").is_none(), "{partial}");

    // A watch: length-framed WatchEvents holding the objects, then the bookmark that
    // ends the initial events.
    let watch = format!(
        "{cms}?watch=1&timeoutSeconds=2&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    );
    let (code, content_type, stream) = s.curl_bytes(&watch, &[ONLY_PROTOBUF]);
    assert_eq!(
        (code, content_type.as_str()),
        (200, "application/vnd.kubernetes.protobuf;stream=watch")
    );
    let events = watch_events(&stream);
    let added: Vec<&str> = events
        .iter()
        .filter(|(ty, _)| ty == "ADDED")
        .map(|(_, o)| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(added.len(), names.len(), "{events:?}");
    let (ty, bookmark) = &events[names.len()];
    assert_eq!(ty, "BOOKMARK");
    assert_eq!(bookmark["kind"], "ConfigMap");
    assert_eq!(
        bookmark["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // An error is a protobuf Status.
    let (code, content_type, status) = protobuf(&format!("{cms}/nope"), ONLY_PROTOBUF);
    assert_eq!((code, content_type.as_str()), (404, PROTOBUF));
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "NotFound");
    assert_eq!(status["code"], 404);
    assert_eq!(status["message"], r#"configmaps "nope" not found"#);

    // Tables have no protobuf form.
    let table = "Accept: application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1";
    assert_eq!(s.curl_bytes(cms, &[table]).0, 406);

    // Custom resources have none either: 406 when nothing else is accepted, JSON when it is.
    let crd = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
      "metadata": {"name": "widgets.example.com"},
      "spec": {"group": "example.com", "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [{"name": "v1", "served": true, "storage": true,
          "schema": {"openAPIV3Schema": {"type": "object"}}}]}}"#;
    let out = s.kubectl_with("kubectl", &["apply", "-f", "-"], Some(crd));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let widgets = "/apis/example.com/v1/namespaces/default/widgets";
    common::wait_for(
        "the custom resource is served",
        Duration::from_secs(30),
        || (s.curl("GET", widgets, None, None).0 == 200).then_some(()),
    );
    let (code, _, body) = s.curl_bytes(widgets, &[ONLY_PROTOBUF]);
    assert_eq!(code, 406);
    let refusal: Value = serde_json::from_slice(&body).expect("a JSON Status");
    assert_eq!(
        refusal["message"],
        "only the following media types are accepted: application/json, application/yaml"
    );
    let either = "Accept: application/vnd.kubernetes.protobuf, application/json";
    let (code, content_type, _) = s.curl_bytes(widgets, &[either]);
    assert_eq!((code, content_type.as_str()), (200, "application/json"));
}

/// The (type, object) of each event of a protobuf watch stream: four big-endian length
/// bytes, then a `WatchEvent {type = 1, object = 2 RawExtension {raw = 1}}`.
fn watch_events(mut stream: &[u8]) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    while stream.len() >= 4 {
        let length = u32::from_be_bytes(stream[..4].try_into().unwrap()) as usize;
        let (event, rest) = stream[4..].split_at(length);
        stream = rest;
        let fields = length_delimited(event);
        let ty = String::from_utf8(fields[0].1.to_vec()).unwrap();
        assert_eq!((fields[0].0, fields[1].0), (1, 2));
        let raw = length_delimited(fields[1].1);
        events.push((ty, decode(raw[0].1).expect("the event's object decodes")));
    }
    assert!(stream.is_empty(), "a partial frame is left");
    events
}

/// The fields of a message whose fields are all length-delimited, as (number, bytes).
fn length_delimited(mut message: &[u8]) -> Vec<(u64, &[u8])> {
    fn varint(bytes: &mut &[u8]) -> u64 {
        let mut value = 0;
        for shift in (0..64).step_by(7) {
            let byte = bytes[0];
            *bytes = &bytes[1..];
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                break;
            }
        }
        value
    }
    let mut fields = Vec::new();
    while !message.is_empty() {
        let key = varint(&mut message);
        assert_eq!(key & 7, 2, "wire type of field {}", key >> 3);
        let length = varint(&mut message) as usize;
        let (value, rest) = message.split_at(length);
        fields.push((key >> 3, value));
        message = rest;
    }
    fields
}
