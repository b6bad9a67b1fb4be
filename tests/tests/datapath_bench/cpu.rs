//! CPU time from /proc/stat, so that each throughput figure can also be
//! given per CPU second spent on it.

use anyhow::{Context, Result};

/// Busy clock ticks of each CPU (user, nice, system, irq and softirq; not
/// idle, iowait or steal), in CPU order.
pub struct Ticks(Vec<u64>);

/// Which CPUs a measurement counts.
#[derive(Clone, Copy)]
pub enum Cpus {
    All,
    One(usize),
}

impl Ticks {
    pub fn now() -> Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let per_cpu = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .map(busy_ticks)
            .collect::<Result<Vec<_>>>()?;
        Ok(Self(per_cpu))
    }

    /// CPU seconds the CPUs in `cpus` were busy between `earlier` and `self`.
    pub fn busy_seconds_since(&self, earlier: &Ticks, cpus: Cpus) -> f64 {
        let delta = |i: usize| self.0[i].saturating_sub(earlier.0[i]);
        let ticks: u64 = match cpus {
            Cpus::All => (0..self.0.len()).map(delta).sum(),
            Cpus::One(i) => delta(i),
        };
        ticks as f64 / ticks_per_second()
    }

    pub fn cpu_count(&self) -> usize {
        self.0.len()
    }
}

fn busy_ticks(line: &str) -> Result<u64> {
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .with_context(|| format!("/proc/stat line {line:?}"))?;
    // user nice system idle iowait irq softirq steal ...
    anyhow::ensure!(f.len() >= 7, "/proc/stat line {line:?} is short");
    Ok(f[0] + f[1] + f[2] + f[5] + f[6])
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
    fn busy_ticks_count_softirq_but_not_idle_or_steal() {
        let busy = busy_ticks("cpu1 10 1 20 1000 5 2 30 400 0 0").unwrap();
        assert_eq!(busy, 10 + 1 + 20 + 2 + 30);
        assert!(busy_ticks("cpu1 10 1").is_err());
    }
}
