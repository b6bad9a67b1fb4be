//! Per-policy counters by counter slot (`POLICY_STATS`, a per-CPU array):
//! a policy keeps its slot, and its counts, while others come and go, over
//! an agent's restart, and a slot given to a new policy starts from zero.

use crate::testrun::*;
use egress_user::datapath::{apply_with, MapShadow};

/// Policies for other pods (10.250.0.x), ahead of `desired()`'s.
fn others(ids: std::ops::Range<u32>) -> Vec<PolicyRule> {
    ids.map(|id| {
        no_blocks_policy(
            id,
            -1_000 + id as i32,
            vec![Cidr::host(
                Ipv4Addr::new(10, 250, 0, (id % 250) as u8 + 1).into(),
            )],
            vec![cidr("203.0.113.0/24")],
        )
    })
    .collect()
}

fn with_others(ids: std::ops::Range<u32>) -> DesiredMaps {
    let mut d = desired();
    d.policies.extend(others(ids));
    d
}

/// One translated packet of the pod (policy 7); its egress count after it.
fn send(fx: &mut Fixture, sport: u16) -> anyhow::Result<u64> {
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, sport, 443, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    Ok(stats::read_policy_stats(fx.pins.path())?[&7].egress_packets)
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_policy_keeps_its_counts_while_others_come_and_go_and_over_a_restart() -> anyhow::Result<()> {
    let mut fx = fixture_with(&desired())?;
    let mut shadow = MapShadow::default();
    apply_with(&mut fx.dp, &desired(), &mut shadow)?;
    assert_eq!(send(&mut fx, 40000)?, 1);
    // Three policies ahead of it: policy 7 moves slots in the policy table,
    // not in the counters.
    apply_with(&mut fx.dp, &with_others(100..103), &mut shadow)?;
    assert_eq!(send(&mut fx, 40001)?, 2);
    let s = stats::read_policy_stats(fx.pins.path())?;
    for id in 100..103 {
        assert_eq!(s[&id], Default::default(), "policy {id} starts from zero");
    }
    // They leave and others come: still counting on.
    apply_with(&mut fx.dp, &with_others(200..202), &mut shadow)?;
    assert_eq!(send(&mut fx, 40002)?, 3);
    // An agent's restart: a new load over the pins and a first apply
    // without a shadow read the slots back from the pinned table.
    let pins = fx.pins;
    drop(fx.dp);
    let dp = Datapath::load(EBPF_OBJECT, pins.path())?;
    let mut fx = Fixture { dp, pins };
    apply(&mut fx.dp, &with_others(200..203))?;
    assert_eq!(send(&mut fx, 40003)?, 4);
    assert_eq!(
        stats::read_policy_stats(fx.pins.path())?[&202],
        Default::default()
    );
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_slot_given_to_a_new_policy_starts_from_zero() -> anyhow::Result<()> {
    // Policy 100 alone ahead of 7 counts a packet of its pod; then it
    // leaves, and enough policies come and go that its slot is handed out
    // again: the new holder must not inherit its count.
    let mut d = with_others(100..101);
    // On the EIP the node holds a block of, so that its packet translates.
    d.policies.last_mut().unwrap().eip_v4 = Some(EIP);
    let mut fx = fixture_with(&d)?;
    let mut shadow = MapShadow::default();
    apply_with(&mut fx.dp, &d, &mut shadow)?;
    let pod100 = Ipv4Addr::new(10, 250, 0, 101);
    let (rc, _) = fx.run("worker_egress", &tcp4(pod100, SERVER, 40000, 443, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let before = stats::read_policy_stats(fx.pins.path())?[&100].egress_packets;
    assert_eq!(before, 1, "policy 100 counted");
    let size = egress_common::maps::POLICY_STATS_SIZE;
    // 200 policies at a time until the cursor has gone round the array.
    let mut first = 1000;
    while first < 1000 + size + 200 {
        apply_with(&mut fx.dp, &with_others(first..first + 200), &mut shadow)?;
        let s = stats::read_policy_stats(fx.pins.path())?;
        assert!(
            (first..first + 200).all(|id| s[&id] == Default::default()),
            "policies {first}..{} start from zero",
            first + 200
        );
        first += 200;
    }
    assert_eq!(send(&mut fx, 40001)?, 1, "policy 7 kept its own count");
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn counters_pinned_as_a_hash_by_policy_id_are_replaced_on_load() -> anyhow::Result<()> {
    let pins = PinDir::new("statspin")?;
    std::fs::create_dir_all(pins.path())?;
    let path = pins.path().join("POLICY_STATS");
    egress_tests::run(&[
        "bpftool",
        "map",
        "create",
        path.to_str().unwrap(),
        "type",
        "percpu_hash",
        "key",
        "4",
        "value",
        "32",
        "entries",
        "2048",
        "name",
        "POLICY_STATS",
    ])?;
    let dp = Datapath::load(EBPF_OBJECT, pins.path())?;
    assert!(dp.replaced.contains(&"POLICY_STATS"), "{:?}", dp.replaced);
    let mut fx = Fixture { dp, pins };
    apply(&mut fx.dp, &desired())?;
    assert_eq!(send(&mut fx, 40000)?, 1);
    Ok(())
}
