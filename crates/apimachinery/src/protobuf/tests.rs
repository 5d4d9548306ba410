//! [`decode`] on request bodies: bytes captured from kubectl 1.32 (`testdata/*.hex`,
//! logged by `kubectl -v=8 create ...`) against the JSON the same kubectl prints with
//! `--dry-run=client -o json` (`testdata/*.json`, Go's encoding/json of the same object),
//! and hand-built bodies for what kubectl does not send. [`encode`] on the same JSON
//! must give Go's bytes back, with or without the zero values Go's JSON writes, and
//! [`go_order`] must give Go's JSON back from the JSON without them.
//!
//! Comparisons are on the JSON text, so field order counts too.

use serde_json::{Value, json};

use super::fixture::{Enc, body, hex, sparse};
use super::{ProtobufError, WireError, decode, encode};

#[track_caller]
fn assert_json(actual: Value, expected: Value) {
    assert_eq!(actual.to_string(), expected.to_string());
}

macro_rules! kubectl_case {
    ($name:ident) => {
        #[test]
        fn $name() {
            let body = hex(include_str!(concat!(
                "testdata/",
                stringify!($name),
                ".hex"
            )));
            let expected: Value = serde_json::from_str(include_str!(concat!(
                "testdata/",
                stringify!($name),
                ".json"
            )))
            .unwrap();
            assert_json(decode(&body).unwrap(), expected.clone());
            assert_eq!(encode(&expected).unwrap(), body, "encoded from Go's JSON");
            assert_eq!(
                encode(&sparse(expected.clone(), &[])).unwrap(),
                body,
                "encoded from sparse JSON"
            );
            // Go's JSON again from the sparse form, with Go's order and zero values.
            let mut restored = sparse(expected.clone(), &[]);
            $crate::protobuf::go_order(&mut restored);
            assert_json(restored, expected);
        }
    };
}

/// Bytes captured from kubectl's generators, decoded to what kubectl prints for them.
mod kubectl {
    use super::*;

    kubectl_case!(namespace);
    kubectl_case!(configmap);
    kubectl_case!(secret);
    kubectl_case!(deployment);
    kubectl_case!(job);
    kubectl_case!(cronjob);
    kubectl_case!(service);
    kubectl_case!(service_np);
    kubectl_case!(sa);
    kubectl_case!(role);
    kubectl_case!(rolebinding);
    kubectl_case!(clusterrole);
    kubectl_case!(priorityclass);
    kubectl_case!(pdb);
    kubectl_case!(ingress);
    kubectl_case!(quota);

    /// `kubectl create token default --duration=1h --audience=api`; kubectl has no
    /// dry-run for it, so the JSON is written from the Go tags: `boundObjectRef` is a
    /// pointer and `token` a string without `omitempty`.
    #[test]
    fn token() {
        let body = hex(include_str!("testdata/token.hex"));
        assert_json(
            decode(&body).unwrap(),
            json!({
                "kind": "TokenRequest",
                "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": null},
                "spec": {"audiences": ["api"], "expirationSeconds": 3600, "boundObjectRef": null},
                "status": {"token": "", "expirationTimestamp": null},
            }),
        );
    }
}

/// ObjectMeta as gogo-protobuf writes it: every non-pointer field, zero or not.
fn meta(name: &str, namespace: &str) -> Enc {
    Enc::new()
        .str(1, name)
        .str(2, "")
        .str(3, namespace)
        .str(4, "")
        .str(5, "")
        .str(6, "")
        .int(7, 0)
        .msg(8, Enc::new())
}

fn quantity(value: &str) -> Enc {
    Enc::new().str(1, value)
}

fn int_or_string_int(value: i64) -> Enc {
    Enc::new().int(1, 0).int(2, value).str(3, "")
}

fn int_or_string_str(value: &str) -> Enc {
    Enc::new().int(1, 1).int(2, 0).str(3, value)
}

