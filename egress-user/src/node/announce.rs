//! Gratuitous ARP and unsolicited neighbour advertisements, sent when this
//! node takes an EIP over in L2 mode, so that the upstream router and
//! neighbours replace the old owner's MAC at once instead of after their
//! neighbour entries expire. (The program answers later ARP/NDP requests.)

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const BROADCAST: [u8; 6] = [0xff; 6];
/// Ethernet address of ff02::1 (all nodes).
const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// A gratuitous ARP request for `ip` from `mac`: sender and target address
/// are both the EIP, broadcast (RFC 5227 "ARP announcement").
pub fn garp_frame(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&BROADCAST);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&0x0806u16.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]); // Ethernet/IPv4, request
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&ip.octets());
    f
}

/// An unsolicited neighbour advertisement for `ip` (RFC 4861 7.2.6): to
/// all nodes, Override set, with the target link-layer address option.
pub fn unsolicited_na_frame(mac: [u8; 6], ip: Ipv6Addr) -> Vec<u8> {
    let mut icmp = Vec::with_capacity(32);
    icmp.extend_from_slice(&[136, 0, 0, 0]); // type NA, code 0, checksum later
    icmp.extend_from_slice(&0x2000_0000u32.to_be_bytes()); // Override
    icmp.extend_from_slice(&ip.octets());
    icmp.extend_from_slice(&[2, 1]); // target link-layer address, 8 bytes
    icmp.extend_from_slice(&mac);
    let sum = icmpv6_checksum(ip, ALL_NODES, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());

    let mut f = Vec::with_capacity(14 + 40 + icmp.len());
    f.extend_from_slice(&ALL_NODES_MAC);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&0x86ddu16.to_be_bytes());
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.extend_from_slice(&[58, 255]); // next header ICMPv6, hop limit 255 (required by NDP)
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&ALL_NODES.octets());
    f.extend_from_slice(&icmp);
    f
}

fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, body: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(body.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(body);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Sends the announcement for `ip` out of the interface `ifindex`.
pub fn announce(ifindex: u32, mac: [u8; 6], ip: IpAddr) -> std::io::Result<()> {
    let (frame, dst) = match ip {
        IpAddr::V4(v4) => (garp_frame(mac, v4), BROADCAST),
        IpAddr::V6(v6) => (unsolicited_na_frame(mac, v6), ALL_NODES_MAC),
    };
    // SAFETY: plain socket(2); the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: zeroed sockaddr_ll is valid; fields set below.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_ifindex = ifindex as i32;
    addr.sll_halen = 6;
    addr.sll_addr[..6].copy_from_slice(&dst);
    // SAFETY: frame and addr outlive the call; sizes are theirs.
    let rc = unsafe {
        libc::sendto(
            fd,
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];

    #[test]
    fn garp_is_a_broadcast_request_for_the_eip_itself() {
        let ip = Ipv4Addr::new(10, 10, 0, 200);
        let f = garp_frame(MAC, ip);
        assert_eq!(f.len(), 42);
        assert_eq!(&f[0..6], &BROADCAST);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[20..22], &[0, 1], "opcode request");
        assert_eq!(&f[22..28], &MAC, "sender MAC");
        assert_eq!(&f[28..32], &ip.octets(), "sender IP");
        assert_eq!(&f[38..42], &ip.octets(), "target IP");
    }

    #[test]
    fn unsolicited_na_parses_and_its_checksum_verifies() {
        let ip: Ipv6Addr = "fd00:10::200".parse().unwrap();
        let f = unsolicited_na_frame(MAC, ip);
        let p = SlicedPacket::from_ethernet(&f).expect("valid frame");
        let Some(NetSlice::Ipv6(v6)) = &p.net else {
            panic!("not IPv6")
        };
        assert_eq!(v6.header().hop_limit(), 255);
        assert_eq!(v6.header().destination_addr(), ALL_NODES);
        let Some(TransportSlice::Icmpv6(icmp)) = &p.transport else {
            panic!("not ICMPv6")
        };
        // Recompute with the independent library and compare.
        let expected = icmp
            .icmp_type()
            .calc_checksum(
                v6.header().source(),
                v6.header().destination(),
                icmp.payload(),
            )
            .unwrap();
        assert_eq!(icmp.checksum(), expected);
        assert_eq!(icmp.type_u8(), 136);
        assert_eq!(&icmp.payload()[..16], &ip.octets(), "target address");
    }
}
