//! The gateway's XDP reply path on the uplink (`uplink_xdp`): whether to
//! attach it, attaching it through a pinned link (kept across agent
//! restarts and taken over in place, as the TC links are), and falling back
//! to the TC program alone where the device will not run it natively.
//!
//! The TC program stays attached either way: the XDP program handles the
//! common reply and passes everything else to it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use aya::programs::{
    links::{FdLink, PinnedLink},
    xdp::XdpLink,
    Xdp, XdpMode,
};
use egress_common::maps::PROG_UPLINK_XDP;

use super::{links::link_pin_path, Datapath};

/// `--uplink-xdp`: what the operator allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UplinkXdpMode {
    /// Native XDP where the driver runs it and a veth is not involved.
    #[default]
    Auto,
    /// Native XDP whatever the driver (falls back to TC if it refuses).
    Native,
    /// TC only.
    Off,
}

/// Which program answers the gateway's common replies, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ReplyPath {
    /// `xdp` or `tc`.
    pub path: &'static str,
    pub mode: UplinkXdpMode,
    /// The uplink's driver, as `ethtool -i` names it, when it answered.
    pub driver: Option<String>,
    pub reason: String,
}

impl ReplyPath {
    pub fn is_xdp(&self) -> bool {
        self.path == "xdp"
    }
}

/// What to try, from the mode and the uplink's driver.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    Native,
    /// TC only, for this reason.
    Tc(String),
}

/// The decision, before any attach is tried.
pub fn plan(mode: UplinkXdpMode, driver: Option<&str>) -> Plan {
    match (mode, driver) {
        (UplinkXdpMode::Off, _) => Plan::Tc("--uplink-xdp=off".into()),
        (UplinkXdpMode::Native, _) => Plan::Native,
        // A veth runs XDP natively, but the frames it sends back with
        // XDP_TX are only received if its peer end runs an XDP program too
        // (the kernel polls the peer's ring for nothing else), which this
        // node can neither see nor set from its own namespace.
        (UplinkXdpMode::Auto, Some("veth")) => Plan::Tc(
            "the uplink is a veth: XDP_TX needs an XDP program on its peer (--uplink-xdp=native if it has one)"
                .into(),
        ),
        (UplinkXdpMode::Auto, _) => Plan::Native,
    }
}

/// Attaches `uplink_xdp` natively to the uplink where the plan allows and
/// the driver accepts it, else makes sure no XDP program of ours is left
/// there. Never fails the agent: the TC path serves every packet anyway.
pub fn attach(dp: &mut Datapath, mode: UplinkXdpMode, iface: &str, ifindex: u32) -> ReplyPath {
    let driver = driver_of(iface);
    let pin = link_pin_path(&dp.pin_dir, PROG_UPLINK_XDP, ifindex);
    let tc = |reason: String, driver: Option<String>| ReplyPath {
        path: "tc",
        mode,
        driver,
        reason,
    };
    match plan(mode, driver.as_deref()) {
        Plan::Tc(reason) => {
            remove_pinned_link(&pin);
            tc(reason, driver)
        }
        Plan::Native => match attach_native(dp, iface, ifindex, &pin) {
            Ok(how) => ReplyPath {
                path: "xdp",
                mode,
                driver,
                reason: format!("native XDP on {iface} ({how})"),
            },
            Err(e) => {
                remove_pinned_link(&pin);
                tc(format!("native XDP on {iface} refused: {e:#}"), driver)
            }
        },
    }
}

