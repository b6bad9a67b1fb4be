//! The datapath benchmark (`cargo xtask bench datapath` runs this and
//! forwards its last line). Not a test: it asserts nothing about speed, it
//! measures and prints one JSON object as its last line.
//!
//! 1. Per-packet cost of each program path with BPF_PROG_TEST_RUN,
//!    `repeat` one million (100 calls of 10,000, the median call). Every
//!    path rewrites the buffer the kernel runs it on again and again, so
//!    the paths run as the `bench_*` programs of
//!    target/ebpf/egress-bench.bpf.o (egress-ebpf/src/bench.rs): each run
//!    writes the template packet back (taking the last run's 50 bytes of
//!    outer headers off first) and then runs the real program's code. The
//!    restore's own cost (measured alone) is taken off. The kernel refuses
//!    to encapsulate an skb twice, so on these runs the room for the VXLAN
//!    headers grows without the encapsulation flags (they only record the
//!    inner headers' offsets for segmentation). "First packet" is a new
//!    flow in every run (destination and source port from the run's
//!    number), so every run allocates a port and inserts both NAT entries;
//!    once the LRU tables are full every insert also evicts. The same
//!    paths also run as the agent's own programs, one million single runs
//!    each (a fresh skb each, the real flags), reported under
//!    `single_run_ns`. Every call must return the path's verdict, the
//!    worker paths must count every run in the policy's counter, the
//!    outputs must carry our VXLAN headers (the forward's must be the
//!    forwarded packet). Also measured: the empty program (the floor every
//!    figure includes, for both methods) and the helper calls the paths
//!    are built from, which with the writable-skb prologue (one byte
//!    written) give the least each path can cost above the floor. The
//!    encapsulating paths (worker first packet and established, gateway
//!    reply) then run again on a node whose underlay is IPv6 (`v6u_` keys):
//!    70 bytes of outer headers, each output checked for EtherType 0x86dd,
//!    next header UDP and the VXLAN port; the restore takes the 70 bytes
//!    off as it does 50.
//! 2. Throughput from a pod to an external server through (a) this
//!    datapath, (b) the same topology built the way spidernet egressgateway
//!    does it (mangle MARK from an ipset, `ip rule fwmark` into a kernel
//!    VXLAN device, iptables SNAT on the gateway), (c) plain routing through
//!    the gateway with SNAT: iperf3 TCP, 64-byte UDP packets that
//!    arrive, and short TCP connections per second (`egress-traffic
//!    crr-client`: connect, 64-byte request and reply, close, four at a
//!    time); each mode on an IPv4 underlay and on an IPv6 one (`v6u_`
//!    keys: the worker and the gateway share only IPv6 addresses, the
//!    direct path routes IPv4 by IPv6 next hops); five rounds in which the
//!    six beds take turns, medians.
//! 3. The gateway's reply and forward paths on one CPU, native XDP against
//!    TC: packets per second through a veth whose far end sends and sinks
//!    by XDP (`reply_rate`); five rounds taking turns, medians.

#![recursion_limit = "256"]

mod cpu;
mod gateway_profile;
mod reply_rate;
mod throughput;

use std::{
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result};
use aya::{
    maps::{Array, HashMap},
    programs::{Program, SchedClassifier, TestRun, TestRunOptions},
};
use egress_common::nat::{NatEntry, NatKey};
use egress_tests::{link_veth, Netns, PinDir};
use egress_user::{
    datapath::{
        apply, Cidr, Datapath, DesiredMaps, NodeConfig, OwnedEip, PolicyRule, PortBlockGrant,
        ReplySteering,
    },
    EBPF_OBJECT,
};
use etherparse::PacketBuilder;
use throughput::{crr_per_s, crr_server, testbed, throughputs, Mode, CRR_CLIENTS};

const RUNS: u32 = 1_000_000;
/// TC_ACT_REDIRECT: the verdict of every measured path.
const REDIRECT: u32 = 7;
const BLOCK_SIZE: u16 = 1024;
/// The worker's blocks: ports 1024-62463, about what the iptables path's
/// SNAT draws from (1024-65535), so short connections find as many ports
/// on both (a closed TCP flow keeps its port for the transitory timeout).
const BLOCKS: std::ops::Range<u16> = 1..61;
const EIP: &str = "203.0.113.100";
const SRV: &str = "203.0.113.10";
const POD: &str = "10.244.1.11";
const VXLAN: &str = "egress.vx";
/// The benchmark's VXLAN network identifier.
const VNI: u32 = 7;

fn ip4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// The family of the nodes' addresses, which the tunnel's outer headers
/// carry. On the IPv6 one (`v6u_` keys) the nodes have no IPv4 address
/// on it; the pods' IPv4 traffic crosses it in IPv6 outer headers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Underlay {
    V4,
    V6,
}

/// The gateway's and the worker's numbers on the underlay (10.100.0.11,
/// fd00:100::11 ...).
const GATEWAY_NODE: u8 = 11;
const WORKER_NODE: u8 = 21;

impl Underlay {
    /// The prefix of this underlay's keys in the JSON line.
    pub fn key_prefix(self) -> &'static str {
        match self {
            Underlay::V4 => "",
            Underlay::V6 => "v6u_",
        }
    }

    /// Node `n`'s address on the underlay.
    pub fn node_addr(self, n: u8) -> String {
        match self {
            Underlay::V4 => format!("10.100.0.{n}"),
            Underlay::V6 => format!("fd00:100::{n}"),
        }
    }

    /// Node `n`'s address with the underlay's prefix length (node 0: the
    /// underlay's network).
    pub fn node_cidr(self, n: u8) -> String {
        let len = match self {
            Underlay::V4 => 24,
            Underlay::V6 => 64,
        };
        format!("{}/{len}", self.node_addr(n))
    }

    fn node_ip(self, n: u8) -> IpAddr {
        self.node_addr(n).parse().unwrap()
    }

    /// The outer IP header's length.
    fn outer_ip_len(self) -> usize {
        match self {
            Underlay::V4 => 20,
            Underlay::V6 => 40,
        }
    }

    /// 1500 less the outer Ethernet, IP, UDP and VXLAN headers (50 / 70).
    fn tunnel_mtu(self) -> u16 {
        1500 - (ETH_LEN + self.outer_ip_len() + 16) as u16
    }
}

