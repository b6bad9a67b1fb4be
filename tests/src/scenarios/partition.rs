//! `datastore-partition`, and the iptables rules that cut a node from etcd.

use std::time::Instant;

use anyhow::Result;
use serde_json::json;

use super::{
    ds_watch::record_datastore,
    ms, say,
    stage::stage,
    tracker::{
        check_event, check_no_dual_announce_after_eviction, record_dual_announce,
        stop_and_check_traffic, wait_new_owner,
    },
    Bins, Options, Outcome,
};
use crate::cluster::Cluster;

/// Drops TCP 2379 between the fabric's etcd and node `i` (iptables, or
/// ip6tables on an IPv6 underlay, in the fabric).
pub fn block_datastore(cluster: &Cluster, i: usize, block: bool) -> Result<()> {
    let node_ip = cluster.topo.nodes[i].underlay_ip;
    let ip = node_ip.to_string();
    let tables = if node_ip.is_ipv6() {
        "ip6tables"
    } else {
        "iptables"
    };
    let op = if block { "-I" } else { "-D" };
    let fab = &cluster.topo.fabric;
    let port = cluster.datastore_port().to_string();
    fab.exec(&[
        tables, op, "INPUT", "-s", &ip, "-p", "tcp", "--dport", &port, "-j", "DROP",
    ])?;
    fab.exec(&[
        tables, op, "OUTPUT", "-d", &ip, "-p", "tcp", "--sport", &port, "-j", "DROP",
    ])?;
    Ok(())
}

/// `datastore-partition`: the owner loses etcd only; it must fence itself
/// before the timeout, nobody else may announce before it, exactly one
/// node after it.
pub(super) fn datastore_partition(bins: &Bins, opts: &Options) -> Result<Outcome> {
    let (mut st, mut out) = stage(bins, opts, 1, "datastore-partition")?;
    let (old, old_name) = st.owner_and_name();
    std::thread::sleep(opts.settle);
    let t0 = Instant::now();
    block_datastore(&st.cluster, old, true)?;
    say(&format!(
        "fault: TCP 2379 between etcd and {old_name} dropped; its datapath stays up"
    ));
    let eviction = opts.eviction();
    let bound = opts.heartbeat_bound();
    let moved = wait_new_owner(&st.tracker, old, t0, bound);
    // Let the run go on, then read the whole record.
    std::thread::sleep(opts.after);
    // Self-fencing: silent by the eviction timeout (plus one poll period).
    let silent = st.tracker.first_silent(old, t0);
    let fenced_seen = st
        .tracker
        .tracks
        .lock()
        .unwrap()
        .get(old)
        .is_some_and(|tr| tr.iter().any(|s| s.0 > t0 && s.1.fenced && !s.1.announced));
    match silent {
        Some(at) => say(&format!(
            "{old_name} stopped announcing {} ms after the partition (fenced: {fenced_seen})",
            ms(at - t0)
        )),
        None => say(&format!("{old_name} never stopped announcing")),
    }
    out.extra
        .insert("fenced_ms".into(), json!(silent.map(|at| ms(at - t0))));
    // The design says "silent by the eviction timeout"; the agent is a
    // userspace process, so allow the slack for scheduling. What safety
    // needs (nobody else announcing meanwhile) is checked by dual_announce_ms.
    out.check(
        silent.is_some_and(|at| at - t0 <= eviction + opts.slack),
        format!(
            "{old_name} did not fence itself within the eviction timeout ({} ms) + slack: silent after {:?} ms",
            ms(eviction),
            silent.map(|at| ms(at - t0))
        ),
    );
    out.check(
        fenced_seen,
        format!("{old_name}'s /state never showed fenced with nothing announced"),
    );
    match moved {
        Some((at, node)) => {
            st.note_new_owner(&mut out, node, at - t0, "the partition");
            out.extra
                .insert("new_owner".into(), json!(st.cluster.topo.nodes[node].name));
            // g1's last heartbeat may have landed up to one update period
            // before the fault, so the controller may rightly evict it that
            // much earlier than `eviction` after the fault.
            let earliest = eviction.saturating_sub(opts.update());
            out.check(
                at - t0 >= earliest,
                format!(
                    "another node announced {} ms after the partition, before the eviction timeout less one update period ({} ms)",
                    ms(at - t0),
                    ms(earliest)
                ),
            );
        }
        None => out.check(
            false,
            format!("no other node announced the EIP within {} ms", ms(bound)),
        ),
    }
    out.extra.insert("old_owner".into(), json!(old_name));
    if moved.is_some() {
        check_event(&mut out, &st.cluster, &old_name, "HeartbeatTimeout");
    }
    record_dual_announce(&mut out, &st.tracker, t0, eviction);
    let end = st.tracker.announcers_now();
    out.check(
        end.len() == 1 && end[0] != old,
        format!(
            "at the end the EIP is announced by {:?} (expected exactly one node, not {old_name})",
            end.iter()
                .map(|&i| st.cluster.topo.nodes[i].name.clone())
                .collect::<Vec<_>>()
        ),
    );
    stop_and_check_traffic(&mut out, &mut st, bound)?;
    check_no_dual_announce_after_eviction(&mut out);
    // The partitioned owner keeps its datapath, so it must be silent before
    // anyone else speaks: no overlap at all, not only after the timeout.
    out.check(
        out.dual_announce_total_ms == 0,
        format!(
            "two nodes announced the EIP at once for {} ms after the partition",
            out.dual_announce_total_ms
        ),
    );
    let _ = block_datastore(&st.cluster, old, false);
    record_datastore(&mut out, &st.ds, &st.eip, &old_name, t0);
    st.finish(out)
}
