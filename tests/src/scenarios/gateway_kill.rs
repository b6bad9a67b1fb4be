//! `gateway-kill`, and the two scenarios that start the same way:
//! `controller-kill` and `gateway-recover`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use super::{
    ds_watch::{assignments, duplicates, record_datastore},
    ms, say,
    stage::{stage, start_udp, stop_udp, UDP2_PORT},
    tracker::{
        check_event, check_no_dual_announce_after_eviction, check_one_announcer_at_end, check_tcp,
        check_udp, record_dual_announce, stop_and_check_traffic, tunnel_phase, wait_new_owner,
    },
    Bins, Options, Outcome,
};
use crate::cluster::wait_until;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    Kill,
    ControllerKill,
    Recover,
}

/// `gateway-kill`, and the two scenarios that start the same way.
pub(super) fn gateway_kill(bins: &Bins, opts: &Options, variant: Variant) -> Result<Outcome> {
    let name = match variant {
        Variant::Kill => "gateway-kill",
        Variant::ControllerKill => "controller-kill",
        Variant::Recover => "gateway-recover",
    };
    let controllers = if variant == Variant::ControllerKill {
        2
    } else {
        1
    };
    let (mut st, mut out) = stage(bins, opts, controllers, name)?;
    let (old, old_name) = st.owner_and_name();
    let mut leader = None;
    if variant == Variant::ControllerKill {
        // Controller 0 started first; whichever leads says so once.
        for i in 0..2 {
            if st.cluster.wait_leading(i, Duration::from_secs(3)).is_ok() {
                leader = Some(i);
                break;
            }
        }
        let l = leader.context("no controller says it leads")?;
        say(&format!("controller-{l} leads"));
    }
    std::thread::sleep(opts.settle);

    let t0 = Instant::now();
    st.cluster.kill_agent(old);
    st.cluster.topo.cut_node(old)?;
    say(&format!(
        "fault: {old_name}'s agent killed (SIGKILL) and its link cut"
    ));
    let probes = opts.timers.probe.is_some() && st.cluster.agents_probe();
    let mut bound = if probes {
        opts.probe_bound()
    } else {
        opts.heartbeat_bound()
    };

    let mut dup_seen = Vec::new();
    if let Some(l) = leader {
        // Kill the leader during the failover, before it can move the EIP.
        std::thread::sleep(opts.eviction() / 2);
        let killed = Instant::now();
        st.cluster.kill_controller(l);
        say(&format!(
            "controller-{l} (leader) killed at +{} ms",
            ms(killed - t0)
        ));
        let other = 1 - l;
        let lease = opts.lease();
        let takeover_bound = lease + lease / 3 + opts.slack;
        let taken = st
            .cluster
            .wait_leading(other, takeover_bound)
            .map(|_| killed.elapsed());
        match &taken {
            Ok(d) => say(&format!("controller-{other} took over after {} ms", ms(*d))),
            Err(e) => say(&format!("controller-{other} did not take over: {e:#}")),
        }
        out.extra.insert(
            "takeover_ms".into(),
            json!(taken.as_ref().ok().map(|d| ms(*d))),
        );
        out.check(
            taken.is_ok(),
            format!(
                "the other controller did not lead within {} ms (lease {} + lease/3 + slack)",
                ms(takeover_bound),
                ms(lease)
            ),
        );
        // The new leader gives every node a full timeout from its start.
        bound = (killed - t0) + takeover_bound + opts.heartbeat_bound();
    }

    let moved = wait_new_owner(&st.tracker, old, t0, bound);
    let new = match moved {
        Some((at, node)) => {
            let d = at - t0;
            st.note_new_owner(&mut out, node, d, "the fault");
            Some(node)
        }
        None => {
            out.check(
                false,
                format!("no other node announced the EIP within {} ms", ms(bound)),
            );
            None
        }
    };
    if let Some(n) = new {
        out.check(
            st.cluster.topo.nodes[n].name.starts_with('g'),
            "the EIP moved to a node that is not a gateway",
        );
        out.extra
            .insert("new_owner".into(), json!(st.cluster.topo.nodes[n].name));
    }
    out.extra.insert("old_owner".into(), json!(old_name));
    std::thread::sleep(opts.after);
    if new.is_some() {
        check_event(&mut out, &st.cluster, &old_name, "HeartbeatTimeout");
    }

    if variant == Variant::Recover {
        let report1 = st.traffic.stop_udp()?;
        check_udp(&mut out, &report1, &st.eip, bound);
        // A second UDP stream over the return of the node; the TCP
        // connection keeps running across both phases.
        let udp2 = start_udp(&st.cluster, bins, UDP2_PORT, opts.udp_interval_ms)?;
        std::thread::sleep(opts.settle);
        let back = Instant::now();
        st.cluster.topo.restore_node(old)?;
        let agent = st.cluster.spawn_agent(old)?;
        st.cluster.agents[old] = Some(agent);
        say(&format!(
            "{old_name} is back: link up, agent restarted ({} ms)",
            ms(back.elapsed())
        ));
        let ready = wait_until(
            "the returned node's tunnel is Ready again",
            opts.heartbeat_bound() + Duration::from_secs(5),
            || Ok(tunnel_phase(&st.cluster, &old_name).as_deref() == Some("Ready")),
        );
        out.extra.insert(
            "recovered_ready_ms".into(),
            json!(ready.as_ref().ok().map(|_| ms(back.elapsed()))),
        );
        out.check(
            ready.is_ok(),
            format!("{old_name}'s EgressTunnel did not return to Ready"),
        );
        check_event(&mut out, &st.cluster, &old_name, "Ready");
        // Nothing moves back, for a while.
        let observe = (2 * opts.eviction()).max(Duration::from_secs(3));
        std::thread::sleep(observe);
        let end = Instant::now();
        let r2 = stop_udp(udp2, opts.udp_interval_ms)?;
        let gap2 = r2.gap_ms;
        say(&format!(
            "second UDP stream over the return: gap {:.0} ms, lost {} of {}",
            gap2.unwrap_or(-1.0),
            r2.lost,
            r2.sent
        ));
        out.extra.insert(
            "recover_gap_ms".into(),
            json!(gap2.map(|g| g.round() as u64)),
        );
        out.check(
            !st.tracker.announced_between(old, back, end),
            format!("{old_name} announced the EIP again after its return"),
        );
        if let Some(n) = new {
            out.check(
                st.tracker.now(n).announced,
                "the new owner stopped announcing after the old node returned",
            );
            let list = assignments(&st.cluster)?;
            let owners: Vec<&String> = list
                .iter()
                .filter(|(ip, _, _)| *ip == st.eip)
                .map(|(_, n, _)| n)
                .collect();
            out.check(
                owners == [&st.cluster.topo.nodes[n].name],
                format!("the EIP's assignment moved after the return: {owners:?}"),
            );
        }
        out.check(
            gap2.is_some_and(|g| g < 1000.0) && r2.lost < 100 && r2.sources == [st.eip.clone()],
            format!(
                "the return disturbed the traffic: gap {gap2:?} ms, lost {}, sources {:?}",
                r2.lost, r2.sources
            ),
        );
        let tcp = st.traffic.stop_tcp()?;
        check_tcp(&mut out, &tcp);
        check_one_announcer_at_end(&mut out, &st.tracker);
        record_dual_announce(&mut out, &st.tracker, t0, opts.eviction());
    } else {
        record_dual_announce(&mut out, &st.tracker, t0, opts.eviction());
        stop_and_check_traffic(&mut out, &mut st, bound)?;
        check_one_announcer_at_end(&mut out, &st.tracker);
        if variant == Variant::ControllerKill {
            if let Ok(list) = assignments(&st.cluster) {
                dup_seen.extend(duplicates(&list));
            }
            dup_seen.extend(st.ds.duplicates());
            dup_seen.sort();
            dup_seen.dedup();
            out.extra
                .insert("duplicate_allocations".into(), json!(dup_seen));
            out.check(
                dup_seen.is_empty(),
                format!("EIPs assigned to two nodes at once: {dup_seen:?}"),
            );
        }
    }
    check_no_dual_announce_after_eviction(&mut out);
    record_datastore(&mut out, &st.ds, &st.eip, &old_name, t0);
    st.finish(out)
}
