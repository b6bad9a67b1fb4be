//! Active-active scenarios (issue 17): three gateways hold one EIP at once
//! in BGP mode. The upstream router is FRR with zebra, and the fabric
//! routes the EIP's prefix through it, so replies reach a gateway only as
//! BGP (ECMP over every path the reflector sends by ADD-PATH) says. Pods on
//! both workers run many UDP flows and several echoing TCP connections.
//!
//! - `active-active-kill`: one gateway's agent is killed and its link cut;
//!   flows through the others see no gap longer than two probe intervals,
//!   flows through it recover, the upstream route loses exactly its next
//!   hop; then it comes back and takes exactly its flows back.
//! - `active-active-reflector-restart`: the reflector is killed and started
//!   again during the traffic; the upstream never loses a next hop.
//! - `active-active-partition`: one gateway loses the datastore only; it
//!   fences itself (withdraws the EIP) within the eviction timeout, the
//!   upstream drops its next hop, and it takes its share back once the
//!   datastore returns.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::json;

use super::{ms, say, stage::report_of, Bins, Options, Outcome};
use crate::{
    cluster::{wait_until, Cluster, ClusterSpec, GATEWAY_LABEL},
    topology::SERVER_IP,
    Proc,
};

mod flows;
use flows::{gateway_of_flows, AaTraffic};

/// The EIP: outside the underlay subnet, so only a route finds it.
pub(super) const AA_EIP: &str = "10.20.0.1";
/// Its IPv6 pair. On an IPv4 underlay its paths' next hops are IPv4-mapped
/// and the upstream cannot forward by them; what is checked is that every
/// holder's /128 reaches the upstream by ADD-PATH (on an IPv6 underlay
/// too, where the IPv4 EIP's paths carry IPv6 next hops, RFC 8950).
const AA_EIP6: &str = "fd00:20::1";
const AA_PREFIX: &str = "10.20.0.0/24";
const WORKERS: usize = 2;
const GATEWAYS: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AaFault {
    KillGateway,
    RestartReflector,
    PartitionGateway,
}

/// The ActiveActive gateway over the gateway nodes and a policy for the
/// `app=web` pods, as one manifest.
fn manifest() -> String {
    let (k, v) = GATEWAY_LABEL.split_once('=').unwrap();
    format!(
        "apiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressGateway\nmetadata:\n  name: aa\n\
         spec:\n  mode: ActiveActive\n  ippools:\n    ipv4: [\"{AA_EIP}\"]\n    ipv4DefaultEIP: {AA_EIP}\n\
         \x20   ipv6: [\"{AA_EIP6}\"]\n    ipv6DefaultEIP: \"{AA_EIP6}\"\n\
         \x20 nodeSelector:\n    selector:\n      matchLabels:\n        {k}: \"{v}\"\n---\n\
         apiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressPolicy\nmetadata:\n  name: web\n  namespace: default\n\
         spec:\n  egressGatewayName: aa\n  appliedTo:\n    podSelector:\n      matchLabels:\n        app: web\n\
         \x20 destSubnet: [\"198.51.100.0/24\"]\n"
    )
}

/// The cluster, with the gateway and policy applied and every gateway
/// announcing the EIP.
fn stage(bins: &Bins, opts: &Options) -> Result<Cluster> {
    #[allow(clippy::needless_update)]
    let spec = ClusterSpec {
        workers: WORKERS,
        gateways: GATEWAYS,
        pods_per_worker: 1,
        timers: opts.timers.clone(),
        ipv6_underlay: opts.ipv6_underlay,
        bgp: true,
        upstream_frr: true,
        via_upstream: vec![AA_PREFIX.into()],
        ..ClusterSpec::default()
    };
    let cluster = Cluster::start(&bins.egress, spec)?;
    if opts.ipv6_underlay {
        cluster.ensure_ipv6_only()?;
        say("underlay: IPv6 only (no node has an IPv4 address)");
    }
    let up = &cluster.upstream.as_ref().context("upstream")?.ns;
    // Replies of one EIP to one server differ only by port: hash on it.
    up.sysctl(&["net.ipv4.fib_multipath_hash_policy=1"])?;
    let file = std::env::temp_dir().join(crate::netns::unique_name("aa.yaml"));
    std::fs::write(&file, manifest())?;
    let applied = cluster.apply(&file);
    let _ = std::fs::remove_file(&file);
    applied?;
    let all = gateway_indexes();
    wait_until(
        "every gateway announces the EIP",
        Duration::from_secs(30),
        || Ok(cluster.announcers(AA_EIP) == all),
    )?;
    wait_until(
        "the upstream's kernel route has every gateway",
        Duration::from_secs(30),
        || Ok(upstream_hops(&cluster)? == hops_of(&cluster, &all)),
    )?;
    wait_until(
        "the upstream holds every gateway's /128 path",
        Duration::from_secs(30),
        || Ok(upstream_v6_paths(&cluster)? == hops_of(&cluster, &all).len()),
    )?;
    for w in 0..WORKERS {
        wait_until(
            "the workers apply the policy",
            Duration::from_secs(30),
            || Ok(cluster.agent_state(w)?["policies"].as_u64() == Some(1)),
        )?;
    }
    Ok(cluster)
}

