//! The agent's way to the apiservers when there are several, as k3s's agent load
//! balancer: a TCP proxy on loopback that the node's components use as their server,
//! passing each connection to a live apiserver. The list starts with the server the
//! agent joined and follows the `kubernetes` Endpoints (every live apiserver, kept by
//! the apiservers themselves), so the agent keeps working when the server it joined
//! dies. TLS passes through untouched: every apiserver's certificate names 127.0.0.1.
//!
//! A connection goes to the server that last took one; when that one cannot be
//! reached, the next in the list is tried, and so on. The current server is also tried
//! every few seconds. Once a server cannot be reached, every connection open to it is
//! closed (a server cut off by the network never closes them itself, and a watch on one
//! would wait for nothing), and its clients reconnect through here to the next. The list is
//! kept in a file (as k3s keeps `k3s-agent-load-balancer.json`), so an agent that
//! starts again while the server it joined is down still finds the others.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Endpoints;
use krust_api::sync::UnpoisonedRw;
use kube::runtime::watcher;
use tokio::net::{TcpListener, TcpStream};

/// How long connecting to one server may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the current server is tried when no connection is being made.
const HEALTH_INTERVAL: Duration = Duration::from_secs(3);

/// The servers, in the order they are tried.
#[derive(Debug, Default)]
struct Servers {
    /// `host:port` of every known apiserver.
    list: Vec<String>,
    /// The one that last took a connection.
    current: usize,
}

/// A running load balancer.
#[derive(Clone)]
pub struct LoadBalancer {
    addr: SocketAddr,
    /// The server the agent was given, always kept as a last resort.
    default: String,
    servers: Arc<RwLock<Servers>>,
    /// Where the list is kept across restarts.
    state: Option<PathBuf>,
    /// Names each server found unreachable, so the connections to it close.
    unreachable: tokio::sync::broadcast::Sender<String>,
}

/// The kept list: the server it was learned through, and every server.
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Kept {
    server_url: String,
    server_addresses: Vec<String>,
}

impl LoadBalancer {
    /// Listens on `bind` (port 0 for any) and passes connections to `server`
    /// (`https://host:port`) and the servers kept in `state` from an earlier run with
    /// the same `server`, until the list is learned.
    pub async fn start(
        bind: SocketAddr,
        server: &str,
        state: Option<PathBuf>,
    ) -> std::io::Result<LoadBalancer> {
        let default = host_port(server).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{server:?} is not an https://host:port URL"),
            )
        })?;
        let kept = state
            .as_deref()
            .and_then(|path| std::fs::read(path).ok())
            .and_then(|bytes| k8s_openapi::serde_json::from_slice::<Kept>(&bytes).ok())
            // The same server however its URL is spelled (`https://h` is `https://h:443/`).
            .filter(|kept| host_port(&kept.server_url).as_ref() == Some(&default))
            .map(|kept| kept.server_addresses)
            .unwrap_or_default();
        let listener = TcpListener::bind(bind).await?;
        let lb = LoadBalancer {
            addr: listener.local_addr()?,
            servers: Arc::new(RwLock::new(Servers {
                list: vec![default.clone()],
                current: 0,
            })),
            default,
            state,
            unreachable: tokio::sync::broadcast::channel(64).0,
        };
        if !kept.is_empty() {
            lb.set_servers(kept);
        }
        tokio::spawn(lb.clone().check_current());
        tokio::spawn(lb.clone().serve(listener));
        tracing::info!(addr = %lb.addr, server = %lb.default, "apiserver load balancer listening");
        Ok(lb)
    }

    /// The URL the node's components use.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The servers now, in order.
    pub fn servers(&self) -> Vec<String> {
        self.servers.read_locked().list.clone()
    }

    /// Replaces the list with `servers` (the default one kept last if missing), keeping
    /// the current server first when it is still listed.
    pub fn set_servers(&self, mut servers: Vec<String>) {
        servers.sort();
        servers.dedup();
        if !servers.contains(&self.default) {
            servers.push(self.default.clone());
        }
        let mut known = self.servers.write_locked();
        if known.list == servers {
            return;
        }
        let current = known.list.get(known.current).cloned();
        known.current = current
            .and_then(|c| servers.iter().position(|s| *s == c))
            .unwrap_or(0);
        tracing::info!(servers = ?servers, "apiservers known to the load balancer");
        known.list = servers;
        drop(known);
        self.keep();
    }

    /// Writes the list to the state file, whole or not at all.
    fn keep(&self) {
        let Some(path) = &self.state else {
            return;
        };
        let kept = Kept {
            server_url: format!("https://{}", self.default),
            server_addresses: self.servers(),
        };
        let tmp = path.with_extension("tmp");
        let written = k8s_openapi::serde_json::to_vec_pretty(&kept)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(&tmp, bytes)?;
                std::fs::rename(&tmp, path)
            });
        if let Err(err) = written {
            tracing::warn!(path = %path.display(), %err, "keeping the apiserver list");
        }
    }

    async fn serve(self, listener: TcpListener) {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            let lb = self.clone();
            tokio::spawn(async move {
                let mut unreachable = lb.unreachable.subscribe();
                let Some((mut server, address)) = lb.connect().await else {
                    return;
                };
                let mut client = client;
                let closed = async {
                    loop {
                        match unreachable.recv().await {
                            Ok(lost) if lost == address => return,
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                                std::future::pending::<()>().await
                            }
                            _ => {}
                        }
                    }
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    _ = closed => tracing::debug!(server = %address, "closing a connection to an unreachable apiserver"),
                }
            });
        }
    }

    /// Tries the current server every few seconds, so a server that stopped answering
    /// is left (and its connections closed) even while no new connection is made.
    async fn check_current(self) {
        loop {
            tokio::time::sleep(HEALTH_INTERVAL).await;
            drop(self.connect().await);
        }
    }

    /// A connection to the current server, else to the next that answers, with the
    /// address it went to.
    async fn connect(&self) -> Option<(TcpStream, String)> {
        let (list, start) = {
            let servers = self.servers.read_locked();
            (servers.list.clone(), servers.current)
        };
        for i in 0..list.len() {
            let at = (start + i) % list.len();
            let attempt = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&list[at]));
            match attempt.await {
                Ok(Ok(stream)) => {
                    if at != start {
                        tracing::warn!(from = %list[start], to = %list[at], "apiserver unreachable; switched");
                        let mut servers = self.servers.write_locked();
                        if servers.list == list {
                            servers.current = at;
                        }
                    }
                    let _ = stream.set_nodelay(true);
                    return Some((stream, list[at].clone()));
                }
                Ok(Err(err)) => tracing::debug!(server = %list[at], %err, "apiserver unreachable"),
                Err(_) => tracing::debug!(server = %list[at], "apiserver connect timed out"),
            }
            let _ = self.unreachable.send(list[at].clone());
        }
        tracing::warn!(servers = ?list, "no apiserver reachable");
        None
    }

    /// Follows the `kubernetes` Endpoints through `client` (which should reach the
    /// servers through this balancer) until the process ends.
    pub async fn follow(self, client: kube::Client) {
        let api: kube::Api<Endpoints> = kube::Api::namespaced(client, "default");
        let config = watcher::Config::default().fields("metadata.name=kubernetes");
        let mut events = watcher::watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(eps) | watcher::Event::InitApply(eps)) => {
                    let servers = addresses(&eps);
                    if !servers.is_empty() {
                        self.set_servers(servers);
                    }
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::debug!(%err, "watching the kubernetes endpoints");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// `host:port` of every ready address of the `kubernetes` Endpoints.
fn addresses(eps: &Endpoints) -> Vec<String> {
    eps.subsets
        .iter()
        .flatten()
        .flat_map(|subset| {
            let port = subset
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref().is_none_or(|n| n == "https"))
                .map(|p| p.port);
            subset
                .addresses
                .iter()
                .flatten()
                .filter_map(move |a| Some(join_host_port(&a.ip, port?)))
        })
        .collect()
}

