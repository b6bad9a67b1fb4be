//! Throughput from a pod to an external server through this datapath, the
//! spidernet-style iptables path and plain routing with SNAT, with the CPU
//! time each figure costs: of the whole machine, and of the gateway alone
//! in rounds where its packet work is steered to a CPU of its own.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use egress_tests::{link_veth, Netns, PinDir};
use egress_user::{
    datapath::{apply, Datapath},
    EBPF_OBJECT,
};

use crate::{
    cpu::{Cpus, Ticks},
    desired, link_info, Underlay, EIP, GATEWAY_NODE, POD, SRV, VNI, VXLAN, WORKER_NODE,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Ebpf,
    Iptables,
    Direct,
}

pub const MODES: [Mode; 3] = [Mode::Ebpf, Mode::Iptables, Mode::Direct];

/// Every bed the throughput rounds take turns on: each mode on the IPv4
/// underlay, then on the IPv6 one.
pub const BEDS: [(Underlay, Mode); 6] = [
    (Underlay::V4, Mode::Ebpf),
    (Underlay::V4, Mode::Iptables),
    (Underlay::V4, Mode::Direct),
    (Underlay::V6, Mode::Ebpf),
    (Underlay::V6, Mode::Iptables),
    (Underlay::V6, Mode::Direct),
];

/// A bed's name in the benchmark's output: `Ebpf`, `v6u_Ebpf`...
pub fn bed_name((underlay, mode): (Underlay, Mode)) -> String {
    format!("{}{mode:?}", underlay.key_prefix())
}

pub struct Bed {
    pub pod: Netns,
    pub srv: Netns,
    pub wk: Netns,
    pub gw: Netns,
    _dps: Vec<Datapath>,
    _pins: Vec<PinDir>,
}

/// The gateway of the iptables and direct beds: the EIP on its uplink and
/// the pod's traffic SNATed to it there.
fn snat_to_the_eip(gw: &Netns) -> Result<()> {
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
    Ok(())
}

/// An IPv4 route to `dst` by node `n`'s underlay address: on the IPv6
/// underlay an IPv6 next hop (`via inet6`, RFC 5549).
fn route_via_node(ns: &Netns, dst: &str, n: u8, underlay: Underlay) -> Result<()> {
    let via = underlay.node_addr(n);
    match underlay {
        Underlay::V4 => ns.route(&[dst, "via", &via]),
        Underlay::V6 => ns
            .ip(&["-4", "route", "add", dst, "via", "inet6", &via])
            .map(|_| ()),
    }
}

/// A diagnosis (`EGRESS_BENCH_GATEWAY_VXLAN=plain`): the gateway of the IPv4
/// underlay's eBPF bed receives through a plain VXLAN device (no learning)
/// instead of the agent's `external` one, which allocates tunnel metadata
/// for every packet it receives. The forward never reads that metadata;
/// the agent keeps `external` for its device fallback (see
/// docs/architecture.md, "CPU per unit moved").
fn plain_gateway_vxlan() -> bool {
    std::env::var("EGRESS_BENCH_GATEWAY_VXLAN").is_ok_and(|v| v == "plain")
}

fn plain_vxlan(ns: &Netns) -> Result<()> {
    // Its figures are not the agent's: say so beside them.
    eprintln!("diagnosis: the gateway receives through a plain VXLAN device");
    ns.ip(&[
        "link",
        "add",
        VXLAN,
        "type",
        "vxlan",
        "id",
        &VNI.to_string(),
        "dstport",
        "4789",
        "nolearning",
    ])?;
    ns.ip(&["link", "set", VXLAN, "up"])?;
    Ok(())
}

