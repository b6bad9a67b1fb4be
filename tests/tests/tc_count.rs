//! The whole chain on the real kernel: build -> embed -> load -> attach ->
//! count real packets -> read the pinned, BTF-typed map.

use std::time::Duration;

use egress_tests::{egress_bin, link_veth, run, Netns, PinDir};

#[test]
#[ignore = "needs root: creates namespaces and loads BPF programs"]
fn tc_count_counts_real_packets_in_a_pinned_btf_map() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let egress = egress.to_str().unwrap();
    let node = Netns::new("node")?;
    let peer = Netns::new("peer")?;
    link_veth(&node, "eth0", &peer, "eth0")?;
    node.addr("eth0", "10.99.0.1/24")?;
    peer.addr("eth0", "10.99.0.2/24")?;
    let pins = PinDir::new("count")?;
    let pin_dir = pins.path().to_str().unwrap();

    let mut agent = node.spawn(&[
        egress,
        "agent",
        "--pin-dir",
        pin_dir,
        "--count-iface",
        "eth0",
    ])?;
    agent.wait_for_line("ready", Duration::from_secs(20))?;

    // 5 pings of 100 bytes of payload: each echo request enters node's eth0.
    // (ARP and the replies' neighbour traffic add a few more packets.)
    peer.exec(&[
        "ping",
        "-c",
        "5",
        "-i",
        "0.05",
        "-s",
        "100",
        "-W",
        "2",
        "10.99.0.1",
    ])?;

    let json = run(&[egress, "inspect", "--pin-dir", pin_dir, "--json"])?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    let packets = v["iface_stats"]["packets"].as_u64().unwrap();
    let bytes = v["iface_stats"]["bytes"].as_u64().unwrap();
    assert!(
        packets >= 5,
        "expected at least the 5 echo requests, counted {packets}"
    );
    // 100 payload + 8 ICMP + 20 IPv4 + 14 Ethernet = 142 bytes per request.
    assert!(
        bytes >= 5 * 142,
        "expected at least 710 bytes, counted {bytes}"
    );

    // The pinned map carries BTF: bpftool prints the value struct's field names.
    let map_path = format!("{pin_dir}/IFACE_STATS");
    let dump = run(&["bpftool", "-j", "map", "dump", "pinned", &map_path])?;
    assert!(
        dump.contains("\"packets\""),
        "bpftool dump lacks the field name: {dump}"
    );
    assert!(
        dump.contains("\"bytes\""),
        "bpftool dump lacks the field name: {dump}"
    );

    // Stopping the agent leaves the pinned map (state survives restarts).
    agent.terminate()?;
    assert!(
        std::path::Path::new(&map_path).exists(),
        "the map pin must outlive the agent"
    );
    Ok(())
}
