//! exec, attach and port-forward sessions over WebSocket, as the apiserver bridges them
//! to a runtime's SPDY streaming server: the input is what the client sent (raw
//! WebSocket frames) and what the runtime answered (raw SPDY frames), for one of the
//! session kinds. Nothing may panic, and the session must end once both sides are done.
#![no_main]

use std::time::Duration;

use krust_httpstream::websocket::{Session, Streams, bridge};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The session kinds, chosen by the input's first byte.
fn session(kind: u8) -> Session {
    match kind % 4 {
        0 | 1 => Session::RemoteCommand {
            streams: Streams {
                stdin: kind & 0x10 != 0,
                stdout: kind & 0x20 != 0,
                stderr: kind & 0x40 != 0,
                tty: kind & 0x80 != 0,
            },
            close_signal: kind % 4 == 1,
        },
        2 => Session::PortForward,
        _ => Session::PortForwardChannels {
            ports: (0..(kind >> 4) % 4).map(|i| 8000 + u16::from(i)).collect(),
        },
    }
}

/// Writes `input` to one end of `io` and then closes it, reading whatever comes back.
async fn peer(io: tokio::io::DuplexStream, input: &[u8]) {
    let (mut read, mut write) = tokio::io::split(io);
    let send = async {
        let _ = write.write_all(input).await;
        let _ = write.shutdown().await;
    };
    let drain = async {
        let mut sink = Vec::new();
        let _ = read.read_to_end(&mut sink).await;
    };
    tokio::join!(send, drain);
}

fuzz_target!(|data: &[u8]| {
    let [kind, split_hi, split_lo, rest @ ..] = data else {
        return;
    };
    let split = usize::from(u16::from_be_bytes([*split_hi, *split_lo])).min(rest.len());
    let (client_bytes, runtime_bytes) = rest.split_at(split);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (client, client_peer) = tokio::io::duplex(1 << 16);
        let (spdy, spdy_peer) = tokio::io::duplex(1 << 16);
        let session = async {
            let _ = bridge(session(*kind), client, spdy).await;
        };
        let all = async {
            tokio::join!(
                session,
                peer(client_peer, client_bytes),
                peer(spdy_peer, runtime_bytes)
            )
        };
        tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .expect("the session did not end after both sides closed");
    });
});
