//! SPDY/3.1 framing, as far as Kubernetes' streams use it (spdystream): the client side
//! of a connection to a runtime's streaming server — streams opened with SYN_STREAM,
//! DATA with FIN for half-close, PING answered. Header blocks the server sends are never
//! needed (the server opens no streams), so they are skipped undecoded; the ones sent
//! are one zlib stream of stored (uncompressed) blocks, which a SPDY peer's zlib reader
//! takes like any other.

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;
/// An empty stored deflate block: BFINAL 0, BTYPE 00, LEN 0, NLEN 0xffff.
const SYNC_FLUSH: [u8; 5] = [0x00, 0x00, 0x00, 0xff, 0xff];
/// Frames longer than this are refused (SPDY lengths are 24 bits).
const MAX_FRAME: usize = 1 << 24;

/// A frame received from the peer, reduced to what a client acts on.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
    Ping {
        id: u32,
    },
    GoAway,
    /// Any other control frame (SYN_REPLY, RST_STREAM, SETTINGS, WINDOW_UPDATE, ...).
    Control {
        kind: u16,
    },
}

/// Reads the next frame; `None` at a clean end of the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<Frame>> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let flags = head[4];
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    if len >= MAX_FRAME {
        return Err(std::io::Error::other("SPDY frame too long"));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    if head[0] & 0x80 == 0 {
        let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        return Ok(Some(Frame::Data {
            stream,
            fin: flags & FLAG_FIN != 0,
            data: Bytes::from(payload),
        }));
    }
    let kind = u16::from_be_bytes([head[2], head[3]]);
    Ok(Some(match kind {
        PING if payload.len() >= 4 => Frame::Ping {
            id: u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]),
        },
        GOAWAY => Frame::GoAway,
        kind => Frame::Control { kind },
    }))
}

/// The sending half: frames plus the connection's header-block zlib stream.
pub struct Writer<W> {
    w: W,
    zlib_started: bool,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub fn new(w: W) -> Self {
        Writer {
            w,
            zlib_started: false,
        }
    }

    /// Opens a stream with the given headers (names lower-case, as SPDY wants).
    pub async fn syn_stream(
        &mut self,
        stream: u32,
        headers: &[(&str, &str)],
    ) -> std::io::Result<()> {
        let block = self.header_block(headers);
        let mut payload = BytesMut::with_capacity(10 + block.len());
        payload.put_u32(stream & 0x7fff_ffff);
        payload.put_u32(0); // associated-to stream
        payload.put_u8(0); // priority
        payload.put_u8(0); // slot
        payload.put_slice(&block);
        self.control(SYN_STREAM, 0, &payload).await
    }

    pub async fn data(&mut self, stream: u32, data: &[u8], fin: bool) -> std::io::Result<()> {
        for (i, chunk) in data.chunks(MAX_FRAME - 1).enumerate() {
            let last = (i + 1) * (MAX_FRAME - 1) >= data.len();
            self.data_frame(stream, chunk, fin && last).await?;
        }
        if data.is_empty() {
            self.data_frame(stream, &[], fin).await?;
        }
        self.w.flush().await
    }

    pub async fn ping(&mut self, id: u32) -> std::io::Result<()> {
        self.control(PING, 0, &id.to_be_bytes()).await
    }

    pub async fn shutdown(&mut self) -> std::io::Result<()> {
        self.w.shutdown().await
    }

    async fn data_frame(&mut self, stream: u32, data: &[u8], fin: bool) -> std::io::Result<()> {
        let mut head = BytesMut::with_capacity(8);
        head.put_u32(stream & 0x7fff_ffff);
        head.put_u8(if fin { FLAG_FIN } else { 0 });
        head.put_slice(&(data.len() as u32).to_be_bytes()[1..]);
        self.w.write_all(&head).await?;
        self.w.write_all(data).await
    }

    async fn control(&mut self, kind: u16, flags: u8, payload: &[u8]) -> std::io::Result<()> {
        let mut frame = BytesMut::with_capacity(8 + payload.len());
        frame.put_u16(0x8000 | VERSION);
        frame.put_u16(kind);
        frame.put_u8(flags);
        frame.put_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        frame.put_slice(payload);
        self.w.write_all(&frame).await?;
        self.w.flush().await
    }

    /// A name/value header block, as the next piece of the connection's zlib stream:
    /// the zlib header once, then the block as stored deflate blocks and an empty
    /// stored block, the marker a sync flush ends with. The marker matters: Go's
    /// inflater hands out a stored block's bytes only when the next block begins, so
    /// without it the peer would wait past the end of the frame.
    fn header_block(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut raw = BytesMut::new();
        raw.put_u32(headers.len() as u32);
        for (name, value) in headers {
            raw.put_u32(name.len() as u32);
            raw.put_slice(name.as_bytes());
            raw.put_u32(value.len() as u32);
            raw.put_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 7);
        if !self.zlib_started {
            // CMF: deflate, 32 KiB window; FLG: no dictionary, check bits (0x7801 % 31 == 0).
            out.extend_from_slice(&[0x78, 0x01]);
            self.zlib_started = true;
        }
        for chunk in raw.chunks(u16::MAX as usize) {
            let len = chunk.len() as u16;
            out.push(0x00); // BFINAL = 0, BTYPE = 00 (stored)
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        out.extend_from_slice(&SYNC_FLUSH);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_through_the_reader() {
        let mut buf = Vec::new();
        let mut w = Writer::new(&mut buf);
        w.syn_stream(1, &[("streamtype", "error")]).await.unwrap();
        w.data(3, b"hello", false).await.unwrap();
        w.data(3, b"", true).await.unwrap();
        w.ping(7).await.unwrap();
        let mut r = &buf[..];
        assert_eq!(
            read_frame(&mut r).await.unwrap(),
            Some(Frame::Control { kind: SYN_STREAM })
        );
        assert_eq!(
            read_frame(&mut r).await.unwrap(),
            Some(Frame::Data {
                stream: 3,
                fin: false,
                data: Bytes::from_static(b"hello")
            })
        );
        assert_eq!(
            read_frame(&mut r).await.unwrap(),
            Some(Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::new()
            })
        );
        assert_eq!(
            read_frame(&mut r).await.unwrap(),
            Some(Frame::Ping { id: 7 })
        );
        assert_eq!(read_frame(&mut r).await.unwrap(), None);
    }

    #[test]
    fn header_blocks_form_one_zlib_stream_of_stored_blocks() {
        let mut w = Writer::new(Vec::new());
        let first = w.header_block(&[("streamtype", "stdin")]);
        let second = w.header_block(&[("a", "b")]);
        assert_eq!(&first[..2], &[0x78, 0x01]);
        assert_eq!(second[0], 0, "the zlib header comes only once");
        assert!(first.ends_with(&SYNC_FLUSH) && second.ends_with(&SYNC_FLUSH));
        // A real zlib reader, fed the blocks as they arrive, yields the raw blocks.
        let mut inflate = flate2::Decompress::new(true);
        let mut out = Vec::with_capacity(256);
        for block in [&first, &second] {
            inflate
                .decompress_vec(block, &mut out, flate2::FlushDecompress::Sync)
                .unwrap();
        }
        let mut want = Vec::new();
        for (n, v) in [("streamtype", "stdin"), ("a", "b")] {
            want.extend_from_slice(&1u32.to_be_bytes());
            want.extend_from_slice(&(n.len() as u32).to_be_bytes());
            want.extend_from_slice(n.as_bytes());
            want.extend_from_slice(&(v.len() as u32).to_be_bytes());
            want.extend_from_slice(v.as_bytes());
        }
        assert_eq!(out, want);
    }
}