/// Native attach, or the takeover of the link a previous agent pinned.
fn attach_native(dp: &mut Datapath, iface: &str, ifindex: u32, pin: &Path) -> Result<&'static str> {
    std::fs::create_dir_all(pin.parent().unwrap())
        .with_context(|| format!("creating {}", pin.display()))?;
    let prog: &mut Xdp = dp
        .ebpf
        .program_mut(PROG_UPLINK_XDP)
        .with_context(|| format!("program {PROG_UPLINK_XDP} is not in the eBPF object"))?
        .try_into()?;
    if prog.fd().is_err() {
        prog.load()
            .with_context(|| format!("loading {PROG_UPLINK_XDP}"))?;
    }
    if let Ok(old) = PinnedLink::from_pin(pin) {
        let link = XdpLink::try_from(FdLink::from(old))?;
        let id = prog
            .attach_to_link(link)
            .with_context(|| format!("updating the XDP link on {iface}"))?;
        // The pin keeps the link; this handle can go.
        drop(prog.take_link(id)?);
        return Ok("link taken over");
    }
    let id = prog
        .attach_to_if_index(ifindex, XdpMode::Driver)
        .with_context(|| format!("attaching {PROG_UPLINK_XDP} to {iface} in driver mode"))?;
    let link: FdLink = prog
        .take_link(id)?
        .try_into()
        .context("the kernel attached XDP without a BPF link (kernel older than 5.9)")?;
    link.pin(pin)
        .with_context(|| format!("pinning the link at {}", pin.display()))?;
    Ok("new link")
}

/// Detaches an XDP link a previous agent pinned (the mode changed, or the
/// driver now refuses it): the link goes with its last reference.
fn remove_pinned_link(pin: &Path) {
    if let Ok(link) = PinnedLink::from_pin(pin) {
        match link.unpin() {
            Ok(fd) => drop(fd),
            Err(e) => tracing::warn!(pin = %pin.display(), "could not unpin the XDP link: {e}"),
        }
    }
}

/// Pin path of the XDP link on `ifindex` (for tests and `egress inspect`).
pub fn pin_path(pin_dir: &Path, ifindex: u32) -> PathBuf {
    link_pin_path(pin_dir, PROG_UPLINK_XDP, ifindex)
}

/// The driver of `iface` (ETHTOOL_GDRVINFO), None when it does not answer.
pub fn driver_of(iface: &str) -> Option<String> {
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    // struct ethtool_drvinfo: cmd, then driver[32] and the rest we ignore.
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        rest: [u8; 160],
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut DrvInfo,
        _pad: [u8; 16],
    }
    if iface.len() >= libc::IFNAMSIZ {
        return None;
    }
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        rest: [0; 160],
    };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: &mut info,
        _pad: [0; 16],
    };
    req.name[..iface.len()].copy_from_slice(iface.as_bytes());
    // SAFETY: plain socket and ioctl calls on valid, live buffers.
    let rc = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let rc = libc::ioctl(fd, SIOCETHTOOL as _, &mut req);
        libc::close(fd);
        rc
    };
    if rc != 0 {
        return None;
    }
    let end = info.driver.iter().position(|b| *b == 0).unwrap_or(32);
    let name = String::from_utf8_lossy(&info.driver[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_is_tc_whatever_the_driver() {
        for d in [None, Some("veth"), Some("mlx5_core")] {
            assert!(matches!(plan(UplinkXdpMode::Off, d), Plan::Tc(r) if r.contains("off")));
        }
    }

    #[test]
    fn auto_tries_native_except_on_veth() {
        assert_eq!(plan(UplinkXdpMode::Auto, Some("mlx5_core")), Plan::Native);
        assert_eq!(plan(UplinkXdpMode::Auto, Some("virtio_net")), Plan::Native);
        // A driver that does not answer may still run XDP: the attach says.
        assert_eq!(plan(UplinkXdpMode::Auto, None), Plan::Native);
        assert!(
            matches!(plan(UplinkXdpMode::Auto, Some("veth")), Plan::Tc(r) if r.contains("veth"))
        );
    }

    #[test]
    fn native_is_tried_even_on_veth() {
        assert_eq!(plan(UplinkXdpMode::Native, Some("veth")), Plan::Native);
    }

    #[test]
    fn an_unknown_device_has_no_driver() {
        assert_eq!(driver_of("no-such-dev0"), None);
        assert_eq!(driver_of("an-interface-name-too-long"), None);
    }
}
