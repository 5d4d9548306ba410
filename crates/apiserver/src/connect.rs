//! The connect subresources of pods — `log`, `exec`, `attach` and `portforward` — are
//! served by the kubelet of the pod's node: the apiserver checks the pod and container,
//! then forwards the request to the kubelet's HTTPS port with its own client
//! certificate and passes the answer back (streamed logs, or a spliced upgraded
//! connection for SPDY or WebSocket). The kubelet's serving certificate must chain to
//! the cluster CA and name the address dialled (upstream's
//! `--kubelet-certificate-authority`): kubelets obtain theirs through the CSR API, so a
//! man in the middle of the node network sees no exec session or log.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use krust_api::status::ApiError;
use krust_httpstream::params;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use tokio_rustls::TlsConnector;

use crate::admission::{Attributes, Operation};
use crate::request::RequestInfo;
use crate::response::{Response, full};
use crate::rest::Call;

/// Which connect subresource a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    Log,
    Exec,
    Attach,
    PortForward,
}

impl Connect {
    pub fn of(info: &RequestInfo) -> Option<Connect> {
        if !info.group.is_empty() || info.resource != "pods" || info.name.is_none() {
            return None;
        }
        match info.subresource.as_deref()? {
            "log" => Some(Connect::Log),
            "exec" => Some(Connect::Exec),
            "attach" => Some(Connect::Attach),
            "portforward" => Some(Connect::PortForward),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Connect::Log => "log",
            Connect::Exec => "exec",
            Connect::Attach => "attach",
            Connect::PortForward => "portforward",
        }
    }
}

/// The apiserver's TLS client towards kubelets.
#[derive(Clone)]
pub struct KubeletClient {
    tls: TlsConnector,
}

impl KubeletClient {
    pub fn new(pki: &crate::pki::Pki) -> anyhow::Result<KubeletClient> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(pki.kubelet_client_cert.as_bytes())
                .collect::<Result<_, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(pki.kubelet_client_key.as_bytes())?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(pki.ca_cert.as_bytes()) {
            roots.add(ca?)?;
        }
        let provider = rustls::crypto::ring::default_provider();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)?;
        // Upgrades need HTTP/1.1.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(KubeletClient {
            tls: TlsConnector::from(Arc::new(config)),
        })
    }

    /// A TLS connection to the kubelet at `host:port`, verified against the cluster CA
    /// and authenticated with the apiserver's kubelet client certificate.
    pub async fn dial(
        &self,
        host: &str,
        port: u16,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect((host, port)).await?;
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        self.tls.connect(name, tcp).await
    }
}

