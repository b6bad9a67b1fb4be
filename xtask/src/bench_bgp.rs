//! `cargo xtask bench bgp`: route reflection throughput and memory.
//!
//! One client sends `routes` IPv4 routes to a reflector, which reflects
//! them to `clients` BIRD clients and one BIRD upstream non-client. The
//! source is our `bgp-speaker` (the same for every reflector): BIRD as the
//! source held back its last UPDATE for ~3 s towards fast readers (seen
//! with tcpdump), which would measure BIRD rather than the reflector. Measured: the time from the source's session
//! reaching Established to every receiver holding every route, and the
//! reflector's peak resident memory (VmHWM). Each of our speaker, GoBGP,
//! BIRD and FRR takes the reflector's seat in turn, in namespaces joined by
//! one bridge. The last line printed is one JSON object with every figure.
//!
//! Our reflector is the `bgp-speaker` example, built here in release mode.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use egress_tests::{link_veth, run, unique_name, Netns, Proc};
use serde_json::json;

const ASN: u32 = 65000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reflector {
    Ours,
    Gobgp,
    Bird,
    Frr,
}

impl Reflector {
    pub const ALL: [Reflector; 4] = [
        Reflector::Ours,
        Reflector::Gobgp,
        Reflector::Bird,
        Reflector::Frr,
    ];

    pub fn parse(s: &str) -> Option<Reflector> {
        Reflector::ALL.into_iter().find(|r| r.key() == s)
    }

    fn key(self) -> &'static str {
        match self {
            Reflector::Ours => "ours",
            Reflector::Gobgp => "gobgp",
            Reflector::Bird => "bird",
            Reflector::Frr => "frr",
        }
    }
}

