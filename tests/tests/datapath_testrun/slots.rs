//! Policy slots past the first 64-bit word, the shared fail-closed slot
//! past the last one, and policy maps pinned with the 64-slot layout.

use crate::testrun::*;

/// `n` policies for other pods (10.250.x.y), priorities `0..n`, ahead of
/// everything `desired()` holds.
fn others(n: u32) -> Vec<PolicyRule> {
    (0..n)
        .map(|i| {
            no_blocks_policy(
                1000 + i,
                -1_000_000 + i as i32,
                vec![Cidr::host(
                    Ipv4Addr::new(10, 250, (i / 250) as u8, (i % 250) as u8 + 1).into(),
                )],
                vec![cidr("203.0.113.0/24")],
            )
        })
        .collect()
}

/// `desired()` with `n` policies ahead of its own: policy 8 gets slot
/// `n`, policy 7 (the one the pod's traffic to SERVER takes) slot `n + 1`.
fn behind(n: u32) -> DesiredMaps {
    let mut d = desired();
    d.policies.extend(others(n));
    d
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_policy_in_slot_700_translates_as_in_slot_1() -> anyhow::Result<()> {
    let mut fx = fixture_with(&behind(699))?;
    let (rc, out) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "policy 7 in slot 700 applies");
    let s = check(&out);
    assert_eq!(s.src, IpAddr::from(EIP));
    assert!(in_block(s.sport, BLOCK), "port {} from the block", s.sport);
    assert_eq!(
        stats::read_policy_stats(fx.pins.path())?[&7].egress_packets,
        1
    );
    // A pod of slot 0 still takes its own policy (no block for its EIP:
    // dropped under that reason, not matched to slot 700).
    let first = Ipv4Addr::new(10, 250, 0, 1);
    let (rc, _) = fx.run("worker_egress", &tcp4(first, SERVER, 40001, 443, true))?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_NO_PORT_BLOCK), 1, "{}", fx.all_drops());
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_policy_past_the_last_slot_fails_closed() -> anyhow::Result<()> {
    let slots = egress_common::policy::MAX_POLICY_SLOTS as u32;
    let mut fx = fixture_with(&behind(slots))?;
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, true))?;
    assert_eq!(
        rc, TC_ACT_SHOT,
        "dropped, never sent with the pod's address"
    );
    assert_eq!(fx.drops(DROP_NO_GATEWAY), 1);
    // Traffic no policy covers still passes.
    let (rc, out) = fx.run("worker_egress", &udp4(POD_OTHER, SERVER, 5000, 53, b"q"))?;
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(check(&out).src, IpAddr::from(POD_OTHER));
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn policy_maps_pinned_with_64_slots_are_replaced_on_load() -> anyhow::Result<()> {
    let pins = PinDir::new("slotpin")?;
    std::fs::create_dir_all(pins.path())?;
    let pin = |name: &str| pins.path().join(name).to_str().unwrap().to_string();
    let old: [&[&str]; 3] = [
        &["lpm_trie", "20", "8", "16384", "POLICY_SRC"],
        &["lpm_trie", "20", "24", "16384", "POLICY_DST"],
        &["array", "4", "48", "64", "POLICY_TARGETS"],
    ];
    for m in old {
        let path = pin(m[4]);
        let mut args = vec!["bpftool", "map", "create", &path, "type", m[0]];
        args.extend(["key", m[1], "value", m[2], "entries", m[3], "name", m[4]]);
        if m[0] == "lpm_trie" {
            args.extend(["flags", "1"]);
        }
        egress_tests::run(&args)?;
    }
    let mut dp = Datapath::load(EBPF_OBJECT, pins.path())?;
    assert!(dp.policy_maps_replaced(), "{:?}", dp.replaced);
    apply(&mut dp, &behind(699))?;
    let info = |name: &str| {
        aya::maps::MapData::from_pin(pin(name))
            .unwrap()
            .info()
            .unwrap()
    };
    assert_eq!(
        info("POLICY_DST").value_size() as usize,
        std::mem::size_of::<egress_common::policy::DstMatch>()
    );
    assert_eq!(info("POLICY_TARGETS").max_entries(), 1024);
    let (rc, out) = run_prog(
        &mut dp,
        "worker_egress",
        &tcp4(POD, SERVER, 40000, 443, true),
    )?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).src, IpAddr::from(EIP));
    // Loaded again over its own pins: nothing to replace.
    drop(dp);
    let dp = Datapath::load(EBPF_OBJECT, pins.path())?;
    assert!(dp.replaced.is_empty(), "{:?}", dp.replaced);
    Ok(())
}

/// `n` /24s from 100.64.0.0 on, `offset` /24s in.
fn dests(offset: u32, n: u32) -> Vec<Cidr> {
    (offset..offset + n)
        .map(|i| {
            cidr(&format!(
                "{}.{}.{}.0/24",
                100 + i / 65536,
                (i / 256) % 256,
                i % 256
            ))
        })
        .collect()
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_trie_filled_past_half_its_size_is_rewritten_with_other_prefixes() -> anyhow::Result<()> {
    // 12,000 destinations, then 12,000 others: both fit the 16,384-entry
    // trie, not both at once.
    let mut d = desired();
    d.policies[0].destinations = dests(0, 12_000);
    let mut fx = fixture_with(&d)?;
    d.policies[0].destinations = dests(20_000, 12_000);
    apply(&mut fx.dp, &d)?;
    let new_dst = Ipv4Addr::new(100, 78, 33, 1); // /24 number 20,001
    let (rc, out) = fx.run("worker_egress", &tcp4(POD, new_dst, 40000, 443, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).src, IpAddr::from(EIP));
    let old_dst = Ipv4Addr::new(100, 0, 1, 1);
    let (rc, out) = fx.run("worker_egress", &tcp4(POD, old_dst, 40001, 443, true))?;
    assert_eq!(rc, TC_ACT_OK, "no longer a destination of the policy");
    assert_eq!(check(&out).src, IpAddr::from(POD));
    Ok(())
}
