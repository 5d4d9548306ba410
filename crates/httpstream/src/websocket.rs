//! WebSocket clients of exec, attach and port-forward, served by a runtime streaming
//! server that speaks SPDY (containerd 1.6 knows neither the v5 WebSocket protocol nor
//! port-forward over WebSocket). kubectl 1.30+ tries WebSocket first:
//! - remote commands (`v5.channel.k8s.io`, and `v4.channel.k8s.io` as the Python client
//!   uses): each message (binary, or text as the Python client writes stdin) is one
//!   channel byte and data — 0 stdin, 1 stdout,
//!   2 stderr, 3 the error stream (a metav1.Status when the command ends), 4 terminal
//!   resize, and with v5 255 closes the channel named by the next byte. Each channel
//!   becomes a SPDY stream at the runtime (`v4.channel.k8s.io` there);
//! - port-forward (`SPDY/3.1+portforward.k8s.io`): the client tunnels SPDY frames in
//!   binary messages; they are passed to and from the runtime's SPDY connection as is;
//! - port-forward over channels (`v4.channel.k8s.io`, as the Python client and
//!   upstream's kubelet speak it): the `ports` of the query get channels `2i` (data)
//!   and `2i + 1` (errors), each opened with the port as two little-endian bytes; each
//!   pair becomes a data and an error SPDY stream at the runtime.
//!
//! Upstream's apiserver does the same translation (its StreamTranslator and
//! TunnelingHandler) in front of kubelets that speak SPDY.

use std::collections::HashMap;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use crate::spdy::{self, Frame};

pub const REMOTE_COMMAND_V5: &str = "v5.channel.k8s.io";
pub const REMOTE_COMMAND_V4: &str = "v4.channel.k8s.io";
pub const PORT_FORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";
/// The SPDY protocols asked of the runtime.
const SPDY_REMOTE_COMMAND: &str = "v4.channel.k8s.io";
const SPDY_PORT_FORWARD: &str = "portforward.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad WebSocket handshake: {0}")]
    Handshake(&'static str),
    #[error("the runtime's streaming server refused the upgrade: {0}")]
    Refused(StatusCode),
    #[error("connecting to the runtime's streaming server: {0}")]
    Http(#[from] hyper::Error),
    #[error("building the upgrade request: {0}")]
    Request(#[from] http::Error),
}

/// Which streams a remote command has.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// What a WebSocket connection carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Session {
    /// exec or attach; `close_signal` with v5.
    RemoteCommand {
        streams: Streams,
        close_signal: bool,
    },
    /// SPDY tunnelled in WebSocket messages.
    PortForward,
    /// A data and an error channel per port.
    PortForwardChannels { ports: Vec<u16> },
}

impl Session {
    /// The session a WebSocket upgrade asks for, if it offers a protocol served here:
    /// for a remote command, v5 before v4; for a port-forward (`remote_command` is
    /// `None`) of `ports`, the SPDY tunnel before channels.
    pub fn negotiate(
        headers: &HeaderMap,
        remote_command: Option<Streams>,
        ports: &[u16],
    ) -> Option<Session> {
        if !is_websocket(headers) {
            return None;
        }
        let offered: Vec<&str> = headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        match remote_command {
            Some(streams) if offered.contains(&REMOTE_COMMAND_V5) => Some(Session::RemoteCommand {
                streams,
                close_signal: true,
            }),
            Some(streams) if offered.contains(&REMOTE_COMMAND_V4) => Some(Session::RemoteCommand {
                streams,
                close_signal: false,
            }),
            None if offered.contains(&PORT_FORWARD_TUNNEL) => Some(Session::PortForward),
            None if offered.contains(&REMOTE_COMMAND_V4) && !ports.is_empty() => {
                Some(Session::PortForwardChannels {
                    ports: ports.to_vec(),
                })
            }
            _ => None,
        }
    }

    fn websocket_protocol(&self) -> &'static str {
        match self {
            Session::RemoteCommand {
                close_signal: true, ..
            } => REMOTE_COMMAND_V5,
            Session::RemoteCommand { .. } | Session::PortForwardChannels { .. } => {
                REMOTE_COMMAND_V4
            }
            Session::PortForward => PORT_FORWARD_TUNNEL,
        }
    }

    fn spdy_protocol(&self) -> &'static str {
        match self {
            Session::RemoteCommand { .. } => SPDY_REMOTE_COMMAND,
            Session::PortForward | Session::PortForwardChannels { .. } => SPDY_PORT_FORWARD,
        }
    }
}