pub struct BenchArgs {
    pub routes: usize,
    pub clients: usize,
    /// Which implementations take the reflector's seat (all by default).
    pub reflectors: Vec<Reflector>,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            routes: 100_000,
            clients: 10,
            reflectors: Reflector::ALL.to_vec(),
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

/// A scratch folder, world-writable for FRR's own user, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Result<Dir> {
        let p = std::env::temp_dir().join(unique_name("bgpbench"));
        std::fs::create_dir_all(&p)?;
        run(&["chmod", "0777", p.to_str().context("path")?])?;
        Ok(Dir(p))
    }

    fn file(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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

/// A receiving BIRD that peers with the reflector.
fn bird_receiver_config(me: u8) -> String {
    let mut s = format!("router id {};\nprotocol device {{ }}\n", ip(me));
    let _ = write!(
        s,
        "protocol bgp refl {{\n  local {me} as {ASN};\n  neighbor {rr} as {ASN};\n  direct;\n  connect retry time 1;\n  \
         ipv4 {{ import all; export none; }};\n}}\n",
        me = ip(me),
        rr = ip(REFLECTOR)
    );
    s
}

/// (neighbour, is a client) pairs of the reflector.
fn reflector_neighbors(clients: usize) -> Vec<(String, bool)> {
    let mut v = vec![(ip(SOURCE), true)];
    v.extend((0..clients as u8).map(|i| (ip(11 + i), true)));
    v.push((ip(UPSTREAM), false));
    v
}

fn start_reflector(
    kind: Reflector,
    ns: &Netns,
    dir: &Dir,
    clients: usize,
    speaker: &Path,
) -> Result<Proc> {
    let neighbors = reflector_neighbors(clients);
    let me = ip(REFLECTOR);
    match kind {
        Reflector::Ours => {
            let peers: Vec<_> = neighbors
                .iter()
                .map(|(a, c)| json!({"address": a, "asn": ASN, "client": c, "passive": true}))
                .collect();
            let cfg = json!({"asn": ASN, "router_id": me, "cluster_id": "1.1.1.1", "listen": format!("{me}:179"),
                "restart_time": 0, "restarting": false, "peers": peers, "print_routes": false});
            std::fs::write(dir.file("speaker.json"), cfg.to_string())?;
            let mut p = ns.spawn(&[
                speaker.to_str().context("speaker path")?,
                &dir.file("speaker.json"),
            ])?;
            p.wait_for_line("ready", Duration::from_secs(10))?;
            Ok(p)
        }
        Reflector::Bird => {
            let mut s = format!("router id {me};\nprotocol device {{ }}\n");
            for (i, (a, client)) in neighbors.iter().enumerate() {
                let rr = if *client {
                    "  rr client;\n  rr cluster id 1.1.1.1;\n"
                } else {
                    ""
                };
                let _ = write!(
                    s,
                    "protocol bgp n{i} {{\n  local {me} as {ASN};\n  neighbor {a} as {ASN};\n  direct;\n{rr}  \
                     ipv4 {{ import all; export all; }};\n}}\n"
                );
            }
            std::fs::write(dir.file("rr-bird.conf"), s)?;
            ns.spawn(&[
                "bird",
                "-f",
                "-c",
                &dir.file("rr-bird.conf"),
                "-s",
                &dir.file("rr-bird.ctl"),
            ])
        }
        Reflector::Frr => {
            let mut s = format!(
                "frr defaults datacenter\nhostname rr\nrouter bgp {ASN}\n bgp router-id {me}\n bgp cluster-id 1.1.1.1\n \
                 no bgp ebgp-requires-policy\n"
            );
            for (a, _) in &neighbors {
                let _ = writeln!(s, " neighbor {a} remote-as {ASN}\n neighbor {a} passive");
            }
            s += " address-family ipv4 unicast\n";
            for (a, client) in &neighbors {
                if *client {
                    let _ = writeln!(s, "  neighbor {a} route-reflector-client");
                }
            }
            s += " exit-address-family\n";
            std::fs::write(dir.file("bgpd.conf"), s)?;
            ns.spawn(&[
                "/usr/lib/frr/bgpd",
                "-f",
                &dir.file("bgpd.conf"),
                "-Z",
                "-i",
                &dir.file("bgpd.pid"),
                "--vty_socket",
                &dir.0.to_string_lossy(),
                "-u",
                "frr",
                "-g",
                "frr",
                "-P",
                "0",
            ])
        }
        Reflector::Gobgp => {
            let mut s = format!(
                "[global.config]\n  as = {ASN}\n  router-id = \"{me}\"\n  local-address-list = [\"{me}\"]\n"
            );
            for (a, client) in &neighbors {
                let _ = write!(
                    s,
                    "[[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{a}\"\n    peer-as = {ASN}\n  \
                     [neighbors.transport.config]\n    passive-mode = true\n"
                );
                if *client {
                    s += "  [neighbors.route-reflector.config]\n    route-reflector-client = true\n    \
                          route-reflector-cluster-id = \"1.1.1.1\"\n";
                }
                s += "  [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"ipv4-unicast\"\n";
            }
            std::fs::write(dir.file("gobgp.toml"), s)?;
            ns.spawn(&[
                "gobgpd",
                "-f",
                &dir.file("gobgp.toml"),
                "--api-hosts",
                "127.0.0.1:50051",
                "-l",
                "warn",
            ])
        }
    }
}

fn birdc(ns: &Netns, sock: &str, args: &[&str]) -> Result<String> {
    let mut argv = vec!["birdc", "-s", sock];
    argv.extend_from_slice(args);
    ns.exec(&argv)
}

fn bird_established(ns: &Netns, sock: &str) -> bool {
    birdc(ns, sock, &["show", "protocols", "refl"]).is_ok_and(|o| o.contains("Established"))
}

/// Routes in a receiving BIRD's table ("N of N routes for N networks").
fn bird_route_count(ns: &Netns, sock: &str) -> usize {
    birdc(ns, sock, &["show", "route", "count"])
        .ok()
        .and_then(|o| {
            o.lines()
                .find(|l| l.contains("routes for"))
                .and_then(|l| l.split_whitespace().next().and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

fn peak_rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|k| k.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// CPU seconds (user + system) the process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name, which is in parentheses.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(f64::NAN)
}

fn wait(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// One run with `kind` as the reflector: (seconds to converge, peak MB).
fn measure(kind: Reflector, args: &BenchArgs, speaker: &Path) -> Result<(f64, f64)> {
    let dir = Dir::new()?;
    let lan_ns = Netns::new("blan")?;
    lan_ns.bridge("br0")?;
    let mut lan = Lan {
        ns: lan_ns,
        ports: 0,
    };
    let rr_ns = lan.node("brr", REFLECTOR)?;
    let reflector = start_reflector(kind, &rr_ns, &dir, args.clients, speaker)?;

    let mut receivers = Vec::new();
    for n in receiver_ips(args.clients) {
        let ns = lan.node("brx", n)?;
        let conf = dir.file(&format!("rx{n}.conf"));
        let sock = dir.file(&format!("rx{n}.ctl"));
        std::fs::write(&conf, bird_receiver_config(n))?;
        let p = ns.spawn(&["bird", "-f", "-c", &conf, "-s", &sock])?;
        receivers.push((ns, sock, p));
    }
    for (ns, sock, _) in &receivers {
        wait("receiver sessions", Duration::from_secs(60), || {
            bird_established(ns, sock)
        })?;
    }

    let cpu_before = cpu_seconds(reflector.pid());
    let src_ns = lan.node("bsrc", SOURCE)?;
    let status = dir.file("source-status.json");
    let routes: Vec<_> = (0..args.routes)
        .map(|i| {
            json!([
                format!("{}.{}.{}.0/24", 16 + (i >> 16), (i >> 8) & 255, i & 255),
                ip(SOURCE)
            ])
        })
        .collect();
    let src_cfg = json!({"asn": ASN, "router_id": ip(SOURCE), "listen": format!("{}:179", ip(SOURCE)),
        "restart_time": 0, "connect_retry_ms": 200, "print_routes": false, "status_file": status, "status_routes": false,
        "peers": [{"address": ip(REFLECTOR), "asn": ASN}], "announce": routes});
    std::fs::write(dir.file("source.json"), src_cfg.to_string())?;
    let mut source = src_ns.spawn(&[
        speaker.to_str().context("speaker path")?,
        &dir.file("source.json"),
    ])?;
    source.wait_for_line("ready", Duration::from_secs(30))?;
    wait("source session", Duration::from_secs(60), || {
        std::fs::read_to_string(&status).is_ok_and(|s| s.contains("\"Established\""))
    })?;
    let t0 = Instant::now();
    let mut done: Vec<Option<f64>> = vec![None; receivers.len()];
    let mut first_seen: Vec<Option<f64>> = vec![None; receivers.len()];
    wait(
        "every receiver to hold every route",
        Duration::from_secs(300),
        || {
            for (i, (ns, sock, _)) in receivers.iter().enumerate() {
                if done[i].is_none() {
                    let n = bird_route_count(ns, sock);
                    if n > 0 && first_seen[i].is_none() {
                        first_seen[i] = Some(t0.elapsed().as_secs_f64());
                    }
                    if n >= args.routes {
                        done[i] = Some(t0.elapsed().as_secs_f64());
                    }
                }
            }
            done.iter().all(|d| d.is_some())
        },
    )?;
    let secs = t0.elapsed().as_secs_f64();
    let show = |v: &[Option<f64>]| {
        v.iter()
            .map(|t| format!("{:.2}", t.unwrap_or(f64::NAN)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    eprintln!(
        "{:>6}: first route at receivers [{}], complete [{}]",
        kind.key(),
        show(&first_seen),
        show(&done)
    );
    let mb = peak_rss_mb(reflector.pid());
    let cpu = cpu_seconds(reflector.pid()) - cpu_before;
    eprintln!(
        "{:>6}: {secs:.2} s, {mb:.0} MB, reflector CPU {cpu:.2} s",
        kind.key()
    );
    Ok((secs, mb))
}

/// Builds our speaker in release mode and returns its path.
fn build_speaker(root: &Path) -> Result<PathBuf> {
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
    for &kind in &args.reflectors {
        let (secs, mb) = measure(kind, &args, &speaker)
            .with_context(|| format!("{} as reflector", kind.key()))?;
        out.insert(
            format!("{}_s", kind.key()),
            json!((secs * 1000.0).round() / 1000.0),
        );
        out.insert(format!("{}_mb", kind.key()), json!(mb.round()));
    }
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}

/// Entry point for `cargo xtask bench bgp [--routes N] [--only ours,frr]`.
pub fn run_cli(root: &Path, routes: Option<usize>, only: Option<&str>) -> Result<()> {
    let mut args = BenchArgs::default();
    if let Some(n) = routes {
        args.routes = n;
    }
    if let Some(list) = only {
        args.reflectors = list
            .split(',')
            .map(|k| Reflector::parse(k.trim()).with_context(|| format!("unknown reflector {k:?}")))
            .collect::<Result<_>>()?;
    }
    run_bench(root, args)
}
