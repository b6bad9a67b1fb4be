//! Translation past the map limits: what fits is applied, the rest is
//! reported and its traffic dropped, never left untranslated.

use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::datapath::{
    capacity::{Limit, OVERFLOW_POLICY_ID},
    desired::PolicyRule,
};

/// Policy `i`: pod 10.(i/256).(i%256).1 to 192.0.2.0/24, priority `i`.
fn numbered(i: u32) -> PolicyRule {
    PolicyRule::for_test(
        i + 1,
        i as i32,
        vec![format!("10.{}.{}.1/32", i / 256, i % 256).parse().unwrap()],
        vec!["192.0.2.0/24".parse().unwrap()],
    )
}

fn pod(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, (i / 256) as u8, (i % 256) as u8, 1))
}

/// The target the program would use, with its slot.
fn target_of(m: &MapContents, src: IpAddr, dst: &str) -> Option<EgressTarget> {
    let id = lookup_policy(m, src, dst.parse().unwrap())?;
    m.targets
        .iter()
        .find(|t| t.policy_id == id && t.flags != 0)
        .copied()
}

#[test]
fn more_policies_than_slots_fill_every_slot_and_the_rest_fail_closed() {
    let d = DesiredMaps {
        policies: (0..1100).map(numbered).collect(),
        ..Default::default()
    };
    let m = translate(&d).expect("too many policies is no error");
    let used = m.targets.iter().filter(|t| t.flags != 0).count();
    assert_eq!(used, MAX_POLICY_SLOTS);
    // Slots 0..1023 carry the first 1023 policies, each with its own EIP target.
    for i in [0, 63, 64, 700, 1022] {
        let t = target_of(&m, pod(i), "192.0.2.9").unwrap();
        assert_eq!(
            (t.policy_id, t.flags & TARGET_NO_GATEWAY),
            (i + 1, 0),
            "policy {i}"
        );
    }
    // The rest share the last slot, which drops.
    for i in [1023, 1050, 1099] {
        let t = target_of(&m, pod(i), "192.0.2.9").unwrap();
        assert_eq!(t.policy_id, OVERFLOW_POLICY_ID, "policy {i}");
        assert_ne!(
            t.flags & TARGET_NO_GATEWAY,
            0,
            "policy {i} must fail closed"
        );
    }
    assert_eq!(
        target_of(&m, pod(1099), "203.0.113.1"),
        None,
        "outside every policy"
    );
    let left: Vec<u32> = m.over_capacity.iter().map(|o| o.policy_id).collect();
    assert_eq!(left, (1024..=1100).collect::<Vec<_>>());
    assert!(m
        .over_capacity
        .iter()
        .all(|o| (o.limit, o.count, o.max) == (Limit::PolicySlots, 1100, MAX_POLICY_SLOTS)));
}

#[test]
fn a_policy_with_more_destinations_than_the_trie_is_reported_and_drops() {
    let mut big = numbered(0);
    big.destinations = (0..20_000u32)
        .map(|i| {
            format!("100.{}.{}.0/24", 64 + i / 256, i % 256)
                .parse()
                .unwrap()
        })
        .collect();
    let d = DesiredMaps {
        policies: vec![big, numbered(1)],
        ..Default::default()
    };
    let m = translate(&d).expect("an oversized policy is no error");
    assert!(m.policy_dst.len() <= egress_common::maps::POLICY_TRIE_SIZE as usize);
    assert_eq!(m.over_capacity.len(), 1);
    let o = &m.over_capacity[0];
    assert_eq!(
        (o.policy_id, o.limit, o.count),
        (1, Limit::DestinationCidrs, 20_000)
    );
    for dst in ["100.64.0.1", "100.141.31.200"] {
        let t = target_of(&m, pod(0), dst).unwrap();
        assert_eq!(t.policy_id, 1);
        assert_eq!(t.flags, TARGET_NO_GATEWAY, "{dst}: dropped, not translated");
    }
    let t = target_of(&m, pod(1), "192.0.2.9").unwrap();
    assert_eq!(
        (t.policy_id, t.flags & TARGET_NO_GATEWAY),
        (2, 0),
        "the next one applies"
    );
}

/// More EIPs granted on the node than the port-block table holds: the
/// policies past it fail closed and are reported, and only the placed
/// policies' EIPs are written (the map update does not fail whole).
#[test]
fn more_eips_than_the_port_block_table_are_reported_not_a_failed_update() {
    let eip = |i: u32| Ipv4Addr::new(100, 64 + (i / 256) as u8, (i % 256) as u8, 1);
    let d = DesiredMaps {
        policies: (0..1000)
            .map(|i| PolicyRule {
                eip_v4: Some(eip(i)),
                ..numbered(i)
            })
            .collect(),
        port_blocks: (0..700)
            .map(|i| crate::datapath::desired::PortBlockGrant {
                eip: IpAddr::V4(eip(i)),
                blocks: vec![1],
            })
            .collect(),
        ..Default::default()
    };
    let caps = Caps {
        eips: 600,
        ..NODE_CAPS
    };
    let m = translate_within(&d, caps, &Default::default()).expect("no error past the EIP table");
    assert!(
        m.port_blocks.len() <= 600,
        "{} EIPs written",
        m.port_blocks.len()
    );
    let over: Vec<_> = m
        .over_capacity
        .iter()
        .filter(|o| o.limit == Limit::Eips)
        .collect();
    assert_eq!(over.len(), 400, "policies 600..1000 are past the table");
    assert!(over.iter().all(|o| o.max == 600));
    let t = target_of(&m, pod(700), "192.0.2.9").unwrap();
    assert_ne!(
        t.flags & TARGET_NO_GATEWAY,
        0,
        "a policy past the table drops"
    );
}
