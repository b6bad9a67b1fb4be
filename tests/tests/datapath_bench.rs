//! The datapath benchmark (`cargo xtask bench datapath` runs this and
//! forwards its last line). Not a test: it asserts nothing about speed, it
//! measures and prints one JSON object as its last line.
//!
//! 1. Per-packet cost of each program path with BPF_PROG_TEST_RUN, one
//!    million runs each. The kernel re-runs a program on the same buffer
//!    when asked for `repeat`, so paths that rewrite the packet (every
//!    worker path, the gateway forward) are run one million times with
//!    `repeat = 1` on fresh data and the median kernel-measured duration is
//!    taken; every run must return the path's verdict. "First packet" is a
//!    new flow (its own destination and port) in every run, so every run
//!    allocates a port and inserts both NAT entries. The gateway reply path
//!    leaves the packet as it is and runs in 100 batches of `repeat =
//!    10_000` (median batch). Both methods have a fixed cost of their own,
//!    measured on the trivial `tc_count` program and printed as the floors.
//! 2. Throughput from a pod to an external server through (a) this
//!    datapath, (b) the same topology built the way spidernet egressgateway
//!    does it (mangle MARK from an ipset, `ip rule fwmark` into a kernel
//!    VXLAN device, iptables SNAT on the gateway), (c) plain routing through
//!    the gateway with SNAT: iperf3 TCP, and 64-byte UDP packets that arrive.

use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use egress_tests::{link_veth, Netns, PinDir};
use egress_user::{
    datapath::{
        apply, Cidr, Datapath, DesiredMaps, NodeConfig, OwnedEip, PolicyRule, PortBlockGrant,
        ReplySteering,
    },
    EBPF_OBJECT,
};
use etherparse::PacketBuilder;

const RUNS: u32 = 1_000_000;
/// TC_ACT_REDIRECT: the verdict of every measured path.
const REDIRECT: u32 = 7;
const BLOCK_SIZE: u16 = 1024;
const EIP: &str = "203.0.113.100";
const SRV: &str = "203.0.113.10";
const POD: &str = "10.244.1.11";
const VXLAN: &str = "egress.vx";

fn ip4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn desired(worker: bool, gateway: bool, vxlan_ifindex: u32, uplink: (u32, [u8; 6])) -> DesiredMaps {
    DesiredMaps {
        config: NodeConfig {
            is_worker: worker,
            is_gateway: gateway,
            vxlan_ifindex,
            vni: 7,
            uplink_ifindex: uplink.0,
            uplink_mac: uplink.1,
            tunnel_mtu: 1450,
            port_block_size: BLOCK_SIZE,
            node_tunnel_ip: ip4(if gateway {
                "10.100.0.11"
            } else {
                "10.100.0.21"
            }),
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
                gateway_tunnel_ip: ip4("10.100.0.11"),
                local_gateway: false,
                use_node_ip: false,
                no_gateway: false,
            }]
        } else {
            vec![]
        },
        cluster_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "10.100.0.0/24".parse().unwrap(),
        ],
        port_blocks: if worker {
            vec![PortBlockGrant {
                eip: EIP.parse().unwrap(),
                blocks: (40..56).collect(),
            }]
        } else {
            vec![]
        },
        reply_steering: (40..56)
            .map(|b| ReplySteering {
                eip: EIP.parse().unwrap(),
                block: b,
                worker_tunnel_ip: ip4("10.100.0.21"),
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

fn udp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 1, 5], [2, 0, 0, 0, 1, 1])
        .ipv4(src.octets(), dst.octets(), 64)
        .udp(sport, dport)
        .write(&mut v, &[0u8; 18])
        .unwrap();
    v
}

fn prog<'a>(dp: &'a mut Datapath, name: &str) -> Result<&'a mut SchedClassifier> {
    let p: &mut SchedClassifier = dp.ebpf.program_mut(name).context("program")?.try_into()?;
    if p.fd().is_err() {
        p.load()?;
    }
    Ok(p)
}

/// Median kernel-measured ns over `RUNS` single runs; `patch(i, buf)` makes
/// run i's packet. The median, because on a shared machine a run that is
/// preempted costs milliseconds and would dominate a mean.
fn per_run_ns(
    runs: u32,
    p: &SchedClassifier,
    template: &[u8],
    expect: u32,
    mut patch: impl FnMut(u32, &mut [u8]),
) -> Result<f64> {
    let mut buf = template.to_vec();
    let mut out = vec![0u8; template.len() + 128];
    let mut samples = Vec::with_capacity(runs as usize);
    for i in 0..runs {
        buf.copy_from_slice(template);
        patch(i, &mut buf);
        let r = p.test_run(TestRunOptions {
            data_in: Some(&buf),
            data_out: Some(&mut out),
            ..TestRunOptions::new()
        })?;
        // Every run must take the path it stands for (a drop is cheaper).
        anyhow::ensure!(
            r.return_value == expect,
            "run {i}: verdict {} instead of {expect}",
            r.return_value
        );
        samples.push(r.duration.as_nanos() as u64);
    }
    Ok(median(&mut samples))
}