const ETH_LEN: usize = 14;

fn desired(
    worker: bool,
    gateway: bool,
    vxlan_ifindex: u32,
    uplink: (u32, [u8; 6]),
    underlay: Underlay,
) -> DesiredMaps {
    DesiredMaps {
        config: NodeConfig {
            is_worker: worker,
            is_gateway: gateway,
            vxlan_ifindex,
            vni: VNI,
            uplink_ifindex: uplink.0,
            uplink_mac: uplink.1,
            tunnel_mtu: underlay.tunnel_mtu(),
            port_block_size: BLOCK_SIZE,
            node_tunnel_ip: underlay.node_ip(if gateway { GATEWAY_NODE } else { WORKER_NODE }),
            ..Default::default()
        },
        policies: if worker {
            vec![PolicyRule {
                id: 1,
                priority: 0,
                sources: vec![Cidr::host(ip4(POD).into())],
                destinations: vec![],
                excluded: vec![],
                eip_v4: Some(ip4(EIP)),
                eip_v6: None,
                gateway_tunnel_ip: underlay.node_ip(GATEWAY_NODE),
                spread: vec![],
                local_gateway: false,
                use_node_ip: false,
                no_gateway: false,
            }]
        } else {
            vec![]
        },
        cluster_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            underlay.node_cidr(0).parse().unwrap(),
        ],
        port_blocks: if worker {
            vec![PortBlockGrant {
                eip: EIP.parse().unwrap(),
                blocks: BLOCKS.collect(),
            }]
        } else {
            vec![]
        },
        reply_steering: BLOCKS
            .map(|b| ReplySteering {
                eip: EIP.parse().unwrap(),
                block: b,
                worker_tunnel_ip: underlay.node_ip(WORKER_NODE),
                local: false,
            })
            .collect(),
        owned_eips: if gateway {
            vec![OwnedEip {
                eip: EIP.parse().unwrap(),
                answer_neigh: true,
                node_ip: false,
                epoch: 1,
            }]
        } else {
            vec![]
        },
        routes: vec![],
    }
}

/// A 64-byte UDP frame (the length `egress-ebpf/src/bench.rs` restores).
fn udp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 1, 5], [2, 0, 0, 0, 1, 1])
        .ipv4(src.octets(), dst.octets(), 64)
        .udp(sport, dport)
        .write(&mut v, &[0u8; 22])
        .unwrap();
    assert_eq!(v.len(), 64);
    v
}

fn prog<'a>(dp: &'a mut Datapath, name: &str) -> Result<&'a mut SchedClassifier> {
    let p: &mut SchedClassifier = dp.ebpf.program_mut(name).context("program")?.try_into()?;
    if p.fd().is_err() {
        p.load().with_context(|| format!("loading {name}"))?;
    }
    Ok(p)
}

fn median(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64
}

/// Median ns per run of `name` over `calls` TestRun calls of `repeat` runs
/// each (a call that the machine preempts would dominate a mean);
/// `patch(i, buf)` makes call i's packet from `template`. Every call must
/// end with `expect`. Returns the ns and the last output packet.
fn measure(
    dp: &mut Datapath,
    name: &str,
    template: &[u8],
    expect: u32,
    (calls, repeat): (u32, u32),
    mut patch: impl FnMut(u32, &mut [u8]),
) -> Result<(f64, Vec<u8>)> {
    let p = prog(dp, name)?;
    let mut buf = template.to_vec();
    let mut out = vec![0u8; template.len() + 128];
    let mut samples = Vec::with_capacity(calls as usize);
    let mut len = 0;
    for i in 0..calls {
        buf.copy_from_slice(template);
        patch(i, &mut buf);
        let r = p.test_run(TestRunOptions {
            data_in: Some(&buf),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::new()
        })?;
        // Every call must take the path it stands for (a drop is cheaper).
        anyhow::ensure!(
            r.return_value == expect,
            "{name}, call {i}: verdict {} instead of {expect}",
            r.return_value
        );
        samples.push(r.duration.as_nanos() as u64);
        len = r.data_size_out as usize;
    }
    out.truncate(len.min(out.len()));
    Ok((median(&mut samples), out))
}

/// `runs` runs as 100 calls of `repeat = runs / 100`.
fn timed(
    dp: &mut Datapath,
    name: &str,
    pkt: &[u8],
    expect: u32,
    runs: u32,
) -> Result<(f64, Vec<u8>)> {
    measure(dp, name, pkt, expect, (100, runs / 100), |_, _| {})
}

/// `runs` single runs (`repeat = 1`, a fresh skb each).
fn single_runs(
    dp: &mut Datapath,
    name: &str,
    template: &[u8],
    expect: u32,
    runs: u32,
    patch: impl FnMut(u32, &mut [u8]),
) -> Result<(f64, Vec<u8>)> {
    measure(dp, name, template, expect, (runs, 1), patch)
}

