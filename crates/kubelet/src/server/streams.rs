//! exec, attach and port-forward: the runtime is asked for a streaming URL (CRI `Exec`,
//! `Attach`, `PortForward`). A SPDY client's upgrade request is forwarded there and the
//! connections spliced, so the client speaks SPDY with containerd's streaming server,
//! as upstream's kubelet does when it proxies container streams; a WebSocket client
//! (kubectl 1.30+, the Python client) is translated to SPDY on the way.

use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use krust_api::status::ApiError;
use krust_cri::Runtime;
use krust_cri::api::{
    AttachRequest, ExecRequest, ListPodSandboxRequest, PodSandboxFilter, PodSandboxState,
    PodSandboxStateValue, PortForwardRequest,
};

use krust_httpstream::websocket::{Session, Streams};

use krust_httpstream::params;

use super::{Body, running};
use crate::pods::spec::{POD_NAME, POD_NAMESPACE};

/// Which streams the client wants (upstream's kubelet parameter names).
#[derive(Debug, Default, PartialEq)]
struct StreamOptions {
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl StreamOptions {
    fn parse(query: Option<&str>) -> StreamOptions {
        let mut o = StreamOptions::default();
        for (k, v) in params::pairs(query) {
            let on = params::flag(&v);
            match k.as_str() {
                "command" => o.command.push(v),
                "input" => o.stdin = on,
                "output" => o.stdout = on,
                "error" => o.stderr = on,
                "tty" => o.tty = on,
                _ => {}
            }
        }
        // With a terminal, stderr is merged into stdout.
        o.stderr &= !o.tty;
        o
    }

    fn streams(&self) -> Streams {
        Streams {
            stdin: self.stdin,
            stdout: self.stdout,
            stderr: self.stderr,
            tty: self.tty,
        }
    }
}

fn runtime_error(call: &str, status: tonic::Status) -> ApiError {
    ApiError::internal(format!("{call}: {}", status.message()))
}

/// A remote command in a running container: `exec` runs a new process, `attach`
/// joins the container's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteCommand {
    Exec,
    Attach,
}

pub async fn remote_command(
    kind: RemoteCommand,
    runtime: &Runtime,
    (ns, pod, container): (&str, &str, &str),
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let o = StreamOptions::parse(req.uri().query());
    if kind == RemoteCommand::Exec && o.command.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    let container_id = running(runtime, ns, pod, container).await?.id;
    let streams = o.streams();
    let mut cri = runtime.runtime.clone();
    let answer = match kind {
        RemoteCommand::Exec => cri
            .exec(ExecRequest {
                container_id,
                cmd: o.command,
                tty: o.tty,
                stdin: o.stdin,
                stdout: o.stdout,
                stderr: o.stderr,
            })
            .await
            .map(|r| r.into_inner().url),
        RemoteCommand::Attach => cri
            .attach(AttachRequest {
                container_id,
                stdin: o.stdin,
                tty: o.tty,
                stdout: o.stdout,
                stderr: o.stderr,
            })
            .await
            .map(|r| r.into_inner().url),
    };
    let url = answer.map_err(|e| runtime_error(&format!("{kind:?}"), e))?;
    forward(&url, req, Some(streams), &[]).await
}

/// The `ports` of a port-forward's query (repeated, or comma-separated as the Python
/// client writes them).
fn query_ports(query: Option<&str>) -> Result<Vec<u16>, ApiError> {
    params::pairs(query)
        .into_iter()
        .filter(|(k, _)| k == "ports")
        .flat_map(|(_, v)| {
            v.split(',')
                .map(str::trim)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .map(|p| {
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| ApiError::bad_request(format!("invalid port {p:?}")))
        })
        .collect()
}

pub async fn port_forward(
    runtime: &Runtime,
    ns: &str,
    pod: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let filter = PodSandboxFilter {
        label_selector: [(POD_NAMESPACE, ns), (POD_NAME, pod)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        state: Some(PodSandboxStateValue {
            state: PodSandboxState::SandboxReady as i32,
        }),
        ..PodSandboxFilter::default()
    };
    let sandbox = runtime
        .runtime
        .clone()
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(filter),
        })
        .await
        .map_err(|e| runtime_error("ListPodSandbox", e))?
        .into_inner()
        .items
        .into_iter()
        .max_by_key(|s| s.created_at)
        .ok_or_else(|| ApiError::bad_request(format!("pod {ns}/{pod} has no running sandbox")))?;
    // Ports travel in the stream headers (SPDY) or the query (WebSocket); the runtime
    // needs none up front.
    let ports = query_ports(req.uri().query())?;
    let url = runtime
        .runtime
        .clone()
        .port_forward(PortForwardRequest {
            pod_sandbox_id: sandbox.id,
            port: Vec::new(),
        })
        .await
        .map_err(|e| runtime_error("PortForward", e))?
        .into_inner()
        .url;
    forward(&url, req, None, &ports).await
}

/// Forwards the client's request to the runtime's streaming URL; `remote_command`
/// names a remote command's streams (none for port-forward, which has `ports`).
async fn forward(
    url: &str,
    req: Request<Incoming>,
    remote_command: Option<Streams>,
    ports: &[u16],
) -> Result<Response<Body>, ApiError> {
    let uri: Uri = url
        .parse()
        .map_err(|_| ApiError::internal(format!("the runtime returned a bad URL: {url}")))?;
    let authority = uri
        .authority()
        .map(|a| a.to_string())
        .ok_or_else(|| ApiError::internal(format!("the runtime returned a bad URL: {url}")))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|e| ApiError::internal(format!("connecting to {authority}: {e}")))?;
    if let Some(session) = Session::negotiate(req.headers(), remote_command, ports) {
        let resp = krust_httpstream::websocket::serve(req, session, tcp, &authority, &path)
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
        return Ok(resp.map(|body| body.map_err(|never| match never {}).boxed()));
    }
    let resp = krust_httpstream::proxy::forward(tcp, &authority, &path, req)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(resp.map(|body| body.map_err(std::io::Error::other).boxed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_forward_ports_come_repeated_or_comma_separated() {
        assert_eq!(
            query_ports(Some("ports=80&ports=8080")).unwrap(),
            [80, 8080]
        );
        assert_eq!(query_ports(Some("ports=80,8080")).unwrap(), [80, 8080]);
        assert!(query_ports(None).unwrap().is_empty());
        assert!(query_ports(Some("ports=0")).is_err());
        assert!(query_ports(Some("ports=http")).is_err());
    }

    #[test]
    fn stream_options_as_upstream_names_them() {
        let o = StreamOptions::parse(Some(
            "command=sh&command=-c&command=echo+a%20b&input=1&output=1&error=1&tty=1",
        ));
        assert_eq!(o.command, ["sh", "-c", "echo a b"]);
        assert!(o.stdin && o.stdout && o.tty);
        assert!(!o.stderr, "a terminal merges stderr into stdout");
    }
}