fn is_websocket(headers: &HeaderMap) -> bool {
    crate::proxy::is_upgrade(headers)
        && headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Answers the WebSocket upgrade `req` for `session`: first upgrades `io`, a fresh
/// connection to the runtime's streaming server, to SPDY at `path`; once the client's
/// connection is upgraded too, the two are bridged until either ends.
pub async fn serve<IO>(
    mut req: Request<Incoming>,
    session: Session,
    io: IO,
    authority: &str,
    path: &str,
) -> Result<Response<Empty<Bytes>>, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let key = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or(Error::Handshake("no Sec-WebSocket-Key"))?;
    let accept = derive_accept_key(key.as_bytes());
    let client = hyper::upgrade::on(&mut req);

    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!(%err, "runtime streaming connection ended with an error");
        }
    });
    let upgrade = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, authority)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", session.spdy_protocol())
        .body(Empty::<Bytes>::new())?;
    let mut answer = sender.send_request(upgrade).await?;
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(Error::Refused(answer.status()));
    }
    let runtime = hyper::upgrade::on(&mut answer);
    let protocol = session.websocket_protocol();
    tokio::spawn(async move {
        let (client, runtime) = match tokio::try_join!(client, runtime) {
            Ok(both) => both,
            Err(err) => {
                tracing::debug!(%err, "stream upgrade did not complete");
                return;
            }
        };
        if let Err(err) = bridge(session, TokioIo::new(client), TokioIo::new(runtime)).await {
            tracing::debug!(%err, "stream session ended with an error");
        }
    });

    let mut resp = Response::new(Empty::new());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = resp.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).expect("base64 is a valid header value"),
    );
    headers.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(protocol),
    );
    Ok(resp)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs `session` between `client`, a connection upgraded to WebSocket (its frames
/// start at once), and `runtime`, one upgraded to SPDY at the runtime's streaming
/// server, until either ends.
pub async fn bridge<C, R>(session: Session, client: C, runtime: R) -> Result<(), BoxError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + AsyncWrite + Send + 'static,
{
    let ws = WebSocketStream::from_raw_socket(client, Role::Server, None).await;
    match session {
        Session::RemoteCommand {
            streams,
            close_signal,
        } => remote_command(ws, runtime, streams, close_signal).await,
        Session::PortForward => tunnel(ws, runtime).await,
        Session::PortForwardChannels { ports } => port_channels(ws, runtime, &ports).await,
    }
}

/// The WebSocket channels of a session and the SPDY streams opened for them at the
/// runtime, both ways.
#[derive(Default)]
struct Channels {
    stream_of: HashMap<u8, u32>,
    channel_of: HashMap<u32, u8>,
    /// Client streams have odd ids.
    last_id: Option<u32>,
}

impl Channels {
    /// Opens the runtime stream for `channel`.
    async fn open<W: AsyncWrite + Unpin>(
        &mut self,
        spdy: &mut spdy::Writer<W>,
        channel: u8,
        headers: &[(&str, &str)],
    ) -> std::io::Result<()> {
        let id = self.last_id.map_or(1, |id| id + 2);
        spdy.syn_stream(id, headers).await?;
        self.last_id = Some(id);
        self.stream_of.insert(channel, id);
        self.channel_of.insert(id, channel);
        Ok(())
    }
}

/// Reads the runtime's side into a channel, so the bridge can wait on both sides
/// without losing a partly read frame.
fn spawn_reader<R, T>(
    mut read: R,
    next: impl Fn(&mut R) -> futures::future::BoxFuture<'_, std::io::Result<Option<T>>> + Send + 'static,
) -> mpsc::Receiver<T>
where
    R: Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok(Some(item)) = next(&mut read).await {
            if tx.send(item).await.is_err() {
                break;
            }
        }
    });
    rx
}