/// Pod, worker, gateway and server in a row; the worker and the gateway
/// share only `underlay`'s addresses.
pub fn testbed(mode: Mode, underlay: Underlay) -> Result<Bed> {
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
    wk.addr("eth0", &underlay.node_cidr(WORKER_NODE))?;
    gw.addr("eth0", &underlay.node_cidr(GATEWAY_NODE))?;
    gw.addr("eth1", "203.0.113.2/24")?;
    srv.addr("eth0", &format!("{SRV}/24"))?;
    wk.enable_forwarding()?;
    gw.enable_forwarding()?;
    let mut dps = Vec::new();
    let mut pins = Vec::new();
    match mode {
        Mode::Ebpf => {
            for (ns, worker) in [(&wk, true), (&gw, false)] {
                if !worker && underlay == Underlay::V4 && plain_gateway_vxlan() {
                    plain_vxlan(ns)?;
                } else {
                    ns.vxlan_external(VXLAN)?;
                }
                let vx = link_info(ns, VXLAN)?.0;
                // The worker's uplink faces the gateway; the gateway's the server.
                let uplink = link_info(ns, if worker { "eth0" } else { "eth1" })?;
                let d = desired(worker, !worker, vx, uplink, underlay);
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
                (&wk, WORKER_NODE, GATEWAY_NODE, "172.31.0.21/24"),
                (&gw, GATEWAY_NODE, WORKER_NODE, "172.31.0.11/24"),
            ] {
                let (local, remote) = (underlay.node_addr(local), underlay.node_addr(remote));
                ns.ip(&[
                    "link", "add", "egvx", "type", "vxlan", "id", "100", "local", &local, "remote",
                    &remote, "dstport", "4789", "dev", "eth0",
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
            snat_to_the_eip(&gw)?;
            gw.route(&["10.244.1.0/24", "via", "172.31.0.21", "dev", "egvx"])?;
        }
        Mode::Direct => {
            route_via_node(&wk, "default", GATEWAY_NODE, underlay)?;
            snat_to_the_eip(&gw)?;
            route_via_node(&gw, "10.244.1.0/24", WORKER_NODE, underlay)?;
        }
    }
    Ok(Bed {
        pod,
        srv,
        wk,
        gw,
        _dps: dps,
        _pins: pins,
    })
}

/// Rounds of the throughput runs; the beds take turns within a round, so
/// that a change of the machine's speed during the benchmark hits all of
/// them alike, and each figure is the median of its rounds.
pub const ROUNDS: usize = 5;
/// Rounds of the runs that measure the gateway's CPU alone (see
/// [`steer_gateway_to`]), on the IPv4 underlay's beds only (the IPv6
/// underlay's figures are its rates; six beds would double these rounds).
pub const GATEWAY_CPU_ROUNDS: usize = 3;
const SECONDS: &str = "4";
/// The CPU the gateway's receive work is steered to when its CPU time is
/// measured; everything else then runs on CPU 0.
pub const GATEWAY_CPU: usize = 1;

/// The loads each mode is measured under.
#[derive(Clone, Copy, Debug)]
pub enum Load {
    /// iperf3 TCP: Gbit/s, amount in Gbit.
    Tcp,
    /// iperf3 64-byte UDP as fast as it can: Mpps arriving, amount in packets.
    Udp64,
    /// Short TCP connections: per second, amount in connections.
    Crr,
}

const LOADS: [Load; 3] = [Load::Tcp, Load::Udp64, Load::Crr];

/// One run of a load: its rate, what it moved, the CPU seconds spent while
/// it ran (on the CPUs the run counts), and failed connections.
pub struct Run {
    pub rate: f64,
    pub amount: f64,
    pub busy_s: f64,
    /// The run's wall-clock length.
    pub secs: f64,
    pub failed: u64,
}

/// `argv` run in the pod, on CPU 0 when `pinned`.
fn in_pod(bed: &Bed, pinned: bool, argv: &[&str]) -> Result<String> {
    let mut full = if pinned {
        vec!["taskset", "-c", "0"]
    } else {
        vec![]
    };
    full.extend_from_slice(argv);
    bed.pod.exec(&full)
}

fn iperf3(bed: &Bed, pinned: bool, extra: &[&str]) -> Result<serde_json::Value> {
    let mut argv = vec![
        "timeout", "30", "iperf3", "-c", SRV, "-p", "5201", "-t", SECONDS, "-J",
    ];
    argv.extend_from_slice(extra);
    Ok(serde_json::from_str(&in_pod(bed, pinned, &argv)?)?)
}

/// (rate, amount, failed) of one run of `load`.
fn run_load(bed: &Bed, load: Load, pinned: bool) -> Result<(f64, f64, u64)> {
    match load {
        Load::Tcp => {
            let v = iperf3(bed, pinned, &[])?;
            let sum = &v["end"]["sum_received"];
            let bps = sum["bits_per_second"].as_f64().context("tcp bps")?;
            let bytes = sum["bytes"].as_f64().context("tcp bytes")?;
            Ok((bps / 1e9, bytes * 8.0 / 1e9, 0))
        }
        Load::Udp64 => {
            let v = iperf3(bed, pinned, &["-u", "-l", "64", "-b", "0"])?;
            let sum = &v["end"]["sum"];
            let packets = sum["packets"].as_f64().context("udp packets")?;
            let lost = sum["lost_packets"].as_f64().unwrap_or(0.0);
            let secs = sum["seconds"].as_f64().context("udp seconds")?;
            let arrived = packets - lost;
            Ok((arrived / secs / 1e6, arrived, 0))
        }
        Load::Crr => {
            let traffic = egress_tests::traffic_bin()?;
            let out = in_pod(
                bed,
                pinned,
                &[
                    "timeout",
                    "30",
                    &traffic.to_string_lossy(),
                    "crr-client",
                    &format!("{SRV}:{CRR_PORT}"),
                    SECONDS,
                    &CRR_CLIENTS.to_string(),
                ],
            )?;
            let v: serde_json::Value = serde_json::from_str(out.trim())?;
            Ok((
                v["per_second"].as_f64().context("crr per_second")?,
                v["completed"].as_f64().context("crr completed")?,
                v["failed"].as_u64().unwrap_or(0),
            ))
        }
    }
}

/// One run of `load`, with the busy time of `cpus` around it.
pub fn measured(bed: &Bed, load: Load, cpus: Cpus) -> Result<Run> {
    // A one-CPU measure counts the gateway's CPU: everything else on CPU 0.
    let pinned = matches!(cpus, Cpus::AwakeOf(_) | Cpus::InterruptsOf(_));
    let (before, started) = (Ticks::now()?, Instant::now());
    let (rate, amount, failed) = run_load(bed, load, pinned)?;
    let busy_s = Ticks::now()?.seconds_since(&before, cpus);
    Ok(Run {
        rate,
        amount,
        busy_s,
        secs: started.elapsed().as_secs_f64(),
        failed,
    })
}

/// Short connections from the pod for `SECONDS`, `CRR_CLIENTS` at a
/// time: (completed per second, failed).
pub fn crr_per_s(bed: &Bed) -> Result<(f64, u64)> {
    let (rate, _, failed) = run_load(bed, Load::Crr, false)?;
    Ok((rate, failed))
}

const CRR_PORT: u16 = 5202;

/// The short-connection server on the bed's server, once it listens.
pub fn crr_server(bed: &Bed) -> Result<egress_tests::Proc> {
    let traffic = egress_tests::traffic_bin()?;
    bed.srv.spawn_ready(&[
        &traffic.to_string_lossy(),
        "crr-server",
        &format!("0.0.0.0:{CRR_PORT}"),
    ])
}
pub const CRR_CLIENTS: usize = 4;

/// Makes the gateway's packet work run on `GATEWAY_CPU` and everything
/// else on CPU 0, so that `GATEWAY_CPU`'s busy time is the gateway's: RPS
/// sends what the gateway's two veths receive to `GATEWAY_CPU` and what
/// the worker and the server receive from it back to CPU 0, and the pod's
/// and the server's processes are pinned to CPU 0. A veth's own receive
/// poll (GRO, and XDP where attached) stays on the sending CPU.
pub fn steer_gateway_to(bed: &Bed, servers: &[&egress_tests::Proc]) -> Result<()> {
    let gateway = format!("{:x}", 1u32 << GATEWAY_CPU);
    for (ns, dev, mask) in [
        (&bed.gw, "eth0", gateway.as_str()),
        (&bed.gw, "eth1", gateway.as_str()),
        (&bed.wk, "eth0", "1"),
        (&bed.wk, "vp11", "1"),
        (&bed.srv, "eth0", "1"),
    ] {
        // sysfs shows the namespace it is mounted in: `ip netns exec` mounts
        // the namespace's own.
        egress_tests::run(&[
            "ip",
            "netns",
            "exec",
            ns.name(),
            "sh",
            "-c",
            &format!("echo {mask} > /sys/class/net/{dev}/queues/rx-0/rps_cpus"),
        ])?;
    }
    for p in servers {
        egress_tests::run(&["taskset", "-a", "-p", "-c", "0", &p.pid().to_string()])?;
    }
    Ok(())
}

/// A load's figures for one mode: the median rate of its rounds and the
/// median CPU cost per unit moved, of the whole machine and (from the
/// steered rounds) of the gateway alone.
#[derive(Clone, Copy, Default)]
pub struct Figures {
    pub rate: f64,
    pub cpu_per_unit: f64,
    pub gateway_rate: f64,
    pub gateway_cpu_per_unit: f64,
}

/// The medians of one bed.
pub struct Throughput {
    pub tcp: Figures,
    pub udp64: Figures,
    pub crr: Figures,
    /// Short connections that failed, over every round.
    pub crr_failed: u64,
    /// The gateway CPU's busy share while nothing ran, taken off the
    /// steered rounds' figures.
    pub gateway_cpu_idle_share: f64,
}

/// A bed of `mode` on `underlay` with its servers listening: iperf3 and
/// the short-connection server.
pub fn serving_bed(
    (underlay, mode): (Underlay, Mode),
) -> Result<(Bed, egress_tests::Proc, egress_tests::Proc)> {
    let bed = testbed(mode, underlay)?;
    let mut server = bed
        .srv
        .spawn(&["iperf3", "-s", "-p", "5201", "--forceflush"])?;
    server.wait_for_line("Server listening", Duration::from_secs(10))?;
    let crr = crr_server(&bed)?;
    Ok((bed, server, crr))
}

/// The median, NaN (null in the JSON) for no values.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Each bed's throughput figures, in `BEDS` order (the gateway-alone
/// figures NaN on the IPv6 underlay's).
pub fn throughputs() -> Result<Vec<Throughput>> {
    let beds = BEDS
        .into_iter()
        .map(serving_bed)
        .collect::<Result<Vec<_>>>()?;
    // runs[bed][load]: the whole machine's rounds, then the steered ones.
    let mut runs: Vec<Vec<Vec<Run>>> = (0..BEDS.len())
        .map(|_| LOADS.iter().map(|_| Vec::new()).collect())
        .collect();
    for round in 0..ROUNDS {
        for (l, load) in LOADS.iter().enumerate() {
            for (m, (bed, _, _)) in beds.iter().enumerate() {
                runs[m][l].push(measured(bed, *load, Cpus::AllBusy)?);
            }
        }
        for (m, bed) in BEDS.into_iter().enumerate() {
            let [tcp, udp, crr] = [0, 1, 2].map(|l| &runs[m][l][round]);
            eprintln!(
                "round {round} {}: tcp {:.2} Gbit/s, udp64 {:.3} Mpps arriving, \
                 {:.0} short connections/s ({} failed)",
                bed_name(bed),
                tcp.rate,
                udp.rate,
                crr.rate,
                crr.failed
            );
        }
    }
    let mut steered: Vec<Vec<Vec<Run>>> = (0..BEDS.len())
        .map(|_| LOADS.iter().map(|_| Vec::new()).collect())
        .collect();
    // A machine with one CPU has no second one to steer the gateway to.
    let gateway_rounds = if Ticks::now()?.cpu_count() > GATEWAY_CPU {
        GATEWAY_CPU_ROUNDS
    } else {
        0
    };
    let idle_share = gateway_cpu_idle_share()?;
    let v4_beds = || (0..BEDS.len()).filter(|&m| BEDS[m].0 == Underlay::V4);
    for m in v4_beds() {
        let (bed, server, crr) = &beds[m];
        steer_gateway_to(bed, &[server, crr])?;
    }
    for _ in 0..gateway_rounds {
        for (l, load) in LOADS.iter().enumerate() {
            for m in v4_beds() {
                let bed = &beds[m].0;
                steered[m][l].push(measured(bed, *load, Cpus::AwakeOf(GATEWAY_CPU))?);
            }
        }
    }
    let figures = |whole: &[Run], gateway: &[Run]| Figures {
        rate: median(whole.iter().map(|r| r.rate).collect()),
        cpu_per_unit: median(whole.iter().map(|r| r.busy_s / r.amount).collect()),
        gateway_rate: median(gateway.iter().map(|r| r.rate).collect()),
        gateway_cpu_per_unit: median(
            gateway
                .iter()
                .map(|r| (r.busy_s - idle_share * r.secs).max(0.0) / r.amount)
                .collect(),
        ),
    };
    Ok((0..BEDS.len())
        .map(|m| Throughput {
            tcp: figures(&runs[m][0], &steered[m][0]),
            udp64: figures(&runs[m][1], &steered[m][1]),
            crr: figures(&runs[m][2], &steered[m][2]),
            crr_failed: runs[m][2]
                .iter()
                .chain(&steered[m][2])
                .map(|r| r.failed)
                .sum(),
            gateway_cpu_idle_share: idle_share,
        })
        .collect())
}

/// The share of `GATEWAY_CPU` that is awake while no load runs (other
/// processes of the machine), over one second.
fn gateway_cpu_idle_share() -> Result<f64> {
    let before = Ticks::now()?;
    std::thread::sleep(Duration::from_secs(1));
    Ok(Ticks::now()?.seconds_since(&before, Cpus::AwakeOf(GATEWAY_CPU)))
}
