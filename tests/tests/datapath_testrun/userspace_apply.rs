//! Userspace apply.

use crate::open_flow;
use crate::testrun::*;

#[test]
#[ignore = "needs root: loads BPF programs"]
fn apply_writes_only_the_difference() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    // The same desired state again: nothing is written or removed.
    let again = apply(&mut fx.dp, &desired())?;
    assert_eq!(
        (again.total_written(), again.total_removed()),
        (0, 0),
        "{again:?}"
    );
    // An established flow keeps working across a resync that changes nothing.
    let p = open_flow(&mut fx, &udp4(POD, SERVER, 5353, 53, b"q"));
    // One more owned EIP and one steering entry fewer: exactly those change.
    let mut d = desired();
    d.owned_eips.push(OwnedEip {
        eip: Ipv4Addr::new(198, 51, 100, 77).into(),
        answer_neigh: true,
        node_ip: false,
        epoch: 3,
    });
    d.reply_steering.pop();
    let r = apply(&mut fx.dp, &d)?;
    assert_eq!(r.written[egress_common::maps::OWNED_EIPS], 1, "{r:?}");
    assert_eq!(r.removed[egress_common::maps::REPLY_STEERING], 1, "{r:?}");
    // ... and the config, for its new gateway epoch (the gateway caches).
    assert_eq!(r.written[egress_common::maps::CONFIG], 1, "{r:?}");
    assert_eq!((r.total_written(), r.total_removed()), (2, 1), "{r:?}");
    let (rc, out) = fx.run("tunnel_ingress", &udp4(SERVER, EIP, 53, p, b"a"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).dport, 5353);
    // A policy change rewrites the tables it touches and bumps the epoch.
    let mut d2 = d.clone();
    d2.policies[0].excluded.push(cidr("203.0.113.0/28"));
    let r = apply(&mut fx.dp, &d2)?;
    assert!(r.written[egress_common::maps::POLICY_DST] >= 1, "{r:?}");
    assert_eq!(
        r.written[egress_common::maps::CONFIG],
        1,
        "new policy epoch: {r:?}"
    );
    assert_eq!(r.written[egress_common::maps::PORT_BLOCKS], 0, "{r:?}");
    // The established flow now goes to an excluded destination: normal path.
    let pkt = udp4(POD, SERVER, 5353, 53, b"q");
    let (rc, out) = fx.run("worker_egress", &pkt)?;
    assert_eq!(
        (rc, out),
        (TC_ACT_OK, pkt),
        "an old NAT entry does not outlive the policy"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn no_gateway_policies_fail_closed() -> anyhow::Result<()> {
    // Policy 9 (highest precedence) has no EIP and no gateway yet: what it
    // matches is dropped and counted, never sent out with the pod's address.
    let mut d = desired();
    d.policies.push(PolicyRule::fail_closed(
        9,
        1,
        vec![Cidr::host(POD.into()), Cidr::host(POD6.into())],
        vec![cidr("198.18.0.0/15"), cidr("2001:db8:f::/48")],
        vec![],
    ));
    let mut fx = fixture_with(&d)?;
    let pending4 = Ipv4Addr::new(198, 18, 0, 1);
    let pending6 = Ipv6Addr::new(0x2001, 0xdb8, 0xf, 0, 0, 0, 0, 1);
    let (rc, _) = fx.run("worker_egress", &udp4(POD, pending4, 5000, 53, b"q"))?;
    assert_eq!(rc, TC_ACT_SHOT, "IPv4 to the pending policy's destination");
    let (rc, _) = fx.run("worker_egress", &tcp6(POD6, pending6, 5001, 443))?;
    assert_eq!(rc, TC_ACT_SHOT, "IPv6 too, whatever the family");
    assert_eq!(fx.drops(DROP_NO_GATEWAY), 2);
    assert_eq!(fx.all_drops(), 2, "counted under no_gateway only");
    assert_eq!(
        stats::read_drops(fx.pins.path())?[DROP_NO_GATEWAY as usize].0,
        "no_gateway"
    );
    // Pods it does not select and destinations it does not cover are untouched.
    let (rc, out) = fx.run("worker_egress", &udp4(POD_OTHER, pending4, 5000, 53, b"q"))?;
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(check(&out).src, IpAddr::from(POD_OTHER));
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 5002, 53, b"q"))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "policy 7 still applies");
    assert_eq!(check(&out).src, IpAddr::from(EIP));

    // An established flow whose policy loses its gateway (its endpoint is
    // gone): the next packet is dropped, not sent untranslated, even though
    // its NAT entry is still there; it is translated again once the gateway is back.
    let flow = udp4(POD, SERVER, 5003, 53, b"e");
    let (rc, out) = fx.run("worker_egress", &flow)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let port = check(&out).sport;
    let mut lost = d.clone();
    let p7 = lost.policies.iter_mut().find(|p| p.id == 7).unwrap();
    p7.no_gateway = true;
    p7.eip_v4 = None;
    p7.eip_v6 = None;
    apply(&mut fx.dp, &lost)?;
    let (rc, _) = fx.run("worker_egress", &flow)?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_NO_GATEWAY), 3);
    apply(&mut fx.dp, &d)?;
    let (rc, out) = fx.run("worker_egress", &flow)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!(
        (s.src, s.sport),
        (IpAddr::from(EIP), port),
        "same translation"
    );
    Ok(())
}
