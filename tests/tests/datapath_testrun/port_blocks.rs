//! Port blocks by use, in the worker's program: ports spread over a
//! thousand small blocks, a draining block takes no new flow while its
//! flows' replies still come back, and a flow that finds no port (the
//! worker's blocks full, or the EIP granted it none) is answered with
//! "administratively prohibited" and counted, never dropped silently.

use std::collections::BTreeSet;

use crate::fail_closed::assert_prohibited_v4;
use crate::testrun::*;
use etherparse::IpNumber;

/// `blocks` of `size` ports for the EIP (and nothing else changed).
fn with_blocks(size: u16, blocks: Vec<u16>) -> DesiredMaps {
    let mut d = desired();
    d.config.port_block_size = size;
    d.port_blocks[0].blocks = blocks;
    d
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn flows_spread_over_a_thousand_blocks_each_port_once() -> anyhow::Result<()> {
    let mut fx = fixture_with(&with_blocks(64, (16..1024).collect()))?;
    let mut ports = BTreeSet::new();
    for sport in 0..3000u16 {
        let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 10000 + sport, 53, b"x"))?;
        assert_eq!(rc, TC_ACT_REDIRECT, "flow {sport}");
        let p = check(&out).sport;
        assert!(p >= 1024, "flow {sport}: port {p} below the first block");
        assert!(ports.insert(p), "flow {sport}: port {p} given twice");
    }
    let blocks: BTreeSet<u16> = ports.iter().map(|p| p / 64).collect();
    assert!(
        blocks.len() > 900,
        "3000 flows over 1008 blocks reach most of them, not the first 16: {}",
        blocks.len()
    );
    assert_eq!(fx.all_drops(), 0);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_draining_block_takes_no_new_flow_and_its_replies_still_arrive() -> anyhow::Result<()> {
    let mut fx = fixture_with(&with_blocks(1024, vec![16, 17]))?;
    // Flows until one lands in block 17.
    let (old_sport, old_port) = (0..200u16)
        .map(|i| {
            let (rc, out) = fx
                .run("worker_egress", &udp4(POD, SERVER, 20000 + i, 53, b"x"))
                .unwrap();
            assert_eq!(rc, TC_ACT_REDIRECT);
            (20000 + i, check(&out).sport)
        })
        .find(|(_, p)| p / 1024 == 17)
        .expect("some flow in block 17");
    // Block 17 drains: gone from the worker's blocks, still steered here.
    apply(&mut fx.dp, &with_blocks(1024, vec![16]))?;
    for i in 0..100u16 {
        let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 30000 + i, 53, b"n"))?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(
            check(&out).sport / 1024,
            16,
            "a new flow in the draining block"
        );
    }
    // The old flow keeps its port, both ways.
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, old_sport, 53, b"o"))?;
    assert_eq!((rc, check(&out).sport), (TC_ACT_REDIRECT, old_port));
    let (rc, out) = fx.run("tunnel_ingress", &udp4(SERVER, EIP, 53, old_port, b"r"))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "the reply to the draining block");
    assert_eq!(check(&out).dport, old_sport);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_flow_that_finds_no_port_is_refused_at_once() -> anyhow::Result<()> {
    // One port (block size 1): the second TCP connection to the same
    // server and port finds none.
    let mut d = desired();
    d.config.port_block_size = 1;
    d.port_blocks[0].blocks = vec![50000];
    let mut fx = fixture_with(&d)?;
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, 2000, 443, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, out) = fx.run_sum_unused("worker_egress", &tcp4(POD, SERVER, 2001, 443, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "the answer goes back to the pod");
    assert_prohibited_v4(&out, SERVER, IpNumber::TCP);
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 1);
    assert_eq!(fx.all_drops(), 1);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn an_eip_granted_no_block_refuses_while_one_not_yet_granted_drops() -> anyhow::Result<()> {
    // Policy 8 (192.0.2.0/24) leaves with EIP_NO_BLOCKS. Not granted yet
    // (no entry): dropped, the SYN is retried once the grant arrives.
    let mut d = desired();
    let mut fx = fixture_with(&d)?;
    let to = Ipv4Addr::new(192, 0, 2, 1);
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, to, 3000, 443, true))?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_NO_PORT_BLOCK), 1);
    // The controller found no free block (an empty grant): refused at once.
    d.port_blocks.push(PortBlockGrant {
        eip: EIP_NO_BLOCKS.into(),
        blocks: vec![],
    });
    apply(&mut fx.dp, &d)?;
    let (rc, out) = fx.run_sum_unused("worker_egress", &tcp4(POD, to, 3001, 443, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_prohibited_v4(&out, to, IpNumber::TCP);
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 1);
    Ok(())
}
