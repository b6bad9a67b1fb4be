//! The agent's netlink edge on the real kernel: the VXLAN device is created,
//! kept, adjusted and replaced as planned; pod veths are seen as they appear.

use egress_tests::{link_veth, Netns};
use egress_user::node::{
    vxlan::{self, VxlanSpec},
    watch::{LinkEvent, LinkWatch},
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
#[ignore = "needs root: creates namespaces and devices"]
fn vxlan_device_is_created_kept_and_replaced() -> anyhow::Result<()> {
    let node = Netns::new("vx")?;
    let want = VxlanSpec {
        name: "egress.vxlan".into(),
        port: 4789,
        mtu: 1450,
        ipv6_underlay: false,
    };
    let first = {
        let want = want.clone();
        node.enter(move || {
            runtime().block_on(async {
                let (conn, handle, _) = rtnetlink::new_connection()?;
                tokio::spawn(conn);
                let a = vxlan::ensure(&handle, &want).await?;
                let b = vxlan::ensure(&handle, &want).await?;
                Ok((a, b))
            })
        })?
    };
    assert_eq!(
        first.0, first.1,
        "a second ensure must keep the device, not recreate it"
    );
    let details = node.ip(&["-d", "link", "show", "egress.vxlan"])?;
    assert!(
        details.contains("external"),
        "not in external mode: {details}"
    );
    assert!(details.contains("dstport 4789"), "wrong port: {details}");
    assert!(details.contains("mtu 1450"), "wrong mtu: {details}");
    assert!(details.contains(",UP"), "not up: {details}");

    // Another port cannot be set on a live device: it is replaced.
    let moved = VxlanSpec {
        port: 8472,
        ..want.clone()
    };
    let second = node.enter(move || {
        runtime().block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(conn);
            vxlan::ensure(&handle, &moved).await
        })
    })?;
    assert_ne!(second, first.0);
    let details = node.ip(&["-d", "link", "show", "egress.vxlan"])?;
    assert!(
        details.contains("dstport 8472"),
        "port not changed: {details}"
    );

    // An IPv6 underlay needs a device that takes zero UDP checksums over
    // IPv6 (the programs write none). A device made without that (as an
    // older agent made them) is replaced, then kept.
    node.ip(&["link", "del", "egress.vxlan"])?;
    node.ip(&[
        "link",
        "add",
        "egress.vxlan",
        "type",
        "vxlan",
        "external",
        "dstport",
        "8472",
    ])?;
    let old = node.ip(&["-d", "link", "show", "egress.vxlan"])?;
    assert!(old.contains(" noudp6zerocsumrx"), "{old}");
    let v6 = VxlanSpec {
        port: 8472,
        mtu: 1430,
        ipv6_underlay: true,
        ..want
    };
    let third = node.enter(move || {
        runtime().block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(conn);
            let a = vxlan::ensure(&handle, &v6).await?;
            let b = vxlan::ensure(&handle, &v6).await?;
            Ok((a, b))
        })
    })?;
    let _ = second;
    assert_ne!(
        old.split(':').next(),
        Some(third.0.to_string().as_str()),
        "the device must be replaced: {old}"
    );
    assert_eq!(third.0, third.1, "a fitting device must be kept");
    let details = node.ip(&["-d", "link", "show", "egress.vxlan"])?;
    assert!(
        details.contains(" udp6zerocsumrx"),
        "zero checksums over IPv6 refused: {details}"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: creates namespaces and devices"]
fn a_pod_veth_is_seen_when_it_appears() -> anyhow::Result<()> {
    let node = Netns::new("lw")?;
    let pod = Netns::new("pod")?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let watcher = {
        let node_path = node.path();
        std::thread::spawn(move || -> anyhow::Result<Vec<String>> {
            let file = std::fs::File::open(node_path)?;
            use std::os::fd::AsRawFd;
            // SAFETY: valid namespace fd; only this thread moves.
            anyhow::ensure!(
                unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } == 0,
                "setns failed"
            );
            runtime().block_on(async {
                let mut watch = LinkWatch::start().await?;
                ready_tx.send(()).unwrap();
                let mut seen = Vec::new();
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
                while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, watch.next()).await {
                    if let LinkEvent::Present(link) = ev {
                        if link.is_pod_veth() {
                            seen.push(link.name.clone());
                            break;
                        }
                        seen.push(format!("other:{}", link.name));
                    }
                }
                Ok(seen)
            })
        })
    };
    ready_rx.recv()?;
    link_veth(&node, "vethpod1", &pod, "eth0")?;
    let seen = watcher.join().unwrap()?;
    assert_eq!(
        seen.last().map(String::as_str),
        Some("vethpod1"),
        "events: {seen:?}"
    );
    assert!(
        seen.iter().any(|s| s == "other:lo"),
        "the initial listing must include lo: {seen:?}"
    );
    Ok(())
}
