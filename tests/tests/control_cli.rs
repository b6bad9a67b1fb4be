//! `egress apply/get/delete/pod/controller` against a real etcd started by
//! the test (needs `cargo build -p egress-user` first; no root needed).

use std::process::Command;
use std::time::{Duration, Instant};

use egress_tests::etcd::EtcdServer;
use egress_tests::{egress_bin, Proc};

struct Cli {
    bin: std::path::PathBuf,
    endpoint: String,
    dir: std::path::PathBuf,
}

impl Cli {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .env("EGRESS_DATASTORE", "etcd")
            .env("EGRESS_ETCD_ENDPOINTS", &self.endpoint)
            .env("EGRESS_ETCD_PREFIX", "/cli")
            .env("RUST_LOG", "warn");
        c
    }
    /// Runs; returns (success, stdout, stderr).
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = self.cmd(args).output().expect("egress runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }
    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(ok, "egress {args:?} failed: {err}");
        out
    }
    fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
}

const MANIFEST: &str =
    include_str!("../../egress-user/control/src/manifest/testdata/gateway_and_policy.yaml");

#[test]
fn apply_get_delete_pods_and_controller_on_etcd() {
    let etcd = EtcdServer::start().unwrap();
    let cli = Cli {
        bin: egress_bin().unwrap(),
        endpoint: etcd.endpoint(),
        dir: etcd.data_dir().to_path_buf(),
    };

    // CRDs print.
    let crds = cli.ok(&["crd"]);
    assert_eq!(crds.matches("kind: CustomResourceDefinition").count(), 4);

    // Dry run writes nothing; apply creates; apply again changes nothing.
    let m = cli.file("m.yaml", MANIFEST);
    let out = cli.ok(&["apply", "-f", &m, "--dry-run"]);
    assert!(
        out.contains("egresspolicy/default/web created (dry run)"),
        "{out}"
    );
    assert!(
        cli.ok(&["get", "egp"]).lines().count() == 1,
        "only the header after a dry run"
    );
    assert!(cli
        .ok(&["apply", "-f", &m])
        .contains("egressgateway/egw created"));
    assert!(cli
        .ok(&["apply", "-f", &m])
        .contains("egresspolicy/default/web unchanged"));

    // A bad manifest: clear error naming field and reason; nothing changes,
    // not even the good document beside it.
    let bad = cli.file(
        "bad.yaml",
        &format!(
            "{MANIFEST}---\napiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressPolicy\nmetadata: {{name: bad}}\n\
             spec:\n  egressGatewayName: egw\n  egressIP: {{ipv4: 10.9.9.9}}\n  appliedTo: {{podSubnet: [10.0.0.0/8]}}\n\
             ---\napiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressPolicy\nmetadata: {{name: fine}}\n\
             spec:\n  egressGatewayName: egw\n  appliedTo: {{podSubnet: [10.0.0.0/8]}}\n"
        ),
    );
    let before = cli.ok(&["get", "egp", "-A", "-o", "json"]);
    let (ok, _, err) = cli.run(&["apply", "-f", &bad]);
    assert!(!ok);
    assert!(
        err.contains("spec.egressIP.ipv4: 10.9.9.9 is outside the ipv4 pool of gateway egw"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(cli.ok(&["get", "egp", "-A", "-o", "json"]), before);

    // A typo of a field (issue 15: `destSubnets` made the policy match
    // every destination) is refused with its path, one line per problem,
    // in a dry run as in the write; so is an empty manifest.
    let typo = cli.file(
        "typo.yaml",
        &MANIFEST.replace("appliedTo:", "destSubnets: [10.0.0.0/8]\n  appliedTo:"),
    );
    for dry in [&["--dry-run"][..], &[]] {
        let (ok, _, err) = cli.run(&[&["apply", "-f", &typo][..], dry].concat());
        assert!(!ok);
        assert_eq!(
            err,
            format!(
                "{typo}: document 2 (EgressPolicy default/web): spec.destSubnets: unknown field\n\
                 error: {typo} was not applied: 1 problem(s) (nothing was written)\n"
            )
        );
    }
    let empty = cli.file("empty.yaml", "---\n# nothing here\n");
    let (ok, _, err) = cli.run(&["apply", "-f", &empty]);
    assert!(!ok);
    assert!(err.contains("the manifest holds no documents"), "{err}");
    assert_eq!(cli.ok(&["get", "egp", "-A", "-o", "json"]), before);

    // Pods.
    cli.ok(&[
        "pod",
        "add",
        "web-1",
        "--labels",
        "app=web,tier=x",
        "--node",
        "w1",
        "--ip",
        "10.244.1.5",
    ]);
    let pods = cli.ok(&["get", "pod", "web-1", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&pods).unwrap();
    assert_eq!(v["spec"]["ips"][0], "10.244.1.5");
    assert_eq!(v["metadata"]["labels"]["tier"], "x");
    let (ok, _, err) = cli.run(&["pod", "add", "x", "--node", "w1", "--ip", "10.1"]);
    assert!(
        !ok && err.contains("--ip: \"10.1\" is not an IP address"),
        "{err}"
    );

    // Nodes as records (what an agent registers).
    let n = cli.file(
        "n.yaml",
        "apiVersion: standalone.egress.dev/v1\nkind: Node\nmetadata: {name: gw1, labels: {egress: \"true\"}}\nspec: {addresses: [172.18.0.2]}\n",
    );
    cli.ok(&["apply", "-f", &n]);

    // The controller leads and reports that the gateway has no Ready node
    // (no agent registered a tunnel): a condition and an event.
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut ctl = cli.cmd(&[
        "controller",
        "--leader-election-lease-duration",
        "2s",
        "--tunnel-update-period",
        "200ms",
        "--tunnel-monitor-period",
        "200ms",
        "--eip-eviction-timeout",
        "1s",
        "--metrics-port",
        &metrics_port.to_string(),
    ]);
    ctl.env("EGRESS_CONTROLLER_ID", "c1");
    let mut ctl = Proc::spawn(ctl, "egress controller".into()).unwrap();
    ctl.wait_for_line("controller c1 leading", Duration::from_secs(10))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v: serde_json::Value =
            serde_json::from_str(&cli.ok(&["get", "egp", "web", "-o", "json"])).unwrap();
        if v["status"]["conditions"][0]["reason"] == "NoReadyGatewayNode" {
            break;
        }
        assert!(Instant::now() < deadline, "no status written: {v}");
        std::thread::park_timeout(Duration::from_millis(50)); // polling the CLI, not a synchronisation
    }
    assert!(cli.ok(&["get", "events"]).contains("NoReadyGatewayNode"));
    let metrics = http_get(metrics_port, "/metrics");
    assert!(metrics.contains("egress_controller_leader 1"), "{metrics}");
    assert!(http_get(metrics_port, "/healthz").ends_with("ok\n"));
    let st = ctl.terminate().unwrap();
    assert!(st.success(), "controller exits cleanly on SIGTERM: {st}");

    // Delete.
    assert!(cli.ok(&["delete", "egp", "web"]).contains("deleted"));
    let (ok, _, err) = cli.run(&["get", "egp", "web"]);
    assert!(!ok && err.contains("not found"), "{err}");
    let (ok, _, err) = cli.run(&["get", "gadgets"]);
    assert!(!ok && err.contains("unknown kind"), "{err}");
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
