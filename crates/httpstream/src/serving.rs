//! Serving connections that cannot be held for ever by a client that says nothing or
//! says it too slowly: [`builder`] gives hyper's server its header deadline and HTTP/2
//! pings, and [`FirstByteDeadline`] fails a connection whose first byte does not come
//! in time. hyper's HTTP/1 header timeout starts only once a request begins, so a client
//! that completes TLS and then sends nothing would otherwise hold its connection for
//! ever (Go's `ReadHeaderTimeout` covers it).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// HTTP/2 connections whose peer stops answering pings are closed.
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A connection builder whose HTTP/1 requests must bring their headers within
/// `header_timeout`, and whose idle HTTP/2 peers are pinged.
pub fn builder(header_timeout: Duration) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    builder
}

pub struct FirstByteDeadline<T> {
    io: T,
    /// Until the first byte has come.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<T> FirstByteDeadline<T> {
    pub fn new(io: T, within: Duration) -> Self {
        FirstByteDeadline {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FirstByteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if self.deadline.is_some() {
            if read.is_ready() && buf.filled().len() > before {
                self.deadline = None;
            } else if read.is_pending()
                && let Some(deadline) = self.deadline.as_mut()
                && deadline.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Err(std::io::ErrorKind::TimedOut.into()));
            }
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FirstByteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn silence_times_out_and_speech_lifts_the_deadline() {
        let (client, server) = tokio::io::duplex(64);
        let mut silent = FirstByteDeadline::new(server, Duration::from_millis(50));
        let mut byte = [0u8; 1];
        let err = silent.read(&mut byte).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        drop(client);

        let (mut client, server) = tokio::io::duplex(64);
        let mut talking = FirstByteDeadline::new(server, Duration::from_millis(50));
        client.write_all(b"x").await.unwrap();
        assert_eq!(talking.read(&mut byte).await.unwrap(), 1);
        // Quiet after the first byte is no longer limited here.
        let later = tokio::time::timeout(Duration::from_millis(150), talking.read(&mut byte)).await;
        assert!(later.is_err(), "still waiting, not timed out");
    }
}
