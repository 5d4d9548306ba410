//! The Gateway API (issue 33, item 4) with the real kubectl: the CRDs and the `krust`
//! GatewayClass installed at start; a Gateway's listeners opened on their ports;
//! HTTPRoutes matched by hostname, path, header and query, with header modifiers,
//! redirects, rewrites and weighted backends; a ReferenceGrant deciding a reference to
//! another namespace; HTTPS listeners with their Secret's certificate; GRPCRoutes by
//! service and method; and the status conditions and reasons the API names. Backends
//! run in the test (Services without selectors, as in `ingress_options`).

use std::net::TcpListener;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Server, free_port, wait_for};
use crate::ingress::{certificate, get_tls};
use crate::ingress_options::{backend, grpc_channel, identity_backend, request, selectorless};

const DEADLINE: Duration = Duration::from_secs(30);

/// The condition `kind` in `conditions`: (status, reason).
fn condition(conditions: &Value, kind: &str) -> (String, String) {
    let found = (conditions.as_array().into_iter().flatten())
        .find(|c| c["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} condition in {conditions}"));
    (
        found["status"].as_str().unwrap_or_default().to_string(),
        found["reason"].as_str().unwrap_or_default().to_string(),
    )
}

/// The `krust` GatewayClass once it is accepted (the CRDs are then served).
pub(crate) fn gateway_api(s: &Server) -> Value {
    wait_for("the krust GatewayClass accepted", DEADLINE, || {
        let out = s.kubectl(&["get", "gatewayclass", "krust", "-o", "json"]);
        let class: Value = serde_json::from_slice(&out.stdout).ok()?;
        let conditions = class["status"]["conditions"].as_array()?;
        conditions
            .iter()
            .any(|c| c["type"] == "Accepted" && c["status"] == "True")
            .then_some(class)
    })
}

fn pair(status: &str, reason: &str) -> (String, String) {
    (status.to_string(), reason.to_string())
}

/// The conditions of the route's entry for krust's parent `gateway`, once written.
fn route_parent(s: &Server, kind: &str, ns: &str, name: &str) -> Value {
    wait_for(&format!("{kind} {ns}/{name} status"), DEADLINE, || {
        let route = s.get_json(&[kind, name, "-n", ns]);
        let parents = route["status"]["parents"].as_array()?.clone();
        parents
            .into_iter()
            .find(|p| p["controllerName"] == "krust.io/gateway-controller")
            .map(|p| p["conditions"].clone())
    })
}

fn http_route(ns: &str, name: &str, hostnames: &[&str], rules: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"parentRefs": [{"name": "web", "namespace": "default", "sectionName": "http"}],
                 "hostnames": hostnames, "rules": rules}})
}

fn backend_ref(name: &str, weight: u32) -> Value {
    json!({"name": name, "port": 80, "weight": weight})
}