/// Median ns per run of each path (its TestRun floor included, the bench
/// restore not), the floors, and the helper calls the paths need.
struct Costs {
    /// The encapsulating paths on the IPv4 underlay.
    v4: TunnelPaths,
    /// The same paths on the IPv6 underlay (70 bytes of outer headers).
    v6u: TunnelPaths,
    /// The gateway's forward (no tunnel: the same on both underlays),
    /// `repeat` runs less the restore, and single runs.
    fwd: f64,
    fwd_single: f64,
    /// The empty program, `repeat` runs: what TestRun itself costs per run.
    floor: f64,
    /// The empty program, single runs.
    single_floor: f64,
    /// What the `bench_*` programs add to the paths.
    overheads: Overheads,
    csum: f64,
    /// `bpf_skb_set_tunnel_key` + redirect: the hand-over to the VXLAN
    /// device (the fallback before a next hop is known).
    tunnel: f64,
    fib: f64,
    redirect: f64,
}

/// What the `bench_*` path programs do besides the path, measured alone
/// and taken off their figures.
#[derive(Clone, Copy)]
struct Overheads {
    /// One byte written (`bench_touch`) above the floor: the prologue that
    /// makes the skb writable, which every path that writes the packet pays.
    touch: f64,
    /// Writing the template back (`bench_restore`), above a program that
    /// writes one byte.
    restore: f64,
    /// A 50-byte `bpf_skb_adjust_room`: the room for our own VXLAN headers,
    /// and the next run's shrink (the same work). The 70 bytes of the IPv6
    /// underlay cost the same once the skb has the headroom, which only
    /// the first of 10,000 runs lacks: the kernel moves the 14-byte MAC
    /// header either way.
    grow: f64,
    /// The restore and the first packet's new-flow writes.
    new_flow: f64,
}

/// Median ns per run of the worker's and the gateway's encapsulating
/// paths on one underlay.
#[derive(Clone, Copy, Default)]
struct TunnelPaths {
    /// `repeat` runs of the `bench_*` programs, their overheads taken off.
    first: f64,
    est: f64,
    reply: f64,
    /// Single runs of the agent's own programs (a fresh skb each, the
    /// real encapsulation flags).
    first_single: f64,
    est_single: f64,
    reply_single: f64,
}

impl Costs {
    /// The least each path can cost above the floor, comparable with its
    /// `net_of_floor` figure: making the skb writable (every path writes
    /// the packet) and the helper calls it cannot do without (two checksum
    /// updates, address and port, then the room for the VXLAN headers and
    /// the redirect for a translated packet; the redirect for a forwarded
    /// one whose FIB result is cached, the FIB lookup too when not; room
    /// and redirect for a steered reply).
    fn least(&self) -> Least {
        let writable = self.overheads.touch;
        let tunnel = self.overheads.grow + self.redirect;
        Least {
            worker: writable + 2.0 * self.csum + tunnel,
            forward_cached: writable + self.redirect,
            forward_fib: writable + self.fib,
            reply: writable + tunnel,
        }
    }
}

struct Least {
    worker: f64,
    forward_cached: f64,
    forward_fib: f64,
    reply: f64,
}

fn bench_object() -> Result<Vec<u8>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/ebpf/egress-bench.bpf.o"
    );
    std::fs::read(path).with_context(|| {
        format!("{path}: build it with `cargo xtask bench datapath` (feature bench)")
    })
}

fn egress_packets(pins: &Path) -> Result<u64> {
    Ok(egress_user::datapath::stats::read_policy_stats(pins)?
        .get(&1)
        .map_or(0, |s| s.egress_packets))
}

/// Single runs of `worker_egress` (median ns): each run must translate
/// (policy counter) and the last must leave in our VXLAN headers.
fn translated_runs(
    dp: &mut Datapath,
    pins: &Path,
    underlay: Underlay,
    what: &str,
    template: &[u8],
    runs: u32,
    patch: impl FnMut(u32, &mut [u8]),
) -> Result<f64> {
    let before = egress_packets(pins)?;
    let (ns, out) = single_runs(dp, "worker_egress", template, REDIRECT, runs, patch)?;
    let counted = egress_packets(pins)? - before;
    anyhow::ensure!(
        counted == u64::from(runs),
        "{what}: {counted} of {runs} runs translated"
    );
    anyhow::ensure!(encapsulated(&out, underlay), "{what}: not encapsulated");
    Ok(ns)
}

/// The 64-byte frame left the program in our own VXLAN headers over
/// `underlay`: the outer EtherType, UDP, to the VXLAN port.
fn encapsulated(out: &[u8], underlay: Underlay) -> bool {
    let (ethertype, next_header_at) = match underlay {
        Underlay::V4 => (0x0800u16, ETH_LEN + 9),
        Underlay::V6 => (0x86dd, ETH_LEN + 6),
    };
    let udp = ETH_LEN + underlay.outer_ip_len();
    out.len() == 64 + udp + 16
        && out[12..14] == ethertype.to_be_bytes()
        && out[next_header_at] == 17
        && out[udp + 2..udp + 4] == 4789u16.to_be_bytes()
}

/// `runs` runs of the `bench_*` program `name` with `repeat`, on `pkt` as
/// the template it restores every run.
fn restored_runs(
    dp: &mut Datapath,
    name: &str,
    pkt: &[u8],
    expect: u32,
    runs: u32,
) -> Result<(f64, Vec<u8>)> {
    let mut tpl: Array<_, [u64; 8]> =
        Array::try_from(dp.ebpf.map_mut("BENCH_PACKET").context("BENCH_PACKET")?)?;
    let mut words = [0u64; 8];
    for (w, c) in words.iter_mut().zip(pkt.chunks(8)) {
        *w = u64::from_ne_bytes(c.try_into().unwrap());
    }
    tpl.set(0, words, 0)?;
    timed(dp, name, pkt, expect, runs)
}

