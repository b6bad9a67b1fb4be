//! `cargo xtask bench bgp`: route reflection throughput and memory.
//!
//! One client sends `routes` IPv4 routes to a reflector, which reflects
//! them to `clients` clients and one upstream non-client. Each of our
//! speaker, GoBGP, BIRD and FRR takes the reflector's seat in turn, in
//! namespaces joined by one bridge. Measured: the time from the source's
//! session reaching Established to every receiver holding every route, and
//! the reflector's peak resident memory (VmHWM). The last line printed is
//! one JSON object with every figure (`<kind>_first_s`: when the last
//! receiver got its first route).
//!
//! The source and the receivers are the harness's own minimal BGP peers
//! ([`wire`]): one thread each, the table pre-encoded in full UPDATEs, and
//! each receiver timestamps the read that completed its table. An earlier
//! version used 11 BIRD receivers polled with `birdc` every 50 ms: a poll
//! round over 11 receivers took ~0.3 s, the receivers competed with the
//! reflector for the two cores, and the figures measured the harness
//! (BIRD 0.9-1.2 s there, 0.36 s here). The source was our own speaker
//! before that, because BIRD as the source held back its last UPDATE.
//!
//! Our reflector is the `bgp-speaker` example, built here in release mode.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use egress_tests::{link_veth, Netns};
use serde_json::json;

pub use crate::bgp_seat::Reflector;
use crate::bgp_seat::{cpu_seconds, peak_rss_mb, start_reflector, Dir, Seat, ASN};

pub struct BenchArgs {
    pub routes: usize,
    pub clients: usize,
    /// Which implementations take the reflector's seat (all by default).
    pub reflectors: Vec<Reflector>,
    /// Run the 100,000-route feed.
    pub feed: bool,
    /// The cluster shape's sizes (none: skipped) and per-phase timeout.
    pub cluster_sizes: Vec<usize>,
    pub cluster_timeout: Duration,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            routes: 100_000,
            clients: 10,
            reflectors: Reflector::ALL.to_vec(),
            feed: true,
            cluster_sizes: vec![250, 500, 1000],
            cluster_timeout: Duration::from_secs(180),
        }
    }
}

fn ip(n: u8) -> String {
    format!("10.98.0.{n}")
}

const REFLECTOR: u8 = 1;
const SOURCE: u8 = 2;
const UPSTREAM: u8 = 254;

fn receiver_ips(clients: usize) -> Vec<u8> {
    (0..clients as u8)
        .map(|i| 11 + i)
        .chain([UPSTREAM])
        .collect()
}

struct Lan {
    ns: Netns,
    ports: usize,
}

impl Lan {
    fn node(&mut self, label: &str, n: u8) -> Result<Netns> {
        let ns = Netns::new(label)?;
        self.ports += 1;
        let port = format!("p{}", self.ports);
        link_veth(&ns, "eth0", &self.ns, &port)?;
        self.ns.ip(&["link", "set", &port, "master", "br0"])?;
        ns.addr("eth0", &format!("{}/24", ip(n)))?;
        Ok(ns)
    }
}

/// (neighbour, is a client) pairs of the reflector.
fn reflector_neighbors(clients: usize) -> Vec<(String, bool)> {
    let mut v = vec![(ip(SOURCE), true)];
    v.extend((0..clients as u8).map(|i| (ip(11 + i), true)));
    v.push((ip(UPSTREAM), false));
    v
}

/// The benchmark's own BGP peers (the source and the receivers): a few
/// hand-made messages on blocking sockets, one thread each, so the harness
/// costs next to nothing beside the reflector it measures, and each
/// receiver notes the instant its table became complete itself (no
/// polling of another daemon's CLI).
mod wire {
    use std::io::{self, Read, Write};
    use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
    use std::sync::mpsc::Sender;
    use std::time::{Duration, Instant};

    const OPEN: u8 = 1;
    const UPDATE: u8 = 2;
    const NOTIFICATION: u8 = 3;
    const KEEPALIVE: u8 = 4;

