//! A gateway's own address used as an EIP (useNodeIP) shares its ports with
//! the node: a packet to a port in one of its port blocks is steered to the
//! worker holding the block, so a block over the node's ephemeral range
//! takes replies to the node's own connections. The controller grants
//! node-IP blocks only inside `--node-ip-port-range`; this checks that range
//! against the node's `net.ipv4.ip_local_port_range` where it matters, on
//! the node itself, and says which blocks collide.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::datapath::DesiredMaps;

/// The node-IP blocks of `maps` (steered by this node) that overlap any of
/// `ranges` (the ephemeral range; the VXLAN and probe ports as one-port
/// ranges: the programs would steer those packets to a worker too).
pub fn colliding_blocks(maps: &DesiredMaps, ranges: &[(u16, u16)]) -> BTreeSet<(IpAddr, u16)> {
    let size = u32::from(maps.config.port_block_size.max(1));
    let node_ips: BTreeSet<IpAddr> = maps
        .owned_eips
        .iter()
        .filter(|o| o.node_ip)
        .map(|o| o.eip)
        .collect();
    maps.reply_steering
        .iter()
        .filter(|s| node_ips.contains(&s.eip))
        .filter(|s| {
            let lo = u32::from(s.block) * size;
            let hi = lo + size - 1;
            ranges
                .iter()
                .any(|&(first, last)| lo <= u32::from(last) && hi >= u32::from(first))
        })
        .map(|s| (s.eip, s.block))
        .collect()
}

/// `net.ipv4.ip_local_port_range` ("32768\t60999"), if readable.
pub fn ephemeral_range() -> Option<(u16, u16)> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    parse_range(&s)
}

fn parse_range(s: &str) -> Option<(u16, u16)> {
    let mut it = s.split_whitespace().map(|p| p.parse::<u16>().ok());
    Some((it.next()??, it.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::{OwnedEip, ReplySteering};

    #[test]
    fn blocks_over_the_ephemeral_range_are_found_for_node_ips_only() {
        let node_ip: IpAddr = "192.168.0.5".parse().unwrap();
        let eip: IpAddr = "198.51.100.10".parse().unwrap();
        let mut maps = DesiredMaps::default();
        maps.config.port_block_size = 1024;
        maps.owned_eips = vec![
            OwnedEip {
                eip: node_ip,
                answer_neigh: false,
                node_ip: true,
                epoch: 1,
            },
            OwnedEip {
                eip,
                answer_neigh: true,
                node_ip: false,
                epoch: 1,
            },
        ];
        let steer = |eip, block| ReplySteering {
            eip,
            block,
            worker_tunnel_ip: "10.0.0.2".parse().unwrap(),
            local: false,
        };
        // Blocks 31 (31744-32767), 32 (32768-33791), 59 (60416-61439), 60.
        maps.reply_steering = vec![
            steer(node_ip, 31),
            steer(node_ip, 32),
            steer(node_ip, 59),
            steer(node_ip, 60),
            steer(eip, 40),
        ];
        assert_eq!(
            colliding_blocks(&maps, &[(32768, 60999)]),
            [(node_ip, 32), (node_ip, 59)].into()
        );
        assert!(colliding_blocks(&maps, &[(20000, 30000)]).is_empty());
        // A one-port range: the VXLAN port 31800 lies in block 31.
        assert_eq!(
            colliding_blocks(&maps, &[(20000, 30000), (31800, 31800)]),
            [(node_ip, 31)].into()
        );
        assert_eq!(parse_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_range("nonsense"), None);
    }
}
