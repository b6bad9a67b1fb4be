//! The grant rule: headroom, caps, lazy shrinking, and the hand-back that
//! never gives a block in use to another worker.

use super::*;

const RANGE: std::ops::Range<u16> = 16..1024; // 64-port blocks above 1024

fn worker(held: &[u16], in_use: u32) -> WorkerPorts {
    WorkerPorts {
        held: held.to_vec(),
        in_use,
        demand: true,
        cap: 1024,
        ..Default::default()
    }
}

fn plan(workers: &[(&str, WorkerPorts)]) -> BTreeMap<String, Holding> {
    let w = workers
        .iter()
        .map(|(n, s)| (n.to_string(), s.clone()))
        .collect();
    plan_address(RANGE, 64, &w)
}

#[test]
fn headroom_is_twice_the_use_plus_a_block() {
    let cases: [(u32, u16); 6] = [
        (0, 1),
        (1, 2),
        (32, 2),
        (33, 3),
        (30_000, 939),
        (u32::MAX, u16::MAX),
    ];
    for (in_use, want) in cases {
        assert_eq!(wanted_blocks(in_use, 64), want, "{in_use} ports in use");
    }
}

#[test]
fn a_new_worker_gets_one_block_and_grows_with_use() {
    let p = plan(&[("w1", worker(&[], 0))]);
    assert_eq!(p["w1"].held, vec![16]);
    let p = plan(&[("w1", worker(&[16], 100))]);
    assert_eq!(p["w1"].held, vec![16, 17, 18, 19, 20], "ceil(200 / 64) + 1");
}

#[test]
fn the_cap_bounds_growth_and_says_so() {
    let mut w = worker(&[16], 1000);
    w.cap = 3;
    let p = plan(&[("w1", w)]);
    assert_eq!(p["w1"].held, vec![16, 17, 18]);
    assert_eq!(p["w1"].wanted, 33);
    assert!(!p["w1"].refused, "capped is not refused");
}

#[test]
fn shrinking_waits_until_use_falls_below_a_quarter_then_drains_the_top() {
    let held: Vec<u16> = (16..24).collect();
    // 8 active, target 2 (in_use 20): 8 > 4, the top 6 drain.
    let p = plan(&[("w1", worker(&held, 20))]);
    assert_eq!(p["w1"].held, held, "draining blocks stay held");
    assert_eq!(p["w1"].draining, (18..24).collect::<Vec<_>>());
    // 8 active, target 4 (in_use 100): 8 <= 8, nothing drains.
    let p = plan(&[("w1", worker(&held, 100))]);
    assert!(p["w1"].draining.is_empty());
}

#[test]
fn growth_reactivates_own_draining_blocks_before_taking_new_ones() {
    let mut w = worker(&[16, 17, 18], 100);
    w.draining = vec![17, 18];
    let p = plan(&[("w1", w)]);
    assert_eq!(p["w1"].held, vec![16, 17, 18, 19, 20]);
    assert!(p["w1"].draining.is_empty());
}

#[test]
fn a_draining_block_in_use_is_never_given_to_another_worker() {
    // The pool holds two blocks; w1 drains one (no more demand) and its
    // agent has not released it: w2 is refused rather than given it.
    let w = |held: &[u16], demand| WorkerPorts {
        held: held.to_vec(),
        demand,
        cap: 16,
        ..Default::default()
    };
    let workers: BTreeMap<String, WorkerPorts> = [
        ("w1".to_string(), w(&[0, 1], false)),
        ("w2".to_string(), w(&[], true)),
    ]
    .into();
    let p = plan_address(0..2, 64, &workers);
    assert_eq!(p["w1"].held, vec![0, 1]);
    assert_eq!(p["w1"].draining, vec![0, 1]);
    assert!(p["w2"].held.is_empty() && p["w2"].refused, "{p:?}");

    // Released while active (a stale report): not taken away either.
    let mut stale = w(&[0, 1], true);
    stale.released = vec![0, 1];
    let workers: BTreeMap<String, WorkerPorts> =
        [("w1".to_string(), stale), ("w2".to_string(), w(&[], true))].into();
    let p = plan_address(0..2, 64, &workers);
    assert_eq!(p["w1"].held, vec![0, 1]);
    assert!(p["w2"].refused);

    // Released once draining: it leaves w1 and w2 may have it in this pass.
    let mut done = w(&[0, 1], false);
    done.draining = vec![0, 1];
    done.released = vec![1];
    let workers: BTreeMap<String, WorkerPorts> =
        [("w1".to_string(), done), ("w2".to_string(), w(&[], true))].into();
    let p = plan_address(0..2, 64, &workers);
    assert_eq!(
        (p["w1"].held.clone(), p["w1"].draining.clone()),
        (vec![0], vec![0])
    );
    assert_eq!(p["w2"].held, vec![1]);
}

#[test]
fn a_block_still_listed_as_released_is_not_granted_back_to_its_worker() {
    // w1 released block 16 and its report still says so; it needs a block
    // again: it gets 17, so that the stale report cannot free the new grant.
    let mut w = worker(&[], 0);
    w.released = vec![16];
    let p = plan(&[("w1", w)]);
    assert_eq!(p["w1"].held, vec![17]);
}

#[test]
fn grants_already_made_are_never_renumbered() {
    let p = plan(&[("a", worker(&[900], 0)), ("b", worker(&[16, 500], 10))]);
    assert_eq!(p["a"].held, vec![900]);
    assert_eq!(p["b"].held, vec![16, 500]);
}

#[test]
fn a_thousand_workers_with_light_use_share_one_eip() {
    let workers: Vec<(String, WorkerPorts)> = (0..1000)
        .map(|i| (format!("w{i:04}"), worker(&[], 0)))
        .collect();
    let refs: Vec<(&str, WorkerPorts)> = workers
        .iter()
        .map(|(n, w)| (n.as_str(), w.clone()))
        .collect();
    let p = plan(&refs);
    let mut seen = BTreeSet::new();
    for (n, h) in &p {
        assert_eq!(h.held.len(), 1, "{n}: {h:?}");
        assert!(!h.refused, "{n} refused");
        assert!(
            seen.insert(h.held[0]),
            "{n}: block {} given twice",
            h.held[0]
        );
    }
    assert_eq!(p.len(), 1000);
}

#[test]
fn one_worker_grows_to_thirty_thousand_connections() {
    let mut held = vec![];
    let mut in_use = 0;
    // A burst fills every active port between two reports; after each
    // pass the use is at most half the active ports, and the grant at
    // least doubles: 30,000 within a dozen reports.
    for _ in 0..12 {
        let h = &plan(&[("w1", worker(&held, in_use))])["w1"];
        held = h.held.clone();
        let ports = h.active() as u32 * 64;
        assert!(in_use * 2 <= ports, "{in_use} in use of {ports}");
        in_use = ports.min(30_000);
    }
    assert_eq!(in_use, 30_000);
    assert_eq!(held.len(), 939);
}