    fn header(out: &mut Vec<u8>, kind: u8, body_len: usize) {
        out.extend_from_slice(&[0xff; 16]);
        out.extend_from_slice(&(19 + body_len as u16).to_be_bytes());
        out.push(kind);
    }

    /// OPEN with IPv4 unicast and 4-octet AS (the light clients' own).
    pub fn open(asn: u32, id: Ipv4Addr) -> Vec<u8> {
        egress_tests::bgp_fleet::wire::open(asn, id, None)
    }

    fn keepalive() -> Vec<u8> {
        egress_tests::bgp_fleet::wire::keepalive()
    }

    /// The `i`th benchmark prefix: 16.0.0.0/24, 16.0.1.0/24, ...
    pub fn prefix(i: usize) -> [u8; 3] {
        [16 + (i >> 16) as u8, (i >> 8) as u8, i as u8]
    }

    fn index(p: &[u8]) -> Option<usize> {
        let a = p.first()?.checked_sub(16)?;
        Some((a as usize) << 16 | (*p.get(1)? as usize) << 8 | *p.get(2)? as usize)
    }

    /// The whole table in full 4096-octet UPDATEs (1013 prefixes each, one
    /// attribute set, as a node's routes would arrive), then End-of-RIB.
    pub fn table(routes: usize, next_hop: Ipv4Addr) -> Vec<u8> {
        let mut attrs = vec![0x40, 1, 1, 0, 0x40, 2, 0, 0x40, 3, 4];
        attrs.extend_from_slice(&next_hop.octets());
        attrs.extend_from_slice(&[0x40, 5, 4, 0, 0, 0, 100]);
        let per = (4096 - 19 - 4 - attrs.len()) / 4;
        let mut out = Vec::new();
        let mut i = 0;
        while i < routes {
            let n = per.min(routes - i);
            header(&mut out, UPDATE, 4 + attrs.len() + 4 * n);
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
            out.extend_from_slice(&attrs);
            for j in i..i + n {
                out.push(24);
                out.extend_from_slice(&prefix(j));
            }
            i += n;
        }
        header(&mut out, UPDATE, 4);
        out.extend_from_slice(&[0, 0, 0, 0]);
        out
    }

    /// Which benchmark prefixes a receiver holds.
    struct Table {
        bits: Vec<u64>,
        routes: usize,
        count: usize,
    }

    impl Table {
        fn set(&mut self, i: usize, on: bool) {
            if i >= self.routes {
                return;
            }
            let (w, b) = (i / 64, 1u64 << (i % 64));
            if (self.bits[w] & b != 0) != on {
                self.bits[w] ^= b;
                if on {
                    self.count += 1;
                } else {
                    self.count -= 1;
                }
            }
        }

        fn prefixes(&mut self, mut b: &[u8], on: bool) -> Option<()> {
            while let Some((&len, rest)) = b.split_first() {
                let n = (len as usize).div_ceil(8);
                let p = rest.get(..n)?;
                if len == 24 {
                    if let Some(i) = index(p) {
                        self.set(i, on);
                    }
                }
                b = &rest[n..];
            }
            Some(())
        }