fn established_pkt() -> Vec<u8> {
    udp(ip4(POD), ip4(SRV), 40000, 443)
}

/// Makes single run `i` a new flow, to its own destination (so no
/// (destination, port) pair runs out of EIP ports).
fn new_flow_of_run(i: u32, b: &mut [u8]) {
    let d = (0x6440_0000u32 + i + 1).to_be_bytes(); // 100.64.0.0/11 (the repeat runs use 100.96.0.0/11)
    b[14 + 16..14 + 20].copy_from_slice(&d);
    b[14 + 20..14 + 22].copy_from_slice(&((i % 50000) as u16 + 1024).to_be_bytes());
}

/// A node with its uplink, on `underlay`: the FIB knows the server and
/// its neighbour (the gateway's forward) and a route to both tunnel
/// endpoints (so the programs encapsulate themselves, as on a running
/// node). Runs `f` there on the bench object, loaded as worker and gateway.
fn on_bench_node<T: Send + 'static>(
    underlay: Underlay,
    f: impl FnOnce(&mut Datapath, &Path) -> Result<T> + Send + 'static,
) -> Result<T> {
    let ns = Netns::new("bfib")?;
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
    ns.ip(&["link", "set", "up1", "up"])?;
    ns.addr("up0", "203.0.113.1/24")?;
    ns.addr("up0", &underlay.node_cidr(1))?;
    ns.permanent_neighbour("up0", SRV, "02:00:00:00:0e:10")?;
    ns.enable_forwarding()?;
    let uplink = link_info(&ns, "up0")?;
    let pins = PinDir::new("bench")?;
    let pin_path: PathBuf = pins.path().to_owned();
    let object = bench_object()?;
    ns.enter(move || {
        let mut dp = Datapath::load(&object, &pin_path)?;
        apply(&mut dp, &desired(true, true, 1, uplink, underlay))?;
        f(&mut dp, &pin_path)
    })
}

/// The worker's first-packet and established paths and the gateway's
/// reply on `underlay`: single runs of the agent's programs first (the
/// first packet's fill the NAT tables), then the `bench_*` programs with
/// `repeat`, `o` taken off. Every call must return the path's verdict, the
/// worker's runs must each count in the policy's counter, the outputs must
/// carry our VXLAN headers over `underlay`.
fn tunnel_paths(
    dp: &mut Datapath,
    pins: &Path,
    underlay: Underlay,
    runs: u32,
    o: Overheads,
) -> Result<TunnelPaths> {
    let new_flow = udp(ip4(POD), ip4("100.64.0.1"), 1024, 53);
    let est_pkt = established_pkt();
    let reply_pkt = udp(ip4(SRV), ip4(EIP), 443, 40 * BLOCK_SIZE + 5);
    // Worker, first packet: every run a new flow; the flows must be in
    // the NAT table.
    let first_single = translated_runs(
        dp,
        pins,
        underlay,
        "first packet",
        &new_flow,
        runs,
        new_flow_of_run,
    )?;
    let nat: HashMap<_, NatKey, NatEntry> =
        HashMap::try_from(dp.ebpf.map("NAT_FWD").context("NAT_FWD")?)?;
    let flows = nat.keys().count() as u64;
    anyhow::ensure!(
        flows >= u64::from(runs).min(262_144) / 2,
        "first packet: only {flows} flows in NAT_FWD after {runs} new flows"
    );
    // Worker, established flow: the same packet every run.
    let est_single = translated_runs(dp, pins, underlay, "established", &est_pkt, runs, |_, _| {})?;
    // Gateway, reply: steered to the worker, in our own headers.
    let (reply_single, out) =
        single_runs(dp, "uplink_ingress", &reply_pkt, REDIRECT, runs, |_, _| {})?;
    anyhow::ensure!(encapsulated(&out, underlay), "reply: not encapsulated");

    // The same three paths with `repeat` (egress-ebpf/src/bench.rs):
    // every run first puts the template back, taking the last run's outer
    // headers off, and the first-packet runs then make it a new flow.
    let mut repeated = |name: &str, pkt: &[u8], what: &str| -> Result<f64> {
        // The verifier may refuse a `bench_*` program that the agent's own
        // passes (the restore's frame on top of the path's deepest calls can
        // pass 512 bytes of stack): then the figure is null, with the reason.
        if let Err(e) = prog(dp, name) {
            eprintln!("{underlay:?} underlay: {what} not measured with repeat: {e:#}");
            return Ok(f64::NAN);
        }
        let before = egress_packets(pins)?;
        let (ns, out) = restored_runs(dp, name, pkt, REDIRECT, runs)?;
        anyhow::ensure!(
            encapsulated(&out, underlay),
            "{what} (repeat): not encapsulated"
        );
        let counted = egress_packets(pins)? - before;
        anyhow::ensure!(
            name == "bench_gateway_reply" || counted == u64::from(runs / 100 * 100),
            "{what} (repeat): {counted} of {runs} runs translated"
        );
        Ok(ns)
    };
    Ok(TunnelPaths {
        first: repeated("bench_worker_first", &new_flow, "first packet")? - o.new_flow - o.grow,
        est: repeated("bench_worker_established", &est_pkt, "established")? - o.restore - o.grow,
        reply: repeated("bench_gateway_reply", &reply_pkt, "reply")? - o.restore - o.grow,
        first_single,
        est_single,
        reply_single,
    })
}

