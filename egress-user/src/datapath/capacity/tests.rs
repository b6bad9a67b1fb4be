//! Unit tests of the placement: what fits, what stands in, what is reported.

use std::net::Ipv4Addr;

use super::*;

fn rule(id: u32, priority: i32, sources: &[&str], dests: &[&str]) -> PolicyRule {
    PolicyRule::for_test(
        id,
        priority,
        sources.iter().map(|s| s.parse().unwrap()).collect(),
        dests.iter().map(|s| s.parse().unwrap()).collect(),
    )
}

/// `n` distinct /24 destinations under 100.64.0.0/10.
fn many_dests(n: u32) -> Vec<String> {
    (0..n)
        .map(|i| format!("100.{}.{}.0/24", 64 + i / 256, i % 256))
        .collect()
}

const BIG: Caps = Caps {
    slots: 8,
    src_entries: 64,
    dst_entries: 64,
    eips: 16,
};

#[test]
fn everything_that_fits_is_applied_unchanged() {
    let a = rule(1, 0, &["10.244.1.5/32"], &["192.0.2.0/24"]);
    let b = rule(2, 1, &["10.244.1.6/32"], &[]);
    let p = place(&[&a, &b], &[], BIG);
    assert_eq!(p.rules, vec![a, b]);
    assert!(p.over.is_empty());
}

#[test]
fn too_many_destinations_stand_in_fail_closed_and_the_rest_still_applies() {
    let d = many_dests(100);
    let d: Vec<&str> = d.iter().map(String::as_str).collect();
    let big = rule(7, 0, &["10.244.1.5/32"], &d);
    let after = rule(8, 1, &["10.244.1.6/32"], &["203.0.113.0/24"]);
    let p = place(&[&big, &after], &[], BIG);
    assert_eq!(
        p.over,
        vec![OverCapacity {
            policy_id: 7,
            limit: Limit::DestinationCidrs,
            count: 100,
            max: 64
        }]
    );
    let s = &p.rules[0];
    assert!(s.no_gateway && s.eip_v4.is_none(), "stand-in drops: {s:?}");
    assert_eq!(s.sources, big.sources);
    assert!(s.destinations.len() < 64, "{}", s.destinations.len());
    for want in &big.destinations {
        assert!(
            s.destinations.iter().any(|c| c.contains(want)),
            "{want:?} not covered by the stand-in"
        );
    }
    assert_eq!(p.rules[1], after, "a later policy that fits is applied");
}

#[test]
fn with_the_trie_full_the_stand_in_covers_everything() {
    let caps = Caps {
        dst_entries: 3,
        ..BIG
    };
    let full = rule(1, 0, &["10.244.1.1/32"], &["192.0.2.0/24"]);
    let over = rule(
        2,
        1,
        &["10.244.1.2/32"],
        &["198.51.100.0/24", "2001:db8::/32"],
    );
    let p = place(&[&full, &over], &[], caps);
    assert_eq!(p.over.len(), 1);
    let s = &p.rules[1];
    assert!(s.no_gateway);
    assert_eq!(s.destinations, always_present().to_vec());
}

#[test]
fn too_many_sources_are_reported_as_source_pods() {
    let caps = Caps {
        src_entries: 4,
        ..BIG
    };
    let pods: Vec<String> = (1..=10).map(|i| format!("10.244.1.{i}/32")).collect();
    let pods: Vec<&str> = pods.iter().map(String::as_str).collect();
    let p = place(&[&rule(3, 0, &pods, &["192.0.2.0/24"])], &[], caps);
    assert_eq!(p.over[0].limit, Limit::SourcePods);
    assert_eq!((p.over[0].count, p.over[0].max), (10, 4));
    assert!(p.rules[0].no_gateway && p.rules[0].sources.len() <= 2);
}

#[test]
fn past_the_slots_the_last_one_is_shared_and_fails_closed() {
    let rules: Vec<PolicyRule> = (1..=11)
        .map(|i| {
            rule(
                i,
                i as i32,
                &[&format!("10.244.1.{i}/32")],
                &["192.0.2.0/24"],
            )
        })
        .collect();
    let refs: Vec<&PolicyRule> = rules.iter().collect();
    let p = place(&refs, &[], BIG);
    assert_eq!(p.rules.len(), 8);
    assert_eq!(&p.rules[..7], &rules[..7]);
    let shared = &p.rules[7];
    assert_eq!(shared.id, OVERFLOW_POLICY_ID);
    assert!(shared.no_gateway);
    assert_eq!(shared.sources.len(), 4, "the sources of policies 8..=11");
    let left: Vec<(u32, Limit, usize, usize)> = p
        .over
        .iter()
        .map(|o| (o.policy_id, o.limit, o.count, o.max))
        .collect();
    assert_eq!(
        left,
        (8..=11)
            .map(|i| (i, Limit::PolicySlots, 11, 8))
            .collect::<Vec<_>>()
    );
}

#[test]
fn summarize_shortens_only_as_far_as_needed() {
    let have: BTreeSet<Cidr> = always_present().into();
    let p: Vec<Cidr> = ["10.1.1.0/24", "10.1.2.0/24", "10.2.0.0/24"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(summarize(&p, &have, 3), p);
    let two = summarize(&p, &have, 2);
    assert_eq!(two.len(), 2);
    assert!(p.iter().all(|c| two.iter().any(|s| s.contains(c))));
    assert_eq!(
        summarize(&p, &have, 0),
        vec!["0.0.0.0/0".parse::<Cidr>().unwrap()]
    );
    assert!(summarize(&[], &have, 0).is_empty());
}

/// A policy whose EIP would be one more than the port-block table holds
/// stands in and is reported; a later one reusing a placed EIP still fits.
#[test]
fn a_policy_past_the_eip_table_is_reported_and_fails_closed() {
    let caps = Caps { eips: 2, ..BIG };
    let with_eip = |id: u32, last: u8| PolicyRule {
        eip_v4: Some(Ipv4Addr::new(198, 51, 100, last)),
        ..rule(id, id as i32, &[&format!("10.244.1.{id}/32")], &[])
    };
    let rules = [
        with_eip(1, 1),
        with_eip(2, 2),
        with_eip(3, 3),
        with_eip(4, 1),
    ];
    let refs: Vec<&PolicyRule> = rules.iter().collect();
    let p = place(&refs, &[], caps);
    assert_eq!(
        p.over,
        [OverCapacity {
            policy_id: 3,
            limit: Limit::Eips,
            count: 3,
            max: 2
        }]
    );
    assert!(
        p.rules[2].no_gateway && p.rules[2].eip_v4.is_none(),
        "stands in"
    );
    assert_eq!(p.rules[3], rules[3], "an EIP already placed costs nothing");
}
