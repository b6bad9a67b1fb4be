//! Scenarios where only the agent process fails, the node's datapath
//! (pinned programs and maps) staying up:
//!
//! - `agent-restart`: the agents of the pod's worker and of the EIP's owner
//!   are killed (SIGKILL), stay down for a second, and start again. Traffic
//!   must not stop (the pinned datapath carries it without an agent), the
//!   TCP connection survives (the NAT table is kept), the EIP never moves,
//!   and the restarted agents take over the pinned links and the previous
//!   run's announce lease instead of starting from empty maps.
//! - `gateway-agent-crash`: the owner's agent is killed and stays down; its
//!   datapath keeps running. The controller moves the EIP after the eviction
//!   timeout, and the dead agent's node must fall silent for ARP by then by
//!   itself (the datapath's announce lease): at no instant do two MACs answer
//!   for the EIP. An `arp-watch` on the fabric's bridge asks every 20 ms.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{
    ms, say,
    stage::stage,
    tracker::{check_not_heartbeat_timeout, check_tcp, check_udp, wait_new_owner},
    Bins, Options, Outcome,
};
use crate::{
    cluster::{wait_until, Cluster},
    topology::FABRIC_UNDERLAY_IP,
    Proc,
};

/// How long the killed agents stay down in `agent-restart`.
const AGENT_DOWN: Duration = Duration::from_secs(1);
/// ARP request interval of the watch.
const ARP_INTERVAL_MS: u64 = 20;

