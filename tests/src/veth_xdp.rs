//! One-verdict XDP programs for the far end of a veth, and the veth's own
//! per-queue XDP counters.
//!
//! A veth sends what its XDP program returns `XDP_TX` for into its peer's
//! receive ring, and the kernel only polls that ring when the peer has an
//! XDP program of its own (`veth_xdp_flush` checks the peer's `xdp_prog`;
//! GRO gives the peer NAPI but nothing kicks it). So wherever a test or
//! the benchmark runs `uplink_xdp` on a veth, the other end gets one of
//! these: `XDP_PASS` (the frames go on into the stack, a bridge port
//! bridges them) or `XDP_DROP` (a sink whose counter is the veth's
//! `rx_queue_N_xdp_drops`). A real NIC needs none of this, nor the
//! checksum setting of [`tx_checksum_off`].

use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};

use crate::Netns;

/// `enum xdp_action`.
#[derive(Clone, Copy, Debug)]
pub enum Verdict {
    Drop = 1,
    Pass = 2,
}

fn bpf(cmd: libc::c_long, attr: &mut [u64], what: &str) -> Result<OwnedFd> {
    // SAFETY: attr is a zero-padded bpf_attr whose pointers outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if fd < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a new fd the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Loads `r0 = verdict; exit` as an XDP program.
pub fn load(verdict: Verdict) -> Result<OwnedFd> {
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_TYPE_XDP: u64 = 6;
    // BPF_ALU64 | BPF_MOV | BPF_K into r0, then BPF_JMP | BPF_EXIT.
    let insns: [u64; 2] = [0xb7 | ((verdict as u64) << 32), 0x95];
    let license = b"GPL\0";
    let mut attr = [0u64; 16];
    attr[0] = BPF_PROG_TYPE_XDP | ((insns.len() as u64) << 32);
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    bpf(
        BPF_PROG_LOAD,
        &mut attr,
        "loading a one-verdict XDP program",
    )
}

/// Attaches `prog` in driver mode to `ifindex` of the calling thread's
/// namespace through a BPF link, which stays as long as the returned fd.
pub fn attach_driver(prog: &OwnedFd, ifindex: u32) -> Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_XDP: u64 = 37;
    const XDP_FLAGS_DRV_MODE: u64 = 1 << 2;
    let mut attr = [0u64; 16];
    attr[0] = prog.as_raw_fd() as u64 | (u64::from(ifindex) << 32);
    attr[1] = BPF_XDP | (XDP_FLAGS_DRV_MODE << 32);
    bpf(BPF_LINK_CREATE, &mut attr, "attaching XDP in driver mode")
}

/// A one-verdict program attached to `dev` of `ns`; detached on drop.
pub struct PeerProgram {
    _link: OwnedFd,
}

impl PeerProgram {
    pub fn attach(ns: &Netns, dev: &str, verdict: Verdict) -> Result<Self> {
        let ifindex = ifindex(ns, dev)?;
        let link = ns.enter(move || attach_driver(&load(verdict)?, ifindex))?;
        Ok(Self { _link: link })
    }
}

/// The ifindex of `dev` in `ns`.
pub fn ifindex(ns: &Netns, dev: &str) -> Result<u32> {
    let v: serde_json::Value = serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", dev])?)?;
    Ok(v[0]["ifindex"].as_u64().context("ifindex")? as u32)
}

/// Turns transmit checksum offload of `dev` in `ns` off, so that what a
/// namespace sends carries a full checksum as a frame off a wire does. A
/// veth hands its peer packets whose checksum is left to "hardware"
/// (`CHECKSUM_PARTIAL`); XDP sees only bytes, so a frame it sends on with
/// `XDP_TX` loses that state and its receiver finds the checksum wrong.
pub fn tx_checksum_off(ns: &Netns, dev: &str) -> Result<()> {
    const ETHTOOL_STXCSUM: u32 = 0x17;
    ethtool_set(ns, dev, ETHTOOL_STXCSUM, 0)
}

/// GRO on `dev` in `ns`: on a veth without an XDP program this gives its
/// receive ring NAPI, so that frames its peer sends it with XDP are taken
/// in (and built into skbs) instead of dropped.
pub fn gro_on(ns: &Netns, dev: &str) -> Result<()> {
    const ETHTOOL_SGRO: u32 = 0x2c;
    ethtool_set(ns, dev, ETHTOOL_SGRO, 1)
}

/// One ethtool setting of the `struct ethtool_value` kind (`cmd`, `data`).
fn ethtool_set(ns: &Netns, dev: &str, cmd: u32, data: u32) -> Result<()> {
    let dev = dev.to_owned();
    ns.enter(move || {
        let mut value = [cmd, data];
        ethtool(&dev, value.as_mut_ptr().cast())
    })
}

/// The veth `dev`'s ethtool statistics (`ethtool -S`) by name.
pub fn stats(ns: &Netns, dev: &str) -> Result<std::collections::BTreeMap<String, u64>> {
    let dev = dev.to_owned();
    ns.enter(move || ethtool_stats(&dev))
}

/// The sum over receive queues of the veth counter `rx_queue_N_<name>`.
pub fn rx_queues_sum(stats: &std::collections::BTreeMap<String, u64>, name: &str) -> u64 {
    stats
        .iter()
        .filter(|(k, _)| k.starts_with("rx_queue_") && k.ends_with(&format!("_{name}")))
        .map(|(_, v)| v)
        .sum()
}

fn ethtool_stats(dev: &str) -> Result<std::collections::BTreeMap<String, u64>> {
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    const ETHTOOL_GSTRINGS: u32 = 0x1b;
    const ETHTOOL_GSTATS: u32 = 0x1d;
    const ETH_SS_STATS: u32 = 1;
    // struct ethtool_drvinfo is 196 bytes; n_stats is at 180.
    let mut info = [0u32; 49];
    info[0] = ETHTOOL_GDRVINFO;
    ethtool(dev, info.as_mut_ptr().cast())?;
    let n = info[45] as usize;
    let mut names = vec![0u32; 3 + n * 8];
    names[..3].copy_from_slice(&[ETHTOOL_GSTRINGS, ETH_SS_STATS, n as u32]);
    ethtool(dev, names.as_mut_ptr().cast())?;
    let mut values = vec![0u64; 1 + n];
    values[0] = u64::from(ETHTOOL_GSTATS) | ((n as u64) << 32);
    ethtool(dev, values.as_mut_ptr().cast())?;
    let bytes: Vec<u8> = names[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok(bytes
        .chunks(32)
        .zip(&values[1..])
        .map(|(name, v)| {
            let end = name.iter().position(|b| *b == 0).unwrap_or(32);
            (String::from_utf8_lossy(&name[..end]).into_owned(), *v)
        })
        .collect())
}

/// SIOCETHTOOL with `data` as `ifr_data`.
fn ethtool(dev: &str, data: *mut libc::c_void) -> Result<()> {
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut libc::c_void,
        _pad: [u8; 16],
    }
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    if dev.len() >= libc::IFNAMSIZ {
        bail!("interface name {dev} is too long");
    }
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data,
        _pad: [0; 16],
    };
    req.name[..dev.len()].copy_from_slice(dev.as_bytes());
    // SAFETY: plain socket and ioctl calls; `data` is the caller's live buffer.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            bail!("socket: {}", std::io::Error::last_os_error());
        }
        let rc = libc::ioctl(fd, SIOCETHTOOL as _, &mut req);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc != 0 {
            bail!("ethtool ioctl on {dev}: {err}");
        }
    }
    Ok(())
}
