//! The agent's map shadow on the real kernel maps: an apply that diffs
//! against the last apply's contents instead of reading the maps back
//! leaves them exactly as an apply that reads them, writes only what
//! changed, and a forgotten shadow puts right an entry changed behind it.

use std::net::Ipv4Addr;

use anyhow::Result;
use aya::maps::HashMap;
use egress_common::steering::{SteerKey, SteerTarget};
use egress_tests::PinDir;
use egress_user::{
    datapath::{
        apply, apply_with, Datapath, DesiredMaps, MapShadow, NodeConfig, OwnedEip, ReplySteering,
    },
    EBPF_OBJECT,
};

const EIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);

/// A gateway that owns `EIP` and steers `blocks` to workers 10.100.0.(20 + worker).
fn gateway(blocks: &[(u16, u8)]) -> DesiredMaps {
    DesiredMaps {
        config: NodeConfig {
            is_gateway: true,
            vxlan_ifindex: 1,
            vni: 4242,
            uplink_ifindex: 1,
            tunnel_mtu: 1450,
            port_block_size: 64,
            node_tunnel_ip: Ipv4Addr::new(10, 100, 0, 11).into(),
            ..Default::default()
        },
        reply_steering: blocks
            .iter()
            .map(|(block, worker)| ReplySteering {
                eip: EIP.into(),
                block: *block,
                worker_tunnel_ip: Ipv4Addr::new(10, 100, 0, 20 + worker).into(),
                local: false,
            })
            .collect(),
        owned_eips: vec![OwnedEip {
            eip: EIP.into(),
            answer_neigh: true,
            node_ip: false,
            epoch: 1,
        }],
        ..Default::default()
    }
}

fn steering(dp: &mut Datapath) -> Result<Vec<(SteerKey, SteerTarget)>> {
    let map: HashMap<_, SteerKey, SteerTarget> =
        HashMap::try_from(dp.ebpf.map_mut("REPLY_STEERING").unwrap())?;
    let mut v: Vec<_> = map.iter().collect::<Result<_, _>>()?;
    v.sort_by_key(|(k, _)| (k.eip, k.block));
    Ok(v)
}

#[test]
#[ignore = "needs root (BPF maps)"]
fn an_apply_from_the_shadow_leaves_the_maps_as_an_apply_that_reads_them() -> Result<()> {
    let pins = PinDir::new("shadow")?;
    let mut dp = Datapath::load(EBPF_OBJECT, pins.path())?;
    let mut shadow = MapShadow::default();
    let many: Vec<(u16, u8)> = (1..200).map(|b| (b, (b % 7) as u8)).collect();

    let first = apply_with(&mut dp, &gateway(&many), &mut shadow)?;
    assert!(first.total_written() >= many.len(), "{first:?}");
    assert!(!shadow.is_empty(), "the apply left its contents");
    let again = apply_with(&mut dp, &gateway(&many), &mut shadow)?;
    assert_eq!(
        (again.total_written(), again.total_removed()),
        (0, 0),
        "{again:?}"
    );

    // One block moves to another worker, one goes away, one is new.
    let mut next = many.clone();
    next[10].1 = 6 - next[10].1 % 7;
    next.remove(20);
    next.push((300, 3));
    let r = apply_with(&mut dp, &gateway(&next), &mut shadow)?;
    assert_eq!(r.written.get("REPLY_STEERING"), Some(&2), "{r:?}");
    assert_eq!(r.removed.get("REPLY_STEERING"), Some(&1), "{r:?}");
    // An apply that reads the kernel's maps finds nothing left to do.
    let check = apply(&mut dp, &gateway(&next))?;
    assert_eq!(
        (check.total_written(), check.total_removed()),
        (0, 0),
        "{check:?}"
    );
    assert_eq!(steering(&mut dp)?.len(), next.len());

    // An entry changed behind the shadow's back (by hand, with bpftool):
    // the shadow does not see it; once forgotten, the apply puts it right.
    let (key, mut target) = steering(&mut dp)?[0];
    target.worker_tunnel_ip = [192, 0, 2, 99];
    {
        let mut map: HashMap<_, SteerKey, SteerTarget> =
            HashMap::try_from(dp.ebpf.map_mut("REPLY_STEERING").unwrap())?;
        map.insert(key, target, 0)?;
    }
    let blind = apply_with(&mut dp, &gateway(&next), &mut shadow)?;
    assert_eq!(blind.written.get("REPLY_STEERING"), Some(&0), "{blind:?}");
    shadow.forget();
    let healed = apply_with(&mut dp, &gateway(&next), &mut shadow)?;
    assert_eq!(healed.written.get("REPLY_STEERING"), Some(&1), "{healed:?}");
    assert_ne!(steering(&mut dp)?[0].1.worker_tunnel_ip, [192, 0, 2, 99]);
    Ok(())
}