fn uplink_mac(cluster: &Cluster, i: usize) -> Result<String> {
    let node = &cluster.topo.nodes[i];
    let out = node.ns.exec(&["ip", "-j", "link", "show", &node.uplink])?;
    let v: Value = serde_json::from_str(&out)?;
    v[0]["address"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no MAC on {}'s {}", node.name, node.uplink))
}

/// `agent-restart`: see the module doc.
pub(super) fn agent_restart(bins: &Bins, opts: &Options) -> Result<Outcome> {
    let (mut st, mut out) = stage(bins, opts, 1, "agent-restart")?;
    let worker = 0;
    let (owner, owner_name) = st.owner_and_name();
    anyhow::ensure!(
        AGENT_DOWN * 2 < opts.eviction(),
        "agent-restart needs an eviction timeout above {} ms (the agents are down {} ms)",
        ms(AGENT_DOWN * 2),
        ms(AGENT_DOWN)
    );
    say(&format!(
        "timers for this scenario: eviction {}",
        opts.timers.eviction
    ));
    std::thread::sleep(opts.settle);

    let t0 = Instant::now();
    st.cluster.kill_agent(worker);
    st.cluster.kill_agent(owner);
    say(&format!(
        "fault: the agents of w1 and {owner_name} killed (SIGKILL); their datapaths stay up"
    ));
    // Down on purpose: the datapath alone must carry the traffic meanwhile.
    std::thread::sleep(AGENT_DOWN);
    let mut restarted: Vec<(usize, Proc)> = Vec::new();
    for i in [worker, owner] {
        restarted.push((i, st.cluster.spawn_agent(i)?));
    }
    say(&format!(
        "agents started again {} ms after the kill",
        ms(t0.elapsed())
    ));
    for (i, p) in restarted {
        st.cluster.agents[i] = Some(p);
    }
    // The worker's new agent takes over the pinned link of the pod's veth
    // (the program is swapped in place; a new link would mean the old one
    // was gone), and the owner's starts its fence from the pinned lease.
    let resumed = |i: usize| -> Value {
        st.cluster
            .agent_state(i)
            .map(|v| v["resumed"].clone())
            .unwrap_or(Value::Null)
    };
    let worker_resumed = wait_until(
        "w1's agent attaches to the pod veth",
        Duration::from_secs(20),
        || {
            let r = resumed(worker);
            Ok(r["pod_links_taken_over"].as_u64().unwrap_or(0)
                + r["pod_links_new"].as_u64().unwrap_or(0)
                > 0)
        },
    )
    .map(|_| resumed(worker))
    .unwrap_or(Value::Null);
    out.extra
        .insert("worker_resumed".into(), worker_resumed.clone());
    out.check(
        worker_resumed["pod_links_taken_over"].as_u64() == Some(1)
            && worker_resumed["pod_links_new"].as_u64() == Some(0),
        format!("the restarted worker agent did not take over the pinned pod-veth link: {worker_resumed}"),
    );
    let owner_resumed = resumed(owner);
    out.extra
        .insert("owner_resumed".into(), owner_resumed.clone());
    out.check(
        owner_resumed["announce_lease"] == true,
        format!("{owner_name}'s restarted agent did not start from the previous announce lease: {owner_resumed}"),
    );
    std::thread::sleep(opts.after);

    let moved = st.tracker.first_other(owner, t0);
    out.check(
        moved.is_none(),
        format!(
            "the EIP moved to {:?} during the restart",
            moved.map(|(_, n)| st.cluster.topo.nodes[n].name.clone())
        ),
    );
    let end = st.tracker.announcers_now();
    out.check(
        end == [owner],
        format!("at the end the EIP is announced by nodes {end:?}, expected only {owner_name}"),
    );
    check_not_heartbeat_timeout(
        &st.cluster,
        &mut out,
        &owner_name,
        "owner_phase",
        format!("{owner_name} went HeartbeatTimeout during a restart"),
    );
    // An outage that waited for the new agents would last AGENT_DOWN or more.
    let bound = AGENT_DOWN / 2;
    let udp = st.traffic.stop_udp()?;
    check_udp(&mut out, &udp, &st.eip, bound);
    let tcp = st.traffic.stop_tcp()?;
    check_tcp(&mut out, &tcp);
    st.finish(out)
}

/// `gateway-agent-crash`: see the module doc.
pub(super) fn gateway_agent_crash(bins: &Bins, opts: &Options) -> Result<Outcome> {
    let (mut st, mut out) = stage(bins, opts, 1, "gateway-agent-crash")?;
    let (old, old_name) = st.owner_and_name();
    let macs: Vec<String> = (0..st.cluster.topo.nodes.len())
        .map(|i| uplink_mac(&st.cluster, i))
        .collect::<Result<_>>()?;
    let tb = bins.traffic.to_string_lossy().into_owned();
    let watch = st.cluster.topo.fabric.spawn_ready(&[
        &tb,
        "arp-watch",
        "br0",
        &st.eip,
        &FABRIC_UNDERLAY_IP.to_string(),
        &ARP_INTERVAL_MS.to_string(),
    ])?;
    let watch_start = Instant::now();
    std::thread::sleep(opts.settle);

    let t0 = Instant::now();
    st.cluster.kill_agent(old);
    say(&format!(
        "fault: {old_name}'s agent killed (SIGKILL); its datapath and links stay up"
    ));
    let eviction = opts.eviction();
    let moved = wait_new_owner(&st.tracker, old, t0, opts.heartbeat_bound());
    match moved {
        Some((at, n)) => {
            st.note_new_owner(&mut out, n, at - t0, "the crash");
        }
        None => out.check(false, "no other node took the EIP"),
    }
    std::thread::sleep(opts.after);
    let arp = super::stage::report_of(watch)?;
    let fault_ms = (t0 - watch_start).as_secs_f64() * 1000.0;
    let answer = |mac: &str| {
        arp["answers"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["mac"] == mac))
            .cloned()
    };
    let old_answer = answer(&macs[old]);
    let old_last = old_answer
        .as_ref()
        .and_then(|a| a["last_ms"].as_f64())
        .map(|t| t - fault_ms);
    say(&format!(
        "ARP: {old_name} last answered {:?} ms after the crash; {} rounds, {} unanswered, {} answered by two MACs",
        old_last.map(f64::round),
        arp["rounds"],
        arp["unanswered_rounds"],
        arp["multi_answer_rounds"].as_array().map_or(0, Vec::len)
    ));
    out.extra
        .insert("old_owner_last_arp_ms".into(), json!(old_last));
    out.extra.insert("arp".into(), arp.clone());
    out.check(
        old_last.is_some(),
        format!("{old_name} never answered ARP for the EIP (the watch saw nothing)"),
    );
    // Silent by the eviction timeout (one request round of measurement slack).
    let limit = ms(eviction) as f64 + ARP_INTERVAL_MS as f64;
    out.check(
        old_last.is_some_and(|t| t <= limit),
        format!(
            "{old_name}'s datapath still answered ARP {:?} ms after its agent died (limit: the eviction timeout, {limit} ms)",
            old_last.map(f64::round)
        ),
    );
    let multi = arp["multi_answer_rounds"].as_array().map_or(0, Vec::len);
    out.check(
        multi == 0,
        format!("two MACs answered ARP for the EIP in {multi} rounds (split brain)"),
    );
    if let Some((_, n)) = moved {
        out.extra.insert(
            "new_owner".into(),
            json!(st.cluster.topo.nodes[n].name.clone()),
        );
        out.check(
            answer(&macs[n]).is_some(),
            format!(
                "the new owner {} never answered ARP for the EIP",
                st.cluster.topo.nodes[n].name
            ),
        );
    }
    let udp = st.traffic.stop_udp()?;
    check_udp(&mut out, &udp, &st.eip, opts.heartbeat_bound());
    let tcp = st.traffic.stop_tcp()?;
    check_tcp(&mut out, &tcp);
    st.finish(out)
}
