//! Test traffic for the end-to-end scenarios and the demo: a numbered UDP
//! stream and one long-lived TCP connection, with sinks that record when each
//! message arrived and from which address, so a scenario can read the largest
//! gap, what was lost, whether the connection survived, and which source
//! address the server saw (the EIP or not).
//!
//! Every role stops on SIGTERM (or after --duration-s) and prints one JSON
//! report line on stdout.

mod arp_watch;
mod ip_count;
mod readiness;
mod tcp_crr;
mod tcp_echo;
mod tcp_open;
mod udp_flows;

use std::{
    collections::BTreeSet,
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use readiness::{Readiness, LISTENER};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn usage() -> ! {
    eprintln!(
        "usage: egress-traffic udp-sink LISTEN | udp-source TARGET [INTERVAL_MS] | \
         tcp-sink LISTEN | tcp-source TARGET [INTERVAL_MS] | tcp-open TARGET COUNT | \
         crr-server LISTEN | crr-client TARGET SECONDS [CONCURRENCY] | \
         udp-flows TARGET FLOWS [INTERVAL_MS] | udp-flows-sink LISTEN [echo] | ip-count IFACE DST | \
         arp-watch IFACE TARGET_IP SENDER_IP [INTERVAL_MS]   (stops on SIGTERM; \
         EGRESS_TRAFFIC_DURATION_S limits the run)"
    );
    std::process::exit(2)
}

fn main() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_term as *const () as libc::sighandler_t);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let deadline = std::env::var("EGRESS_TRAFFIC_DURATION_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(|s| Instant::now() + Duration::from_secs_f64(s));
    let interval =
        |i: usize| Duration::from_millis(args.get(i).and_then(|s| s.parse().ok()).unwrap_or(10));
    let addr = |i: usize| -> SocketAddr {
        args.get(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| usage())
    };
    let report = match args.first().map(String::as_str) {
        Some("udp-sink") => udp_sink(addr(1), deadline),
        Some("udp-source") => udp_source(addr(1), interval(2), deadline),
        Some("tcp-sink") => tcp_sink(addr(1), deadline),
        Some("tcp-source") => tcp_source(addr(1), interval(2), deadline),
        Some("tcp-echo") => tcp_echo::run(addr(1), deadline),
        Some("udp-flows") => udp_flows::source(
            addr(1),
            args.get(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| usage()),
            interval(3),
            deadline,
        ),
        Some("udp-flows-sink") => {
            udp_flows::sink(addr(1), args.get(2).is_some_and(|a| a == "echo"), deadline)
        }
        Some("crr-server") => tcp_crr::server(addr(1), deadline),
        Some("crr-client") => tcp_crr::client(
            addr(1),
            args.get(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| usage()),
            args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4),
        ),
        Some("tcp-open") => Ok(tcp_open::run(
            addr(1),
            args.get(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| usage()),
            Duration::from_secs(args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0)),
            deadline,
        )),
        Some("ip-count") => {
            let iface = args.get(1).cloned().unwrap_or_else(|| usage());
            let dst = args
                .get(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| usage());
            ip_count::run(&iface, dst, || running(deadline))
        }
        Some("arp-watch") => {
            let ip = |i: usize| -> std::net::Ipv4Addr {
                args.get(i)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| usage())
            };
            let iface = args.get(1).cloned().unwrap_or_else(|| usage());
            arp_watch::run(&iface, ip(2), ip(3), interval(4), || running(deadline))
        }
        _ => usage(),
    };
    match report {
        Ok(json) => println!("{json}"),
        Err(e) => {
            println!("{}", serde_json::json!({ "error": e.to_string() }));
            std::process::exit(1);
        }
    }
}

fn running(deadline: Option<Instant>) -> bool {
    !STOP.load(Ordering::SeqCst) && deadline.is_none_or(|d| Instant::now() < d)
}

