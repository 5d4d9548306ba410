//! Container probes as upstream runs them: startup, liveness and readiness; each an
//! exec (exit code 0), an httpGet (status 200–399), a tcpSocket (the connection
//! opens) or a gRPC health check (SERVING), with initialDelaySeconds, periodSeconds, timeoutSeconds, successThreshold
//! and failureThreshold. Until a startup probe succeeds the others do not run; a
//! container is ready when its readiness probe passes (or it has none). State belongs
//! to one container instance, so a restart starts it afresh.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, ExecAction, GRPCAction, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use krust_cri::Runtime;
use krust_cri::api::ExecSyncRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Startup,
    Liveness,
    Readiness,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Startup => "Startup",
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
        }
    }

    fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            Kind::Startup => c.startup_probe.as_ref(),
            Kind::Liveness => c.liveness_probe.as_ref(),
            Kind::Readiness => c.readiness_probe.as_ref(),
        }
    }
}

/// The running tally of one probe of one container instance.
#[derive(Debug, Default)]
struct Tally {
    last_run: Option<Instant>,
    successes: i32,
    failures: i32,
    /// The probe's verdict once a threshold has been crossed.
    result: Option<bool>,
}

/// What a pass of the probes concluded for one container instance.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub started: bool,
    pub ready: bool,
    /// The liveness probe failed `failureThreshold` times: restart, with the message.
    pub kill: Option<String>,
    /// Failures to report as `Unhealthy` events (kind, message).
    pub unhealthy: Vec<String>,
}

/// The probe tallies of every container instance of one pod.
#[derive(Debug, Default)]
pub struct Prober {
    tallies: HashMap<(String, Kind), Tally>,
}

impl Prober {
    /// Runs the probes that are due for a running container instance `id`, started at
    /// `started`, and says whether it is started, ready, or to be killed.
    pub async fn check(
        &mut self,
        runtime: &Runtime,
        id: &str,
        container: &Container,
        pod_ip: &str,
        started: Instant,
    ) -> Verdict {
        self.tallies.retain(|(instance, _), _| instance == id);
        let now = Instant::now();
        let mut verdict = Verdict::default();
        let mut startup_done = true;
        for kind in [Kind::Startup, Kind::Liveness, Kind::Readiness] {
            let Some(probe) = kind.of(container) else {
                match kind {
                    Kind::Readiness => verdict.ready = startup_done,
                    Kind::Startup => startup_done = true,
                    Kind::Liveness => {}
                }
                continue;
            };
            if kind != Kind::Startup && !startup_done {
                continue;
            }
            let tally = self.tallies.entry((id.to_string(), kind)).or_default();
            let initial =
                Duration::from_secs(probe.initial_delay_seconds.unwrap_or(0).max(0) as u64);
            let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
            // Startup stops probing once it has succeeded.
            let settled = kind == Kind::Startup && tally.result == Some(true);
            let due = now >= started + initial
                && tally.last_run.is_none_or(|t| now - t >= period)
                && !settled;
            if due {
                tally.last_run = Some(now);
                let outcome = run(runtime, id, container, probe, pod_ip).await;
                let success_threshold = probe.success_threshold.unwrap_or(1).max(1);
                let failure_threshold = probe.failure_threshold.unwrap_or(3).max(1);
                match outcome {
                    Ok(()) => {
                        tally.failures = 0;
                        tally.successes += 1;
                        if tally.successes >= success_threshold {
                            tally.result = Some(true);
                        }
                    }
                    Err(message) => {
                        tally.successes = 0;
                        tally.failures += 1;
                        verdict
                            .unhealthy
                            .push(format!("{} probe failed: {message}", kind.name()));
                        if tally.failures >= failure_threshold {
                            tally.result = Some(false);
                            if kind != Kind::Readiness {
                                verdict.kill = Some(format!(
                                    "Container {} failed {} probe, will be restarted",
                                    container.name,
                                    kind.name().to_lowercase()
                                ));
                            }
                        }
                    }
                }
            }
            match kind {
                Kind::Startup => startup_done = tally.result == Some(true),
                Kind::Readiness => verdict.ready = tally.result == Some(true),
                Kind::Liveness => {}
            }
        }
        verdict.started = startup_done;
        verdict.ready &= startup_done;
        verdict
    }
}

/// Runs one probe once; `Err` carries why it failed.
async fn run(
    runtime: &Runtime,
    id: &str,
    container: &Container,
    probe: &Probe,
    pod_ip: &str,
) -> Result<(), String> {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(action) = &probe.exec {
        return exec(runtime, id, action, timeout).await;
    }
    if let Some(action) = &probe.http_get {
        return http_get(container, action, pod_ip, timeout).await;
    }
    if let Some(action) = &probe.tcp_socket {
        let host = target_host(action.host.as_deref(), pod_ip);
        let port = port(container, &action.port)?;
        return tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port)))
            .await
            .map_err(|_| format!("dial tcp {host}:{port}: i/o timeout"))?
            .map(|_| ())
            .map_err(|e| format!("dial tcp {host}:{port}: {e}"));
    }
    if let Some(action) = &probe.grpc {
        return grpc(action, pod_ip, timeout).await;
    }
    Err("the probe names no action".into())
}