#[test]
fn configmap_binary_data_is_base64_and_maps_are_sorted() {
    let raw = Enc::new()
        .msg(1, meta("cm", "default"))
        .entry(2, "b", "2")
        .entry(2, "a", "1")
        .msg(3, Enc::new().str(1, "bin").bytes(2, &[0, 1, 2, 0xff]))
        .msg(3, Enc::new().str(1, "empty"))
        .int(4, 0);
    assert_json(
        decode(&body("v1", "ConfigMap", raw)).unwrap(),
        json!({
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": "cm", "namespace": "default", "creationTimestamp": null},
            // A pointer: present on the wire, so written even though false.
            "immutable": false,
            "data": {"a": "1", "b": "2"},
            "binaryData": {"bin": "AAEC/w==", "empty": ""},
        }),
    );
}

#[test]
fn secret_data_is_base64() {
    let raw = Enc::new()
        .msg(1, meta("s", "default"))
        .msg(2, Enc::new().str(1, "password").bytes(2, b"s3cr3t"))
        .str(3, "Opaque")
        .entry(4, "user", "admin");
    assert_json(
        decode(&body("v1", "Secret", raw)).unwrap(),
        json!({
            "kind": "Secret",
            "apiVersion": "v1",
            "metadata": {"name": "s", "namespace": "default", "creationTimestamp": null},
            "data": {"password": "czNjcjN0"},
            "stringData": {"user": "admin"},
            "type": "Opaque",
        }),
    );
}

fn deployment(max_surge: Enc) -> Vec<u8> {
    let limits = Enc::new()
        .entry_msg(1, "memory", quantity("128Mi"))
        .entry_msg(1, "cpu", quantity("500m"));
    let container = Enc::new()
        .str(1, "web")
        .str(2, "nginx")
        .msg(6, Enc::new().int(3, 80).str(4, "TCP"))
        .msg(8, limits);
    let pod_spec = Enc::new()
        .msg(2, container)
        .str(3, "")
        .int(11, 0) // hostNetwork: false, written, omitted from JSON
        .int(13, 1); // hostIPC
    let rolling = Enc::new()
        .msg(1, int_or_string_str("25%"))
        .msg(2, max_surge);
    let spec = Enc::new()
        .int(1, 3)
        .msg(2, Enc::new().entry(1, "app", "web"))
        .msg(3, Enc::new().msg(1, meta("", "")).msg(2, pod_spec))
        .msg(4, Enc::new().str(1, "RollingUpdate").msg(2, rolling))
        .int(5, 0)
        .int(7, 0);
    body(
        "apps/v1",
        "Deployment",
        Enc::new().msg(1, meta("web", "default")).msg(2, spec),
    )
}

fn deployment_json(max_surge: Value) -> Value {
    json!({
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": {"name": "web", "namespace": "default", "creationTimestamp": null},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"creationTimestamp": null},
                "spec": {
                    "containers": [{
                        "name": "web",
                        "image": "nginx",
                        "ports": [{"containerPort": 80, "protocol": "TCP"}],
                        "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
                    }],
                    "hostIPC": true,
                },
            },
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": max_surge},
            },
        },
        "status": {},
    })
}

#[test]
fn deployment_max_surge_as_int_and_as_percent() {
    assert_json(
        decode(&deployment(int_or_string_int(1))).unwrap(),
        deployment_json(json!(1)),
    );
    assert_json(
        decode(&deployment(int_or_string_str("25%"))).unwrap(),
        deployment_json(json!("25%")),
    );
}

#[test]
fn pod_times_inline_structs_and_both_list_encodings() {
    let metadata = Enc::new()
        .str(1, "p")
        .msg(8, Enc::new().int(1, 1_767_323_045))
        .int(10, 0) // deletionGracePeriodSeconds: a pointer, so 0 is kept
        .msg(13, Enc::new().str(1, "ReplicaSet").str(3, "rs").int(6, 1));
    let probe = Enc::new()
        .msg(
            1,
            Enc::new().msg(
                2,
                Enc::new()
                    .str(1, "/healthz")
                    .msg(2, int_or_string_str("http")),
            ),
        )
        .int(2, 5);
    let container = Enc::new().str(1, "c").msg(10, probe);
    let volume = Enc::new()
        .str(1, "scratch")
        .msg(2, Enc::new().msg(2, Enc::new()));
    let security = Enc::new()
        .packed(4, &[1000, 2000]) // supplementalGroups, packed
        .int(4, 3000) // and one more, unpacked
        .int(5, -1); // fsGroup, negative
    let spec = Enc::new()
        .msg(1, volume)
        .msg(2, container)
        .msg(14, security);
    let status = Enc::new()
        .str(1, "Running")
        .msg(7, Enc::new().int(1, 1_767_323_000).int(2, 999));
    let raw = Enc::new().msg(1, metadata).msg(2, spec).msg(3, status);
    assert_json(
        decode(&body("v1", "Pod", raw)).unwrap(),
        json!({
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": "p",
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "deletionGracePeriodSeconds": 0,
                "ownerReferences": [
                    {"apiVersion": "", "kind": "ReplicaSet", "name": "rs", "uid": "", "controller": true},
                ],
            },
            "spec": {
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [{
                    "name": "c",
                    "resources": {},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "initialDelaySeconds": 5},
                }],
                "securityContext": {"supplementalGroups": [1000, 2000, 3000], "fsGroup": -1},
            },
            "status": {"phase": "Running", "startTime": "2026-01-02T03:03:20Z"},
        }),
    );
}

