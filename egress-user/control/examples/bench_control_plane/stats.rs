//! Process figures read from /proc, percentiles, and the final JSON.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::Size;

pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Peak resident memory of a process (VmHWM), in MB.
pub fn peak_mb(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// CPU time a process has used so far (user + system), in milliseconds.
pub fn cpu_ms(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count after its ')'.
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|t| t.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after ')'.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) * 1000.0 / hz
}

pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

pub fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

/// One object: the small size's figures under their own names, every
/// other size's prefixed with its name (`large_cold_start_s`), and the
/// ratios of the agent's CPU per change (large over small).
pub fn merge(all: &mut Map<String, Value>, per_size: &[(Size, Map<String, Value>)]) {
    all.insert("bench".into(), "control-plane".into());
    all.insert("datastore".into(), "etcd".into());
    for (size, figures) in per_size {
        for (k, v) in figures {
            let key = if size.name == "small" {
                k.clone()
            } else {
                format!("{}_{k}", size.name)
            };
            all.insert(key, v.clone());
        }
    }
    for (ratio, key) in [
        ("agent_cpu_per_change_ratio", "agent_cpu_per_own_change_ms"),
        (
            "agent_cpu_per_other_change_ratio",
            "agent_cpu_per_other_change_ms",
        ),
        (
            "controller_cpu_per_change_ratio",
            "controller_cpu_per_change_ms",
        ),
        // Net of the agent's idle CPU over each phase's length.
        (
            "agent_cpu_per_change_net_ratio",
            "agent_cpu_per_own_change_net_ms",
        ),
        (
            "agent_cpu_per_other_change_net_ratio",
            "agent_cpu_per_other_change_net_ms",
        ),
    ] {
        let get = |k: &str| all.get(k).and_then(Value::as_f64);
        if let (Some(s), Some(l)) = (get(key), get(&format!("large_{key}"))) {
            if s > 0.0 {
                all.insert(ratio.into(), round(l / s, 2).into());
            }
        }
    }
    all.insert("target_cold_start_s".into(), 5.into());
    all.insert("target_large_change_p99_ms".into(), 50.into());
    all.insert("target_large_new_pod_grant_p99_ms".into(), 100.into());
    all.insert("target_agent_cpu_per_change_ratio".into(), 1.5.into());
}
