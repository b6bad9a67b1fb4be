//! ActiveActive on the worker: new flows spread over the policy's gateways
//! by hash, a flow keeps its gateway, and when a gateway leaves only its
//! flows move (keeping their EIP and port); when it comes back they return.

use std::collections::{BTreeMap, BTreeSet};

use crate::testrun::*;
use crate::worker::outer_vxlan;
use egress_tests::Netns;

const GATEWAYS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 100, 0, 11),
    Ipv4Addr::new(10, 100, 0, 12),
    Ipv4Addr::new(10, 100, 0, 13),
];
const FLOWS: u16 = 60;

/// Policy 7 of the shared set-up, held by `gateways`.
fn spread_over(gateways: &[Ipv4Addr]) -> DesiredMaps {
    let mut d = desired();
    d.policies[0].spread = gateways.iter().map(|g| IpAddr::V4(*g)).collect();
    d
}

/// (gateway, EIP port) of every flow's next packet, by pod source port.
fn where_flows_go(fx: &mut Fixture, vni: u32) -> anyhow::Result<BTreeMap<u16, (Ipv4Addr, u16)>> {
    let mut out = BTreeMap::new();
    for sport in 20000..20000 + FLOWS {
        let (rc, frame) = fx.run("worker_egress", &udp4(POD, SERVER, sport, 53, b"q"))?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        let to = outer_destination(&frame);
        let inner = check(&outer_vxlan(&frame, vni, to));
        assert_eq!(inner.src, IpAddr::from(EIP));
        out.insert(sport, (to, inner.sport));
    }
    Ok(out)
}

fn outer_destination(frame: &[u8]) -> Ipv4Addr {
    match SlicedPacket::from_ethernet(frame).expect("parses").net {
        Some(NetSlice::Ipv4(ip)) => ip.header().destination_addr(),
        _ => panic!("outer not IPv4"),
    }
}

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn flows_spread_over_the_gateways_and_only_a_gone_gateways_flows_move() -> anyhow::Result<()> {
    let ns = Netns::new("spread")?;
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
    ns.ip(&["link", "set", "up1", "up"])?;
    ns.ip(&["link", "set", "up0", "up"])?;
    ns.enable_forwarding()?;
    ns.ip(&["addr", "add", &format!("{WORKER_TUNNEL}/24"), "dev", "up0"])?;
    let uplink: serde_json::Value =
        serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", "up0"])?)?;
    let uplink_ifindex = uplink[0]["ifindex"].as_u64().unwrap() as u32;
    ns.enter(move || {
        let with = |gws: &[Ipv4Addr]| {
            let mut d = spread_over(gws);
            d.config.uplink_ifindex = uplink_ifindex;
            d
        };
        let all = with(&GATEWAYS);
        let vni = all.config.vni;
        let mut fx = fixture_with(&all)?;
        let first = where_flows_go(&mut fx, vni)?;
        let used: BTreeSet<Ipv4Addr> = first.values().map(|(g, _)| *g).collect();
        assert_eq!(used, GATEWAYS.into_iter().collect(), "{first:?}");
        // A flow's next packets (the established path) keep its gateway.
        assert_eq!(where_flows_go(&mut fx, vni)?, first);

        // The second gateway leaves: its flows go to the other two, the
        // others do not move, and no flow changes its EIP port.
        let gone = GATEWAYS[1];
        let rest = [GATEWAYS[0], GATEWAYS[2]];
        apply(&mut fx.dp, &with(&rest))?;
        let without = where_flows_go(&mut fx, vni)?;
        for (sport, (gw, port)) in &first {
            let (now, now_port) = without[sport];
            assert_eq!(now_port, *port, "flow {sport} kept its EIP port");
            if *gw == gone {
                assert!(rest.contains(&now), "flow {sport} moved to {now}");
            } else {
                assert_eq!(now, *gw, "flow {sport} stayed on its gateway");
            }
        }
        // It comes back: exactly its flows return to it.
        apply(&mut fx.dp, &all)?;
        assert_eq!(where_flows_go(&mut fx, vni)?, first);
        assert_eq!(fx.all_drops(), 0);
        Ok(())
    })
}
