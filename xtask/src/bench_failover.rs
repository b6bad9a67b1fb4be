//! `cargo xtask bench failover`: the traffic gap of `gateway-kill` with the
//! default timers (heartbeats 5 s / 5 s / 15 s, the binaries' default
//! probes) and with fast probes (100 ms x 3), five runs each; median and
//! worst, and in how many runs the TCP connection survived. Then
//! `gateway-under-load` with the defaults (`LOAD_RUNS` runs): every CPU
//! busy, then a saturating flow through the gateway, and the false
//! failovers they caused (`false_failovers_under_load`, must be 0). The
//! last line is one JSON object.
//!
//! The probe flags go to the controllers and, when `egress agent` has them,
//! to the agents (`agent_probe_flags`). Whether probes actually moved the
//! EIP is measured: `probes_effective` is true when the fast series'
//! median detection is below the eviction timeout (15 s), which the
//! heartbeat path cannot do.

use std::path::Path;

use anyhow::{bail, Result};
use egress_tests::{
    cluster::agent_has_flag,
    scenarios::{self, Options, Outcome},
};
use serde_json::json;

use crate::{
    e2e::{build_bins, require_root},
    shell::step,
};

const RUNS: usize = 5;
const FAST_PROBE: (u64, u32) = (100, 3);
/// The target for the fast configuration.
const TARGET_GAP_MS: f64 = 1000.0;
/// The target for the default timers' median gap.
const TARGET_DEFAULT_MEDIAN_MS: f64 = 300.0;
const LOAD_RUNS: usize = 2;

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn series(
    bins: &egress_tests::scenarios::Bins,
    scenario: &str,
    label: &str,
    runs: usize,
    opts: &Options,
) -> Vec<Outcome> {
    let mut out = Vec::new();
    for i in 1..=runs {
        step(&format!("{label} run {i}/{runs}"));
        match scenarios::run(bins, scenario, opts) {
            Ok(o) => {
                println!("{}", o.json());
                out.push(o);
            }
            Err(e) => {
                eprintln!("run failed: {e:#}");
                out.push(Outcome {
                    scenario: scenario.into(),
                    failures: vec![format!("{e:#}")],
                    ..Default::default()
                });
            }
        }
    }
    out
}

fn stats(runs: &[Outcome]) -> (Option<f64>, Option<f64>, Option<f64>) {
    let mut gaps: Vec<f64> = runs.iter().filter_map(|o| o.gap_ms).collect();
    let worst = if gaps.len() == runs.len() {
        gaps.iter().copied().reduce(f64::max)
    } else {
        None // a run without a measurement has no finite worst case
    };
    let mut det: Vec<f64> = runs
        .iter()
        .filter_map(|o| o.detection_ms.map(|d| d as f64))
        .collect();
    (median(&mut gaps), worst, median(&mut det))
}

