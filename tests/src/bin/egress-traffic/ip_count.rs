//! `ip-count IFACE DST`: counts the IPv4 packets arriving on IFACE for the
//! address DST. A packet socket for every protocol (`ETH_P_ALL`) sees a
//! frame before the interface's TC programs do (one for IPv4 alone would
//! see it only after them), so on a gateway's uplink it counts the replies
//! the upstream router sent to this gateway, even though the datapath then
//! steers them into the tunnel and the stack never sees them.

use std::{io, net::Ipv4Addr};

use serde_json::{json, Value};

const ETH_P_ALL: u16 = 0x0003;
const ETH_P_IP: u16 = 0x0800;

/// Counts until `running` says stop.
pub fn run(iface: &str, dst: Ipv4Addr, running: impl Fn() -> bool) -> io::Result<Value> {
    let fd = open(iface)?;
    println!("ready");
    let mut buf = [0u8; 2048];
    let mut packets = 0u64;
    while running() {
        // SAFETY: a buffer of the given length, our own descriptor.
        let n = unsafe { libc::recv(fd.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) {
                continue;
            }
            return Err(e);
        }
        // An IPv4 header after the Ethernet one; the destination is at
        // offset 16 of it.
        let n = n as usize;
        if n >= 14 + 20 && buf[12..14] == ETH_P_IP.to_be_bytes() && buf[30..34] == dst.octets() {
            packets += 1;
        }
    }
    Ok(json!({ "role": "ip-count", "iface": iface, "dst": dst.to_string(), "packets": packets }))
}

struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

fn open(iface: &str) -> io::Result<Fd> {
    let name = std::ffi::CString::new(iface).map_err(io::Error::other)?;
    // SAFETY: plain syscalls on a descriptor we own; structs zeroed and sized.
    unsafe {
        let ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
        if ifindex == 0 {
            return Err(io::Error::other(format!("no interface {iface}")));
        }
        let fd = libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW,
            i32::from(ETH_P_ALL.to_be()),
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = Fd(fd);
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ALL.to_be();
        sll.sll_ifindex = ifindex;
        if libc::bind(
            fd.0,
            &sll as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 20_000,
        };
        libc::setsockopt(
            fd.0,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as u32,
        );
        Ok(fd)
    }
}
