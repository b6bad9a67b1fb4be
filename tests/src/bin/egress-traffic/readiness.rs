//! Which of many sockets have something to read (epoll, level-triggered):
//! a server with thousands of connections wakes for the ones that have
//! data instead of trying each in turn, so one slow round over all of
//! them does not add to every new connection's first reply.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    time::Duration,
};

/// The token of a server's listening socket; connections use their index.
pub const LISTENER: u64 = u64::MAX;

pub struct Readiness {
    epoll: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Readiness {
    pub fn new() -> io::Result<Self> {
        // SAFETY: a plain system call; the descriptor is owned at once.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 1024],
        })
    }

    /// Reports `fd` under `token` while it is readable (or hung up).
    pub fn watch(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: token,
        };
        // SAFETY: `ev` outlives the call; the kernel copies it.
        let r =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stops reporting `fd` (a closed connection must not wake the loop).
    pub fn forget(&self, fd: RawFd) {
        // SAFETY: as in `watch`; an error only means it was not watched.
        unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            );
        }
    }

    /// The tokens of the sockets ready now, waiting up to `timeout` for
    /// the first (so the caller's loop still sees its deadline and SIGTERM).
    pub fn wait(&mut self, ready: &mut Vec<u64>, timeout: Duration) -> io::Result<()> {
        ready.clear();
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let cap = self.events.len() as i32;
        // SAFETY: the kernel writes at most `cap` events into the buffer.
        let n =
            unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), self.events.as_mut_ptr(), cap, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        ready.extend(self.events[..n as usize].iter().map(|e| e.u64));
        Ok(())
    }
}