/// `cargo xtask bench failover`.
pub fn run(root: &Path) -> Result<()> {
    require_root()?;
    let bins = build_bins(root)?;
    let agent_probe_flags = agent_has_flag(&bins.egress, "--probe-interval-ms");
    let default_opts = Options::defaults();
    let mut fast_opts = Options::defaults();
    fast_opts.timers.probe = Some(FAST_PROBE);
    let default_runs = series(&bins, "gateway-kill", "default timers", RUNS, &default_opts);
    let fast_runs = series(
        &bins,
        "gateway-kill",
        "fast probes (100 ms x 3)",
        RUNS,
        &fast_opts,
    );
    let load_runs = series(
        &bins,
        "gateway-under-load",
        "default timers under load",
        LOAD_RUNS,
        &default_opts,
    );
    let load = load_figures(&load_runs);
    let (dm, dw, ddet) = stats(&default_runs);
    let (fm, fw, fdet) = stats(&fast_runs);
    let all: Vec<&Outcome> = default_runs.iter().chain(&fast_runs).collect();
    let survived = all.iter().filter(|o| o.tcp_survived).count();
    let round = |v: Option<f64>| v.map(|x| x.round() as u64);
    let default_met = dm.is_some_and(|m| m < TARGET_DEFAULT_MEDIAN_MS);
    let target_met = fw.is_some_and(|w| w < TARGET_GAP_MS)
        && survived == all.len()
        && default_met
        && load.false_failovers == Some(0);
    let summary = json!({
        "bench": "failover",
        "scenario": "gateway-kill",
        "runs": RUNS,
        "gap_default_ms_median": round(dm),
        "gap_default_ms_worst": round(dw),
        "gap_fast_ms_median": round(fm),
        "gap_fast_ms_worst": round(fw),
        "detection_default_ms_median": round(ddet),
        "detection_fast_ms_median": round(fdet),
        "tcp_survived_runs": survived,
        "total_runs": all.len(),
        "dual_announce_ms_max": all.iter().map(|o| o.dual_announce_ms).max(),
        "agent_probe_flags": agent_probe_flags,
        "probes_effective": fdet.is_some_and(|d| d < 15000.0),
        "target_gap_ms": TARGET_GAP_MS,
        "target_default_median_ms": TARGET_DEFAULT_MEDIAN_MS,
        "default_probe_interval_ms": scenarios::default_probe().0,
        "default_probe_detect_multiplier": scenarios::default_probe().1,
        "load_runs": LOAD_RUNS,
        "false_failovers_under_load": load.false_failovers,
        "false_failovers_cpu": load.cpu,
        "false_failovers_traffic": load.traffic,
        "eip_moved_under_load": load.eip_moved,
        "load_traffic_iperf3_gbps_min": load.gbps_min,
        "load_cpu_busy_min": load.cpu_busy_min,
        "target_met": target_met,
    });
    println!("{summary}");
    if !target_met {
        bail!(
            "target not met: default median gap {:?} ms (target < {TARGET_DEFAULT_MEDIAN_MS} ms), false failovers under load {:?} (target 0), fast-probe worst gap {:?} ms (target < {TARGET_GAP_MS} ms), TCP survived {survived}/{}{}",
            round(dm),
            load.false_failovers,
            round(fw),
            all.len(),
            if fdet.is_some_and(|d| d < 15000.0) {
                ""
            } else {
                " (the heartbeat still decides: no prober acts on the datapath yet)"
            }
        );
    }
    Ok(())
}

/// The under-load series, summed: false failovers (`None` when a run
/// measured nothing), per load, whether the EIP moved, and how hard the
/// loads were (the slowest iperf3 run, the least busy CPU share).
struct LoadFigures {
    false_failovers: Option<u64>,
    cpu: Option<u64>,
    traffic: Option<u64>,
    eip_moved: bool,
    gbps_min: Option<f64>,
    cpu_busy_min: Option<f64>,
}

fn load_figures(runs: &[Outcome]) -> LoadFigures {
    let sum = |key: &str| -> Option<u64> {
        runs.iter()
            .map(|o| o.extra.get(key).and_then(serde_json::Value::as_u64))
            .sum()
    };
    let min = |f: &dyn Fn(&Outcome) -> Option<f64>| runs.iter().filter_map(f).reduce(f64::min);
    LoadFigures {
        false_failovers: sum("false_failovers_under_load"),
        cpu: sum("false_failovers_cpu"),
        traffic: sum("false_failovers_traffic"),
        eip_moved: runs
            .iter()
            .any(|o| o.extra.get("eip_moved_under_load") != Some(&serde_json::Value::Bool(false))),
        gbps_min: min(&|o| {
            o.extra
                .get("load_traffic_figure")?
                .get("iperf3_gbps")?
                .as_f64()
        }),
        cpu_busy_min: min(&|o| o.extra.get("load_cpu_cpu_busy")?.as_f64()),
    }
}