async fn remote_command<C, R>(
    mut ws: WebSocketStream<C>,
    runtime: R,
    streams: Streams,
    close_signal: bool,
) -> Result<(), BoxError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(runtime);
    let mut spdy = spdy::Writer::new(write);
    let wanted = [
        (ERROR, "error", true),
        (STDIN, "stdin", streams.stdin),
        (STDOUT, "stdout", streams.stdout),
        (STDERR, "stderr", streams.stderr && !streams.tty),
        (RESIZE, "resize", streams.tty),
    ];
    let mut channels = Channels::default();
    for (channel, kind, on) in wanted {
        if on {
            channels
                .open(&mut spdy, channel, &[("streamtype", kind)])
                .await?;
        }
    }
    let Channels {
        stream_of,
        channel_of,
        ..
    } = channels;
    let mut frames = spawn_reader(read, |r| Box::pin(spdy::read_frame(r)));
    let mut status = Vec::new();
    loop {
        tokio::select! {
            message = ws.next() => match message.map(|m| m.map(text_as_binary)) {
                Some(Ok(Message::Binary(data))) if !data.is_empty() => {
                    let (channel, payload) = (data[0], &data[1..]);
                    if channel == CLOSE && close_signal {
                        if let Some(stream) = payload.first().and_then(|c| stream_of.get(c)) {
                            spdy.data(*stream, &[], true).await?;
                        }
                    } else if let Some(stream) = stream_of.get(&channel)
                        && (channel == STDIN || channel == RESIZE)
                    {
                        spdy.data(*stream, payload, false).await?;
                    }
                }
                Some(Ok(Message::Close(_))) | None => break,
                Some(Ok(_)) => {}
                Some(Err(err)) => return Err(err.into()),
            },
            frame = frames.recv() => match frame {
                Some(Frame::Data { stream, fin, data }) => match channel_of.get(&stream) {
                    Some(&ERROR) => {
                        status.extend_from_slice(&data);
                        if fin && !status.is_empty() {
                            ws.send(channel_message(ERROR, &std::mem::take(&mut status))).await?;
                        }
                    }
                    Some(&channel) if !data.is_empty() => {
                        ws.send(channel_message(channel, &data)).await?;
                    }
                    _ => {}
                },
                Some(Frame::Ping { id }) => spdy.ping(id).await?,
                Some(Frame::GoAway) | None => break,
                Some(Frame::Control { .. }) => {}
            },
        }
    }
    if !status.is_empty() {
        ws.send(channel_message(ERROR, &status)).await?;
    }
    let _ = ws.close(Some(normal_closure())).await;
    let _ = spdy.shutdown().await;
    Ok(())
}

/// Clients take a close without a code as a failure.
fn normal_closure() -> CloseFrame {
    CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }
}

fn channel_message(channel: u8, data: &[u8]) -> Message {
    let mut message = Vec::with_capacity(1 + data.len());
    message.push(channel);
    message.extend_from_slice(data);
    Message::Binary(message.into())
}

/// A text message as the binary one with its bytes: the Python client writes stdin as
/// text (channel byte first), and upstream reads both alike.
fn text_as_binary(message: Message) -> Message {
    match message {
        Message::Text(text) => Message::Binary(Bytes::from(text.as_str().as_bytes().to_vec())),
        other => other,
    }
}