fn gateway_indexes() -> Vec<usize> {
    (WORKERS..WORKERS + GATEWAYS).collect()
}

fn hops_of(cluster: &Cluster, nodes: &[usize]) -> BTreeSet<String> {
    nodes
        .iter()
        .map(|&i| cluster.topo.nodes[i].underlay_ip.to_string())
        .collect()
}

fn upstream_hops(cluster: &Cluster) -> Result<BTreeSet<String>> {
    let up = cluster.upstream.as_ref().context("upstream")?;
    crate::frr::kernel_next_hops(&up.ns, &format!("{AA_EIP}/32"))
}

/// Distinct paths (by ADD-PATH id) of the IPv6 EIP in the upstream's BGP table.
fn upstream_v6_paths(cluster: &Cluster) -> Result<usize> {
    let up = cluster.upstream.as_ref().context("upstream")?;
    let text = up
        .frr
        .vtysh(&format!("show bgp ipv6 unicast {AA_EIP6}/128 json"))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let ids: BTreeSet<u64> = v["paths"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["addpathRxId"].as_u64())
        .collect();
    Ok(ids.len())
}

/// Counts the replies reaching each gateway's uplink for a while.
fn replies_per_gateway(cluster: &Cluster, bins: &Bins, d: Duration) -> Result<Vec<u64>> {
    let tb = bins.traffic.to_string_lossy().into_owned();
    let counters: Vec<Proc> = gateway_indexes()
        .into_iter()
        .map(|i| {
            let n = &cluster.topo.nodes[i];
            n.ns.spawn_ready(&[&tb, "ip-count", &n.uplink, AA_EIP])
        })
        .collect::<Result<_>>()?;
    std::thread::sleep(d);
    counters
        .into_iter()
        .map(|p| Ok(report_of(p)?["packets"].as_u64().unwrap_or(0)))
        .collect()
}

/// Runs one active-active scenario.
pub(super) fn active_active(bins: &Bins, opts: &Options, fault: AaFault) -> Result<Outcome> {
    let name = match fault {
        AaFault::KillGateway => "active-active-kill",
        AaFault::RestartReflector => "active-active-reflector-restart",
        AaFault::PartitionGateway => "active-active-partition",
    };
    let mut out = Outcome::named(name);
    let mut cluster = stage(bins, opts)?;
    say(&format!(
        "cluster up: {AA_EIP} announced by all {GATEWAYS} gateways"
    ));
    let traffic = AaTraffic::start(&cluster, bins, opts)?;
    std::thread::sleep(opts.settle);
    let before = gateway_of_flows(&cluster, WORKERS)?;
    let used: BTreeSet<String> = before.values().cloned().collect();
    out.extra
        .insert("flows_per_gateway".into(), json!(count_by(&before)));
    out.check(
        used == hops_of(&cluster, &gateway_indexes()),
        format!("the workers' flows did not use every gateway: {used:?}"),
    );
    let replies = replies_per_gateway(&cluster, bins, Duration::from_secs(1))?;
    out.extra
        .insert("replies_per_gateway".into(), json!(replies));
    out.check(
        replies.iter().all(|r| *r > 0),
        format!("replies did not arrive through every gateway: {replies:?}"),
    );
    let fault_at = Instant::now();
    let dead = match fault {
        AaFault::KillGateway => Some(kill_and_return(&mut cluster, opts, &mut out)?),
        AaFault::PartitionGateway => Some(partition_and_return(&cluster, opts, &mut out)?),
        AaFault::RestartReflector => {
            restart_reflector(&mut cluster, opts, &mut out)?;
            None
        }
    };
    std::thread::sleep(opts.after);
    let after = gateway_of_flows(&cluster, WORKERS)?;
    out.check(
        after == before,
        "after the return, flows are not back on the gateways they started on",
    );
    let report = traffic.stop(opts)?;
    // A dead gateway is found by the probes; a partitioned one fences
    // itself by the heartbeat timeout, its datapath working meanwhile.
    let dead_bound = match fault {
        AaFault::PartitionGateway => opts.heartbeat_bound(),
        _ => opts.probe_bound(),
    };
    report.check(
        &mut out,
        &before,
        dead.as_deref(),
        dead_bound,
        opts,
        fault_at,
    );
    Ok(out.finished())
}

