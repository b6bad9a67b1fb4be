//! A diagnosis of the gateway's CPU: where the tunnel's cost goes.

use anyhow::{Context, Result};
use egress_tests::Netns;

use crate::{
    cpu::{Cpus, Ticks},
    throughput::{measured, serving_bed, steer_gateway_to, Load, GATEWAY_CPU, MODES},
    Underlay,
};

/// Where the gateway's CPU goes under one load: each mode's bed steered as
/// in the CPU rounds, with `perf record -C GATEWAY_CPU -g` around one run
/// (written to `EGRESS_PROFILE_DIR`, default /tmp, as
/// `gateway-<mode>-<load>.perf`), the packets the gateway received from
/// either side, and each BPF program's run time (`kernel.bpf_stats_enabled`
/// is on for the run).
pub fn profile_gateway(load_name: &str) -> Result<()> {
    let stats = egress_tests::run(&["sysctl", "-n", "kernel.bpf_stats_enabled"])?;
    egress_tests::run(&["sysctl", "-qw", "kernel.bpf_stats_enabled=1"])?;
    let r = profile_each_mode(load_name);
    egress_tests::run(&[
        "sysctl",
        "-qw",
        &format!("kernel.bpf_stats_enabled={}", stats.trim()),
    ])?;
    r
}

fn profile_each_mode(load_name: &str) -> Result<()> {
    let dir = std::env::var("EGRESS_PROFILE_DIR").unwrap_or_else(|_| "/tmp".into());
    let load = match load_name {
        "udp64" => Load::Udp64,
        "crr" => Load::Crr,
        _ => Load::Tcp,
    };
    for mode in MODES {
        let (bed, server, crr) = serving_bed((Underlay::V4, mode))?;
        steer_gateway_to(&bed, &[&server, &crr])?;
        let out = format!("{dir}/gateway-{mode:?}-{load_name}.perf");
        let cpu = GATEWAY_CPU.to_string();
        let perf = egress_tests::Proc::spawn(
            {
                let mut c = std::process::Command::new("perf");
                c.args(["record", "-C", &cpu, "-g", "-o", &out, "--", "sleep", "3.5"]);
                c
            },
            "perf record".into(),
        )?;
        let rx_before = rx_packets(&bed.gw, "eth0")?;
        let acks_before = rx_packets(&bed.gw, "eth1")?;
        let progs_before = egress_tests::run(&["bpftool", "-j", "prog", "show"])?;
        let ticks_before = Ticks::now()?;
        let run = measured(&bed, load, Cpus::AwakeOf(GATEWAY_CPU))?;
        // Beside it, what the sampled interrupt ticks say (see `cpu::Ticks`).
        let ticks_s = Ticks::now()?.seconds_since(&ticks_before, Cpus::InterruptsOf(GATEWAY_CPU));
        let rx = rx_packets(&bed.gw, "eth0")? - rx_before;
        let acks = rx_packets(&bed.gw, "eth1")? - acks_before;
        let progs_after = egress_tests::run(&["bpftool", "-j", "prog", "show"])?;
        eprintln!("{mode:?}: {acks} packets in from the server");
        program_time(&progs_before, &progs_after)?;
        perf.terminate()?;
        eprintln!(
            "{mode:?}: rate {:.3}, gateway CPU {:.3} s awake ({ticks_s:.3} s in interrupt \
             ticks) over {:.1} s; {rx} packets in from the worker ({:.0} ns each awake, {:.0} \
             by ticks); profile {out}",
            run.rate,
            run.busy_s,
            run.secs,
            run.busy_s * 1e9 / rx as f64,
            ticks_s * 1e9 / rx as f64
        );
    }
    Ok(())
}

fn rx_packets(ns: &Netns, dev: &str) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_str(&ns.ip(&["-s", "-j", "link", "show", dev])?)?;
    v[0]["stats64"]["rx"]["packets"]
        .as_u64()
        .context("rx packets")
}

/// Prints each program's run time and count between two `bpftool -j prog
/// show` listings (with kernel.bpf_stats_enabled=1).
fn program_time(before: &str, after: &str) -> Result<()> {
    let b: serde_json::Value = serde_json::from_str(before)?;
    let a: serde_json::Value = serde_json::from_str(after)?;
    for p in a.as_array().context("progs")? {
        let id = p["id"].as_u64();
        let old = b
            .as_array()
            .context("progs")?
            .iter()
            .find(|q| q["id"].as_u64() == id);
        let (t0, c0) = old
            .map(|q| {
                (
                    q["run_time_ns"].as_u64().unwrap_or(0),
                    q["run_cnt"].as_u64().unwrap_or(0),
                )
            })
            .unwrap_or((0, 0));
        let (t1, c1) = (
            p["run_time_ns"].as_u64().unwrap_or(0),
            p["run_cnt"].as_u64().unwrap_or(0),
        );
        if c1 > c0 {
            eprintln!(
                "  prog {} {}: {} runs, {:.0} ns each, {:.3} s",
                id.unwrap_or(0),
                p["name"].as_str().unwrap_or("?"),
                c1 - c0,
                (t1 - t0) as f64 / (c1 - c0) as f64,
                (t1 - t0) as f64 / 1e9
            );
        }
    }
    Ok(())
}