/// Every figure of the IPv4 underlay's node, its tunnel paths included
/// (`v6u` left for [`program_costs`]).
fn v4_node_costs(dp: &mut Datapath, pins: &Path, runs: u32) -> Result<Costs> {
    let est_pkt = established_pkt();
    let fwd_pkt = udp(ip4(EIP), ip4(SRV), 40960, 443);
    let new_flow = udp(ip4(POD), ip4("100.64.0.1"), 1024, 53);

    let floor = restored_runs(dp, "bench_empty", &est_pkt, 0, runs)?.0;
    let single_floor = single_runs(dp, "bench_empty", &est_pkt, 0, runs, |_, _| {})?.0;
    // What the restore adds to a program that writes the packet anyway
    // (the forward does, and pays the writable-skb prologue).
    let touch = restored_runs(dp, "bench_touch", &est_pkt, 0, runs)?.0;
    let restore = restored_runs(dp, "bench_restore", &est_pkt, 0, runs)?.0 - touch;
    // A growth and the next run's shrink of 50 bytes: the same work.
    let grow =
        (restored_runs(dp, "bench_grow_shrink", &est_pkt, 0, runs)?.0 - touch - restore) / 2.0;
    let new_flow_writes = restored_runs(dp, "bench_new_flow", &new_flow, 0, runs)?.0 - touch;
    let overheads = Overheads {
        touch: touch - floor,
        restore,
        grow,
        new_flow: new_flow_writes,
    };
    let v4 = tunnel_paths(dp, pins, Underlay::V4, runs, overheads)?;

    // Gateway, forward: a decapsulated packet from the EIP, out by the
    // FIB. The last output must be forwarded once (TTL 63, the
    // neighbour's MAC), which the restore makes true of every run.
    let fwd_single = single_runs(dp, "tunnel_ingress", &fwd_pkt, REDIRECT, runs, |_, _| {})?.0;
    let (fwd, out) = restored_runs(dp, "bench_gateway_forward", &fwd_pkt, REDIRECT, runs)?;
    anyhow::ensure!(
        out.get(22) == Some(&63) && out[..6] == [2, 0, 0, 0, 0x0e, 0x10],
        "forward: the output is not the forwarded packet"
    );

    let helper = |dp: &mut Datapath, name: &str, pkt: &[u8], expect: u32| -> Result<f64> {
        Ok(restored_runs(dp, name, pkt, expect, runs)?.0 - floor)
    };
    Ok(Costs {
        v4,
        v6u: TunnelPaths::default(),
        fwd: fwd - restore,
        fwd_single,
        floor,
        single_floor,
        overheads,
        csum: helper(dp, "bench_l4_csum_replace", &est_pkt, 0)?,
        tunnel: helper(dp, "bench_tunnel_redirect", &est_pkt, REDIRECT)?,
        fib: helper(dp, "bench_fib_redirect", &fwd_pkt, REDIRECT)?,
        redirect: helper(dp, "bench_redirect", &fwd_pkt, REDIRECT)?,
    })
}

/// Every per-packet figure: the IPv4 underlay's node, then the tunnel
/// paths again on an IPv6 underlay's (the overheads measured on the first).
fn program_costs(runs: u32) -> Result<Costs> {
    let mut c = on_bench_node(Underlay::V4, move |dp, pins| v4_node_costs(dp, pins, runs))?;
    let o = c.overheads;
    c.v6u = on_bench_node(Underlay::V6, move |dp, pins| {
        tunnel_paths(dp, pins, Underlay::V6, runs, o)
    })?;
    Ok(c)
}

fn link_info(ns: &Netns, dev: &str) -> Result<(u32, [u8; 6])> {
    let v: serde_json::Value = serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", dev])?)?;
    let mut mac = [0u8; 6];
    for (i, b) in v[0]["address"]
        .as_str()
        .context("mac")?
        .split(':')
        .enumerate()
    {
        mac[i] = u8::from_str_radix(b, 16)?;
    }
    Ok((v[0]["ifindex"].as_u64().context("ifindex")? as u32, mac))
}

fn r2(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `keys` with each name prefixed by `prefix`.
fn prefixed(prefix: &str, keys: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    let serde_json::Value::Object(keys) = keys else {
        unreachable!("an object")
    };
    keys.into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v))
        .collect()
}

/// The keys of one underlay's encapsulating paths (`floor`: the `repeat`
/// floor).
fn tunnel_path_keys(p: &TunnelPaths, floor: f64) -> serde_json::Value {
    serde_json::json!({
        "worker_first_packet_ns": r2(p.first),
        "worker_established_ns": r2(p.est),
        "gateway_reply_ns": r2(p.reply),
        // Each path less the floor of its method: what the program costs.
        "net_of_floor_ns": {
            "worker_first_packet": r2(p.first - floor),
            "worker_established": r2(p.est - floor),
            "gateway_reply": r2(p.reply - floor),
        },
        // The agent's own programs as single runs (a fresh skb each, the
        // real encapsulation flags); their floor is testrun_single_run_floor_ns.
        "single_run_ns": {
            "worker_first_packet": r2(p.first_single),
            "worker_established": r2(p.est_single),
            "gateway_reply": r2(p.reply_single),
        },
    })
}

/// A figure of each mode of one underlay's beds (`MODES` order).
fn per_mode(
    t: &[throughput::Throughput],
    f: impl Fn(&throughput::Throughput) -> f64,
) -> serde_json::Value {
    serde_json::json!({"ebpf": r2(f(&t[0])), "iptables": r2(f(&t[1])), "direct": r2(f(&t[2]))})
}