/// A read that found nothing within its timeout (or was interrupted):
/// the loop goes on.
fn nothing_yet(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// Largest time between two consecutive arrivals, in milliseconds.
struct GapMeter {
    last: Option<Instant>,
    max: Duration,
}

impl GapMeter {
    fn new() -> Self {
        Self {
            last: None,
            max: Duration::ZERO,
        }
    }
    fn arrived(&mut self, now: Instant) {
        if let Some(last) = self.last {
            self.max = self.max.max(now - last);
        }
        self.last = Some(now);
    }
    fn max_ms(&self) -> f64 {
        self.max.as_secs_f64() * 1000.0
    }
}

fn udp_sink(listen: SocketAddr, deadline: Option<Instant>) -> std::io::Result<serde_json::Value> {
    let sock = UdpSocket::bind(listen)?;
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    println!("ready addr={}", sock.local_addr()?);
    let mut gaps = GapMeter::new();
    let mut seqs = BTreeSet::new();
    let mut sources = BTreeSet::new();
    let mut buf = [0u8; 2048];
    while running(deadline) {
        match sock.recv_from(&mut buf) {
            Ok((n, from)) if n >= 8 => {
                gaps.arrived(Instant::now());
                seqs.insert(u64::from_be_bytes(buf[..8].try_into().unwrap()));
                sources.insert(from.ip().to_string());
            }
            Ok(_) => {}
            Err(e) if nothing_yet(&e) => {}
            Err(e) => return Err(e),
        }
    }
    let (first, last) = (
        seqs.first().copied().unwrap_or(0),
        seqs.last().copied().unwrap_or(0),
    );
    let expected = if seqs.is_empty() { 0 } else { last - first + 1 };
    Ok(serde_json::json!({
        "role": "udp-sink", "received": seqs.len(), "first_seq": first, "last_seq": last,
        "lost": expected - seqs.len() as u64, "max_gap_ms": gaps.max_ms(), "sources": sources,
    }))
}

/// The wildcard address of `target`'s family, any port: where a source binds.
fn any_port_for(target: SocketAddr) -> SocketAddr {
    if target.is_ipv6() {
        "[::]:0".parse().unwrap()
    } else {
        "0.0.0.0:0".parse().unwrap()
    }
}

fn udp_source(
    target: SocketAddr,
    interval: Duration,
    deadline: Option<Instant>,
) -> std::io::Result<serde_json::Value> {
    let sock = UdpSocket::bind(any_port_for(target))?;
    println!("ready");
    let mut seq = 0u64;
    let mut send_errors = 0u64;
    let mut next = Instant::now();
    while running(deadline) {
        let mut msg = [0u8; 64];
        msg[..8].copy_from_slice(&seq.to_be_bytes());
        // Errors (no route while a gateway moves) are counted, not fatal: the stream goes on.
        if sock.send_to(&msg, target).is_err() {
            send_errors += 1;
        }
        seq += 1;
        next += interval;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    Ok(serde_json::json!({ "role": "udp-source", "sent": seq, "send_errors": send_errors }))
}

fn tcp_sink(listen: SocketAddr, deadline: Option<Instant>) -> std::io::Result<serde_json::Value> {
    let listener = TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let mut readiness = Readiness::new()?;
    readiness.watch(listener.as_raw_fd(), LISTENER)?;
    println!("ready addr={}", listener.local_addr()?);
    let mut conns: Vec<(TcpStream, SocketAddr, GapMeter, u64, bool)> = Vec::new();
    let (mut buf, mut ready) = ([0u8; 4096], Vec::new());
    while running(deadline) {
        readiness.wait(&mut ready, Duration::from_millis(20))?;
        for &token in &ready {
            if token == LISTENER {
                loop {
                    let (s, peer) = match listener.accept() {
                        Ok(c) => c,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    };
                    // Read only when ready; the timeout guards a spurious wake.
                    s.set_read_timeout(Some(Duration::from_millis(5)))?;
                    readiness.watch(s.as_raw_fd(), conns.len() as u64)?;
                    conns.push((s, peer, GapMeter::new(), 0, false));
                }
                continue;
            }
            let (s, _, gaps, bytes, closed) = &mut conns[token as usize];
            match s.read(&mut buf) {
                Ok(n) if n > 0 => {
                    gaps.arrived(Instant::now());
                    *bytes += n as u64;
                    // Echo, so the source sees the reply path work too.
                    *closed = s.write_all(&buf[..n]).is_err();
                }
                Err(e) if nothing_yet(&e) => {}
                _ => *closed = true,
            }
            if *closed {
                readiness.forget(s.as_raw_fd());
            }
        }
    }
    let report: Vec<_> = conns
        .iter()
        .map(|(_, peer, gaps, bytes, closed)| {
            serde_json::json!({ "peer": peer.ip().to_string(), "peer_port": peer.port(), "bytes": bytes,
                "max_gap_ms": gaps.max_ms(), "closed": closed })
        })
        .collect();
    Ok(serde_json::json!({ "role": "tcp-sink", "connections": report }))
}

fn tcp_source(
    target: SocketAddr,
    interval: Duration,
    deadline: Option<Instant>,
) -> std::io::Result<serde_json::Value> {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
    let connect = started.elapsed();
    // The run's duration counts from the established connection.
    let deadline = deadline.map(|d| d + connect);
    s.set_nodelay(true)?;
    // Long enough to ride out a gateway failover: TCP retransmits meanwhile.
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let local = s.local_addr()?;
    println!("ready local={local}");
    let (mut sent, mut echoed) = (0u64, 0u64);
    let mut gaps = GapMeter::new();
    let mut next = Instant::now();
    let mut failure = None;
    while running(deadline) {
        let msg = sent.to_be_bytes();
        if let Err(e) = s.write_all(&msg) {
            failure = Some(format!("write: {e}"));
            break;
        }
        sent += 1;
        let mut back = [0u8; 8];
        match s.read_exact(&mut back) {
            Ok(()) if back == msg => {
                echoed += 1;
                gaps.arrived(Instant::now());
            }
            Ok(()) => {
                failure = Some("echo out of order".into());
                break;
            }
            Err(e) if STOP.load(Ordering::SeqCst) && e.kind() == ErrorKind::Interrupted => break,
            Err(e) => {
                failure = Some(format!("read: {e}"));
                break;
            }
        }
        next += interval;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    Ok(serde_json::json!({
        "role": "tcp-source", "sent": sent, "echoed": echoed, "survived": failure.is_none(),
        "failure": failure, "max_gap_ms": gaps.max_ms(), "local": local.to_string(),
        "connect_ms": connect.as_secs_f64() * 1000.0,
    }))
}
