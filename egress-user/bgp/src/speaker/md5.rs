//! TCP-MD5 signatures (RFC 2385) on Linux, for peers configured with a
//! password: set on the listening socket (per peer address) and on
//! outbound sockets before connecting.

use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;

/// `struct tcp_md5sig` from linux/tcp.h.
#[repr(C)]
struct TcpMd5Sig {
    addr: libc::sockaddr_storage,
    flags: u8,
    prefixlen: u8,
    keylen: u16,
    ifindex: libc::c_int,
    key: [u8; 80],
}

/// Sets (or, with an empty key, removes) the MD5 key for `peer` on `fd`.
pub(crate) fn set_key(fd: RawFd, peer: IpAddr, key: &[u8]) -> io::Result<()> {
    if key.len() > 80 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "TCP-MD5 key longer than 80 octets",
        ));
    }
    // SAFETY: all-zero is a valid value for this plain C struct.
    let mut sig: TcpMd5Sig = unsafe { std::mem::zeroed() };
    match peer {
        IpAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut sig.addr as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_addr.s_addr = u32::from(a).to_be();
        }
        IpAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut sig.addr as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_addr.s6_addr = a.octets();
        }
    }
    sig.keylen = key.len() as u16;
    sig.key[..key.len()].copy_from_slice(key);
    // SAFETY: fd is an open TCP socket owned by the caller; the option
    // value is a fully initialised tcp_md5sig of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            &sig as *const TcpMd5Sig as *const libc::c_void,
            std::mem::size_of::<TcpMd5Sig>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn struct_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<TcpMd5Sig>(), 216);
    }

    #[tokio::test]
    async fn key_can_be_set_and_removed_and_too_long_is_refused() {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        let peer: IpAddr = "127.0.0.9".parse().unwrap();
        set_key(s.as_raw_fd(), peer, b"secret").unwrap();
        set_key(s.as_raw_fd(), peer, b"").unwrap();
        assert!(set_key(s.as_raw_fd(), peer, &[0; 81]).is_err());
    }
}