/// The keys of one underlay's throughput beds (`MODES` order): the rates,
/// their ratios, and the whole machine's CPU per unit moved.
fn throughput_keys(t: &[throughput::Throughput]) -> serde_json::Value {
    let [(tcp_e, udp_e), (tcp_i, udp_i), (tcp_d, udp_d)] =
        [0, 1, 2].map(|m| (t[m].tcp.rate, t[m].udp64.rate));
    let [crr_e, crr_i, crr_d] = [0, 1, 2].map(|m| t[m].crr.rate);
    serde_json::json!({
        "throughput_ebpf_gbps": r2(tcp_e),
        "throughput_iptables_gbps": r2(tcp_i),
        "throughput_direct_gbps": r2(tcp_d),
        "ratio_ebpf_vs_iptables": r2(tcp_e / tcp_i),
        "udp64_ebpf_mpps": r2(udp_e),
        "udp64_iptables_mpps": r2(udp_i),
        "udp64_direct_mpps": r2(udp_d),
        "ratio_udp64_ebpf_vs_iptables": r2(udp_e / udp_i),
        // Short TCP connections per second (connect, request, reply, close).
        "crr_ebpf_per_s": crr_e.round(),
        "crr_iptables_per_s": crr_i.round(),
        "crr_direct_per_s": crr_d.round(),
        "ratio_crr_ebpf_vs_iptables": r2(crr_e / crr_i),
        "ratio_crr_ebpf_vs_direct": r2(crr_e / crr_d),
        "crr_failed": {
            "ebpf": t[0].crr_failed,
            "iptables": t[1].crr_failed,
            "direct": t[2].crr_failed,
        },
        "ratio_tcp_vs_direct": r2(tcp_e / tcp_d),
        "ratio_udp64_vs_direct": r2(udp_e / udp_d),
        "ratio_conn_rate_vs_iptables": r2(crr_e / crr_i),
        // CPU per unit moved, of the whole machine (the five rounds:
        // sender, receiver and every hop).
        "cpu_ms_per_gbit": per_mode(t, |x| x.tcp.cpu_per_unit * 1e3),
        "cpu_ns_per_udp64_packet": per_mode(t, |x| x.udp64.cpu_per_unit * 1e9),
        "cpu_us_per_connection": per_mode(t, |x| x.crr.cpu_per_unit * 1e6),
    })
}

#[test]
#[ignore = "benchmark: needs root; run by `cargo xtask bench datapath`"]
fn bench_datapath() -> Result<()> {
    let c = program_costs(RUNS)?;
    let least = c.least();
    eprintln!(
        "ns/packet (TestRun, repeat): first {:.1}, established {:.1}, forward {:.1}, reply {:.1}; \
         on the IPv6 underlay first {:.1}, established {:.1}, reply {:.1}; \
         floor {:.1}; helpers: l4_csum_replace {:.1}, tunnel key + redirect {:.1}, \
         fib lookup + redirect {:.1}, redirect {:.1}; least possible: worker {:.1}, \
         forward {:.1} (cached) / {:.1} (FIB), reply {:.1}",
        c.v4.first,
        c.v4.est,
        c.fwd,
        c.v4.reply,
        c.v6u.first,
        c.v6u.est,
        c.v6u.reply,
        c.floor,
        c.csum,
        c.tunnel,
        c.fib,
        c.redirect,
        least.worker,
        least.forward_cached,
        least.forward_fib,
        least.reply
    );
    let beds = throughputs()?;
    let (t, t6) = beds.split_at(throughput::MODES.len());
    let rates = |underlay: Underlay| {
        reply_rate::gateway_rates(underlay).unwrap_or_else(|e| {
            eprintln!(
                "gateway packet rates (XDP against TC, {underlay:?} underlay) not measured on this machine: {e:#}"
            );
            reply_rate::GatewayRates::unmeasured()
        })
    };
    let g = rates(Underlay::V4);
    let g6 = rates(Underlay::V6);
    let rr = &g.reply;
    let fw = &g.forward;
    let mut json = serde_json::json!({
        "gateway_forward_ns": r2(c.fwd),
        // The targets' ratios, from figures of this run: a path's cost net
        // of the floor over the least its path can cost above the floor
        // (as the two keys below report them).
        "ratio_established_vs_least": r2((c.v4.est - c.floor) / least.worker),
        "ratio_first_vs_least": r2((c.v4.first - c.floor) / least.worker),
        // The gateway's reply path on one CPU (sender and sink included).
        "gateway_reply_xdp_mpps": r2(rr.xdp_mpps),
        "gateway_reply_tc_mpps": r2(rr.tc_mpps),
        "ratio_xdp_vs_tc_reply_rate": r2(rr.xdp_mpps / rr.tc_mpps),
        "gateway_reply_ns_per_packet": {
            "xdp": r2(1e3 / rr.xdp_mpps),
            "tc": r2(1e3 / rr.tc_mpps),
        },
        "gateway_reply_delivered_worst": {
            "xdp": r2(rr.xdp_delivered),
            "tc": r2(rr.tc_delivered),
        },
        "gateway_forward_xdp_mpps": r2(fw.xdp_mpps),
        "gateway_forward_tc_mpps": r2(fw.tc_mpps),
        "ratio_xdp_vs_tc_forward_rate": r2(fw.xdp_mpps / fw.tc_mpps),
        "gateway_forward_delivered_worst": {
            "xdp": r2(fw.xdp_delivered),
            "tc": r2(fw.tc_delivered),
        },
        // CPU per unit moved of the gateway alone (rounds with its packet
        // work steered to a CPU of its own by RPS, everything else pinned
        // to CPU 0; `gateway_rates` are the rates those rounds reached), on
        // the IPv4 underlay only.
        "gateway_cpu_ms_per_gbit": per_mode(t, |x| x.tcp.gateway_cpu_per_unit * 1e3),
        "gateway_cpu_ns_per_udp64_packet": per_mode(t, |x| x.udp64.gateway_cpu_per_unit * 1e9),
        "gateway_cpu_us_per_connection": per_mode(t, |x| x.crr.gateway_cpu_per_unit * 1e6),
        "ratio_gateway_cpu_per_gbit_ebpf_vs_iptables":
            r2(t[0].tcp.gateway_cpu_per_unit / t[1].tcp.gateway_cpu_per_unit),
        "ratio_gateway_cpu_per_udp64_packet_ebpf_vs_iptables":
            r2(t[0].udp64.gateway_cpu_per_unit / t[1].udp64.gateway_cpu_per_unit),
        "ratio_gateway_cpu_per_connection_ebpf_vs_iptables":
            r2(t[0].crr.gateway_cpu_per_unit / t[1].crr.gateway_cpu_per_unit),
        "gateway_rates": {
            "tcp_gbps": per_mode(t, |x| x.tcp.gateway_rate),
            "udp64_mpps": per_mode(t, |x| x.udp64.gateway_rate),
            "crr_per_s": per_mode(t, |x| x.crr.gateway_rate.round()),
        },
        "gateway_cpu_idle_share": r2(t[0].gateway_cpu_idle_share),
        "gateway_cpu_rounds": throughput::GATEWAY_CPU_ROUNDS,
        "reply_rate_rounds": reply_rate::ROUNDS,
        "crr_clients": CRR_CLIENTS,
        "testrun_runs": RUNS,
        "throughput_rounds": throughput::ROUNDS,
        "testrun_floor_ns": r2(c.floor),
        "testrun_single_run_floor_ns": r2(c.single_floor),
        "bench_restore_ns": r2(c.overheads.restore),
        // The helper calls alone (above the floor), and the least each
        // path can cost above the floor (as `net_of_floor_ns`): the
        // writable-skb prologue and the helpers it cannot do without.
        "writable_skb_ns": r2(c.overheads.touch),
        "helper_ns": {
            "l4_csum_replace": r2(c.csum),
            "set_tunnel_key_and_redirect": r2(c.tunnel),
            "adjust_room_50": r2(c.overheads.grow),
            "fib_lookup_and_redirect": r2(c.fib),
            "redirect": r2(c.redirect),
        },
        "least_possible_ns": {
            "worker": r2(least.worker),
            "gateway_forward_cached": r2(least.forward_cached),
            "gateway_forward_fib": r2(least.forward_fib),
            "gateway_reply": r2(least.reply),
        },
        "load_average_1m": std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse::<f64>().ok())),
    });
    let keys = json.as_object_mut().unwrap();
    keys.extend(rate_keys("v6u_", &g6));
    keys.extend(prefixed("", tunnel_path_keys(&c.v4, c.floor)));
    keys.extend(prefixed("", throughput_keys(t)));
    // The IPv6 underlay's, under the same names prefixed `v6u_`.
    keys.extend(prefixed("v6u_", tunnel_path_keys(&c.v6u, c.floor)));
    keys.extend(prefixed("v6u_", throughput_keys(t6)));
    keys.insert(
        "v6u_vs_v4_tcp_ebpf".into(),
        r2(t6[0].tcp.rate / t[0].tcp.rate).into(),
    );
    // The forward has no tunnel: one figure for both underlays.
    json["net_of_floor_ns"]["gateway_forward"] = r2(c.fwd - c.floor).into();
    json["single_run_ns"]["gateway_forward"] = r2(c.fwd_single).into();
    println!("{json}");
    Ok(())
}

