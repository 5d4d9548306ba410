//! Forwarding one request to the next hop over a fresh connection. The apiserver uses it
//! towards the kubelet and the kubelet towards the runtime's streaming server; upstream's
//! `UpgradeAwareHandler` plays this part.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("HTTP handshake with {target}: {source}")]
    Handshake {
        target: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{method} {target}: {source}")]
    Send {
        method: http::Method,
        target: String,
        #[source]
        source: hyper::Error,
    },
    #[error("invalid request to forward: {0}")]
    Request(#[from] http::Error),
}

/// Headers that describe one connection, not the request (RFC 9110 §7.6.1); `Connection`
/// and `Upgrade` travel on only when the request asks for an upgrade.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether the request asks to switch protocols (`Connection: Upgrade` plus `Upgrade`).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

/// Sends `req` as `path_and_query` to the host `authority` over `io`, a fresh
/// connection to the next hop, and returns the answer with its body still streaming.
/// Credentials are not passed on: the next hop authenticates this hop, not the client.
/// When an upgrade is answered with 101 Switching Protocols, the client's connection and
/// the next hop's are spliced byte for byte once the caller has sent the 101 on.
pub async fn forward<IO>(
    io: IO,
    authority: &str,
    path_and_query: &str,
    mut req: Request<Incoming>,
) -> Result<Response<Incoming>, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let target = format!("{authority}{path_and_query}");
    let upgrade = is_upgrade(req.headers());
    let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|source| Error::Handshake {
            target: target.clone(),
            source,
        })?;
    tokio::spawn(async move {
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!(%err, "forwarded connection ended with an error");
        }
    });

    let (parts, body) = req.into_parts();
    let mut out = Request::builder()
        .method(parts.method.clone())
        .uri(path_and_query);
    let headers = out.headers_mut().expect("builder without errors so far");
    for (name, value) in &parts.headers {
        let hop = HOP_BY_HOP.contains(&name.as_str());
        let ours =
            name == header::HOST || name == header::AUTHORIZATION || name == header::CONNECTION;
        if ours || (hop && !(upgrade && name == header::UPGRADE)) {
            continue;
        }
        headers.append(name, value.clone());
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    }
    headers.insert(
        header::HOST,
        HeaderValue::from_str(authority).unwrap_or(HeaderValue::from_static("localhost")),
    );
    let body: BoxBody<Bytes, hyper::Error> = if upgrade {
        Empty::new().map_err(|never| match never {}).boxed()
    } else {
        body.boxed()
    };
    let mut resp = sender
        .send_request(out.body(body)?)
        .await
        .map_err(|source| Error::Send {
            method: parts.method.clone(),
            target,
            source,
        })?;
    if let Some(client_side) = client_side
        && resp.status() == StatusCode::SWITCHING_PROTOCOLS
    {
        let next_hop = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let (client, next) = match tokio::try_join!(client_side, next_hop) {
                Ok(both) => both,
                Err(err) => {
                    tracing::debug!(%err, "upgrade did not complete");
                    return;
                }
            };
            let (mut client, mut next) = (TokioIo::new(client), TokioIo::new(next));
            if let Err(err) = tokio::io::copy_bidirectional(&mut client, &mut next).await {
                tracing::debug!(%err, "upgraded stream ended with an error");
            }
        });
    }
    Ok(resp)
}
