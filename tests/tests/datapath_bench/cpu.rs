//! CPU time from /proc/stat, so that each throughput figure can also be
//! given per CPU second spent on it.

use std::time::Instant;

use anyhow::{Context, Result};

/// Clock ticks of each CPU, in CPU order, and when they were read: busy
/// (user, nice, system, irq and softirq; not idle, iowait or steal), of
/// those in interrupts (irq and softirq, where the kernel's packet work
/// runs), and idle (idle and iowait).
///
/// Busy and interrupt ticks are samples: without IRQ time accounting (this
/// kernel has none) each timer tick is charged whole to what it lands in.
/// On a CPU that sleeps between bursts of packet work (NO_HZ idle) the
/// tick that was due while it slept fires as it wakes, inside the softirq
/// that woke it, so interrupt ticks over-count a wake-up-heavy load by
/// several times. Idle time is not sampled: the kernel measures each
/// sleep with its clock, so one CPU's awake time (wall clock less idle) is
/// exact.
pub struct Ticks(Vec<CpuTicks>, Instant);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CpuTicks {
    busy: u64,
    interrupts: u64,
    idle: u64,
}

/// Which CPU time a measurement counts: every CPU's busy time, one CPU's
/// interrupt ticks, or one CPU's awake time (exact; the packet work of
/// whatever is steered to it, and whatever else runs there).
#[derive(Clone, Copy)]
pub enum Cpus {
    AllBusy,
    InterruptsOf(usize),
    AwakeOf(usize),
}

impl Ticks {
    pub fn now() -> Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let per_cpu = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .map(cpu_ticks)
            .collect::<Result<Vec<_>>>()?;
        Ok(Self(per_cpu, Instant::now()))
    }

    /// CPU seconds of `cpus` between `earlier` and `self`.
    pub fn seconds_since(&self, earlier: &Ticks, cpus: Cpus) -> f64 {
        let ticks: u64 = match cpus {
            Cpus::AllBusy => (0..self.0.len())
                .map(|i| self.0[i].busy.saturating_sub(earlier.0[i].busy))
                .sum(),
            Cpus::InterruptsOf(i) => self.0[i].interrupts.saturating_sub(earlier.0[i].interrupts),
            Cpus::AwakeOf(i) => {
                let idle = self.0[i].idle.saturating_sub(earlier.0[i].idle);
                let wall = self.1.duration_since(earlier.1).as_secs_f64();
                return (wall - idle as f64 / ticks_per_second()).max(0.0);
            }
        };
        ticks as f64 / ticks_per_second()
    }

    pub fn cpu_count(&self) -> usize {
        self.0.len()
    }
}

fn cpu_ticks(line: &str) -> Result<CpuTicks> {
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .with_context(|| format!("/proc/stat line {line:?}"))?;
    // user nice system idle iowait irq softirq steal ...
    anyhow::ensure!(f.len() >= 7, "/proc/stat line {line:?} is short");
    Ok(CpuTicks {
        busy: f[0] + f[1] + f[2] + f[5] + f[6],
        interrupts: f[5] + f[6],
        idle: f[3] + f[4],
    })
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn busy_counts_softirq_but_not_idle_or_steal() {
        let t = cpu_ticks("cpu1 10 1 20 1000 5 2 30 400 0 0").unwrap();
        assert_eq!(
            t,
            CpuTicks {
                busy: 10 + 1 + 20 + 2 + 30,
                interrupts: 2 + 30,
                idle: 1000 + 5,
            }
        );
        assert!(cpu_ticks("cpu1 10 1").is_err());
    }

    #[test]
    fn awake_time_is_the_wall_clock_less_the_measured_sleep() {
        let hz = ticks_per_second();
        let t0 = Instant::now();
        let at = |idle: f64| CpuTicks {
            busy: 0,
            interrupts: 0,
            idle: (idle * hz) as u64,
        };
        let before = Ticks(vec![at(0.0), at(100.0)], t0);
        let after = Ticks(vec![at(0.0), at(103.0)], t0 + Duration::from_secs(4));
        let awake = after.seconds_since(&before, Cpus::AwakeOf(1));
        assert!((awake - 1.0).abs() < 1e-9, "{awake}");
        // Asleep all along: nothing, never less.
        let after = Ticks(vec![at(0.0), at(105.0)], t0 + Duration::from_secs(4));
        assert_eq!(after.seconds_since(&before, Cpus::AwakeOf(1)), 0.0);
    }
}