/// Only the per-packet costs, `EGRESS_BENCH_RUNS` runs each (default
/// 200,000): a quick loop for work on the programs.
/// Only the gateway's reply rate, XDP against TC: a quick loop for work on
/// `uplink_xdp`.
#[test]
#[ignore = "benchmark: needs root"]
fn bench_reply_rate() -> Result<()> {
    let mut keys = serde_json::Map::new();
    for (prefix, underlay) in [("", Underlay::V4), ("v6u_", Underlay::V6)] {
        let g = reply_rate::gateway_rates(underlay)?;
        keys.extend(rate_keys(prefix, &g));
        let (r, f) = (&g.reply, &g.forward);
        keys.insert(
            format!("{prefix}delivered_worst"),
            serde_json::json!([
                r.xdp_delivered,
                r.tc_delivered,
                f.xdp_delivered,
                f.tc_delivered
            ]),
        );
    }
    println!("{}", serde_json::Value::Object(keys));
    Ok(())
}

/// The gateway's rates on one CPU, XDP and TC, and their ratio, for the
/// reply and the forward, under keys prefixed `prefix`.
fn rate_keys(
    prefix: &str,
    g: &reply_rate::GatewayRates,
) -> serde_json::Map<String, serde_json::Value> {
    let mut keys = serde_json::Map::new();
    for (path, r) in [("reply", &g.reply), ("forward", &g.forward)] {
        let key = |k: &str| format!("{prefix}{}", k.replace("PATH", path));
        keys.insert(key("gateway_PATH_xdp_mpps"), r2(r.xdp_mpps).into());
        keys.insert(key("gateway_PATH_tc_mpps"), r2(r.tc_mpps).into());
        let ratio = r2(r.xdp_mpps / r.tc_mpps).into();
        keys.insert(key("ratio_xdp_vs_tc_PATH_rate"), ratio);
    }
    keys
}

/// A profile of the gateway's CPU under one load (`EGRESS_PROFILE_LOAD`:
/// tcp, udp64 or crr) in each mode: where the tunnel's cost goes.
#[test]
#[ignore = "diagnosis: needs root and perf"]
fn bench_gateway_cpu_profile() -> Result<()> {
    gateway_profile::profile_gateway(&std::env::var("EGRESS_PROFILE_LOAD").unwrap_or_default())
}

