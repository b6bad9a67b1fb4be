//! Issue 21, point 5: the gateway's reply path in native XDP, chosen by
//! the agent (etcd, controller, agents in namespaces). With
//! `--uplink-xdp=native` every agent attaches `uplink_xdp` to its uplink in
//! driver mode, the EIP owner's forwards and replies leave by `XDP_TX`
//! (its counters grow, the pod still sees its connection work), a
//! restarted agent takes
//! the pinned link over in place, and an agent restarted with the default
//! `auto` on a veth uplink detaches it and says why, the TC path serving
//! the replies from then on.
//!
//! The fabric's ports get an `XDP_PASS` program: a veth's `XDP_TX` frames
//! are only received where its peer runs XDP; and the server and the pods
//! send full checksums, as packets off a wire have them (see
//! `egress_tests::veth_xdp`; a real NIC needs neither).

use anyhow::{Context, Result};
use egress_tests::{
    cluster::{pod_source_seen, Cluster, ClusterSpec},
    egress_bin, metric_sample,
    veth_xdp::{ifindex, tx_checksum_off, PeerProgram, Verdict},
};
use serde_json::Value;

/// The reply path an agent reports in `/state`.
fn reply_path(cluster: &Cluster, i: usize) -> Result<Value> {
    Ok(cluster.agent_state(i)?["uplink_reply_path"].clone())
}

/// `egress_xdp_tx_total` of agent `i`: (replies, forwards).
fn xdp_tx(cluster: &Cluster, i: usize) -> Result<(f64, f64)> {
    let text = cluster.agent_http(i, "/metrics")?;
    let path = |p: &str| {
        metric_sample(&text, "egress_xdp_tx_total", &[("path", p)])
            .with_context(|| format!("no egress_xdp_tx_total{{path={p:?}}}"))
    };
    Ok((path("reply")?, path("forward")?))
}

/// The XDP program attached to node `i`'s uplink, and its mode as the
/// kernel reports it (`ip -d link`: 1 driver, 2 generic).
fn attached_xdp(cluster: &Cluster, i: usize) -> Result<Option<(u64, u64)>> {
    let n = &cluster.topo.nodes[i];
    let out = n.ns.ip(&["-j", "-d", "link", "show", "dev", &n.uplink])?;
    let v: Value = serde_json::from_str(&out)?;
    let xdp = &v[0]["xdp"];
    Ok(xdp["prog"]["id"]
        .as_u64()
        .map(|id| (id, xdp["mode"].as_u64().unwrap_or(0))))
}