fn join_host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// `host:port` of an `https://host:port[/...]` URL (port 443 when none).
fn host_port(url: &str) -> Option<String> {
    let uri: hyper::Uri = url.parse().ok()?;
    let host = uri.host()?;
    let port = uri.port_u16().unwrap_or(443);
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset};

    #[test]
    fn servers_come_from_every_subset_of_the_kubernetes_endpoints() {
        let subset = |ips: &[&str], port| EndpointSubset {
            addresses: Some(
                ips.iter()
                    .map(|ip| EndpointAddress {
                        ip: ip.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ports: Some(vec![EndpointPort {
                name: Some("https".into()),
                port,
                ..Default::default()
            }]),
            ..Default::default()
        };
        let eps = Endpoints {
            subsets: Some(vec![
                subset(&["10.0.0.1", "10.0.0.2"], 6443),
                subset(&["fd00::1"], 7443),
            ]),
            ..Default::default()
        };
        assert_eq!(
            addresses(&eps),
            ["10.0.0.1:6443", "10.0.0.2:6443", "[fd00::1]:7443"]
        );
        assert_eq!(
            host_port("https://10.0.0.1:6443").as_deref(),
            Some("10.0.0.1:6443")
        );
        assert_eq!(
            host_port("https://[fd00::1]:6443").as_deref(),
            Some("[fd00::1]:6443")
        );
    }

    #[tokio::test]
    async fn connections_go_to_the_next_server_when_the_current_one_is_gone() {
        let alive = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let alive_addr = alive.local_addr().unwrap().to_string();
        // A port nothing listens on.
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead_addr = dead.local_addr().unwrap().to_string();
        drop(dead);
        let state = tempfile::tempdir().unwrap();
        let kept = state.path().join("lb.json");
        let url = format!("https://{dead_addr}");
        let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let lb = LoadBalancer::start(bind, &url, Some(kept.clone()))
            .await
            .unwrap();
        lb.set_servers(vec![dead_addr.clone(), alive_addr.clone()]);
        let port = lb.url().rsplit(':').next().unwrap().to_owned();
        let mut client = TcpStream::connect(format!("127.0.0.1:{port}"))
            .await
            .unwrap();
        let (mut accepted, _) = tokio::time::timeout(Duration::from_secs(5), alive.accept())
            .await
            .expect("the live server got the connection")
            .unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        accepted.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        // The live one is now tried first.
        assert_eq!(lb.servers()[lb.servers.read_locked().current], alive_addr);
        // A new start with the same server finds the list kept; another server's does not.
        let again = LoadBalancer::start(bind, &url, Some(kept.clone()))
            .await
            .unwrap();
        assert_eq!(again.servers(), lb.servers());
        // However the URL is spelled.
        let spelled = LoadBalancer::start(bind, &format!("{url}/"), Some(kept.clone()))
            .await
            .unwrap();
        assert_eq!(spelled.servers(), lb.servers());
        let other = LoadBalancer::start(bind, "https://10.0.0.9:6443", Some(kept))
            .await
            .unwrap();
        assert_eq!(other.servers(), ["10.0.0.9:6443"]);
    }
}
