//! The announce lease in the `ANNOUNCE_UNTIL` map: the instant until which
//! the datapath may answer ARP/NDP for this node's EIPs. The agent extends it
//! after every heartbeat renewal to `renewal sent + fence_after`, the same
//! deadline its own fence keeps, so a node whose agent crashed (datapath
//! still up, programs pinned) falls silent when the agent would have, before
//! the controller hands the EIPs to another node.
//!
//! The map holds `bpf_ktime_get_ns()` time, which is CLOCK_MONOTONIC, the
//! clock `std::time::Instant` reads on Linux; [`Clock`] converts between them.

use std::path::Path;
use std::time::{Duration, Instant};

use aya::maps::{Array, Map, MapData};
use egress_common::maps::ANNOUNCE_UNTIL;

/// Pairs an `Instant` with the CLOCK_MONOTONIC reading taken at once.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    at: Instant,
    mono_ns: u64,
}

impl Clock {
    pub fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec out-pointer; CLOCK_MONOTONIC always exists.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        Self {
            at: Instant::now(),
            mono_ns: ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
        }
    }

    /// `t` as kernel monotonic nanoseconds.
    pub fn to_ns(&self, t: Instant) -> u64 {
        if t >= self.at {
            self.mono_ns + (t - self.at).as_nanos() as u64
        } else {
            self.mono_ns.saturating_sub((self.at - t).as_nanos() as u64)
        }
    }

    /// Kernel monotonic nanoseconds as an `Instant`.
    pub fn to_instant(&self, ns: u64) -> Instant {
        if ns >= self.mono_ns {
            self.at + Duration::from_nanos(ns - self.mono_ns)
        } else {
            self.at
                .checked_sub(Duration::from_nanos(self.mono_ns - ns))
                .unwrap_or(self.at)
        }
    }
}

fn open(pin_dir: &Path) -> anyhow::Result<Array<MapData, u64>> {
    let path = pin_dir.join(ANNOUNCE_UNTIL);
    let data = MapData::from_pin(&path)
        .map_err(|e| anyhow::anyhow!("opening pinned map {}: {e}", path.display()))?;
    Ok(Array::try_from(Map::Array(data))?)
}

/// Sets the lease to end at `until` (`None`: no limit, the datapath answers
/// for owned EIPs as long as they are in the map).
pub fn write(pin_dir: &Path, until: Option<Instant>) -> anyhow::Result<()> {
    let ns = until.map_or(0, |t| Clock::now().to_ns(t).max(1));
    open(pin_dir)?.set(0, ns, 0)?;
    Ok(())
}

/// What the map holds now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lease {
    /// 0: no limit.
    Unlimited,
    /// Ends at this instant (possibly in the past).
    Until(Instant),
}

pub fn read(pin_dir: &Path) -> anyhow::Result<Lease> {
    let ns = open(pin_dir)?.get(&0, 0)?;
    Ok(if ns == 0 {
        Lease::Unlimited
    } else {
        Lease::Until(Clock::now().to_instant(ns))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_round_trip_through_kernel_nanoseconds() {
        let c = Clock::now();
        for d in [0u64, 1, 999_999, 1_500_000_000] {
            let later = c.at + Duration::from_nanos(d);
            assert_eq!(c.to_instant(c.to_ns(later)), later);
            assert_eq!(c.to_ns(later), c.mono_ns + d);
        }
        let earlier = c.at.checked_sub(Duration::from_millis(3)).unwrap();
        assert_eq!(c.to_ns(earlier), c.mono_ns - 3_000_000);
        assert_eq!(c.to_instant(c.mono_ns - 3_000_000), earlier);
    }

    #[test]
    fn the_clock_is_the_kernels_monotonic_clock() {
        // Instant::now() and CLOCK_MONOTONIC read the same clock: two
        // successive pairs stay within a few milliseconds of each other.
        let a = Clock::now();
        let b = Clock::now();
        let via_a = a.to_ns(b.at);
        assert!(via_a.abs_diff(b.mono_ns) < 5_000_000, "{a:?} {b:?}");
    }
}
