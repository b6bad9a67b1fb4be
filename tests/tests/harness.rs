//! The harness itself: unique names, cleanup on panic, clear load errors.

use std::path::Path;

use egress_tests::{egress_bin, link_veth, Netns, PinDir};

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

#[test]
#[ignore = "needs root: creates namespaces"]
fn same_label_twice_gives_two_namespaces_that_do_not_collide() -> anyhow::Result<()> {
    // Two threads build the same topology at once, as two tests would.
    let build = || -> anyhow::Result<(String, String)> {
        let a = Netns::new("a")?;
        let b = Netns::new("b")?;
        link_veth(&a, "eth0", &b, "eth0")?;
        a.addr("eth0", "10.98.0.1/24")?;
        b.addr("eth0", "10.98.0.2/24")?;
        a.exec(&["ping", "-c", "1", "-W", "2", "10.98.0.2"])?;
        Ok((a.name().to_owned(), b.name().to_owned()))
    };
    let t1 = std::thread::spawn(build);
    let t2 = std::thread::spawn(build);
    let (a1, b1) = t1.join().unwrap()?;
    let (a2, b2) = t2.join().unwrap()?;
    assert_ne!(a1, a2);
    assert_ne!(b1, b2);
    for name in [a1, b1, a2, b2] {
        assert!(!netns_exists(&name), "{name} was not removed");
    }
    Ok(())
}

#[test]
#[ignore = "needs root: creates namespaces"]
fn a_panicking_test_still_removes_its_namespaces_and_processes() -> anyhow::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let ns = Netns::new("panic").unwrap();
        let sleeper = ns.spawn(&["sleep", "600"]).unwrap();
        tx.send((ns.name().to_owned(), sleeper.pid())).unwrap();
        panic!("the test fails here");
    });
    assert!(result.is_err());
    let (name, pid) = rx.recv()?;
    assert!(!netns_exists(&name), "{name} survived the panic");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} survived the panic"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: uses setpriv to drop to an unprivileged user"]
fn loading_without_capabilities_names_the_missing_ones() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let pins = PinDir::new("nocap")?;
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&egress)
        .args(["agent", "--count-iface", "lo", "--pin-dir"])
        .arg(pins.path())
        .output()?;
    assert!(
        !out.status.success(),
        "the agent must refuse to start without capabilities"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for cap in ["CAP_BPF", "CAP_NET_ADMIN", "CAP_SYS_ADMIN"] {
        assert!(stderr.contains(cap), "stderr does not name {cap}: {stderr}");
    }
    assert!(!stderr.contains("os error"), "a raw errno leaked: {stderr}");
    Ok(())
}
