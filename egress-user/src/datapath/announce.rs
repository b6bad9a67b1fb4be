//! Gratuitous ARP and unsolicited neighbour advertisements: what a gateway
//! sends when it takes an EIP over, so the hosts on the uplink's segment
//! move their neighbour entry for the EIP to this node at once.
//!
//! The frames go out through an AF_PACKET socket of the calling thread's
//! network namespace.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;

/// The interface's index and MAC address.
pub fn iface_index_and_mac(iface: &str) -> io::Result<(u32, [u8; 6])> {
    let name = std::ffi::CString::new(iface).map_err(io::Error::other)?;
    // SAFETY: valid NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a zeroed ifreq is valid; the name fits (checked below).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = iface.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR with a valid ifreq.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(err);
    }
    // SAFETY: the ioctl filled the hardware address member.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok((ifindex, mac))
}

/// A gratuitous ARP request for `eip` from `mac` (sender = target = EIP).
pub fn gratuitous_arp_frame(mac: [u8; 6], eip: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ETH_P_ARP.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&eip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&eip.octets());
    f
}

/// An unsolicited neighbour advertisement for `eip` to all nodes, with the
/// override flag and the target link-layer address option.
pub fn unsolicited_na_frame(mac: [u8; 6], eip: Ipv6Addr) -> Vec<u8> {
    let all_nodes: Ipv6Addr = "ff02::1".parse().expect("valid");
    let mut icmp = vec![136u8, 0, 0, 0, 0x20, 0, 0, 0];
    icmp.extend_from_slice(&eip.octets());
    icmp.extend_from_slice(&[2, 1]);
    icmp.extend_from_slice(&mac);
    // Checksum over the pseudo-header and the message.
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for w in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    add(&eip.octets());
    add(&all_nodes.octets());
    add(&(icmp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(&icmp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let c = !(sum as u16);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = Vec::with_capacity(14 + 40 + icmp.len());
    f.extend_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.extend_from_slice(&[58, 255]);
    f.extend_from_slice(&eip.octets());
    f.extend_from_slice(&all_nodes.octets());
    f.extend_from_slice(&icmp);
    f
}

/// Sends one raw Ethernet frame out of `ifindex`.
fn send_frame(ifindex: u32, frame: &[u8]) -> io::Result<()> {
    // SAFETY: plain socket(2); protocol 0 = send only.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a zeroed sockaddr_ll is valid; fields set below.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_ifindex = ifindex as i32;
    addr.sll_halen = 6;
    addr.sll_addr[..6].copy_from_slice(&frame[..6]);
    // SAFETY: valid buffer and address of the right size.
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
    let err = io::Error::last_os_error();
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(err);
    }
    Ok(())
}

/// Announces that `eip` now lives behind `iface`: a gratuitous ARP (IPv4)
/// or an unsolicited NA (IPv6), `count` times.
pub fn announce_eip(iface: &str, eip: IpAddr, count: u32) -> io::Result<()> {
    let (ifindex, mac) = iface_index_and_mac(iface)?;
    let frame = match eip {
        IpAddr::V4(v4) => gratuitous_arp_frame(mac, v4),
        IpAddr::V6(v6) => unsolicited_na_frame(mac, v6),
    };
    for _ in 0..count {
        send_frame(ifindex, &frame)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_and_the_na_checksum_is_valid() {
        let mac = [2, 0, 0, 0, 0, 9];
        let arp = gratuitous_arp_frame(mac, Ipv4Addr::new(203, 0, 113, 100));
        let p = etherparse::SlicedPacket::from_ethernet(&arp).unwrap();
        let Some(etherparse::NetSlice::Arp(a)) = p.net else {
            panic!("not ARP")
        };
        assert_eq!(a.sender_protocol_addr(), a.target_protocol_addr());
        assert_eq!(a.sender_hw_addr(), &mac);

        let eip: Ipv6Addr = "2001:db8:e::100".parse().unwrap();
        let na = unsolicited_na_frame(mac, eip);
        let p = etherparse::SlicedPacket::from_ethernet(&na).unwrap();
        let Some(etherparse::TransportSlice::Icmpv6(i)) = p.transport else {
            panic!("not ICMPv6")
        };
        let all: Ipv6Addr = "ff02::1".parse().unwrap();
        assert!(i.is_checksum_valid(eip.octets(), all.octets()));
        assert_eq!(i.type_u8(), 136);
    }
}