/// The fabric's ports get `XDP_PASS` programs and the server and pods send
/// full checksums (see the module's doc); the programs live as long as
/// what is returned.
fn wire_like(cluster: &Cluster) -> Result<Vec<PeerProgram>> {
    let peers = cluster
        .topo
        .nodes
        .iter()
        .map(|n| PeerProgram::attach(&cluster.topo.fabric, &n.fabric_port, Verdict::Pass))
        .collect::<Result<Vec<_>>>()?;
    tx_checksum_off(&cluster.topo.server, "eth0")?;
    for n in &cluster.topo.nodes {
        for p in &n.pods {
            tx_checksum_off(&p.ns, "eth0")?;
        }
    }
    Ok(peers)
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn the_gateway_replies_by_xdp_where_chosen_and_by_tc_otherwise() -> Result<()> {
    let spec = ClusterSpec {
        agent_args: vec!["--uplink-xdp=native".into()],
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(&egress_bin()?, spec)?;
    let _peers = wire_like(&cluster)?;
    let (eip, owner) = cluster.examples_up_and_checked()?;

    for i in [0, owner] {
        let p = reply_path(&cluster, i)?;
        assert_eq!(p["path"], "xdp", "node {i}: {p}");
        assert_eq!(p["driver"], "veth", "node {i}: {p}");
        let (_, mode) = attached_xdp(&cluster, i)?.context("no XDP program on the uplink")?;
        assert_eq!(mode, 1, "node {i}: attached in driver mode");
    }
    // The example traffic went both ways by XDP_TX: the counters moved,
    // and more connections move them further.
    let before = xdp_tx(&cluster, owner)?;
    assert!(
        before.0 > 0.0 && before.1 > 0.0,
        "nothing left by XDP before: {before:?}"
    );
    assert_eq!(pod_source_seen(&cluster, 0, 0)?, eip);
    let after = xdp_tx(&cluster, owner)?;
    // The operator's view of the same counters.
    let egress = egress_bin()?;
    let (egress, pin) = (
        egress.to_str().unwrap(),
        cluster.pin_dir(owner).to_str().unwrap(),
    );
    let json = egress_tests::run(&[egress, "inspect", "--pin-dir", pin, "--json"])?;
    let v: Value = serde_json::from_str(&json)?;
    for path in ["reply", "forward"] {
        let n = v["datapath"]["xdp_tx"][path]["packets"]
            .as_u64()
            .unwrap_or(0);
        assert!(n > 0, "inspect: no {path} sent by XDP: {json}");
    }
    let table = egress_tests::run(&[egress, "inspect", "--pin-dir", pin])?;
    assert!(table.contains("SENT BY XDP"), "{table}");
    assert!(
        after.0 > before.0 && after.1 > before.1,
        "XDP {before:?} -> {after:?}"
    );

    // A restart takes the pinned link over: the program is swapped in place.
    let (old_prog, _) = attached_xdp(&cluster, owner)?.context("XDP before the restart")?;
    cluster.kill_agent(owner);
    cluster.agents[owner] = Some(cluster.spawn_agent(owner)?);
    let p = reply_path(&cluster, owner)?;
    assert_eq!(p["path"], "xdp", "{p}");
    assert!(
        p["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("taken over"),
        "{p}"
    );
    let (new_prog, mode) = attached_xdp(&cluster, owner)?.context("XDP after the restart")?;
    assert_ne!(new_prog, old_prog, "the new agent's program is attached");
    assert_eq!(mode, 1);
    cluster.wait_pod_source(0, 0, &eip, "p11 leaves with the EIP after the restart")?;
    let after_restart = xdp_tx(&cluster, owner)?;
    assert!(
        after_restart.0 > after.0 && after_restart.1 > after.1,
        "XDP {after:?} -> {after_restart:?}"
    );

    // `auto` on a veth: TC alone, the link gone, the reason given.
    cluster.set_agent_args(&[]);
    cluster.kill_agent(owner);
    cluster.agents[owner] = Some(cluster.spawn_agent(owner)?);
    let p = reply_path(&cluster, owner)?;
    assert_eq!(p["path"], "tc", "{p}");
    assert_eq!(p["mode"], "auto", "{p}");
    assert!(
        p["reason"].as_str().unwrap_or_default().contains("veth"),
        "{p}"
    );
    assert_eq!(attached_xdp(&cluster, owner)?, None, "XDP left attached");
    let pin = egress_user::datapath::uplink_xdp::pin_path(
        cluster.pin_dir(owner),
        ifindex(
            &cluster.topo.nodes[owner].ns,
            &cluster.topo.nodes[owner].uplink,
        )?,
    );
    assert!(!pin.exists(), "{} left behind", pin.display());
    let metrics = cluster.agent_http(owner, "/metrics")?;
    assert_eq!(metric_sample(&metrics, "egress_uplink_xdp", &[]), Some(0.0));
    let tc_before = xdp_tx(&cluster, owner)?;
    cluster.wait_pod_source(0, 0, &eip, "p11 leaves with the EIP by the TC path")?;
    assert_eq!(xdp_tx(&cluster, owner)?, tc_before, "a packet left by XDP");
    Ok(())
}

/// On an IPv6-only underlay the owner's replies leave by `XDP_TX` in IPv6
/// outer headers and the workers' IPv6 VXLAN packets are decapsulated and
/// forwarded by `XDP_TX` toward the server (its IPv4 route has an IPv6
/// next hop): both counters grow with the pod's connections, which work.
#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn on_an_ipv6_underlay_the_gateway_replies_by_xdp() -> Result<()> {
    let spec = ClusterSpec {
        agent_args: vec!["--uplink-xdp=native".into()],
        ipv6_underlay: true,
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(&egress_bin()?, spec)?;
    cluster.ensure_ipv6_only()?;
    let _peers = wire_like(&cluster)?;
    let (eip, owner) = cluster.examples_up_and_checked()?;
    let p = reply_path(&cluster, owner)?;
    assert_eq!(p["path"], "xdp", "{p}");
    let before = xdp_tx(&cluster, owner)?;
    assert!(
        before.0 > 0.0 && before.1 > 0.0,
        "nothing left by XDP before: {before:?}"
    );
    assert_eq!(pod_source_seen(&cluster, 0, 0)?, eip);
    let after = xdp_tx(&cluster, owner)?;
    assert!(
        after.0 > before.0 && after.1 > before.1,
        "XDP {before:?} -> {after:?}"
    );
    Ok(())
}
