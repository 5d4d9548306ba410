//! The network policy tests' pod program (upstream's agnhost `netexec` and `connect`,
//! reduced), compiled by the test with `rustc` into a static binary for an image of its
//! own: busybox has no UDP server.
//!
//! `netexec serve PORT...` answers "ok" on TCP (then reads and drops whatever the client
//! sends) and on UDP on every PORT;
//! `netexec probe MILLIS PROTO:IP:PORT...` tries each target at once and prints
//! `<target> ok` or `<target> fail` for each;
//! `netexec blast SECONDS IP:PORT` sends as fast as it can over one TCP connection and
//! prints `bytes=<n> seconds=<s>`;
//! `netexec rtt COUNT IP:PORT` times COUNT UDP round trips one after another and prints
//! `p50_us=<n> p99_us=<n>`.
//!
//! The network benchmark (`examples/pod_network_bench.rs`) runs it too.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("probe") => probe(&args[1..]),
        Some("blast") => blast(&args[1..]),
        Some("rtt") => rtt(&args[1..]),
        _ => {
            eprintln!(
                "usage: netexec serve PORT... | probe MILLIS PROTO:IP:PORT... | blast SECONDS IP:PORT | rtt COUNT IP:PORT"
            );
            std::process::exit(2);
        }
    }
}

fn serve(ports: &[String]) {
    let mut threads = Vec::new();
    for port in ports {
        let port: u16 = port.parse().expect("a port number");
        let tcp = TcpListener::bind(("0.0.0.0", port)).expect("binding TCP");
        threads.push(std::thread::spawn(move || {
            for mut stream in tcp.incoming().flatten() {
                std::thread::spawn(move || {
                    if stream.write_all(b"ok\n").is_ok() {
                        let _ = std::io::copy(&mut stream, &mut std::io::sink());
                    }
                });
            }
        }));
        let udp = UdpSocket::bind(("0.0.0.0", port)).expect("binding UDP");
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            loop {
                if let Ok((_, from)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(b"ok\n", from);
                }
            }
        }));
    }
    for thread in threads {
        let _ = thread.join();
    }
}

fn probe(args: &[String]) {
    let timeout = Duration::from_millis(args[0].parse().expect("milliseconds"));
    let threads: Vec<_> = args[1..]
        .iter()
        .cloned()
        .map(|target| {
            std::thread::spawn(move || {
                let ok = reach(&target, timeout);
                println!("{target} {}", if ok { "ok" } else { "fail" });
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
}

fn reach(target: &str, timeout: Duration) -> bool {
    let (protocol, address) = target.split_once(':').expect("PROTO:IP:PORT");
    let address: SocketAddr = address.parse().expect("IP:PORT");
    let mut answer = [0u8; 3];
    match protocol {
        "tcp" => TcpStream::connect_timeout(&address, timeout)
            .and_then(|mut s| {
                s.set_read_timeout(Some(timeout))?;
                s.read_exact(&mut answer)
            })
            .is_ok_and(|()| &answer == b"ok\n"),
        "udp" => {
            let socket = UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
            // A datagram can be lost for reasons of its own: ask three times.
            let deadline = Instant::now() + timeout;
            let _ = socket.set_read_timeout(Some(timeout / 3));
            while Instant::now() < deadline {
                let _ = socket.send_to(b"hi", address);
                if let Ok((3, _)) = socket.recv_from(&mut answer) {
                    return &answer == b"ok\n";
                }
            }
            false
        }
        other => panic!("unknown protocol {other}"),
    }
}

fn blast(args: &[String]) {
    let seconds: u64 = args[0].parse().expect("seconds");
    let address: SocketAddr = args[1].parse().expect("IP:PORT");
    let mut stream = TcpStream::connect(address).expect("connecting");
    let mut greeting = [0u8; 3];
    stream.read_exact(&mut greeting).expect("the server's greeting");
    let buffer = vec![0x5au8; 128 * 1024];
    let (started, mut sent) = (Instant::now(), 0u64);
    while started.elapsed() < Duration::from_secs(seconds) {
        stream.write_all(&buffer).expect("sending");
        sent += buffer.len() as u64;
    }
    println!("bytes={sent} seconds={:.3}", started.elapsed().as_secs_f64());
}

fn rtt(args: &[String]) {
    let count: usize = args[0].parse().expect("a count");
    let address: SocketAddr = args[1].parse().expect("IP:PORT");
    let socket = UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    socket.connect(address).expect("connecting");
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("a timeout");
    let mut answer = [0u8; 16];
    let mut times = Vec::with_capacity(count);
    while times.len() < count {
        let sent = Instant::now();
        socket.send(b"hi").expect("sending");
        if socket.recv(&mut answer).is_ok() {
            times.push(sent.elapsed().as_micros());
        }
    }
    times.sort_unstable();
    let at = |p: f64| times[((times.len() - 1) as f64 * p) as usize];
    println!("p50_us={} p99_us={}", at(0.5), at(0.99));
}