/// Checks the pod and container, then forwards the request to the pod's kubelet.
pub async fn serve(
    kubelet: &KubeletClient,
    connect: Connect,
    call: Call<'_>,
    req: Request<Incoming>,
) -> Result<Response, ApiError> {
    let allowed: &[Method] = match connect {
        Connect::Log => &[Method::GET],
        _ => &[Method::GET, Method::POST],
    };
    if !allowed.contains(req.method()) {
        return Err(ApiError::method_not_allowed(
            req.method().as_str(),
            &format!("pods/{}", connect.name()),
        ));
    }
    let params = params::pairs(req.uri().query());
    // As upstream's connect handler: admission sees the options before anything else.
    if let Some(mut options) = options(connect, &params) {
        let attrs = Attributes::new(&call, Operation::Connect, None);
        call.scope
            .admission
            .admit(&attrs, Some(&mut options))
            .await?;
    }
    let info = &call.info;
    let ns = info.namespace.as_deref().unwrap_or_default();
    let name = info.name.as_deref().unwrap_or_default();
    let pod = call
        .scope
        .cache
        .core_object("pods", Some(ns), name)
        .ok_or_else(|| {
            ApiError::not_found(krust_api::status::Target {
                group: "",
                resource: "pods",
                name,
            })
        })?;
    let param = |key: &str| {
        params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or_default();
    let no_host = || ApiError::bad_request(format!("pod {name} does not have a host assigned"));
    let path = match connect {
        Connect::PortForward => {
            if node_name.is_empty() {
                return Err(no_host());
            }
            let ports: Vec<(String, String)> = params
                .iter()
                .filter(|(k, _)| k == "ports")
                .cloned()
                .collect();
            format!("/portForward/{ns}/{name}{}", params::encode(&ports))
        }
        _ => {
            let container = container(&pod, name, param("container"))?;
            // As upstream, the container is checked before the node: a pod not yet
            // scheduled has no logs (204 No Content) and nothing to exec into.
            if node_name.is_empty() {
                return match connect {
                    Connect::Log => Ok(full(StatusCode::NO_CONTENT, Bytes::new(), "text/plain")),
                    _ => Err(no_host()),
                };
            }
            let mut query = Vec::new();
            if connect == Connect::Log {
                check_logs(
                    &pod,
                    name,
                    &container,
                    param("previous").is_some_and(params::flag),
                )?;
                for key in [
                    "follow",
                    "previous",
                    "timestamps",
                    "tailLines",
                    "limitBytes",
                    "sinceSeconds",
                    "sinceTime",
                ] {
                    if let Some(v) = param(key) {
                        query.push((key.to_string(), v.to_string()));
                    }
                }
            } else {
                for (k, v) in &params {
                    if k == "command" {
                        query.push(("command".into(), v.clone()));
                    }
                }
                for (ours, kubelets) in [
                    ("stdin", "input"),
                    ("stdout", "output"),
                    ("stderr", "error"),
                    ("tty", "tty"),
                ] {
                    if param(ours).is_some_and(params::flag) {
                        query.push((kubelets.into(), "1".into()));
                    }
                }
            }
            let action = match connect {
                Connect::Log => "containerLogs",
                Connect::Exec => "exec",
                _ => "attach",
            };
            format!(
                "/{action}/{ns}/{name}/{container}{}",
                params::encode(&query)
            )
        }
    };
    let node = call
        .scope
        .cache
        .core_object("nodes", None, node_name)
        .ok_or_else(|| ApiError::internal(format!("node {node_name} of pod {name} not found")))?;
    let (host, port) = kubelet_address(&node)
        .ok_or_else(|| ApiError::internal(format!("node {node_name} reports no address")))?;
    let authority = format!("{host}:{port}");
    let method = req.method().clone();
    let fail = |e: &dyn std::fmt::Display| {
        ApiError::internal(format!(
            "error dialing backend: {method} https://{authority}{path}: {e}"
        ))
    };
    let tls = kubelet.dial(&host, port).await.map_err(|e| fail(&e))?;
    let resp = krust_httpstream::proxy::forward(tls, &authority, &path, req)
        .await
        .map_err(|e| fail(&e))?;
    Ok(resp.map(crate::response::streamed))
}

/// The options object of a connect request, as admission (and webhooks) see it:
/// upstream's PodExecOptions, PodAttachOptions or PodPortForwardOptions, with Go's
/// omission of false and empty fields. Logs are read, not connected: none.
fn options(connect: Connect, params: &[(String, String)]) -> Option<Value> {
    let kind = match connect {
        Connect::Log => return None,
        Connect::Exec => "PodExecOptions",
        Connect::Attach => "PodAttachOptions",
        Connect::PortForward => "PodPortForwardOptions",
    };
    let mut options = json!({"kind": kind, "apiVersion": "v1"});
    let all = |key: &'static str| params.iter().filter(move |(k, _)| k == key).map(|(_, v)| v);
    if connect == Connect::PortForward {
        let ports: Vec<i64> = all("ports")
            .flat_map(|v| v.split(','))
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        if !ports.is_empty() {
            options["ports"] = json!(ports);
        }
        return Some(options);
    }
    for flag in ["stdin", "stdout", "stderr", "tty"] {
        if all(flag).next().is_some_and(|v| params::flag(v)) {
            options[flag] = json!(true);
        }
    }
    if let Some(container) = all("container").find(|c| !c.is_empty()) {
        options["container"] = json!(container);
    }
    let command: Vec<&String> = all("command").collect();
    if connect == Connect::Exec && !command.is_empty() {
        options["command"] = json!(command);
    }
    Some(options)
}

/// The container a request names, or the pod's only one; upstream's messages.
fn container(pod: &Value, pod_name: &str, wanted: Option<&str>) -> Result<String, ApiError> {
    let names = |field: &str| -> Vec<String> {
        pod["spec"][field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_string))
            .collect()
    };
    let (containers, init) = (names("containers"), names("initContainers"));
    let ephemeral = names("ephemeralContainers");
    match wanted.filter(|w| !w.is_empty()) {
        Some(w)
            if containers
                .iter()
                .chain(&init)
                .chain(&ephemeral)
                .any(|c| c == w) =>
        {
            Ok(w.to_string())
        }
        Some(w) => Err(ApiError::bad_request(format!(
            "container {w} is not valid for pod {pod_name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None => {
            let mut message = format!(
                "a container name must be specified for pod {pod_name}, choose one of: [{}]",
                containers.join(" ")
            );
            if !init.is_empty() {
                message.push_str(&format!(
                    " or one of the init containers: [{}]",
                    init.join(" ")
                ));
            }
            if !ephemeral.is_empty() {
                message.push_str(&format!(
                    " or one of the ephemeral containers: [{}]",
                    ephemeral.join(" ")
                ));
            }
            Err(ApiError::bad_request(message))
        }
    }
}

/// Upstream's kubelet refuses logs of a container that has not run yet, and previous
/// logs of one that never terminated.
fn check_logs(
    pod: &Value,
    pod_name: &str,
    container: &str,
    previous: bool,
) -> Result<(), ApiError> {
    let status = [
        "containerStatuses",
        "initContainerStatuses",
        "ephemeralContainerStatuses",
    ]
    .iter()
    .filter_map(|f| pod["status"][f].as_array())
    .flatten()
    .find(|s| s["name"] == container);
    let Some(status) = status else {
        return Err(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{pod_name}\" is waiting to start: ContainerCreating"
        )));
    };
    let ran_before = status["lastState"]["terminated"].is_object();
    if previous && !ran_before {
        return Err(ApiError::bad_request(format!(
            "previous terminated container \"{container}\" in pod \"{pod_name}\" not found"
        )));
    }
    if let Some(reason) = status["state"]["waiting"]["reason"].as_str()
        && !previous
        && !ran_before
    {
        return Err(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{pod_name}\" is waiting to start: {reason}"
        )));
    }
    Ok(())
}

