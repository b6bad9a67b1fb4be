//! Both binaries refuse failover timers that cannot work, at start, with a
//! message that names the fields and says why (before touching anything).

use egress_tests::egress_bin;

fn refused(args: &[&str]) -> String {
    let out = std::process::Command::new(egress_bin().unwrap())
        .args(args)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "egress {args:?} must refuse these timers"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const BAD: [&str; 6] = [
    "--tunnel-update-period",
    "5s",
    "--tunnel-monitor-period",
    "5s",
    "--eip-eviction-timeout",
    "10s",
];

#[test]
fn controller_refuses_an_eviction_timeout_not_above_monitor_plus_update() {
    let mut args = vec!["controller", "--etcd-endpoints", "http://127.0.0.1:1"];
    args.extend(BAD);
    let err = refused(&args);
    assert!(err.to_lowercase().contains("eviction"), "{err}");
    assert!(
        !err.contains("etcd"),
        "the timers must be refused before connecting: {err}"
    );
}

#[test]
fn agent_refuses_an_eviction_timeout_not_above_monitor_plus_update() {
    let mut args = vec![
        "agent",
        "--node-name",
        "n1",
        "--etcd-endpoints",
        "http://127.0.0.1:1",
    ];
    args.extend(BAD);
    let err = refused(&args);
    assert!(err.contains("eipEvictionTimeout"), "{err}");
    assert!(
        err.contains("tunnelMonitorPeriod") && err.contains("tunnelUpdatePeriod"),
        "{err}"
    );
}
