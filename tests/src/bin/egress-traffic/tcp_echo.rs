//! `tcp-echo LISTEN`: a SO_REUSEPORT listener (several processes may share
//! the port, each under its own open-file limit) that echoes whatever each
//! connection sends; one non-blocking loop for many thousand connections.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::{AsRawFd, FromRawFd},
    time::{Duration, Instant},
};

use crate::readiness::{Readiness, LISTENER};

/// An IPv4 listener with SO_REUSEPORT set before bind.
fn reuseport_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let SocketAddr::V4(v4) = addr else {
        return Err(std::io::Error::other("tcp-echo listens on IPv4 only"));
    };
    // SAFETY: plain socket calls on a descriptor this function owns.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let one: libc::c_int = 1;
        for opt in [libc::SO_REUSEPORT, libc::SO_REUSEADDR] {
            let p = &one as *const libc::c_int as *const libc::c_void;
            libc::setsockopt(fd, libc::SOL_SOCKET, opt, p, 4);
        }
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(v4.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(fd, &sa as *const _ as *const libc::sockaddr, len) != 0
            || libc::listen(fd, 4096) != 0
        {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        Ok(TcpListener::from_raw_fd(fd))
    }
}

pub fn run(listen: SocketAddr, deadline: Option<Instant>) -> std::io::Result<serde_json::Value> {
    let listener = reuseport_listener(listen)?;
    listener.set_nonblocking(true)?;
    let mut readiness = Readiness::new()?;
    readiness.watch(listener.as_raw_fd(), LISTENER)?;
    println!("ready addr={}", listener.local_addr()?);
    let mut conns: Vec<TcpStream> = Vec::new();
    let (mut bytes, mut buf, mut ready) = (0u64, [0u8; 256], Vec::new());
    while super::running(deadline) {
        readiness.wait(&mut ready, Duration::from_millis(20))?;
        for &token in &ready {
            if token == LISTENER {
                accept_all(&listener, &readiness, &mut conns)?;
                continue;
            }
            let s = &mut conns[token as usize];
            match s.read(&mut buf) {
                Ok(n) if n > 0 && s.write_all(&buf[..n]).is_ok() => bytes += n as u64,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // Closed, or failed: kept open but no longer watched.
                _ => readiness.forget(s.as_raw_fd()),
            }
        }
    }
    Ok(serde_json::json!({"role": "tcp-echo", "connections": conns.len(), "bytes": bytes}))
}

/// Takes every pending connection, non-blocking and watched under its index.
fn accept_all(
    listener: &TcpListener,
    readiness: &Readiness,
    conns: &mut Vec<TcpStream>,
) -> std::io::Result<()> {
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(true)?;
                readiness.watch(s.as_raw_fd(), conns.len() as u64)?;
                conns.push(s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            // Out of descriptors, say: the connection waits in the backlog.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(2));
                return Ok(());
            }
        }
    }
}
