//! The agent's side of the hand-back: use per remote, blocks with live
//! flows, the quarantine, and reports only when they matter.

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn flow(port: u16, remote_port: u16, idle_s: u64) -> Flow {
    Flow {
        eip: ip("10.0.0.1"),
        eip_port: port,
        remote: (ip("198.51.100.1"), remote_port, 6),
        idle_ns: idle_s * 1_000_000_000,
        timeout_ns: 120 * 1_000_000_000,
    }
}

#[test]
fn use_counts_live_flows_to_the_busiest_remote_and_their_blocks() {
    let flows = [
        flow(1024, 443, 1),
        flow(1025, 443, 1),
        flow(1100, 443, 1),
        flow(1024, 80, 1),    // the same port to another remote: no new port
        flow(2000, 443, 500), // idle past its timeout: the datapath may reuse it
    ];
    let s = &summarize(&flows, 64)[&ip("10.0.0.1")];
    assert_eq!(s.in_use, 3);
    assert_eq!(s.live_blocks, BTreeSet::from([16, 17]));
}

#[test]
fn a_draining_block_is_released_only_after_a_quarantine_free_of_flows() {
    let eip = ip("10.0.0.1");
    let draining = BTreeSet::from([(eip, 16), (eip, 17)]);
    let busy = summarize(&[flow(1030, 443, 1)], 64); // block 16 in use
    let mut d = Drains::default();
    let t0 = Instant::now();
    let q = Duration::from_secs(30);
    assert!(
        d.released(t0, &draining, &busy, q).is_empty(),
        "17 free, not yet for 30 s"
    );
    let r = d.released(t0 + q, &draining, &busy, q);
    assert_eq!(r[&eip], vec![17], "16 still has a flow");
    // 16's flow ends: its quarantine starts now, not at t0.
    let idle = BTreeMap::new();
    let r = d.released(t0 + q + Duration::from_secs(1), &draining, &idle, q);
    assert_eq!(r[&eip], vec![17]);
    let r = d.released(t0 + 2 * q + Duration::from_secs(1), &draining, &idle, q);
    assert_eq!(r[&eip], vec![16, 17]);
    // A flow in a quarantined block (a late one) starts it over.
    let mut d = Drains::default();
    let one = BTreeSet::from([(eip, 17)]);
    d.released(t0, &one, &idle, q);
    d.released(
        t0 + Duration::from_secs(20),
        &one,
        &summarize(&[flow(1090, 1, 0)], 64),
        q,
    );
    assert!(d.released(t0 + q, &one, &idle, q).is_empty());
}

#[test]
fn reports_go_out_when_the_controller_would_act_on_them() {
    let u = |in_use, released: &[u16]| {
        vec![EipPortUse {
            gateway: "g".into(),
            eip: "10.0.0.1".into(),
            in_use,
            released: released.to_vec(),
        }]
    };
    assert!(
        !must_publish(&u(10, &[]), &u(20, &[]), 64),
        "both want 2 blocks"
    );
    assert!(must_publish(&u(40, &[]), &u(20, &[]), 64), "3 blocks now");
    assert!(must_publish(&u(20, &[17]), &u(20, &[]), 64));
    assert!(must_publish(&u(0, &[]), &[], 64), "the first report");
}