/// Port-forward over channels: per port, a data and an error SPDY stream at the runtime
/// (headers `streamtype`, `port`, `requestid`, as upstream's kubelet asks for them).
async fn port_channels<C, R>(
    mut ws: WebSocketStream<C>,
    runtime: R,
    ports: &[u16],
) -> Result<(), BoxError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(runtime);
    let mut spdy = spdy::Writer::new(write);
    let mut channels = Channels::default();
    for (i, port) in ports.iter().enumerate() {
        let (port, request) = (port.to_string(), i.to_string());
        for (offset, kind) in [(1, "error"), (0, "data")] {
            let channel = u8::try_from(2 * i + offset)?;
            let headers = [
                ("streamtype", kind),
                ("port", &port),
                ("requestid", &request),
            ];
            channels.open(&mut spdy, channel, &headers).await?;
        }
    }
    let Channels {
        stream_of,
        channel_of,
        ..
    } = channels;
    // Each channel opens with its port.
    for (i, port) in ports.iter().enumerate() {
        for offset in [0, 1] {
            let channel = u8::try_from(2 * i + offset)?;
            ws.send(channel_message(channel, &port.to_le_bytes()))
                .await?;
        }
    }
    let mut frames = spawn_reader(read, |r| Box::pin(spdy::read_frame(r)));
    let mut open_ports = ports.len();
    loop {
        tokio::select! {
            message = ws.next() => match message.map(|m| m.map(text_as_binary)) {
                Some(Ok(Message::Binary(data))) if !data.is_empty() => {
                    // Only data channels (even) carry the client's bytes.
                    if data[0] % 2 == 0
                        && let Some(stream) = stream_of.get(&data[0])
                    {
                        spdy.data(*stream, &data[1..], false).await?;
                    }
                }
                Some(Ok(Message::Close(_))) | None => break,
                Some(Ok(_)) => {}
                Some(Err(err)) => return Err(err.into()),
            },
            frame = frames.recv() => match frame {
                Some(Frame::Data { stream, fin, data }) => {
                    let Some(&channel) = channel_of.get(&stream) else { continue };
                    if !data.is_empty() {
                        ws.send(channel_message(channel, &data)).await?;
                    }
                    // Every port's connection closed by the pod: the session ends, as
                    // upstream's kubelet ends it (the client sees its sockets close).
                    if fin && channel % 2 == 0 {
                        open_ports -= 1;
                        if open_ports == 0 {
                            break;
                        }
                    }
                }
                Some(Frame::Ping { id }) => spdy.ping(id).await?,
                Some(Frame::GoAway) | None => break,
                Some(_) => {}
            },
        }
    }
    let _ = ws.close(Some(normal_closure())).await;
    let _ = spdy.shutdown().await;
    Ok(())
}

/// Port-forward over WebSocket: SPDY frames tunnelled in binary messages.
async fn tunnel<C, R>(mut ws: WebSocketStream<C>, runtime: R) -> Result<(), BoxError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, mut write) = tokio::io::split(runtime);
    let mut chunks = spawn_reader(read, |r| {
        Box::pin(async move {
            let mut buf = vec![0u8; 32 * 1024];
            let n = r.read(&mut buf).await?;
            buf.truncate(n);
            Ok((n > 0).then_some(buf))
        })
    });
    loop {
        tokio::select! {
            message = ws.next() => match message {
                Some(Ok(Message::Binary(data))) => write.write_all(&data).await?,
                Some(Ok(Message::Close(_))) | None => break,
                Some(Ok(_)) => {}
                Some(Err(err)) => return Err(err.into()),
            },
            chunk = chunks.recv() => match chunk {
                Some(chunk) => ws.send(Message::Binary(chunk.into())).await?,
                None => break,
            },
        }
    }
    let _ = ws.close(Some(normal_closure())).await;
    let _ = write.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrade(protocols: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_str(protocols).unwrap(),
        );
        h
    }

    #[test]
    fn negotiates_v5_before_v4_and_the_port_forward_tunnel_before_channels() {
        let streams = Streams {
            stdout: true,
            ..Streams::default()
        };
        let v5 = Session::negotiate(
            &upgrade("v4.channel.k8s.io, v5.channel.k8s.io"),
            Some(streams),
            &[],
        );
        assert_eq!(
            v5,
            Some(Session::RemoteCommand {
                streams,
                close_signal: true
            })
        );
        let v4 = Session::negotiate(&upgrade("v4.channel.k8s.io"), Some(streams), &[]);
        assert_eq!(v4.unwrap().websocket_protocol(), REMOTE_COMMAND_V4);
        assert_eq!(
            Session::negotiate(&upgrade("channel.k8s.io"), Some(streams), &[]),
            None
        );
        assert_eq!(
            Session::negotiate(&upgrade(PORT_FORWARD_TUNNEL), None, &[80]),
            Some(Session::PortForward)
        );
        // The Python client's port-forward: channels per port.
        let channels = Session::negotiate(
            &upgrade("v5.channel.k8s.io,v4.channel.k8s.io"),
            None,
            &[80, 8080],
        );
        assert_eq!(
            channels,
            Some(Session::PortForwardChannels {
                ports: vec![80, 8080]
            })
        );
        assert_eq!(channels.unwrap().websocket_protocol(), REMOTE_COMMAND_V4);
        assert_eq!(
            Session::negotiate(&upgrade("v4.channel.k8s.io"), None, &[]),
            None
        );
        let mut spdy = upgrade("v5.channel.k8s.io");
        spdy.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        assert_eq!(Session::negotiate(&spdy, Some(streams), &[]), None);
    }
}