/// An exec action: the command exits 0 within `timeout`.
pub async fn exec(
    runtime: &Runtime,
    id: &str,
    action: &ExecAction,
    timeout: Duration,
) -> Result<(), String> {
    let out = runtime
        .runtime
        .clone()
        .exec_sync(ExecSyncRequest {
            container_id: id.to_string(),
            cmd: action.command.clone().unwrap_or_default(),
            timeout: timeout.as_secs() as i64,
        })
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner();
    if out.exit_code == 0 {
        Ok(())
    } else {
        let output = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Err(format!("command exited with {}: {output}", out.exit_code))
    }
}

/// An httpGet action: a status from 200 to 399 within `timeout`.
pub async fn http_get(
    container: &Container,
    action: &HTTPGetAction,
    pod_ip: &str,
    timeout: Duration,
) -> Result<(), String> {
    let host = target_host(action.host.as_deref(), pod_ip);
    let port = port(container, &action.port)?;
    let path = action.path.clone().unwrap_or_else(|| "/".into());
    let headers: String = action
        .http_headers
        .iter()
        .flatten()
        .map(|h| format!("{}: {}\r\n", h.name, h.value))
        .collect();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\n{headers}Connection: close\r\n\r\n"
    );
    let url = format!("http://{host}:{port}{path}");
    let status = tokio::time::timeout(timeout, async {
        let mut stream = TcpStream::connect((host.as_str(), port)).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut head = vec![0u8; 64];
        let n = stream.read(&mut head).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&head[..n]).into_owned())
    })
    .await
    .map_err(|_| format!("Get \"{url}\": context deadline exceeded"))?
    .map_err(|e| format!("Get \"{url}\": {e}"))?;
    let code: u16 = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

/// A gRPC action: the standard health service (`grpc.health.v1.Health/Check`) answers
/// SERVING for the named service within `timeout`; upstream's messages.
pub async fn grpc(action: &GRPCAction, pod_ip: &str, timeout: Duration) -> Result<(), String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let address = format!("{pod_ip}:{}", action.port);
    let fail_connect = |e: &dyn std::fmt::Display| {
        format!(
            "timeout: failed to connect service {address:?} within {}s: {e}",
            timeout.as_secs()
        )
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| fail_connect(&e))?
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|e| fail_connect(&e))?;
    let request = HealthCheckRequest {
        service: action.service.clone().unwrap_or_default(),
    };
    let answer = tokio::time::timeout(timeout, HealthClient::new(channel).check(request))
        .await
        .map_err(|_| {
            format!(
                "timeout: health rpc did not complete within {}s",
                timeout.as_secs()
            )
        })?
        .map_err(|status| {
            format!(
                "error: health rpc probe failed: {}",
                crate::rpc_error(&status)
            )
        })?
        .into_inner();
    match ServingStatus::try_from(answer.status) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(other) => Err(format!(
            "service unhealthy (responded with {:?})",
            other.as_str_name()
        )),
        Err(_) => Err(format!(
            "service unhealthy (responded with {})",
            answer.status
        )),
    }
}

/// The host an action names, else the pod's IP.
fn target_host(host: Option<&str>, pod_ip: &str) -> String {
    host.filter(|h| !h.is_empty()).unwrap_or(pod_ip).to_string()
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port(container: &Container, port: &IntOrString) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("port {name} not found in container {}", container.name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::json;

    #[test]
    fn named_ports_resolve_from_the_container() {
        let c: Container = k8s_openapi::serde_json::from_value(json!({
            "name": "c", "ports": [{"name": "http", "containerPort": 8080}]
        }))
        .unwrap();
        assert_eq!(port(&c, &IntOrString::String("http".into())), Ok(8080));
        assert_eq!(port(&c, &IntOrString::Int(9090)), Ok(9090));
        assert!(port(&c, &IntOrString::String("nope".into())).is_err());
    }

    /// A real gRPC health server on loopback, switched between states.
    #[tokio::test]
    async fn grpc_probes_ask_the_standard_health_service() {
        let (reporter, service) = tonic_health::server::health_reporter();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let action = |service: &str| GRPCAction {
            port: port.into(),
            service: Some(service.to_string()),
        };
        let second = Duration::from_secs(1);
        reporter
            .set_service_status("db", tonic_health::ServingStatus::Serving)
            .await;
        assert_eq!(grpc(&action("db"), "127.0.0.1", second).await, Ok(()));
        // The empty service name is the server as a whole, SERVING by default.
        assert_eq!(grpc(&action(""), "127.0.0.1", second).await, Ok(()));
        reporter
            .set_service_status("db", tonic_health::ServingStatus::NotServing)
            .await;
        assert_eq!(
            grpc(&action("db"), "127.0.0.1", second).await,
            Err("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        let unknown = grpc(&action("nope"), "127.0.0.1", second)
            .await
            .unwrap_err();
        assert!(unknown.contains("code = NotFound"), "{unknown}");
        let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let refused = GRPCAction {
            port: nobody.local_addr().unwrap().port().into(),
            service: None,
        };
        drop(nobody);
        let err = grpc(&refused, "127.0.0.1", second).await.unwrap_err();
        assert!(
            err.starts_with("timeout: failed to connect service"),
            "{err}"
        );
    }
}
