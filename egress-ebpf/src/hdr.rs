//! Wire headers as `#[repr(C)]` structs; offsets come from `offset_of!`.
//! Multi-byte fields are kept as byte arrays or raw (network order) integers.

use core::mem::{offset_of, size_of};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_ARP: u16 = 0x0806;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;
/// IPv6 extension headers the parse steps over.
pub const IPPROTO_HOPOPTS: u8 = 0;
pub const IPPROTO_ROUTING: u8 = 43;
pub const IPPROTO_FRAGMENT: u8 = 44;
pub const IPPROTO_DSTOPTS: u8 = 60;

/// Ethernet II header.
#[repr(C)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub proto: [u8; 2],
}
pub const ETH_LEN: usize = size_of::<EthHdr>();

/// IPv4 header without options.
#[repr(C)]
pub struct Ipv4Hdr {
    pub version_ihl: u8,
    pub tos: u8,
    pub tot_len: [u8; 2],
    pub id: [u8; 2],
    pub frag_off: [u8; 2],
    pub ttl: u8,
    pub proto: u8,
    pub check: [u8; 2],
    pub saddr: [u8; 4],
    pub daddr: [u8; 4],
}
pub const IPV4_CHECK: usize = offset_of!(Ipv4Hdr, check);
pub const IPV4_SADDR: usize = offset_of!(Ipv4Hdr, saddr);
pub const IPV4_DADDR: usize = offset_of!(Ipv4Hdr, daddr);

/// IPv6 fixed header.
#[repr(C)]
pub struct Ipv6Hdr {
    pub vtc_flow: [u8; 4],
    pub payload_len: [u8; 2],
    pub nexthdr: u8,
    pub hop_limit: u8,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}
pub const IPV6_LEN: usize = size_of::<Ipv6Hdr>();
pub const IPV6_SADDR: usize = offset_of!(Ipv6Hdr, saddr);
pub const IPV6_DADDR: usize = offset_of!(Ipv6Hdr, daddr);

/// The first 8 bytes every transport header we translate starts with: two
/// ports (TCP, UDP) or type/code/checksum/identifier (ICMP echo).
#[repr(C)]
pub struct TcpHdr {
    pub source: [u8; 2],
    pub dest: [u8; 2],
    pub seq: [u8; 4],
    pub ack_seq: [u8; 4],
    pub doff_res: u8,
    pub flags: u8,
    pub window: [u8; 2],
    pub check: [u8; 2],
    pub urg_ptr: [u8; 2],
}
pub const TCP_LEN: usize = size_of::<TcpHdr>();
pub const TCP_CHECK: usize = offset_of!(TcpHdr, check);
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;

#[repr(C)]
pub struct UdpHdr {
    pub source: [u8; 2],
    pub dest: [u8; 2],
    pub len: [u8; 2],
    pub check: [u8; 2],
}
pub const UDP_CHECK: usize = offset_of!(UdpHdr, check);

/// ICMP / ICMPv6 header with the echo identifier/sequence.
#[repr(C)]
pub struct IcmpHdr {
    pub ty: u8,
    pub code: u8,
    pub check: [u8; 2],
    pub id: [u8; 2],
    pub seq: [u8; 2],
}
pub const ICMP_LEN: usize = size_of::<IcmpHdr>();
pub const ICMP_CHECK: usize = offset_of!(IcmpHdr, check);
pub const ICMP_ID: usize = offset_of!(IcmpHdr, id);

pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_ECHO: u8 = 8;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
pub const ICMP6_DEST_UNREACH: u8 = 1;
pub const ICMP6_PKT_TOO_BIG: u8 = 2;
pub const ICMP6_TIME_EXCEEDED: u8 = 3;
pub const ICMP6_ECHO_REQUEST: u8 = 128;
pub const ICMP6_ECHO_REPLY: u8 = 129;
pub const ICMP6_NEIGH_SOLICIT: u8 = 135;
pub const ICMP6_NEIGH_ADVERT: u8 = 136;

/// ARP for IPv4 over Ethernet.
#[repr(C)]
pub struct ArpHdr {
    pub htype: [u8; 2],
    pub ptype: [u8; 2],
    pub hlen: u8,
    pub plen: u8,
    pub op: [u8; 2],
    pub sha: [u8; 6],
    pub spa: [u8; 4],
    pub tha: [u8; 6],
    pub tpa: [u8; 4],
}

/// Neighbour solicitation / advertisement with one link-layer address option.
#[repr(C)]
pub struct NdMsg {
    pub ty: u8,
    pub code: u8,
    pub check: [u8; 2],
    pub flags: [u8; 4],
    pub target: [u8; 16],
    pub opt_type: u8,
    pub opt_len: u8,
    pub opt_mac: [u8; 6],
}
pub const ND_LEN: usize = size_of::<NdMsg>();
