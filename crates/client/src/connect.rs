//! The API client every krust component uses: kube-rs's request stack over an HTTP
//! client that speaks HTTP/2 when the apiserver offers it, as client-go does. kube-rs's
//! own client is HTTP/1.1 only, so each concurrent request holds a TLS connection of its
//! own and a burst of creates leaves hundreds of idle connections (and their buffers)
//! in the pool; over HTTP/2 every request and watch shares one connection.

use std::time::Duration;

use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use tower::{BoxError, ServiceBuilder};

/// client-go's HTTP/2 health check: a ping after 30 s without frames, and the
/// connection is dropped (requests fail over to a new one) if no answer comes in 15 s.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client for the apiserver that `config` describes.
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let tls = HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => tls.with_server_name_resolver(FixedServerNameResolver::new(
            name.clone().try_into().map_err(|_| {
                kube::Error::Service(format!("invalid tls-server-name {name:?}").into())
            })?,
        )),
        None => tls,
    };
    let connector = tls.enable_all_versions().wrap_connector(http);
    let http_client: HttpClient<_, Body> = HttpClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_adaptive_window(true)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http_client);
    Ok(kube::Client::new(service, config.default_namespace))
}
