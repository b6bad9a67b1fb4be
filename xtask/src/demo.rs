//! `cargo xtask demo`: the project's main job, shown step by step in network
//! namespaces, with everything removed at the end (also on failure or Ctrl-C).
//!
//! Today it shows the chain that everything else stands on: the real agent
//! loads the embedded eBPF object in a "node" namespace, attaches a counting
//! program to the node's uplink, real packets cross it, and `egress inspect`
//! reads the pinned, BTF-typed map. The full cluster (etcd, controller,
//! reflector, gateways, failover) grows here as its parts land.

use std::{
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;
use egress_tests::{link_veth, run as run_cmd, Netns, PinDir};

use crate::{
    build_ebpf,
    shell::{cargo, exec, step},
};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Leave the namespaces and the agent up and print how to look at them.
    #[arg(long)]
    keep: bool,
    /// Skip setup and builds (CI's short mode: the test command has built everything).
    #[arg(long)]
    no_build: bool,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; cleaning up");
    }
    Ok(())
}

pub fn run(root: &Path, args: DemoArgs) -> Result<()> {
    // Ctrl-C only sets a flag: the steps stop at the next check and the
    // namespaces are removed by their destructors on the way out.
    // SAFETY: the handler only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let started = Instant::now();
    if !args.no_build {
        crate::setup::run(root)?;
        build_ebpf::build(root, true)?;
        step("build the egress binary");
        exec(&mut cargo(
            root,
            &["build", "--release", "-p", "egress-user", "--bin", "egress"],
        ))?;
    }
    let egress = root.join("target/release/egress");
    if !egress.exists() {
        bail!("{} is missing: run without --no-build", egress.display());
    }
    let egress = egress.to_str().context("egress path is not UTF-8")?;

    step("create a node and a peer namespace joined by a veth pair");
    let node = Netns::new("node")?;
    let peer = Netns::new("peer")?;
    link_veth(&node, "eth0", &peer, "eth0")?;
    node.addr("eth0", "10.99.0.1/24")?;
    peer.addr("eth0", "10.99.0.2/24")?;
    println!("node = {}, peer = {}", node.name(), peer.name());
    check_interrupt()?;

    step(
        "start the agent in the node: load the eBPF object, pin its maps, attach tc_count to eth0",
    );
    let pins = PinDir::new("demo")?;
    let pin_dir = pins.path().to_str().context("pin path")?.to_owned();
    let mut agent = node.spawn(&[
        egress,
        "agent",
        "--pin-dir",
        &pin_dir,
        "--count-iface",
        "eth0",
    ])?;
    agent.wait_for_line("ready", Duration::from_secs(30))?;
    println!("agent ready, maps pinned under {pin_dir}");
    check_interrupt()?;

    step("send 10 pings from the peer to the node");
    let ping = peer.exec(&["ping", "-c", "10", "-i", "0.05", "-W", "2", "10.99.0.1"])?;
    println!("{}", ping.lines().rev().nth(1).unwrap_or("").trim());
    check_interrupt()?;

    step("read the pinned map with `egress inspect`");
    let table = run_cmd(&[egress, "inspect", "--pin-dir", &pin_dir])?;
    print!("{table}");
    let json: serde_json::Value = serde_json::from_str(&run_cmd(&[
        egress,
        "inspect",
        "--pin-dir",
        &pin_dir,
        "--json",
    ])?)?;
    let packets = json["iface_stats"]["packets"].as_u64().unwrap_or(0);
    let dump = run_cmd(&[
        "bpftool",
        "-j",
        "map",
        "dump",
        "pinned",
        &format!("{pin_dir}/IFACE_STATS"),
    ])?;
    let btf_fields = dump.contains("\"packets\"") && dump.contains("\"bytes\"");
    println!("bpftool map dump shows named fields: {btf_fields}");

    if args.keep {
        println!("\n--keep: the namespaces and the agent stay up. Look at them with:");
        println!("  ip netns exec {} ping -c 3 10.99.0.1", peer.name());
        println!("  {egress} inspect --pin-dir {pin_dir}");
        println!("  bpftool map dump pinned {pin_dir}/IFACE_STATS");
        println!(
            "Remove them with: ip netns del {}; ip netns del {}; rm -r {pin_dir}",
            node.name(),
            peer.name()
        );
        std::mem::forget(agent);
        std::mem::forget(pins);
        std::mem::forget(node);
        std::mem::forget(peer);
        return Ok(());
    }

    agent.terminate()?;
    drop(node);
    drop(peer);
    drop(pins);
    let leftover = std::path::Path::new(&pin_dir).exists();

    println!("\n==> summary");
    println!("{:<34} {}", "packets counted by tc_count", packets);
    println!(
        "{:<34} {}",
        "bpftool shows BTF field names",
        if btf_fields { "yes" } else { "NO" }
    );
    println!(
        "{:<34} {}",
        "cleanup left nothing behind",
        if leftover { "NO" } else { "yes" }
    );
    println!("{:<34} {:.1} s", "elapsed", started.elapsed().as_secs_f64());
    if packets < 10 || leftover || !btf_fields {
        bail!("demo expectation failed: packets={packets}, btf fields={btf_fields}, leftover pins={leftover}");
    }
    Ok(())
}