/// Kills the second gateway (agent and link), waits for the upstream to
/// drop exactly its next hop, then brings it back; returns its address.
fn kill_and_return(cluster: &mut Cluster, opts: &Options, out: &mut Outcome) -> Result<String> {
    let all = gateway_indexes();
    let victim = all[1];
    let name = cluster.topo.nodes[victim].name.clone();
    let t0 = Instant::now();
    cluster.kill_agent(victim);
    cluster.topo.cut_node(victim)?;
    say(&format!("fault: {name}'s agent killed and its link cut"));
    let rest: Vec<usize> = all.iter().copied().filter(|&i| i != victim).collect();
    let want = hops_of(cluster, &rest);
    let gone = wait_until(
        "the upstream drops the dead next hop",
        opts.probe_bound(),
        || Ok(upstream_hops(cluster)? == want),
    );
    out.detection_ms = gone.as_ref().ok().map(|_| ms(t0.elapsed()));
    out.extra
        .insert("upstream_withdraw_ms".into(), json!(out.detection_ms));
    out.check(
        gone.is_ok(),
        "the upstream route kept the dead gateway's next hop",
    );
    std::thread::sleep(opts.after);
    cluster.topo.restore_node(victim)?;
    let agent = cluster.spawn_agent(victim)?;
    cluster.agents[victim] = Some(agent);
    share_back(cluster, opts, out, &name)?;
    Ok(cluster.topo.nodes[victim].underlay_ip.to_string())
}

/// Waits (from now) until the upstream has every gateway's next hop
/// again: `name` took its share back.
fn share_back(cluster: &Cluster, opts: &Options, out: &mut Outcome, name: &str) -> Result<()> {
    let back = Instant::now();
    let all = hops_of(cluster, &gateway_indexes());
    let returned = wait_until(
        "the upstream takes the gateway back",
        opts.heartbeat_bound() + Duration::from_secs(10),
        || Ok(upstream_hops(cluster)? == all),
    );
    out.extra.insert(
        "return_ms".into(),
        json!(returned.as_ref().ok().map(|_| ms(back.elapsed()))),
    );
    out.check(
        returned.is_ok(),
        format!("{name} did not take its share back"),
    );
    Ok(())
}

/// Cuts the second gateway from the datastore only: it must fence itself
/// (stop announcing) within the eviction timeout, and the upstream must drop
/// its next hop; once the datastore is back it takes its share again.
fn partition_and_return(cluster: &Cluster, opts: &Options, out: &mut Outcome) -> Result<String> {
    let all = gateway_indexes();
    let victim = all[1];
    let name = cluster.topo.nodes[victim].name.clone();
    let t0 = Instant::now();
    super::block_datastore(cluster, victim, true)?;
    say(&format!(
        "fault: {name} cut from the datastore; its datapath stays up"
    ));
    let bound = opts.eviction() + opts.slack;
    let silent = wait_until("the partitioned gateway stops announcing", bound, || {
        Ok(!cluster.announcers(AA_EIP).contains(&victim))
    });
    out.extra.insert(
        "fenced_ms".into(),
        json!(silent.as_ref().ok().map(|_| ms(t0.elapsed()))),
    );
    out.check(
        silent.is_ok(),
        format!("{name} kept announcing past the eviction timeout"),
    );
    let rest: Vec<usize> = all.iter().copied().filter(|&i| i != victim).collect();
    let want = hops_of(cluster, &rest);
    let gone = wait_until("the upstream drops its next hop", bound, || {
        Ok(upstream_hops(cluster)? == want)
    });
    out.detection_ms = gone.as_ref().ok().map(|_| ms(t0.elapsed()));
    out.check(
        gone.is_ok(),
        "the upstream kept the partitioned gateway's next hop",
    );
    std::thread::sleep(opts.after);
    super::block_datastore(cluster, victim, false)?;
    share_back(cluster, opts, out, &name)?;
    Ok(cluster.topo.nodes[victim].underlay_ip.to_string())
}

/// Kills the reflector (SIGKILL) and starts it again, watching the
/// upstream's route the whole time: it must never lose a next hop.
fn restart_reflector(cluster: &mut Cluster, opts: &Options, out: &mut Outcome) -> Result<()> {
    let all = hops_of(cluster, &gateway_indexes());
    let mut old = cluster.reflector.take().context("the reflector")?;
    old.kill();
    drop(old);
    say("fault: reflector killed (SIGKILL)");
    cluster.reflector = Some(cluster.spawn_reflector()?);
    say("reflector started again");
    let until = Instant::now() + opts.after + Duration::from_secs(5);
    let mut fewest = all.len();
    while Instant::now() < until {
        fewest = fewest.min(upstream_hops(cluster)?.intersection(&all).count());
        std::thread::sleep(Duration::from_millis(20));
    }
    out.extra
        .insert("upstream_fewest_next_hops".into(), json!(fewest));
    out.check(
        fewest == all.len(),
        format!(
            "the upstream lost a next hop during the restart ({fewest} of {})",
            all.len()
        ),
    );
    Ok(())
}

fn count_by(flows: &BTreeMap<u16, String>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for g in flows.values() {
        *out.entry(g.clone()).or_default() += 1;
    }
    out
}

/// The server's address, for the flows' targets.
fn server(port: u16) -> String {
    format!("{SERVER_IP}:{port}")
}