/// Median ns per run of each path, and the TestRun floors.
struct Costs {
    first: f64,
    est: f64,
    fwd: f64,
    reply: f64,
    /// tc_count, single runs (the floor of first/est/fwd).
    floor: f64,
    /// tc_count, `repeat` batches (the floor of reply).
    floor_repeat: f64,
}

fn median(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64
}

fn program_costs(runs: u32) -> Result<Costs> {
    // A namespace with a route and neighbour for the gateway's FIB lookup.
    let ns = Netns::new("bfib")?;
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
    ns.ip(&["link", "set", "up1", "up"])?;
    ns.addr("up0", "203.0.113.1/24")?;
    ns.ip(&[
        "neigh",
        "add",
        SRV,
        "lladdr",
        "02:00:00:00:0e:10",
        "dev",
        "up0",
        "nud",
        "permanent",
    ])?;
    ns.enable_forwarding()?;
    let pins = PinDir::new("bench")?;
    let pin_path: PathBuf = pins.path().to_owned();
    ns.enter(move || {
        let mut dp = Datapath::load(EBPF_OBJECT, &pin_path)?;
        let mut d = desired(true, true, 1, (1, [2, 0, 0, 0, 0xe, 1]));
        d.config.is_gateway = true;
        apply(&mut dp, &d)?;

        // Worker, first packet: a new flow every run, each to its own
        // destination (so no (destination, port) pair runs out of EIP ports).
        let tpl = udp(ip4(POD), ip4("100.64.0.1"), 1024, 53);
        let first = per_run_ns(
            runs,
            prog(&mut dp, "worker_egress")?,
            &tpl,
            REDIRECT,
            |i, b| {
                let d = (0x6440_0000u32 + i + 1).to_be_bytes(); // 100.64.0.0/10
                b[14 + 16..14 + 20].copy_from_slice(&d);
                b[14 + 20..14 + 22].copy_from_slice(&((i % 50000) as u16 + 1024).to_be_bytes());
            },
        )?;
        // Worker, established flow: the same packet each run.
        let tpl = udp(ip4(POD), ip4(SRV), 40000, 443);
        let est = per_run_ns(
            runs,
            prog(&mut dp, "worker_egress")?,
            &tpl,
            REDIRECT,
            |_, _| {},
        )?;
        // Gateway, forward: decapsulated packet from the EIP, out by the FIB.
        let tpl = udp(ip4(EIP), ip4(SRV), 40960, 443);
        let fwd = per_run_ns(
            runs,
            prog(&mut dp, "tunnel_ingress")?,
            &tpl,
            REDIRECT,
            |_, _| {},
        )?;
        // Gateway, reply: steering leaves the packet unchanged, so `repeat` is exact.
        let pkt = udp(ip4(SRV), ip4(EIP), 443, 40 * BLOCK_SIZE + 5);
        // 100 batches of 10,000 repeats; the median batch.
        let mut out = vec![0u8; pkt.len() + 128];
        let p = prog(&mut dp, "uplink_ingress")?;
        let mut batches = Vec::new();
        for _ in 0..100 {
            let r = p.test_run(TestRunOptions {
                data_in: Some(&pkt),
                data_out: Some(&mut out),
                repeat: runs / 100,
                ..TestRunOptions::new()
            })?;
            anyhow::ensure!(r.return_value == REDIRECT, "reply path did not redirect");
            batches.push(r.duration.as_nanos() as u64);
        }
        let reply = median(&mut batches);
        // The floors of both methods: the trivial tc_count program (one
        // per-CPU array increment), what BPF_PROG_TEST_RUN itself costs.
        let p = prog(&mut dp, "tc_count")?;
        let floor = per_run_ns(runs, p, &tpl, 0, |_, _| {})?;
        let mut batches = Vec::new();
        for _ in 0..100 {
            let r = p.test_run(TestRunOptions {
                data_in: Some(&tpl),
                data_out: Some(&mut out),
                repeat: runs / 100,
                ..TestRunOptions::new()
            })?;
            batches.push(r.duration.as_nanos() as u64);
        }
        let floor_repeat = median(&mut batches);
        Ok(Costs {
            first,
            est,
            fwd,
            reply,
            floor,
            floor_repeat,
        })
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Ebpf,
    Iptables,
    Direct,
}

struct Bed {
    pod: Netns,
    srv: Netns,
    _wk: Netns,
    _gw: Netns,
    _dps: Vec<Datapath>,
    _pins: Vec<PinDir>,
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

fn testbed(mode: Mode) -> Result<Bed> {
    let pod = Netns::new("bpod")?;
    let wk = Netns::new("bwk")?;
    let gw = Netns::new("bgw")?;
    let srv = Netns::new("bsrv")?;
    link_veth(&pod, "eth0", &wk, "vp11")?;
    link_veth(&wk, "eth0", &gw, "eth0")?;
    link_veth(&gw, "eth1", &srv, "eth0")?;
    pod.addr("eth0", &format!("{POD}/32"))?;
    pod.route(&["10.244.1.1", "dev", "eth0"])?;
    pod.route(&["default", "via", "10.244.1.1"])?;
    wk.addr("vp11", "10.244.1.1/32")?;
    wk.route(&[&format!("{POD}/32"), "dev", "vp11"])?;
    wk.addr("eth0", "10.100.0.21/24")?;
    gw.addr("eth0", "10.100.0.11/24")?;
    gw.addr("eth1", "203.0.113.2/24")?;
    srv.addr("eth0", &format!("{SRV}/24"))?;
    wk.enable_forwarding()?;
    gw.enable_forwarding()?;
    let mut dps = Vec::new();
    let mut pins = Vec::new();
    match mode {
        Mode::Ebpf => {
            for (ns, worker) in [(&wk, true), (&gw, false)] {
                ns.ip(&[
                    "link", "add", VXLAN, "type", "vxlan", "external", "dstport", "4789",
                ])?;
                ns.ip(&["link", "set", VXLAN, "up"])?;
                let vx = link_info(ns, VXLAN)?.0;
                let uplink = if worker {
                    (0, [0; 6])
                } else {
                    link_info(ns, "eth1")?
                };
                let d = desired(worker, !worker, vx, uplink);
                let pin = PinDir::new(if worker { "bw" } else { "bg" })?;
                let path = pin.path().to_owned();
                let dp = ns.enter(move || {
                    let mut dp = Datapath::load(EBPF_OBJECT, &path)?;
                    apply(&mut dp, &d)?;
                    dp.attach_vxlan(VXLAN)?;
                    if worker {
                        dp.attach_pod_veth("vp11")?;
                    } else {
                        dp.attach_uplink("eth1")?;
                    }
                    Ok(dp)
                })?;
                dps.push(dp);
                pins.push(pin);
            }
        }
        Mode::Iptables => {
            // Worker: ipset + mangle MARK + fwmark rule into a VXLAN device.
            // The rule is restricted to the pod-side interface: the tunnel's
            // own outer packets inherit the mark and would loop otherwise.
            wk.exec(&["ipset", "create", "egress-src", "hash:ip"])?;
            wk.exec(&["ipset", "add", "egress-src", POD])?;
            wk.exec(&[
                "iptables",
                "-t",
                "mangle",
                "-A",
                "PREROUTING",
                "-i",
                "vp11",
                "-m",
                "set",
                "--match-set",
                "egress-src",
                "src",
                "-j",
                "MARK",
                "--set-mark",
                "0x26000000/0xff000000",
            ])?;
            wk.ip(&[
                "rule",
                "add",
                "fwmark",
                "0x26000000/0xff000000",
                "iif",
                "vp11",
                "table",
                "600",
            ])?;
            for (ns, local, remote, tip) in [
                (&wk, "10.100.0.21", "10.100.0.11", "172.31.0.21/24"),
                (&gw, "10.100.0.11", "10.100.0.21", "172.31.0.11/24"),
            ] {
                ns.ip(&[
                    "link", "add", "egvx", "type", "vxlan", "id", "100", "local", local, "remote",
                    remote, "dstport", "4789", "dev", "eth0",
                ])?;
                ns.addr("egvx", tip)?;
            }
            wk.route(&[
                "default",
                "via",
                "172.31.0.11",
                "dev",
                "egvx",
                "table",
                "600",
            ])?;
            // Gateway: the EIP on the uplink and SNAT.
            gw.addr("eth1", &format!("{EIP}/32"))?;
            gw.exec(&[
                "iptables",
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-s",
                &format!("{POD}/32"),
                "-o",
                "eth1",
                "-j",
                "SNAT",
                "--to-source",
                EIP,
            ])?;
            gw.route(&["10.244.1.0/24", "via", "172.31.0.21", "dev", "egvx"])?;
        }
        Mode::Direct => {
            wk.route(&["default", "via", "10.100.0.11"])?;
            gw.addr("eth1", &format!("{EIP}/32"))?;
            gw.exec(&[
                "iptables",
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-s",
                &format!("{POD}/32"),
                "-o",
                "eth1",
                "-j",
                "SNAT",
                "--to-source",
                EIP,
            ])?;
            gw.route(&["10.244.1.0/24", "via", "10.100.0.21"])?;
        }
    }
    Ok(Bed {
        pod,
        srv,
        _wk: wk,
        _gw: gw,
        _dps: dps,
        _pins: pins,
    })
}

/// (TCP Gbit/s, 64-byte UDP Mpps that arrive) through one testbed.
fn throughput(mode: Mode) -> Result<(f64, f64)> {
    let bed = testbed(mode)?;
    let mut server = bed
        .srv
        .spawn(&["iperf3", "-s", "-p", "5201", "--forceflush"])?;
    server.wait_for_line("Server listening", Duration::from_secs(10))?;
    let tcp = bed.pod.exec(&[
        "timeout", "30", "iperf3", "-c", SRV, "-p", "5201", "-t", "5", "-J",
    ])?;
    let tcp: serde_json::Value = serde_json::from_str(&tcp)?;
    let gbps = tcp["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("tcp bps")?
        / 1e9;
    let udp = bed.pod.exec(&[
        "timeout", "30", "iperf3", "-c", SRV, "-p", "5201", "-u", "-l", "64", "-b", "0", "-t", "5",
        "-J",
    ])?;
    let udp: serde_json::Value = serde_json::from_str(&udp)?;
    let sum = &udp["end"]["sum"];
    let packets = sum["packets"].as_f64().context("udp packets")?;
    let lost = sum["lost_packets"].as_f64().unwrap_or(0.0);
    let secs = sum["seconds"].as_f64().context("udp seconds")?;
    let mpps = (packets - lost) / secs / 1e6;
    eprintln!("{mode:?}: tcp {gbps:.2} Gbit/s, udp64 {mpps:.3} Mpps arriving");
    Ok((gbps, mpps))
}

#[test]
#[ignore = "benchmark: needs root; run by `cargo xtask bench datapath`"]
fn bench_datapath() -> Result<()> {
    let Costs {
        first,
        est,
        fwd,
        reply,
        floor,
        floor_repeat,
    } = program_costs(RUNS)?;
    eprintln!(
        "ns/packet: first {first:.1}, established {est:.1}, forward {fwd:.1}, reply {reply:.1} \
         (TestRun floor, trivial program: single-run {floor:.1}, repeat {floor_repeat:.1})"
    );
    let (tcp_e, udp_e) = throughput(Mode::Ebpf)?;
    let (tcp_i, udp_i) = throughput(Mode::Iptables)?;
    let (tcp_d, udp_d) = throughput(Mode::Direct)?;
    let r2 = |x: f64| (x * 1000.0).round() / 1000.0;
    let json = serde_json::json!({
        "worker_first_packet_ns": r2(first),
        "worker_established_ns": r2(est),
        "gateway_forward_ns": r2(fwd),
        "gateway_reply_ns": r2(reply),
        "throughput_ebpf_gbps": r2(tcp_e),
        "throughput_iptables_gbps": r2(tcp_i),
        "throughput_direct_gbps": r2(tcp_d),
        "ratio_ebpf_vs_iptables": r2(tcp_e / tcp_i),
        "udp64_ebpf_mpps": r2(udp_e),
        "udp64_iptables_mpps": r2(udp_i),
        "udp64_direct_mpps": r2(udp_d),
        "ratio_udp64_ebpf_vs_iptables": r2(udp_e / udp_i),
        "testrun_runs": RUNS,
        "testrun_single_run_floor_ns": r2(floor),
        "testrun_repeat_floor_ns": r2(floor_repeat),
        // Each path less the floor of its method: what the program itself costs.
        "net_of_floor_ns": {
            "worker_first_packet": r2(first - floor),
            "worker_established": r2(est - floor),
            "gateway_forward": r2(fwd - floor),
            "gateway_reply": r2(reply - floor_repeat),
        },
        "load_average_1m": std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse::<f64>().ok())),
    });
    println!("{json}");
    Ok(())
}

/// Only the per-packet costs, `EGRESS_BENCH_RUNS` runs each (default
/// 200,000): a quick loop for work on the programs.
#[test]
#[ignore = "benchmark: needs root"]
fn bench_program_costs() -> Result<()> {
    let runs = std::env::var("EGRESS_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let c = program_costs(runs)?;
    eprintln!(
        "ns/packet ({runs} runs): first {:.1}, established {:.1}, forward {:.1}, reply {:.1} \
         (TestRun floor: single-run {:.1}, repeat {:.1})",
        c.first, c.est, c.fwd, c.reply, c.floor, c.floor_repeat
    );
    Ok(())
}
