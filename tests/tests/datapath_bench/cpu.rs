//! CPU time from /proc/stat, so that each throughput figure can also be
//! given per CPU second spent on it.

use anyhow::{Context, Result};

/// Clock ticks of each CPU, in CPU order: busy (user, nice, system, irq
/// and softirq; not idle, iowait or steal) and of those in interrupts
/// (irq and softirq, where the kernel's packet work runs).
pub struct Ticks(Vec<CpuTicks>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CpuTicks {
    busy: u64,
    interrupts: u64,
}

/// Which CPU time a measurement counts: every CPU's busy time, or one
/// CPU's interrupt time (the packet work of whatever is steered to it,
/// without the processes and kernel threads that also run there).
#[derive(Clone, Copy)]
pub enum Cpus {
    AllBusy,
    InterruptsOf(usize),
}

impl Ticks {
    pub fn now() -> Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let per_cpu = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .map(cpu_ticks)
            .collect::<Result<Vec<_>>>()?;
        Ok(Self(per_cpu))
    }

    /// CPU seconds of `cpus` between `earlier` and `self`.
    pub fn seconds_since(&self, earlier: &Ticks, cpus: Cpus) -> f64 {
        let ticks: u64 = match cpus {
            Cpus::AllBusy => (0..self.0.len())
                .map(|i| self.0[i].busy.saturating_sub(earlier.0[i].busy))
                .sum(),
            Cpus::InterruptsOf(i) => self.0[i].interrupts.saturating_sub(earlier.0[i].interrupts),
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
    use super::*;

    #[test]
    fn busy_counts_softirq_but_not_idle_or_steal() {
        let t = cpu_ticks("cpu1 10 1 20 1000 5 2 30 400 0 0").unwrap();
        assert_eq!(
            t,
            CpuTicks {
                busy: 10 + 1 + 20 + 2 + 30,
                interrupts: 2 + 30
            }
        );
        assert!(cpu_ticks("cpu1 10 1").is_err());
    }
}
