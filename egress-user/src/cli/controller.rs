//! `egress controller`: leader-elected EIP allocation, gateway election,
//! port blocks and heartbeat monitoring.

use std::time::Duration;

use clap::Args;
use egress_control::controller::{run_controller, ControllerConfig, RunConfig, TimerConfig};

use super::datastore::DatastoreArgs;

/// Parses `5`, `1.5`, `5s`, `500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 5s, 500ms, 1.5)"))?;
    if !(v >= 0.0 && v.is_finite()) {
        return Err(format!("{s:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub datastore: DatastoreArgs,
    /// This replica's name in the election (default: hostname-pid).
    #[arg(long, env = "EGRESS_CONTROLLER_ID")]
    pub identity: Option<String>,
    /// Leader lease time.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_ttl: Duration,
    /// How often agents renew their heartbeat.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub tunnel_update_period: Duration,
    /// How often the controller checks heartbeats.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub tunnel_monitor_period: Duration,
    /// A gateway node without heartbeat for this long loses its EIPs.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub eip_eviction_timeout: Duration,
    /// Ports per port block.
    #[arg(long, default_value_t = 1024)]
    pub port_block_size: u16,
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let timers = TimerConfig {
        tunnel_update_period: args.tunnel_update_period,
        tunnel_monitor_period: args.tunnel_monitor_period,
        eip_eviction_timeout: args.eip_eviction_timeout,
    };
    timers.validate()?;
    anyhow::ensure!(
        args.port_block_size.is_power_of_two() && (64..=16384).contains(&args.port_block_size),
        "--port-block-size: {} must be a power of two from 64 to 16384",
        args.port_block_size
    );
    let identity = args.identity.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let ds = args.datastore.connect().await?;
    let cfg = RunConfig {
        identity,
        lease_ttl: args.lease_ttl,
        timers,
        controller: ControllerConfig {
            port_block_size: args.port_block_size,
            first_port: 1024,
        },
    };
    println!("controller {} started", cfg.identity);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // SIGINT or SIGTERM: resign, so another replica takes over at once.
    run_controller(ds, cfg, async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("five")
            .unwrap_err()
            .contains("not a duration"));
    }
}
