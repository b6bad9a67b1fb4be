//! `arp-watch IFACE TARGET SENDER [INTERVAL_MS]`: asks "who has TARGET" on
//! IFACE every interval (raw AF_PACKET socket) and records which MAC
//! addresses answer each round, so a scenario can tell when a node stopped
//! answering for an EIP and whether two nodes ever answered at once.

use std::{
    collections::BTreeMap,
    io,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

const ETH_P_ARP: u16 = 0x0806;

struct RawSocket {
    fd: libc::c_int,
    ifindex: i32,
    mac: [u8; 6],
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.fd) };
    }
}

fn last_os_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl RawSocket {
    fn open(iface: &str) -> io::Result<Self> {
        let name = std::ffi::CString::new(iface).map_err(io::Error::other)?;
        // SAFETY: plain syscalls on a descriptor we own; structs zeroed and sized.
        unsafe {
            let ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
            if ifindex == 0 {
                return Err(last_os_error(&format!("interface {iface}")));
            }
            let fd = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                i32::from(ETH_P_ARP.to_be()),
            );
            if fd < 0 {
                return Err(last_os_error("AF_PACKET socket"));
            }
            let mut sock = Self {
                fd,
                ifindex,
                mac: [0; 6],
            };
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = ETH_P_ARP.to_be();
            sll.sll_ifindex = ifindex;
            if libc::bind(
                fd,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            ) != 0
            {
                return Err(last_os_error("bind"));
            }
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 2000,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
            let mut ifr: libc::ifreq = std::mem::zeroed();
            for (d, s) in ifr.ifr_name.iter_mut().zip(iface.bytes()) {
                *d = s as libc::c_char;
            }
            if libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut ifr) != 0 {
                return Err(last_os_error("SIOCGIFHWADDR"));
            }
            let hw = ifr.ifr_ifru.ifru_hwaddr.sa_data;
            let mut mac = [0u8; 6];
            for (d, s) in mac.iter_mut().zip(hw.iter()) {
                *d = *s as u8;
            }
            sock.mac = mac;
            Ok(sock)
        }
    }

    fn send_request(&self, target: Ipv4Addr, sender: Ipv4Addr) -> io::Result<()> {
        let mut f = Vec::with_capacity(42);
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&self.mac);
        f.extend_from_slice(&ETH_P_ARP.to_be_bytes());
        f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&self.mac);
        f.extend_from_slice(&sender.octets());
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target.octets());
        // SAFETY: sending our buffer to a zeroed, sized link-layer address.
        let n = unsafe {
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = ETH_P_ARP.to_be();
            sll.sll_ifindex = self.ifindex;
            sll.sll_halen = 6;
            sll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
            libc::sendto(
                self.fd,
                f.as_ptr() as *const libc::c_void,
                f.len(),
                0,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if n < 0 {
            return Err(last_os_error("sendto"));
        }
        Ok(())
    }

    /// One frame, or None on timeout.
    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: reading into our buffer, bounded by its length.
        let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(n as usize))
    }
}

/// The sender MAC of an ARP reply for `target`, if `frame` is one.
fn reply_mac(frame: &[u8], target: Ipv4Addr) -> Option<[u8; 6]> {
    if frame.len() < 42 || frame[12..14] != ETH_P_ARP.to_be_bytes() || frame[20..22] != [0, 2] {
        return None;
    }
    if frame[28..32] != target.octets() {
        return None;
    }
    frame[22..28].try_into().ok()
}

fn mac_str(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub fn run(
    iface: &str,
    target: Ipv4Addr,
    sender: Ipv4Addr,
    interval: Duration,
    running: impl Fn() -> bool,
) -> io::Result<Value> {
    let sock = RawSocket::open(iface)?;
    let start = Instant::now();
    println!("ready iface={iface} mac={}", mac_str(&sock.mac));
    // Per round (ms since start): the MACs that answered it.
    let mut rounds: Vec<(f64, Vec<[u8; 6]>)> = Vec::new();
    let mut buf = [0u8; 1600];
    while running() {
        let sent = Instant::now();
        sock.send_request(target, sender)?;
        let mut answered: Vec<[u8; 6]> = Vec::new();
        while sent.elapsed() < interval {
            if let Some(n) = sock.recv(&mut buf)? {
                if let Some(mac) = reply_mac(&buf[..n], target) {
                    if !answered.contains(&mac) {
                        answered.push(mac);
                    }
                }
            }
        }
        rounds.push(((sent - start).as_secs_f64() * 1000.0, answered));
    }
    // Per MAC: first and last round it answered, and how many.
    let mut per: BTreeMap<String, (f64, f64, u64)> = BTreeMap::new();
    for (t, macs) in &rounds {
        for m in macs {
            let e = per.entry(mac_str(m)).or_insert((*t, *t, 0));
            e.1 = *t;
            e.2 += 1;
        }
    }
    let multi: Vec<Value> = rounds
        .iter()
        .filter(|(_, m)| m.len() > 1)
        .map(|(t, m)| json!({"at_ms": t, "macs": m.iter().map(mac_str).collect::<Vec<_>>()}))
        .collect();
    let silent = rounds.iter().filter(|(_, m)| m.is_empty()).count();
    Ok(json!({
        "role": "arp-watch",
        "target": target.to_string(),
        "rounds": rounds.len(),
        "unanswered_rounds": silent,
        "answers": per.iter().map(|(mac, (first, last, n))| json!({
            "mac": mac, "first_ms": first, "last_ms": last, "rounds": n,
        })).collect::<Vec<_>>(),
        "multi_answer_rounds": multi,
    }))
}