#[test]
fn gateways_route_by_the_api_s_matches_filters_and_weights_and_say_so_in_status() {
    let ingress_port = free_port();
    let s = Server::start_with(&[&format!("--ingress-http-port={ingress_port}")]);
    let (http, https) = (free_port(), free_port());
    // A port someone else holds: its listener cannot be opened.
    let busy = TcpListener::bind("0.0.0.0:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port();

    // Installed at start: the CRDs (kubectl finds them by short name) and the class.
    let class = gateway_api(&s);
    assert_eq!(
        class["spec"]["controllerName"],
        "krust.io/gateway-controller"
    );
    s.ok(&["get", "gc,gtw,refgrant,httproutes,grpcroutes", "-A"]);

    let node_ip = krust_kubelet::machine::node_ip().to_string();
    let (a, b, c) = (backend("a"), backend("b"), backend("c"));
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "secure.example.com", "secure");
    s.ok(&[
        "create",
        "secret",
        "tls",
        "secure-cert",
        "--cert",
        &cert,
        "--key",
        &key,
    ]);
    s.ok(&["create", "namespace", "team"]);
    let mut objects = selectorless("main", &node_ip, &[a, b]);
    objects.extend(selectorless("next", &node_ip, &[c]));
    let gateway = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
    "metadata": {"name": "web", "namespace": "default"},
    "spec": {"gatewayClassName": "krust", "listeners": [
        {"name": "http", "port": http, "protocol": "HTTP", "hostname": "*.example.com",
         "allowedRoutes": {"namespaces": {"from": "All"}}},
        {"name": "https", "port": https, "protocol": "HTTPS", "hostname": "secure.example.com",
         "tls": {"certificateRefs": [{"name": "secure-cert"}]}},
        {"name": "tcp", "port": free_port(), "protocol": "TCP"},
        {"name": "busy", "port": busy_port, "protocol": "HTTP"},
    ]}});
    objects.push(gateway);
    let rules = json!([
        {"matches": [{"path": {"type": "Exact", "value": "/exact"}}],
         "backendRefs": [backend_ref("next", 1)]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/api"},
                      "headers": [{"name": "X-Version", "value": "v2"}]}],
         "filters": [
            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-added", "value": "yes"}]}},
            {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "x-served-by", "value": "krust"}]}}],
         "backendRefs": [backend_ref("next", 1)]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}, "queryParams": [{"name": "canary", "value": "1"}]}],
         "backendRefs": [backend_ref("next", 1)]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
         "backendRefs": [backend_ref("main", 1)]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
         "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "statusCode": 301}}]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/rewrite"}}],
         "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}],
         "backendRefs": [backend_ref("main", 1)]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/split"}}],
         "backendRefs": [backend_ref("main", 3), backend_ref("next", 1)]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/missing"}}],
         "backendRefs": [backend_ref("nothing-here", 1)]},
    ]);
    objects.push(http_route("default", "site", &["www.example.com"], rules));
    // Another namespace, refering to a Service of `default`: only with a grant.
    let cross = json!([{"backendRefs": [{"name": "main", "namespace": "default", "port": 80}]}]);
    objects.push(http_route("team", "cross", &["team.example.com"], cross));
    // A hostname the listener does not serve.
    let elsewhere = json!([{"backendRefs": [backend_ref("main", 1)]}]);
    objects.push(http_route(
        "default",
        "elsewhere",
        &["www.other.org"],
        elsewhere,
    ));
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    s.ok_stdin(&["apply", "-f", "-"], &list.to_string());

    // The Gateway: accepted with one listener refused, programmed, at the node's address.
    let gateway = wait_for("the Gateway's status", DEADLINE, || {
        let g = s.get_json(&["gateway", "web"]);
        (g["status"]["listeners"].as_array()?.len() == 4).then_some(g)
    });
    let status = &gateway["status"];
    assert_eq!(
        condition(&status["conditions"], "Accepted"),
        pair("True", "ListenersNotValid")
    );
    assert_eq!(
        condition(&status["conditions"], "Programmed"),
        pair("True", "Programmed")
    );
    assert_eq!(status["addresses"][0]["value"], node_ip.as_str());
    let listener = |name: &str| {
        (status["listeners"].as_array().unwrap().iter())
            .find(|l| l["name"] == name)
            .unwrap()
            .clone()
    };
    let http_listener = listener("http");
    assert_eq!(
        condition(&http_listener["conditions"], "Programmed"),
        pair("True", "Programmed")
    );
    assert_eq!(
        http_listener["supportedKinds"],
        json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"},
               {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}])
    );
    assert_eq!(
        condition(&listener("tcp")["conditions"], "Accepted"),
        pair("False", "UnsupportedProtocol")
    );
    assert_eq!(
        condition(&listener("busy")["conditions"], "Accepted"),
        pair("False", "PortUnavailable")
    );
    assert_eq!(
        condition(&listener("https")["conditions"], "ResolvedRefs"),
        pair("True", "ResolvedRefs")
    );

    // Route statuses: accepted with a missing backend; not permitted; no hostname.
    let site = route_parent(&s, "httproute", "default", "site");
    assert_eq!(condition(&site, "Accepted"), pair("True", "Accepted"));
    assert_eq!(
        condition(&site, "ResolvedRefs"),
        pair("False", "BackendNotFound")
    );
    let cross = route_parent(&s, "httproute", "team", "cross");
    assert_eq!(condition(&cross, "Accepted"), pair("True", "Accepted"));
    assert_eq!(
        condition(&cross, "ResolvedRefs"),
        pair("False", "RefNotPermitted")
    );
    let elsewhere = route_parent(&s, "httproute", "default", "elsewhere");
    assert_eq!(
        condition(&elsewhere, "Accepted"),
        pair("False", "NoMatchingListenerHostname")
    );

    // Requests on the listener's port.
    let host = "www.example.com";
    let body = |path: &str, extra: &[&str]| {
        let (status, _, body) = request(http, host, path, extra);
        assert_eq!(status, 200, "{path}: {body}");
        body
    };
    assert!(body("/exact", &[]).starts_with("c /exact "));
    assert_eq!(request(http, host, "/exact/more", &[]).0, 404);
    assert!(body("/api/v1?x=1", &[]).ends_with(" /api/v1?x=1 0"));
    assert!(!body("/api/v1", &[]).starts_with("c "));
    assert!(body("/api/v1?other=2&canary=1", &[]).starts_with("c "));
    let (status, head, text) = request(http, host, "/api/v1", &["-H", "x-version: v2"]);
    assert_eq!((status, text.split(' ').next()), (200, Some("c")));
    assert!(
        head.to_ascii_lowercase().contains("x-served-by: krust"),
        "{head}"
    );
    let (status, head, _) = request(http, host, "/old/page?q=1", &[]);
    assert_eq!(status, 301);
    assert!(
        head.contains("https://www.example.com/old/page?q=1"),
        "{head}"
    );
    assert!(body("/rewrite/x", &[]).ends_with(" /new/x 0"));
    let to_next = (0..40)
        .filter(|_| body("/split", &[]).starts_with("c "))
        .count();
    // 3:1 in turns (a table rebuilt meanwhile starts its turns again).
    assert!(
        (8..=12).contains(&to_next),
        "{to_next} of 40 with weights 3:1"
    );
    assert_eq!(request(http, host, "/missing", &[]).0, 500);
    // Hostnames: the route's only; the listener's wildcard does not reach the others.
    assert_eq!(request(http, "api.example.com", "/api", &[]).0, 404);
    assert_eq!(request(http, "www.other.org", "/", &[]).0, 404);
    // The Ingress port does not serve the Gateway's routes.
    assert_eq!(request(ingress_port, host, "/api", &[]).0, 404);

    // A ReferenceGrant lets the route of `team` reach the Service of `default`.
    assert_eq!(request(http, "team.example.com", "/", &[]).0, 500);
    let grant = json!({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "team-to-main", "namespace": "default"},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "team"}],
                 "to": [{"group": "", "kind": "Service", "name": "main"}]}});
    s.ok_stdin(&["apply", "-f", "-"], &grant.to_string());
    wait_for("the granted reference", DEADLINE, || {
        (request(http, "team.example.com", "/", &[]).0 == 200).then_some(())
    });
    let cross = route_parent(&s, "httproute", "team", "cross");
    assert_eq!(
        condition(&cross, "ResolvedRefs"),
        pair("True", "ResolvedRefs")
    );

    // The HTTPS listener: the Secret's certificate, a route attached to it.
    let secure = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "secure", "namespace": "default"},
        "spec": {"parentRefs": [{"name": "web", "sectionName": "https"}],
                 "rules": [{"backendRefs": [backend_ref("next", 1)]}]}});
    s.ok_stdin(&["apply", "-f", "-"], &secure.to_string());
    let served = wait_for("the HTTPS listener", DEADLINE, || {
        let got = get_tls(https, "secure.example.com", Some(&cert));
        (got.0 == 0 && got.1 == "2 200").then_some(got)
    });
    assert!(served.2.starts_with("c / "), "{served:?}");

    // The listener's attached routes are counted; a Gateway deleted closes its ports.
    let attached = wait_for("attached routes counted", DEADLINE, || {
        let g = s.get_json(&["gateway", "web"]);
        let listeners = g["status"]["listeners"].as_array()?.clone();
        let count = |name: &str| {
            (listeners.iter())
                .find(|l| l["name"] == name)
                .and_then(|l| l["attachedRoutes"].as_u64())
        };
        (count("https") == Some(1)).then(|| count("http"))
    });
    assert_eq!(
        attached,
        Some(2),
        "site and cross; elsewhere has no hostname"
    );
    s.ok(&["delete", "gateway", "web"]);
    wait_for("the listener closed", DEADLINE, || {
        (std::net::TcpStream::connect(("127.0.0.1", http)).is_err()).then_some(())
    });
    drop(busy);
}