#[test]
fn node_pod_cidrs() {
    let spec = Enc::new()
        .str(1, "10.0.0.0/24")
        .str(7, "10.0.0.0/24")
        .str(7, "fd00::/64");
    let raw = Enc::new().msg(1, meta("n1", "")).msg(2, spec);
    assert_json(
        decode(&body("v1", "Node", raw)).unwrap()["spec"].clone(),
        json!({"podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24", "fd00::/64"]}),
    );
}

#[test]
fn delete_options_in_any_group_version() {
    let raw = || {
        Enc::new()
            .int(1, 0)
            .msg(2, Enc::new().str(1, "uid-1"))
            .str(4, "Foreground")
            .str(5, "All")
    };
    let expected = |api_version: &str| {
        json!({
            "kind": "DeleteOptions",
            "apiVersion": api_version,
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": "uid-1"},
            "propagationPolicy": "Foreground",
            "dryRun": ["All"],
        })
    };
    for api_version in ["v1", "meta.k8s.io/v1", "apps/v1"] {
        assert_json(
            decode(&body(api_version, "DeleteOptions", raw())).unwrap(),
            expected(api_version),
        );
    }
}

#[test]
fn binding_target() {
    let raw = Enc::new()
        .msg(1, meta("p", "default"))
        .msg(2, Enc::new().str(1, "Node").str(3, "n1"));
    assert_json(
        decode(&body("v1", "Binding", raw)).unwrap(),
        json!({
            "kind": "Binding",
            "apiVersion": "v1",
            "metadata": {"name": "p", "namespace": "default", "creationTimestamp": null},
            "target": {"kind": "Node", "name": "n1"},
        }),
    );
}

#[test]
fn lease_and_events_use_micro_time() {
    let raw = Enc::new().msg(1, meta("l", "kube-node-lease")).msg(
        2,
        Enc::new()
            .str(1, "n1")
            .msg(4, Enc::new().int(1, 1_767_323_045).int(2, 123_456_789)),
    );
    assert_json(
        decode(&body("coordination.k8s.io/v1", "Lease", raw)).unwrap()["spec"].clone(),
        json!({"holderIdentity": "n1", "renewTime": "2026-01-02T03:04:05.123456Z"}),
    );

    let raw = Enc::new()
        .msg(1, meta("e", "default"))
        .msg(2, Enc::new().int(1, 1_767_323_045).int(2, 7_000))
        .str(7, "Scheduled");
    let event = decode(&body("events.k8s.io/v1", "Event", raw)).unwrap();
    assert_eq!(event["eventTime"], json!("2026-01-02T03:04:05.000007Z"));
    assert_eq!(event["reason"], json!("Scheduled"));
}

