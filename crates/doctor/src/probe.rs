//! Active probes (`--probe`), for what the API cannot tell: whether the cluster DNS
//! answers a Service's name, whether its cluster IP and each ready endpoint accept a
//! connection from where the doctor runs (a node: it has the Service rules and routes to
//! the pod network), and what the Ingress controller answers a request with its Host.
//! Each outcome is judged so that the link that fails first along the path is named:
//! an endpoint that refuses is the application's, one that never answers the network's,
//! a cluster IP that fails while its endpoints answer the proxy's.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use http_body_util::Empty;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceSpec};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::timeout;

use crate::report::{Link, Owner, State};
use crate::{Context, Error, service};

/// How long one probe waits for an answer.
const PATIENCE: Duration = Duration::from_secs(2);

/// How many ready endpoints of a port are probed.
const ENDPOINTS: usize = 5;

/// What a connection attempt met.
#[derive(Debug, PartialEq, Eq)]
pub enum Reach {
    Connected,
    Refused,
    /// No answer at all within [`PATIENCE`]: packets dropped on the way.
    Silent,
    Failed(String),
}

impl std::fmt::Display for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reach::Connected => write!(f, "connected"),
            Reach::Refused => write!(f, "connection refused"),
            Reach::Silent => write!(f, "no answer within {}s", PATIENCE.as_secs()),
            Reach::Failed(why) => write!(f, "{why}"),
        }
    }
}

pub async fn connect(addr: SocketAddr) -> Reach {
    match timeout(PATIENCE, TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Reach::Connected,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Reach::Refused,
        Ok(Err(e)) => Reach::Failed(e.to_string()),
        Err(_) => Reach::Silent,
    }
}

/// What a DNS server answered for a name's A records.
#[derive(Debug)]
pub enum Answer {
    Addresses(Vec<Ipv4Addr>),
    NoSuchName,
    Error(String),
}

pub async fn resolve(server: SocketAddr, name: &str) -> Answer {
    let Ok(fqdn) = Name::from_ascii(format!("{}.", name.trim_end_matches('.'))) else {
        return Answer::Error(format!("{name:?} is not a DNS name"));
    };
    let mut query = Message::query();
    query.metadata.id = std::process::id() as u16;
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(fqdn, RecordType::A));
    let exchange = async {
        let socket = UdpSocket::bind(("0.0.0.0", 0)).await?;
        socket.connect(server).await?;
        socket
            .send(&query.to_vec().map_err(std::io::Error::other)?)
            .await?;
        let mut buf = vec![0u8; 4096];
        let n = socket.recv(&mut buf).await?;
        Message::from_vec(&buf[..n]).map_err(std::io::Error::other)
    };
    match timeout(PATIENCE, exchange).await {
        Err(_) => Answer::Error(format!(
            "no answer from {server} within {}s",
            PATIENCE.as_secs()
        )),
        Ok(Err(e)) => Answer::Error(format!("asking {server}: {e}")),
        Ok(Ok(reply)) if reply.metadata.response_code == ResponseCode::NXDomain => {
            Answer::NoSuchName
        }
        Ok(Ok(reply)) if reply.metadata.response_code != ResponseCode::NoError => Answer::Error(
            format!("{server} answered {}", reply.metadata.response_code),
        ),
        Ok(Ok(reply)) => Answer::Addresses(
            (reply.answers.iter())
                .filter_map(|r| match &r.data {
                    RData::A(a) => Some(a.0),
                    _ => None,
                })
                .collect(),
        ),
    }
}

