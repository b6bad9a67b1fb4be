//! `gateway-link-down`, and the management link that keeps the owner's
//! datastore reachable while its underlay is down.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use super::{
    ds_watch::record_datastore,
    ms, say,
    stage::stage,
    tracker::{
        check_event, check_no_dual_announce_after_eviction, check_not_heartbeat_timeout,
        check_one_announcer_at_end, record_dual_announce, stop_and_check_traffic, wait_new_owner,
    },
    Bins, Options, Outcome,
};
use crate::cluster::{wait_until, Cluster};

/// Gives node `i` a management link to the fabric that carries only its
/// TCP to and from etcd (policy routing on both ends), so the underlay port
/// can die while the datastore stays reachable.
pub fn add_management_link(cluster: &Cluster, i: usize) -> Result<()> {
    let node = &cluster.topo.nodes[i];
    let fab = &cluster.topo.fabric;
    let port = format!("m{}", node.index);
    crate::link_veth(&node.ns, "mgmt0", fab, &port)?;
    let v6 = cluster.topo.ipv6_underlay;
    let (fab_ip, node_ip, len) = if v6 {
        (
            format!("fd00:11:{}::1", node.index),
            format!("fd00:11:{}::2", node.index),
            64,
        )
    } else {
        (
            format!("10.11.{}.1", node.index),
            format!("10.11.{}.2", node.index),
            30,
        )
    };
    fab.addr(&port, &format!("{fab_ip}/{len}"))?;
    node.ns.addr("mgmt0", &format!("{node_ip}/{len}"))?;
    for (ns, dev) in [(&node.ns, "mgmt0"), (fab, port.as_str())] {
        ns.sysctl(&[
            "net.ipv4.conf.all.rp_filter=0",
            &format!("net.ipv4.conf.{dev}.rp_filter=0"),
        ])?;
    }
    let family = if v6 { "-6" } else { "-4" };
    let etcd = cluster.topo.fabric_ip().to_string();
    let ds_port = cluster.datastore_port().to_string();
    let node_addr = node.underlay_ip.to_string();
    // Node: its datastore traffic (source: its underlay address) via mgmt0.
    node.ns.ip(&[
        family, "route", "add", "default", "via", &fab_ip, "dev", "mgmt0", "table", "100",
    ])?;
    node.ns.ip(&[
        family, "rule", "add", "to", &etcd, "ipproto", "tcp", "dport", &ds_port, "lookup", "100",
        "priority", "100",
    ])?;
    // Fabric: etcd's replies to that node via the management port.
    fab.ip(&[
        family, "route", "add", &node_addr, "via", &node_ip, "dev", &port, "table", "100",
    ])?;
    fab.ip(&[
        family, "rule", "add", "to", &node_addr, "ipproto", "tcp", "sport", &ds_port, "lookup",
        "100", "priority", "100",
    ])?;
    Ok(())
}

/// `gateway-link-down`: the underlay dies, the agent and its datastore stay.
pub(super) fn link_down(bins: &Bins, opts: &Options) -> Result<Outcome> {
    let (mut st, mut out) = stage(bins, opts, 1, "gateway-link-down")?;
    let (old, old_name) = st.owner_and_name();
    add_management_link(&st.cluster, old)?;
    say(&format!(
        "{old_name}: etcd traffic now on a separate management link"
    ));
    std::thread::sleep(opts.settle);
    // The agent must still be healthy (its heartbeat on the management link).
    let agent_ok = st.cluster.agent_state(old).is_ok();
    out.check(agent_ok, format!("{old_name}'s agent does not answer"));

    let t0 = Instant::now();
    st.cluster.topo.cut_node(old)?;
    say(&format!(
        "fault: {old_name}'s underlay link cut; agent and datastore stay up"
    ));
    say("note: only the datapath probes can see this fault (the heartbeats go on)");
    let bound = opts.probe_bound();
    let moved = wait_new_owner(&st.tracker, old, t0, bound);
    let new = match moved {
        Some((at, node)) => {
            st.note_new_owner(&mut out, node, at - t0, "the fault");
            Some(node)
        }
        None => {
            out.check(
                false,
                format!(
                    "no other node announced the EIP within {} ms (probe detection + monitor period + slack)",
                    ms(bound)
                ),
            );
            None
        }
    };
    out.extra.insert("old_owner".into(), json!(old_name));
    if let Some(n) = new {
        out.extra
            .insert("new_owner".into(), json!(st.cluster.topo.nodes[n].name));
        // The old owner, alive and reading the datastore, withdraws.
        let silent = wait_until("the old owner withdraws", Duration::from_secs(5), || {
            Ok(!st.tracker.now(old).announced)
        });
        out.check(
            silent.is_ok(),
            format!("{old_name} still announces after the move"),
        );
        check_event(&mut out, &st.cluster, &old_name, "Failed");
    }
    out.check(
        st.tracker.now(old).reachable,
        format!("{old_name}'s agent died during the link failure"),
    );
    // Its heartbeats went on over the management link: the heartbeat path
    // must not be what moved the EIP.
    check_not_heartbeat_timeout(
        &st.cluster,
        &mut out,
        &old_name,
        "old_owner_phase",
        format!("{old_name} went HeartbeatTimeout: its datastore link was cut too"),
    );
    std::thread::sleep(opts.after);
    record_dual_announce(&mut out, &st.tracker, t0, opts.eviction());
    stop_and_check_traffic(&mut out, &mut st, bound)?;
    check_one_announcer_at_end(&mut out, &st.tracker);
    check_no_dual_announce_after_eviction(&mut out);
    record_datastore(&mut out, &st.ds, &st.eip, &old_name, t0);
    st.finish(out)
}