        /// Applies an UPDATE body: withdrawn routes, MP_(UN)REACH for IPv4
        /// unicast, NLRI.
        fn update(&mut self, body: &[u8]) -> Option<()> {
            let wlen = u16::from_be_bytes([*body.first()?, *body.get(1)?]) as usize;
            self.prefixes(body.get(2..2 + wlen)?, false)?;
            let rest = body.get(2 + wlen..)?;
            let alen = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]) as usize;
            let a = rest.get(2..2 + alen)?;
            let nlri = rest.get(2 + alen..)?;
            egress_tests::bgp_fleet::wire::for_each_attribute(a, |kind, v, _| {
                match kind {
                    14 if v.get(..3)? == [0, 1, 1] => {
                        let nh = *v.get(3)? as usize;
                        self.prefixes(v.get(5 + nh..)?, true)?;
                    }
                    15 if v.get(..3)? == [0, 1, 1] => self.prefixes(&v[3..], false)?,
                    _ => {}
                }
                Some(())
            })?;
            self.prefixes(nlri, true)
        }
    }

    pub enum Event {
        Established(usize, Instant),
        FirstRoute(usize, Instant),
        Complete(usize, Instant),
        Down(usize, String),
    }

    /// Connects from the calling thread's namespace, retrying while the
    /// reflector starts.
    pub fn connect(to: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let deadline = Instant::now() + timeout;
        loop {
            match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                Ok(s) => return Ok(s),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// One session: OPEN, KEEPALIVEs, `send` (the source's table) once
    /// Established, then counting the benchmark prefixes that arrive.
    pub fn session(
        idx: usize,
        mut s: TcpStream,
        asn: u32,
        id: Ipv4Addr,
        send: Option<Vec<u8>>,
        routes: usize,
        events: Sender<Event>,
    ) {
        let report = |e: Event| {
            let _ = events.send(e);
        };
        let down = |why: String| {
            let _ = events.send(Event::Down(idx, why));
        };
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        if let Err(e) = s.write_all(&open(asn, id)) {
            return down(format!("sending OPEN: {e}"));
        }
        let mut send = send;
        let mut table = Table {
            bits: vec![0; routes.div_ceil(64)],
            routes,
            count: 0,
        };
        let mut established = false;
        let mut complete = false;
        let mut last_keepalive = Instant::now();
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
        let mut chunk = vec![0u8; 1 << 18];
        loop {
            match s.read(&mut chunk) {
                Ok(0) => return down("connection closed".into()),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return down(format!("read: {e}")),
            }
            let now = Instant::now();
            let mut at = 0;
            loop {
                let (kind, body, len) =
                    match egress_tests::bgp_fleet::wire::next_message(&buf[at..]) {
                        Ok(Some(m)) => m,
                        Ok(None) => break,
                        Err(e) => return down(e),
                    };
                match kind {
                    OPEN => {
                        if let Err(e) = s.write_all(&keepalive()) {
                            return down(format!("sending KEEPALIVE: {e}"));
                        }
                    }
                    KEEPALIVE if !established => {
                        established = true;
                        report(Event::Established(idx, now));
                        if let Some(t) = send.take() {
                            if let Err(e) = s.write_all(&t) {
                                return down(format!("sending the table: {e}"));
                            }
                        }
                    }
                    UPDATE => {
                        let before = table.count;
                        if table.update(body).is_none() {
                            return down("malformed UPDATE".into());
                        }
                        if before == 0 && table.count > 0 {
                            report(Event::FirstRoute(idx, now));
                        }
                        if !complete && table.count == routes && routes > 0 {
                            complete = true;
                            report(Event::Complete(idx, now));
                        }
                    }
                    NOTIFICATION => {
                        return down(format!(
                            "NOTIFICATION {}/{}",
                            body.first().unwrap_or(&0),
                            body.get(1).unwrap_or(&0)
                        ))
                    }
                    _ => {}
                }
                at += len;
            }
            buf.drain(..at);
            if last_keepalive.elapsed() > Duration::from_secs(30) {
                last_keepalive = Instant::now();
                if let Err(e) = s.write_all(&keepalive()) {
                    return down(format!("sending KEEPALIVE: {e}"));
                }
            }
        }
    }

    /// Ends a session thread (its read fails).
    pub fn close(s: &TcpStream) {
        let _ = s.shutdown(Shutdown::Both);
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn table_round_trips() {
            let t = table(2500, Ipv4Addr::new(10, 98, 0, 2));
            let mut rx = Table {
                bits: vec![0; 2500usize.div_ceil(64)],
                routes: 2500,
                count: 0,
            };
            let mut at = 0;
            let mut messages = 0;
            while at < t.len() {
                let len = u16::from_be_bytes([t[at + 16], t[at + 17]]) as usize;
                assert!(len <= 4096);
                assert_eq!(t[at + 18], UPDATE);
                rx.update(&t[at + 19..at + len]).unwrap();
                at += len;
                messages += 1;
            }
            assert_eq!(rx.count, 2500);
            assert_eq!(messages, 3 + 1); // 1013 per UPDATE, then End-of-RIB
                                         // Withdrawing one in MP_UNREACH form.
            let mut body = vec![0, 0, 0, 10, 0x80, 15, 7, 0, 1, 1, 24];
            body.extend_from_slice(&prefix(7));
            rx.update(&body).unwrap();
            assert_eq!(rx.count, 2499);
        }
    }
}

/// Seconds of `at` after `t0`.
fn since(t0: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(t0).as_secs_f64()
}

/// One run with `kind` as the reflector.
struct Measured {
    /// Until every receiver held every route.
    secs: f64,
    /// Until the last receiver got its first route.
    first_secs: f64,
    /// The reflector's peak resident memory.
    mb: f64,
}

/// One run with `kind` as the reflector.
fn measure(kind: Reflector, args: &BenchArgs, speaker: &Path) -> Result<Measured> {
    use std::net::{Ipv4Addr, SocketAddr, TcpStream};
    use wire::Event;

    let dir = Dir::new()?;
    let lan_ns = Netns::new("blan")?;
    lan_ns.bridge("br0")?;
    let mut lan = Lan {
        ns: lan_ns,
        ports: 0,
    };
    let rr_ns = lan.node("brr", REFLECTOR)?;
    let seat = Seat {
        me: ip(REFLECTOR),
        neighbors: reflector_neighbors(args.clients),
        graceful_restart: None,
        routed: None,
    };
    let reflector = start_reflector(kind, &rr_ns, &dir, &seat, speaker)?;
    let rr_addr: SocketAddr = format!("{}:179", ip(REFLECTOR)).parse()?;

    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    // Sockets kept to end the session threads; namespaces kept alive.
    let mut sockets: Vec<TcpStream> = Vec::new();
    let mut namespaces = Vec::new();
    let mut start_peer = |idx: usize, n: u8, send: Option<Vec<u8>>| -> Result<()> {
        let ns = lan.node(if send.is_some() { "bsrc" } else { "brx" }, n)?;
        let s = ns
            .enter(move || Ok(wire::connect(rr_addr, Duration::from_secs(60))?))
            .with_context(|| format!("connecting from {}", ip(n)))?;
        sockets.push(s.try_clone()?);
        let id: Ipv4Addr = ip(n).parse()?;
        let (tx, routes) = (tx.clone(), args.routes);
        std::thread::spawn(move || wire::session(idx, s, ASN, id, send, routes, tx));
        namespaces.push(ns);
        Ok(())
    };
    let receivers = receiver_ips(args.clients);
    for (i, n) in receivers.iter().enumerate() {
        start_peer(i, *n, None)?;
    }
    let deadline = |s| Instant::now() + Duration::from_secs(s);
    let next = |until: Instant, what: &str| -> Result<Event> {
        rx.recv_timeout(until.saturating_duration_since(Instant::now()))
            .map_err(|_| anyhow::anyhow!("timed out waiting for {what}"))
    };
    let until = deadline(60);
    let mut up = 0;
    while up < receivers.len() {
        match next(until, "the receivers' sessions")? {
            Event::Established(..) => up += 1,
            Event::Down(i, why) => bail!("receiver {} down: {why}", ip(receivers[i])),
            _ => {}
        }
    }

    let cpu_before = cpu_seconds(reflector.pid());
    let source = receivers.len();
    start_peer(
        source,
        SOURCE,
        Some(wire::table(args.routes, ip(SOURCE).parse()?)),
    )?;
    let until = deadline(60);
    let t0 = loop {
        match next(until, "the source's session")? {
            Event::Established(i, at) if i == source => break at,
            Event::Down(i, why) => bail!("peer {i} down: {why}"),
            _ => {}
        }
    };
    let mut first: Vec<Option<f64>> = vec![None; receivers.len()];
    let mut done: Vec<Option<f64>> = vec![None; receivers.len()];
    let until = deadline(300);
    while done.iter().any(Option::is_none) {
        match next(until, "every receiver to hold every route")? {
            Event::FirstRoute(i, at) if i < receivers.len() => first[i] = Some(since(t0, at)),
            Event::Complete(i, at) if i < receivers.len() => done[i] = Some(since(t0, at)),
            Event::Down(i, why) => bail!("peer {i} down: {why}"),
            _ => {}
        }
    }
    let secs = done.iter().flatten().fold(0.0f64, |a, b| a.max(*b));
    let first_secs = first.iter().flatten().fold(0.0f64, |a, b| a.max(*b));
    let mb = peak_rss_mb(reflector.pid());
    let cpu = cpu_seconds(reflector.pid()) - cpu_before;
    for s in &sockets {
        wire::close(s);
    }
    let show = |v: &[Option<f64>]| {
        v.iter()
            .map(|t| format!("{:.3}", t.unwrap_or(f64::NAN)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    eprintln!(
        "{:>6}: first route at receivers [{}], complete [{}]",
        kind.key(),
        show(&first),
        show(&done)
    );
    eprintln!(
        "{:>6}: {secs:.3} s, {mb:.0} MB, reflector CPU {cpu:.2} s",
        kind.key()
    );
    drop(reflector);
    Ok(Measured {
        secs,
        first_secs,
        mb,
    })
}

/// Builds our speaker in release mode and returns its path.
pub(crate) fn build_speaker(root: &Path) -> Result<PathBuf> {
    crate::shell::exec(std::process::Command::new("cargo").current_dir(root).args([
        "build",
        "--release",
        "-p",
        "egress-bgp",
        "--examples",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("release/examples/bgp-speaker"))
}

pub fn run_bench(root: &Path, args: BenchArgs) -> Result<()> {
    anyhow::ensure!(
        egress_tests::is_root(),
        "the BGP benchmark needs root (network namespaces)"
    );
    let speaker = build_speaker(root)?;
    let mut out = serde_json::Map::new();
    out.insert("routes".into(), json!(args.routes));
    out.insert("receivers".into(), json!(args.clients + 1));
    let feed = if args.feed { &args.reflectors[..] } else { &[] };
    for &kind in feed {
        let m = measure(kind, &args, &speaker)
            .with_context(|| format!("{} as reflector", kind.key()))?;
        let ms = |s: f64| json!((s * 1000.0).round() / 1000.0);
        out.insert(format!("{}_s", kind.key()), ms(m.secs));
        out.insert(format!("{}_first_s", kind.key()), ms(m.first_secs));
        out.insert(format!("{}_mb", kind.key()), json!(m.mb.round()));
    }
    let cluster = crate::bench_bgp_cluster::ClusterArgs {
        sizes: args.cluster_sizes.clone(),
        timeout: args.cluster_timeout,
        reflectors: args.reflectors.clone(),
    };
    crate::bench_bgp_cluster::run(&cluster, &speaker, &mut out)?;
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}

/// The command line of `cargo xtask bench bgp`.
pub struct Cli<'a> {
    pub routes: Option<usize>,
    pub only: Option<&'a str>,
    pub no_feed: bool,
    /// e.g. "250,500,1000"; "none" skips the cluster shape.
    pub cluster_sizes: Option<&'a str>,
    pub cluster_timeout: Option<u64>,
}

/// Entry point for `cargo xtask bench bgp [--routes N] [--only ours,frr]
/// [--no-feed] [--cluster-sizes 250,500] [--cluster-timeout SECS]`.
pub fn run_cli(root: &Path, cli: Cli) -> Result<()> {
    let Cli { routes, only, .. } = cli;
    let mut args = BenchArgs::default();
    if let Some(n) = routes {
        args.routes = n;
    }
    args.feed = !cli.no_feed;
    if let Some(s) = cli.cluster_sizes {
        args.cluster_sizes = match s {
            "none" => Vec::new(),
            s => s
                .split(',')
                .map(|n| {
                    n.trim()
                        .parse()
                        .with_context(|| format!("cluster size {n:?}"))
                })
                .collect::<Result<_>>()?,
        };
    }
    if let Some(t) = cli.cluster_timeout {
        args.cluster_timeout = Duration::from_secs(t);
    }
    if let Some(list) = only {
        args.reflectors = list
            .split(',')
            .map(|k| Reflector::parse(k.trim()).with_context(|| format!("unknown reflector {k:?}")))
            .collect::<Result<_>>()?;
    }
    run_bench(root, args)
}
