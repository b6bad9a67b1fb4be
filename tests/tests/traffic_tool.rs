//! The traffic tool on loopback: the sinks see what the sources sent, from
//! which address, and the TCP connection reports that it survived.

use std::{process::Command, time::Duration};

use egress_tests::{traffic_bin, Proc};

fn spawn(args: &[&str]) -> anyhow::Result<Proc> {
    let bin = traffic_bin()?;
    let mut cmd = Command::new(&bin);
    cmd.args(args);
    Proc::spawn(cmd, format!("egress-traffic {}", args.join(" ")))
}

fn report(mut p: Proc) -> anyhow::Result<serde_json::Value> {
    p.signal_term();
    let line = p.wait_for_line("\"role\"", Duration::from_secs(10))?;
    Ok(serde_json::from_str(&line)?)
}

#[test]
fn udp_and_tcp_streams_are_recorded_with_their_source() -> anyhow::Result<()> {
    let mut udp_sink = spawn(&["udp-sink", "127.0.0.1:0"])?;
    let udp_addr = udp_sink
        .wait_for_line("ready", Duration::from_secs(10))?
        .replace("ready addr=", "");
    let mut tcp_sink = spawn(&["tcp-sink", "127.0.0.1:0"])?;
    let tcp_addr = tcp_sink
        .wait_for_line("ready", Duration::from_secs(10))?
        .replace("ready addr=", "");

    let mut udp_source = spawn(&["udp-source", &udp_addr, "2"])?;
    udp_source.wait_for_line("ready", Duration::from_secs(10))?;
    let mut tcp_source = spawn(&["tcp-source", &tcp_addr, "2"])?;
    tcp_source.wait_for_line("ready", Duration::from_secs(10))?;
    // Let a few dozen messages through, then stop the sources before the sinks.
    std::thread::sleep(Duration::from_millis(200));
    let tcp = report(tcp_source)?;
    let udp = report(udp_source)?;
    let udp_seen = report(udp_sink)?;
    let tcp_seen = report(tcp_sink)?;

    assert_eq!(tcp["survived"], true, "{tcp}");
    assert!(tcp["echoed"].as_u64().unwrap() >= 10, "{tcp}");
    assert_eq!(
        tcp_seen["connections"][0]["peer"], "127.0.0.1",
        "{tcp_seen}"
    );
    assert_eq!(
        tcp_seen["connections"][0]["bytes"].as_u64().unwrap(),
        8 * tcp["sent"].as_u64().unwrap()
    );
    assert!(udp_seen["received"].as_u64().unwrap() >= 10, "{udp_seen}");
    assert!(udp_seen["received"].as_u64().unwrap() <= udp["sent"].as_u64().unwrap());
    assert_eq!(udp_seen["sources"][0], "127.0.0.1");
    Ok(())
}