/// Only the throughput runs and their CPU figures: a quick loop for work
/// on the tunnel's cost.
#[test]
#[ignore = "benchmark: needs root"]
fn bench_throughput() -> Result<()> {
    for (bed, t) in throughput::BEDS.into_iter().zip(throughputs()?) {
        println!(
            "{}: tcp {:.2} Gbit/s {:.0} ms/Gbit (gateway {:.1} at {:.2}), \
             udp64 {:.3} Mpps {:.0} ns/packet (gateway {:.0} at {:.3}), \
             crr {:.0}/s {:.0} us/conn (gateway {:.1} at {:.0}); idle share {:.3}",
            throughput::bed_name(bed),
            t.tcp.rate,
            t.tcp.cpu_per_unit * 1e3,
            t.tcp.gateway_cpu_per_unit * 1e3,
            t.tcp.gateway_rate,
            t.udp64.rate,
            t.udp64.cpu_per_unit * 1e9,
            t.udp64.gateway_cpu_per_unit * 1e9,
            t.udp64.gateway_rate,
            t.crr.rate,
            t.crr.cpu_per_unit * 1e6,
            t.crr.gateway_cpu_per_unit * 1e6,
            t.crr.gateway_rate,
            t.gateway_cpu_idle_share,
        );
    }
    Ok(())
}

#[test]
#[ignore = "benchmark: needs root"]
fn bench_program_costs() -> Result<()> {
    let runs = std::env::var("EGRESS_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let c = program_costs(runs)?;
    let l = c.least();
    eprintln!(
        "ns/packet ({runs} runs): first {:.1}, established {:.1}, forward {:.1}, reply {:.1}; \
         single runs {:.1}/{:.1}/{:.1}/{:.1} (floor {:.1}, single-run floor {:.1}, restore {:.1}; csum {:.1}, tunnel {:.1}, \
         grow {:.1}, fib {:.1}, redirect {:.1}; \
         least {:.1}/{:.1}/{:.1}); on the IPv6 underlay first {:.1}, established {:.1}, \
         reply {:.1}, single runs {:.1}/{:.1}/{:.1}",
        c.v4.first,
        c.v4.est,
        c.fwd,
        c.v4.reply,
        c.v4.first_single,
        c.v4.est_single,
        c.fwd_single,
        c.v4.reply_single,
        c.floor,
        c.single_floor,
        c.overheads.restore,
        c.csum,
        c.tunnel,
        c.overheads.grow,
        c.fib,
        c.redirect,
        l.worker,
        l.forward_cached,
        l.reply,
        c.v6u.first,
        c.v6u.est,
        c.v6u.reply,
        c.v6u.first_single,
        c.v6u.est_single,
        c.v6u.reply_single,
    );
    Ok(())
}

/// Short connections through this datapath alone, with the server's and
/// the pod's TCP counters around the run: where a slow rate comes from.
#[test]
#[ignore = "diagnosis: needs root"]
fn crr_diagnosis() -> Result<()> {
    let bed = testbed(Mode::Ebpf, Underlay::V4)?;
    let _crr = crr_server(&bed)?;
    for round in 0..3 {
        bed.srv.exec(&["nstat", "-n"])?;
        bed.pod.exec(&["nstat", "-n"])?;
        let r = crr_per_s(&bed)?;
        eprintln!("round {round}: {r:?}");
        eprintln!(
            "server: {}",
            bed.srv.exec(&[
                "nstat",
                "-z",
                "TcpExtTW*",
                "TcpExtPAWS*",
                "TcpExtTCPChallengeACK",
                "TcpOutRsts",
                "TcpRetransSegs",
                "TcpExtTCPTimeouts",
                "TcpPassiveOpens",
                "TcpExtSyncookies*",
                "TcpExtListen*"
            ])?
        );
        eprintln!(
            "pod: {}",
            bed.pod.exec(&[
                "nstat",
                "-z",
                "TcpActiveOpens",
                "TcpRetransSegs",
                "TcpExtTCPTimeouts",
                "TcpOutRsts",
                "TcpAttemptFails",
                "TcpExtTCPSynRetrans"
            ])?
        );
        eprintln!("server sockets: {}", bed.srv.exec(&["ss", "-s"])?);
    }
    Ok(())
}

/// Every program of the benchmark's object passes the verifier. A
/// `bench_*` wrapper the verifier refuses only turns its figure `null` in
/// the benchmark (which runs outside the test command), so the test
/// command checks the object here: the wrappers add a frame of their own
/// to paths that already use most of the 512-byte stack.
#[test]
#[ignore = "needs root (BPF)"]
fn every_benchmark_program_passes_the_verifier() -> Result<()> {
    let pins = PinDir::new("bverify")?;
    let mut dp = Datapath::load(&bench_object()?, pins.path())?;
    let names: Vec<String> = dp.ebpf.programs().map(|(n, _)| n.to_string()).collect();
    for wanted in [
        "bench_worker_first",
        "bench_worker_established",
        "bench_xdp_send",
    ] {
        anyhow::ensure!(
            names.iter().any(|n| n == wanted),
            "{wanted} is not in the object"
        );
    }
    let mut refused = Vec::new();
    for name in &names {
        let loaded = match dp.ebpf.program_mut(name).context("program")? {
            Program::SchedClassifier(p) if p.fd().is_err() => p.load(),
            Program::Xdp(p) if p.fd().is_err() => p.load(),
            Program::SchedClassifier(_) | Program::Xdp(_) => Ok(()),
            _ => anyhow::bail!("{name}: neither a classifier nor an XDP program"),
        };
        if let Err(e) = loaded {
            refused.push(format!("{name}: {:#}", anyhow::Error::from(e)));
        }
    }
    anyhow::ensure!(
        refused.is_empty(),
        "refused by the verifier:\n{}",
        refused.join("\n")
    );
    Ok(())
}