/// The status a plain HTTP GET of `path` with `host` gets from `addr`.
pub async fn get(addr: SocketAddr, host: &str, path: &str) -> Result<http::StatusCode, String> {
    let exchange = async {
        let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let request = http::Request::get(path)
            .header(http::header::HOST, host)
            .header(http::header::USER_AGENT, "krust-doctor")
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        Ok(response.status())
    };
    timeout(PATIENCE, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {}s", PATIENCE.as_secs())))
}

/// The cluster DNS's address: the cluster IP of kube-system/kube-dns.
pub async fn dns_server(client: &kube::Client) -> Result<Option<SocketAddr>, Error> {
    let api = kube::Api::<Service>::namespaced(client.clone(), "kube-system");
    let svc = api.get_opt("kube-dns").await?;
    let ip = svc.and_then(|s| s.spec?.cluster_ip?.parse::<IpAddr>().ok());
    Ok(ip.map(|ip| SocketAddr::new(ip, 53)))
}

/// The probes of a Service with ready endpoints `ready`: each TCP port's endpoints,
/// then its cluster IP, then its name in the cluster DNS.
pub async fn service(
    ctx: &Context,
    name: &str,
    spec: &ServiceSpec,
    ready: &[String],
    pod: Option<&Pod>,
) -> Result<Vec<Link>, Error> {
    let mut links = Vec::new();
    let cluster_ip = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse::<IpAddr>().ok());
    let declared = pod.map(service::declared).unwrap_or_default();
    let tcp =
        (spec.ports.iter().flatten()).filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP");
    for port in tcp {
        let Some(target) = service::target(port, &declared) else {
            continue;
        };
        let mut answered = false;
        let mut failure = None;
        for address in ready.iter().take(ENDPOINTS) {
            let Ok(ip) = address.parse::<IpAddr>() else {
                continue;
            };
            let addr = SocketAddr::new(ip, target as u16);
            let reach = connect(addr).await;
            let subject = format!("probe: endpoint {addr}");
            links.push(match &reach {
                Reach::Connected => {
                    answered = true;
                    Link::ok(subject, Owner::Application, "connected")
                }
                Reach::Refused => {
                    failure = Some(Owner::Application);
                    Link::new(
                        subject,
                        Owner::Application,
                        State::Broken,
                        format!("connection refused: nothing listens on port {target} in the pod; through an Ingress, requests get 502"),
                    )
                }
                other => {
                    failure = Some(Owner::Network);
                    Link::new(
                        subject,
                        Owner::Network,
                        State::Broken,
                        format!("{other}: the pod network (or a NetworkPolicy) drops the packets"),
                    )
                }
            });
        }
        let Some(ip) = cluster_ip else {
            continue;
        };
        let addr = SocketAddr::new(ip, port.port as u16);
        let subject = format!("probe: cluster IP {addr}");
        links.push(match (connect(addr).await, answered, failure) {
            (Reach::Connected, _, _) => Link::ok(subject, Owner::Proxy, "connected"),
            (reach, true, _) | (reach, false, None) => Link::new(
                subject,
                Owner::Proxy,
                State::Broken,
                format!("{reach} while its endpoints answer: the Service rules of this node do not forward"),
            )
            .next("nft list table ip krust"),
            (reach, false, Some(owner)) => Link::new(
                subject,
                owner,
                State::Broken,
                format!("{reach}, as its endpoints"),
            ),
        });
    }
    let fqdn = format!("{name}.{}.svc.cluster.local", ctx.namespace);
    links.push(dns(ctx, &fqdn, cluster_ip).await?);
    Ok(links)
}

/// The cluster DNS asked for `fqdn`, which should resolve to `want` (any address for a
/// headless Service).
async fn dns(ctx: &Context, fqdn: &str, want: Option<IpAddr>) -> Result<Link, Error> {
    let subject = format!("probe: DNS {fqdn}");
    let Some(server) = dns_server(&ctx.client).await? else {
        return Ok(Link::new(
            subject,
            Owner::Dns,
            State::Broken,
            "no kube-system/kube-dns Service",
        ));
    };
    Ok(match resolve(server, fqdn).await {
        Answer::Addresses(found) if found.is_empty() => Link::new(
            subject,
            Owner::Dns,
            State::Broken,
            format!("{server} answered no address"),
        ),
        Answer::Addresses(found) => {
            let listed = found
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            match want {
                Some(ip) if !found.iter().any(|a| IpAddr::V4(*a) == ip) => Link::new(
                    subject,
                    Owner::Dns,
                    State::Broken,
                    format!("{server} answered {listed}, not the cluster IP {ip}"),
                ),
                _ => Link::ok(subject, Owner::Dns, format!("{listed} (from {server})")),
            }
        }
        Answer::NoSuchName => Link::new(
            subject,
            Owner::Dns,
            State::Broken,
            format!("{server} answered NXDOMAIN"),
        ),
        Answer::Error(why) => {
            Link::new(subject, Owner::Dns, State::Broken, why).next(crate::facts::DNS_ENDPOINTS)
        }
    })
}

/// A request through the Ingress controller at `addr`, as a client sends it.
pub async fn ingress(addr: SocketAddr, host: &str, path: &str) -> Link {
    let subject = format!("probe: GET http://{host}{path} via {addr}");
    match get(addr, host, path).await {
        Ok(status) if status == http::StatusCode::NOT_FOUND => Link::new(
            subject,
            Owner::Ingress,
            State::Broken,
            "404: the controller has no route for it",
        ),
        Ok(status) if status.is_server_error() => Link::new(
            subject,
            Owner::Ingress,
            State::Broken,
            format!("{status}: the controller got no answer from the backend"),
        ),
        Ok(status) => Link::ok(subject, Owner::Ingress, format!("answered {status}")),
        Err(why) => Link::new(
            subject,
            Owner::Ingress,
            State::Broken,
            format!("{why}: is the Ingress controller listening there?"),
        ),
    }
}