#[test]
fn controller_revision_data_is_embedded_json() {
    let raw = Enc::new()
        .msg(1, meta("web-1", "default"))
        .msg(2, Enc::new().str(1, r#"{"spec":{"template":{"x":1}}}"#))
        .int(3, 1);
    assert_json(
        decode(&body("apps/v1", "ControllerRevision", raw)).unwrap(),
        json!({
            "kind": "ControllerRevision",
            "apiVersion": "apps/v1",
            "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": null},
            "data": {"spec": {"template": {"x": 1}}},
            "revision": 1,
        }),
    );
}

#[test]
fn managed_fields_embed_fields_v1() {
    let entry = Enc::new()
        .str(1, "kubectl")
        .str(2, "Apply")
        .msg(7, Enc::new().str(1, r#"{"f:data":{}}"#));
    let raw = Enc::new().msg(1, Enc::new().str(1, "cm").msg(17, entry));
    let object = decode(&body("v1", "ConfigMap", raw)).unwrap();
    assert_json(
        object["metadata"]["managedFields"].clone(),
        json!([{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:data": {}}}]),
    );
}

#[test]
fn repeated_message_fields_merge_and_unknown_fields_are_skipped() {
    let raw = Enc::new()
        .msg(1, Enc::new().str(1, "a").entry(11, "x", "1"))
        .int(99, 7)
        .msg(1, Enc::new().str(3, "ns").entry(11, "y", "2"));
    assert_json(
        decode(&body("v1", "ServiceAccount", raw)).unwrap(),
        json!({
            "kind": "ServiceAccount",
            "apiVersion": "v1",
            "metadata": {"name": "a", "namespace": "ns", "creationTimestamp": null, "labels": {"x": "1", "y": "2"}},
        }),
    );
}

#[test]
fn absent_fields_decode_to_go_zero_values() {
    // Fields without `omitempty` are written by encoding/json even when unset.
    let object = decode(&body(
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        Enc::new(),
    ))
    .unwrap();
    assert_json(
        object,
        json!({
            "kind": "ClusterRoleBinding",
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "roleRef": {"apiGroup": "", "kind": "", "name": ""},
        }),
    );
    let object = decode(&body("autoscaling/v1", "Scale", Enc::new())).unwrap();
    assert_json(
        object,
        json!({
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"creationTimestamp": null},
            "spec": {},
            "status": {"replicas": 0},
        }),
    );
}

#[test]
fn invalid_utf8_in_strings_becomes_replacement_characters() {
    let raw = Enc::new().msg(1, Enc::new().bytes(1, b"a\xffb"));
    let object = decode(&body("v1", "Namespace", raw)).unwrap();
    assert_eq!(object["metadata"]["name"], json!("a\u{fffd}b"));
}

#[test]
fn rejects_bodies_without_the_magic() {
    assert_eq!(decode(b""), Err(ProtobufError::MissingMagic));
    assert_eq!(
        decode(b"{\"kind\":\"Pod\"}"),
        Err(ProtobufError::MissingMagic)
    );
}

#[test]
fn unknown_kinds_are_named() {
    let error = decode(&body("example.com/v1", "Widget", Enc::new())).unwrap_err();
    assert_eq!(
        error.to_string(),
        r#"no protobuf schema is known for apiVersion "example.com/v1", kind "Widget""#
    );
    let error = decode(b"k8s\0").unwrap_err();
    assert_eq!(
        error,
        ProtobufError::UnknownKind {
            api_version: String::new(),
            kind: String::new()
        }
    );
}

#[test]
fn rejects_encodings_it_cannot_read() {
    let envelope = |encoding: &str, content_type: &str| {
        let unknown = Enc::new()
            .msg(1, Enc::new().str(1, "v1").str(2, "Namespace"))
            .msg(2, Enc::new())
            .str(3, encoding)
            .str(4, content_type);
        [b"k8s\0".as_slice(), &unknown.done()].concat()
    };
    assert_eq!(
        decode(&envelope("gzip", "")),
        Err(ProtobufError::ContentEncoding("gzip".into()))
    );
    assert_eq!(
        decode(&envelope("", "application/json")),
        Err(ProtobufError::ContentType("application/json".into()))
    );
    assert!(decode(&envelope("", "application/vnd.kubernetes.protobuf")).is_ok());
}

#[test]
fn malformed_bytes_are_reported_with_their_path() {
    // The template's metadata claims 5 bytes and has none.
    let spec = Enc::new().bytes(3, &[0x0a, 0x05]);
    let error = decode(&body("apps/v1", "Deployment", Enc::new().msg(2, spec))).unwrap_err();
    assert_eq!(
        error.to_string(),
        "malformed protobuf at apps.v1.Deployment.spec.template: length 5 exceeds the 0 bytes left"
    );

    // metadata.name as a varint.
    let raw = Enc::new().msg(1, Enc::new().int(1, 7));
    assert_eq!(
        decode(&body("v1", "Namespace", raw)),
        Err(ProtobufError::Malformed {
            at: "core.v1.Namespace.metadata.name".into(),
            error: WireError::FieldWireType {
                field: 1,
                found: 0,
                expected: 2
            },
        })
    );

    // A cut-off envelope: the raw object (before contentEncoding and contentType, 4
    // bytes) loses its last 2 bytes.
    let mut cut = body("v1", "Namespace", Enc::new().msg(1, meta("x", "")));
    cut.truncate(cut.len() - 6);
    assert!(matches!(
        decode(&cut),
        Err(ProtobufError::Malformed { at, error: WireError::Length { .. } }) if at == "runtime.Unknown"
    ));
}

/// `extra` maps to `ExtraValue`, a `[]string` that protobuf wraps in a message.
#[test]
fn subject_access_review_extra_values_are_string_lists() {
    let attributes = Enc::new().str(1, "team").str(2, "list").str(5, "pods");
    let spec = Enc::new()
        .msg(1, attributes)
        .str(3, "bob")
        .str(4, "devs")
        .msg(
            5,
            Enc::new()
                .str(1, "scopes")
                .msg(2, Enc::new().str(1, "a").str(1, "b")),
        )
        .msg(5, Enc::new().str(1, "none").msg(2, Enc::new()));
    let raw = Enc::new().msg(1, meta("", "")).msg(2, spec);
    let decoded = decode(&body("authorization.k8s.io/v1", "SubjectAccessReview", raw)).unwrap();
    assert_eq!(decoded["spec"]["user"], "bob");
    assert_eq!(decoded["spec"]["groups"], json!(["devs"]));
    assert_eq!(decoded["spec"]["resourceAttributes"]["verb"], "list");
    assert_eq!(
        decoded["spec"]["extra"],
        json!({"none": null, "scopes": ["a", "b"]})
    );
}

/// Lists and errors, which only answers carry: the list's ListMeta and items, and a
/// Status, written as Go writes them and read back.
#[test]
fn lists_and_statuses_encode() {
    let list = json!({
        "kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": "5", "continue": "c"},
        "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}],
    });
    let bytes = encode(&list).unwrap();
    // ListMeta {selfLink = 1, resourceVersion = 2, continue = 3}; remainingItemCount is a
    // pointer and stays out.
    let list_meta = Enc::new().str(1, "").str(2, "5").str(3, "c").done();
    let envelope_head = body("v1", "PodList", Enc::new());
    let raw_at = envelope_head.len() - 6; // the raw field's key, before `{} "" ""`
    assert_eq!(bytes[..raw_at], envelope_head[..raw_at]);
    let raw = &bytes[raw_at + 3..];
    assert_eq!(raw[..2], [0x0a, list_meta.len() as u8]);
    assert_eq!(raw[2..2 + list_meta.len()], list_meta[..]);
    let back = decode(&bytes).unwrap();
    assert_eq!(
        back["metadata"],
        json!({"resourceVersion": "5", "continue": "c"})
    );
    assert_eq!(back["items"][1]["metadata"]["name"], "b");
    assert_eq!(back["items"][1]["spec"]["containers"], Value::Null);

    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "pods \"x\" not found", "reason": "NotFound",
        "details": {"name": "x", "kind": "pods"}, "code": 404,
    });
    let back = decode(&encode(&status).unwrap()).unwrap();
    assert_json(back, status);
}

#[test]
fn watch_events_are_length_framed() {
    let frame = super::watch_event("ADDED", b"k8s\0pod");
    let event = Enc::new()
        .str(1, "ADDED")
        .msg(2, Enc::new().bytes(1, b"k8s\0pod"))
        .done();
    assert_eq!(frame[..4], (event.len() as u32).to_be_bytes());
    assert_eq!(frame[4..], event[..]);
}

#[test]
fn objects_that_do_not_fit_their_kind_are_refused() {
    let error = encode(&json!({"kind": "Pod", "apiVersion": "v1", "spec": {"containers": "x"}}))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot encode core.v1.Pod.spec.containers as protobuf: the JSON holds a list field holding another JSON type"
    );
    let error = encode(&json!({"kind": "Widget", "apiVersion": "example.com/v1"})).unwrap_err();
    assert!(matches!(error, ProtobufError::UnknownKind { .. }));
}