/// The host and port of a node's kubelet: its first InternalIP (else any address) and
/// `status.daemonEndpoints.kubeletEndpoint.Port`.
pub(crate) fn kubelet_address(node: &Value) -> Option<(String, u16)> {
    let addresses = node["status"]["addresses"].as_array()?;
    let address = addresses
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .or_else(|| addresses.first())?["address"]
        .as_str()?
        .to_string();
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .filter(|p| *p > 0 && *p <= u16::MAX as u64)
        .unwrap_or(10250) as u16;
    Some((address, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn container_defaults_and_upstream_messages() {
        let pod = json!({"spec": {
            "containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "i"}],
        }});
        assert_eq!(container(&pod, "p", Some("b")).unwrap(), "b");
        assert_eq!(container(&pod, "p", Some("i")).unwrap(), "i");
        assert_eq!(
            container(&pod, "p", None).unwrap_err().message,
            "a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [i]"
        );
        assert_eq!(
            container(&pod, "p", Some("x")).unwrap_err().message,
            "container x is not valid for pod p"
        );
        let single = json!({"spec": {"containers": [{"name": "only"}]}});
        assert_eq!(container(&single, "p", None).unwrap(), "only");
    }

    #[test]
    fn logs_of_containers_that_have_not_run() {
        let pod = json!({"status": {"containerStatuses": [
            {"name": "c", "state": {"waiting": {"reason": "ImagePullBackOff"}}, "lastState": {}},
        ]}});
        assert_eq!(
            check_logs(&pod, "p", "c", false).unwrap_err().message,
            "container \"c\" in pod \"p\" is waiting to start: ImagePullBackOff"
        );
        assert_eq!(
            check_logs(&pod, "p", "c", true).unwrap_err().message,
            "previous terminated container \"c\" in pod \"p\" not found"
        );
        let restarted = json!({"status": {"containerStatuses": [
            {"name": "c", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"exitCode": 1}}},
        ]}});
        assert!(check_logs(&restarted, "p", "c", false).is_ok());
        assert!(check_logs(&restarted, "p", "c", true).is_ok());
    }

    #[test]
    fn kubelet_address_prefers_internal_ip_and_reported_port() {
        let node = json!({"status": {
            "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.5"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 40000}},
        }});
        assert_eq!(kubelet_address(&node), Some(("10.0.0.5".into(), 40000)));
    }
}
