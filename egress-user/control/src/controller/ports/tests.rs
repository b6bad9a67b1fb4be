//! Caps: the operator's limit and the policies' quotas, in blocks.

use super::*;

fn cfg(max: u32) -> ControllerConfig {
    ControllerConfig {
        port_block_size: 64,
        max_ports_per_node: max,
        ..Default::default()
    }
}

#[test]
fn ports_round_up_to_whole_blocks() {
    for (ports, want) in [(1, 1), (64, 1), (65, 2), (65536, 1024)] {
        assert_eq!(blocks_for(ports, 64), want, "{ports} ports");
    }
}

#[test]
fn the_cap_is_the_operators_unless_every_policy_sets_a_lower_one() {
    let c = cfg(4096);
    assert_eq!(cap_of(&[("a".into(), None)], &c), (64, None));
    assert_eq!(
        cap_of(&[("a".into(), Some(256))], &c),
        (4, Some("a".into()))
    );
    // The largest of the policies' caps; one without a cap: the operator's.
    assert_eq!(
        cap_of(&[("a".into(), Some(256)), ("b".into(), Some(1000))], &c),
        (16, Some("b".into()))
    );
    assert_eq!(
        cap_of(&[("a".into(), Some(256)), ("b".into(), None)], &c),
        (64, None)
    );
    // A quota above the operator's limit does not raise it.
    assert_eq!(cap_of(&[("a".into(), Some(65536))], &c), (64, None));
}