/// GRPCRoutes match a call's service and method: the built-in CSI driver's Identity
/// service, served on a port of this machine, answers through the Gateway over HTTP/2;
/// a method no route matches gets gRPC's UNIMPLEMENTED from the 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_routes_match_services_and_methods() {
    use krust_csi::v1::{
        CreateVolumeRequest, ProbeRequest, controller_client::ControllerClient,
        identity_client::IdentityClient,
    };

    let s = Server::start_with(&[&format!("--ingress-http-port={}", free_port())]);
    let dir = tempfile::tempdir().unwrap();
    let grpc_port = identity_backend(dir.path());
    gateway_api(&s);
    let node_ip = krust_kubelet::machine::node_ip().to_string();
    let port = free_port();
    let mut objects = selectorless("grpc", &node_ip, &[grpc_port]);
    objects.push(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "grpc"},
        "spec": {"gatewayClassName": "krust", "listeners": [
            {"name": "h2c", "port": port, "protocol": "HTTP"}]}}),
    );
    objects.push(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
        "metadata": {"name": "identity"},
        "spec": {"parentRefs": [{"name": "grpc"}], "hostnames": ["grpc.example"],
                 "rules": [{"matches": [{"method": {"service": "csi.v1.Identity", "method": "GetPluginInfo"}}],
                            "backendRefs": [{"name": "grpc", "port": 80}]}]}}));
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    s.ok_stdin(&["apply", "-f", "-"], &list.to_string());

    let channel = grpc_channel(port, "grpc.example").await;
    let mut identity = IdentityClient::new(channel.clone());
    // Another method of the same service is not routed.
    let probe = identity.probe(ProbeRequest {}).await.unwrap_err();
    assert_eq!(probe.code(), tonic::Code::Unimplemented, "{probe}");
    // Nor is another service.
    let mut controller = ControllerClient::new(channel);
    let other = controller
        .create_volume(CreateVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(other.code(), tonic::Code::Unimplemented, "{other}");
    let route = s.get_json(&["grpcroute", "identity"]);
    let parents = route["status"]["parents"].as_array().unwrap();
    assert_eq!(
        condition(&parents[0]["conditions"], "Accepted"),
        pair("True", "Accepted")
    );
}
