//! Worker drops.

use crate::testrun::*;
use etherparse::icmpv4::DestUnreachableHeader;

#[test]
#[ignore = "needs root: loads BPF programs"]
fn drop_no_port_block() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    // Policy 8 wins for 192.0.2.0/24 and its EIP has no block here.
    let (rc, _) = fx.run(
        "worker_egress",
        &udp4(POD, Ipv4Addr::new(192, 0, 2, 1), 1, 2, b"x"),
    )?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_NO_PORT_BLOCK), 1);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn too_big_non_tcp_with_df_gets_icmp_back_to_the_pod() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let big = vec![0xab; 1500 - 20 - 8];
    let (rc, out) = fx.run_sum_unused("worker_egress", &udp4(POD, SERVER, 5353, 53, &big))?;
    assert_eq!(
        rc, TC_ACT_REDIRECT,
        "the error goes back out of the pod's veth"
    );
    assert_eq!(fx.drops(DROP_TOO_BIG), 1, "counted under too_big");
    assert_eq!(&out[0..6], &POD_MAC, "addressed to the pod");
    let s = check(&out); // IPv4 and ICMP checksums by etherparse
    assert_eq!((s.src, s.dst), (IpAddr::from(SERVER), IpAddr::from(POD)));
    let p = SlicedPacket::from_ethernet(&out)?;
    let Some(TransportSlice::Icmpv4(i)) = p.transport else {
        panic!("not ICMP")
    };
    assert_eq!(
        i.icmp_type(),
        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
            next_hop_mtu: MTU
        })
    );
    // The quote starts with the pod's own packet.
    let q = etherparse::Ipv4HeaderSlice::from_slice(i.payload())?;
    assert_eq!(
        (q.source(), q.destination()),
        (POD.octets(), SERVER.octets())
    );

    let big6 = vec![0xcd; 1500 - 40 - 8];
    let (rc, out) = fx.run_sum_unused("worker_egress", &udp6(POD6, SERVER6, 5353, 53, &big6))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out); // ICMPv6 checksum by etherparse
    assert_eq!((s.src, s.dst), (IpAddr::from(SERVER6), IpAddr::from(POD6)));
    let p = SlicedPacket::from_ethernet(&out)?;
    let Some(TransportSlice::Icmpv6(i)) = p.transport else {
        panic!("not ICMPv6")
    };
    assert_eq!(
        i.icmp_type(),
        Icmpv6Type::PacketTooBig {
            mtu: u32::from(MTU)
        }
    );
    assert_eq!(fx.drops(DROP_TOO_BIG), 2);
    // TCP of the same size is not answered: its MSS is clamped instead.
    Ok(())
}

/// One port per block and one block (port 50000), UDP entries idle after
/// `udp_timeout` seconds.
fn one_port(udp_timeout: u32) -> anyhow::Result<Fixture> {
    let mut d = desired();
    d.config.port_block_size = 1;
    d.port_blocks[0].blocks = vec![50000];
    d.config.timeouts.udp = udp_timeout;
    fixture_with(&d)
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn drop_ports_exhausted() -> anyhow::Result<()> {
    // A second flow to the same server and port finds no free port.
    let mut fx = one_port(NatTimeouts::default().udp)?;
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1000, 53, b"a"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).sport, 50000);
    let (rc, _) = fx.run_sum_unused("worker_egress", &udp4(POD, SERVER, 1001, 53, b"b"))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "refused with ICMP back to the pod");
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 1);
    // Another destination port may reuse the same EIP port.
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1001, 54, b"c"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).sport, 50000);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn an_idle_translation_past_its_protocol_timeout_frees_its_port() -> anyhow::Result<()> {
    // UDP entries expire at once.
    let mut fx = one_port(0)?;
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1000, 53, b"a"))?;
    assert_eq!((rc, check(&out).sport), (TC_ACT_REDIRECT, 50000));
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1001, 53, b"b"))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "the idle flow's port is taken over");
    assert_eq!(check(&out).sport, 50000);
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 0);
    // The reply now belongs to the new flow.
    let (rc, out) = fx.run("tunnel_ingress", &udp4(SERVER, EIP, 53, 50000, b"r"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).dport, 1001);
    // TCP keeps its own (long) timeout: a second TCP flow finds no port.
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, 2000, 53, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, _) = fx.run_sum_unused("worker_egress", &tcp4(POD, SERVER, 2001, 53, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "refused with ICMP back to the pod");
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 1);
    Ok(())
}

/// The NAT's clock moves (the programs read the coarse clock once per tick
/// and CPU, `clock::coarse_ns`): a UDP translation idle for its 1 s
/// timeout gives its port up; before, the port is still taken.
#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_translation_frees_its_port_once_idle_for_its_timeout() -> anyhow::Result<()> {
    let mut fx = one_port(1)?;
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1000, 53, b"a"))?;
    assert_eq!((rc, check(&out).sport), (TC_ACT_REDIRECT, 50000));
    let (rc, _) = fx.run_sum_unused("worker_egress", &udp4(POD, SERVER, 1001, 53, b"b"))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "still in use: refused");
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 1);
    // The timeout itself is what is tested: wait it out (plus a tick).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1001, 53, b"b"))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "the idle flow's port is taken over");
    assert_eq!(check(&out).sport, 50000);
    Ok(())
}
