//! Service health check ports, as kube-proxy's service health server: a LoadBalancer
//! Service with `externalTrafficPolicy: Local` has a `healthCheckNodePort`, where every
//! node's proxy answers whether the node has endpoints of that Service (200) or not
//! (503), so that an external balancer sends traffic only to nodes that keep it.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::Ipv4Addr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Service;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::model::{ServicePort, TrafficPolicy};

/// What a health check port answers for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub namespace: String,
    pub name: String,
    /// This node's endpoints of the Service (distinct addresses).
    pub local_endpoints: usize,
}

/// The health check ports this node must serve, from the Services and their ports.
pub fn wanted<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    ports: &[ServicePort],
) -> BTreeMap<u16, Health> {
    let mut wanted = BTreeMap::new();
    for svc in services {
        let Some((namespace, name, spec)) = crate::model::parts(svc) else {
            continue;
        };
        let Some(port) = spec
            .health_check_node_port
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        let mine = ports.iter().filter(|p| {
            p.namespace == namespace
                && p.service == name
                && p.external_policy == TrafficPolicy::Local
        });
        // Ready ones only, as kube-proxy counts: a node whose pods are all terminating
        // answers 503, so balancers move away while it drains.
        let mut addresses: Vec<Ipv4Addr> = mine
            .filter(|p| p.local_ready)
            .flat_map(|p| p.local_endpoints.iter().map(|e| *e.ip()))
            .collect();
        addresses.sort();
        addresses.dedup();
        wanted.insert(
            port,
            Health {
                namespace: namespace.to_string(),
                name: name.to_string(),
                local_endpoints: addresses.len(),
            },
        );
    }
    wanted
}

/// The listeners serving health check ports, one per port.
#[derive(Default)]
pub struct HealthServer {
    serving: HashMap<u16, (watch::Sender<Health>, JoinHandle<()>)>,
}

impl HealthServer {
    /// Serves exactly `wanted`: new ports are opened, gone ones closed, the others
    /// answer the new counts at once.
    pub async fn sync(&mut self, wanted: &BTreeMap<u16, Health>) {
        self.serving.retain(|port, (_, task)| {
            let keep = wanted.contains_key(port);
            if !keep {
                task.abort();
            }
            keep
        });
        for (port, health) in wanted {
            if let Some((sender, _)) = self.serving.get(port) {
                sender.send_if_modified(|current| {
                    let changed = current != health;
                    *current = health.clone();
                    changed
                });
                continue;
            }
            match tokio::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, *port)).await {
                Ok(listener) => {
                    let (sender, receiver) = watch::channel(health.clone());
                    let task = tokio::spawn(serve(listener, receiver));
                    self.serving.insert(*port, (sender, task));
                }
                // Tried again at the next sync.
                Err(err) => tracing::warn!(port, error = %err, "opening a health check port"),
            }
        }
    }
}

impl Drop for HealthServer {
    fn drop(&mut self) {
        for (_, task) in self.serving.values() {
            task.abort();
        }
    }
}

async fn serve(listener: tokio::net::TcpListener, health: watch::Receiver<Health>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            // Out of descriptors, say: do not spin.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let health = health.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_req| {
                let answer = answer(&health.borrow());
                async move { Ok::<_, Infallible>(answer) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// kube-proxy's answer: its JSON body, 200 with local endpoints and 503 without.
fn answer(health: &Health) -> Response<Full<Bytes>> {
    let body = format!(
        "{{\"service\":{{\"namespace\":\"{}\",\"name\":\"{}\"}},\"localEndpoints\":{},\"serviceProxyHealthy\":true}}",
        health.namespace, health.name, health.local_endpoints
    );
    let status = if health.local_endpoints > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert("content-type", "application/json".parse().expect("valid"));
    headers.insert("x-content-type-options", "nosniff".parse().expect("valid"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[tokio::test]
    async fn each_local_balancer_answers_its_nodes_endpoint_count() {
        let lb = service(json!({
            "metadata": {"namespace": "default", "name": "web"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.43.0.20", "ports": [{"port": 80}],
                     "externalTrafficPolicy": "Local", "healthCheckNodePort": 0},
        }));
        let port = ServicePort {
            namespace: "default".into(),
            service: "web".into(),
            port_name: "80".into(),
            protocol: crate::model::Protocol::Tcp,
            cluster_ip: "10.43.0.20".parse().unwrap(),
            external_ips: Vec::new(),
            port: 80,
            node_port: Some(30080),
            endpoints: vec!["10.42.0.5:80".parse().unwrap()],
            local_endpoints: vec!["10.42.0.5:80".parse().unwrap()],
            local_ready: true,
            internal_policy: TrafficPolicy::Cluster,
            external_policy: TrafficPolicy::Local,
            affinity_seconds: None,
            firewall: None,
        };
        // Port 0 in the Service is no port; a free one stands in for the allocated one.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let health_port = free.local_addr().unwrap().port();
        drop(free);
        let mut lb = lb;
        lb.spec.as_mut().unwrap().health_check_node_port = Some(i32::from(health_port));
        let wanted_now = wanted([&lb], std::slice::from_ref(&port));
        assert_eq!(wanted_now[&health_port].local_endpoints, 1);

        let mut server = HealthServer::default();
        server.sync(&wanted_now).await;
        let get = || async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", health_port))
                .await
                .unwrap();
            tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut answer = String::new();
            tcp.read_to_string(&mut answer).await.unwrap();
            answer
        };
        let healthy = get().await;
        assert!(healthy.starts_with("HTTP/1.1 200 OK"), "{healthy}");
        assert!(healthy.ends_with(
            r#"{"service":{"namespace":"default","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}"#
        ));

        let mut elsewhere = port.clone();
        elsewhere.local_endpoints.clear();
        server.sync(&wanted([&lb], &[elsewhere])).await;
        let unhealthy = get().await;
        assert!(unhealthy.starts_with("HTTP/1.1 503"), "{unhealthy}");
        assert!(unhealthy.contains(r#""localEndpoints":0"#));

        server.sync(&BTreeMap::new()).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            tokio::net::TcpStream::connect(("127.0.0.1", health_port))
                .await
                .is_err(),
            "the port is closed once no Service wants it"
        );
    }
}
