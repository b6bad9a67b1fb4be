use std::collections::BTreeSet;

use serde_json::json;

use crate::{
    agent, assert_flags, combination, controller, env_var, field_path, find, flag, flags, mount,
    names, port, render, NAMESPACE,
};

#[test]
fn agent_daemonset_by_default() {
    let objs = render(&json!({}));
    let spec = agent(&objs);
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("egw-egress-gateway-agent")
    );
    // runs on every node: tolerates every taint
    let tol = spec.tolerations.clone().unwrap();
    assert!(
        tol.iter().any(|t| t.operator.as_deref() == Some("Exists")
            && t.key.is_none()
            && t.effect.is_none()),
        "no catch-all toleration: {tol:?}"
    );
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some("egress:0.1.0"));
    assert_eq!(c.command.as_deref(), Some(&["egress".to_owned()][..]));
    assert_eq!(c.args.as_ref().unwrap()[0], "agent");
    let sc = c.security_context.clone().unwrap();
    assert_ne!(sc.privileged, Some(true));
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
    let add: BTreeSet<String> = caps.add.unwrap().into_iter().collect();
    let want: BTreeSet<String> = ["BPF", "NET_ADMIN", "PERFMON", "NET_RAW"]
        .map(String::from)
        .into();
    assert_eq!(add, want);
    assert_eq!(
        sc.seccomp_profile.map(|p| p.type_),
        Some("RuntimeDefault".to_owned())
    );
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    // bpffs and /sys from the host
    let vols = spec.volumes.clone().unwrap();
    let host_path = |name: &str| {
        vols.iter()
            .find(|v| v.name == name)
            .and_then(|v| v.host_path.clone())
            .unwrap_or_else(|| panic!("no hostPath volume {name}"))
            .path
    };
    assert_eq!(host_path("bpffs"), "/sys/fs/bpf");
    assert_eq!(host_path("sys"), "/sys");
    let mounts = c.volume_mounts.clone().unwrap();
    let bpffs = mount(c, "bpffs");
    assert_eq!(bpffs.mount_path, "/sys/fs/bpf");
    assert_eq!(bpffs.mount_propagation.as_deref(), Some("HostToContainer"));
    assert!(mounts
        .iter()
        .any(|m| m.name == "sys" && m.mount_path == "/sys" && m.read_only == Some(true)));
    // NODE_NAME from the downward API
    let env = c.env.clone().unwrap();
    assert_eq!(field_path(env_var(c, "NODE_NAME")), "spec.nodeName");
    assert!(
        env.iter().all(|e| e.name != "EGRESS_BGP_PASSWORD"),
        "a password without a Secret"
    );
    // probes on the metrics port
    assert_eq!(port(c, "metrics").container_port, 9477);
    let path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref().unwrap().http_get.as_ref().unwrap().path.clone()
    };
    assert_eq!(path(&c.liveness_probe).as_deref(), Some("/healthz"));
    assert_eq!(path(&c.readiness_probe).as_deref(), Some("/readyz"));
    // flags
    let f = flags(c);
    assert_flags(
        &f,
        &[
            ("datastore", "kubernetes"),
            ("node-name", "$(NODE_NAME)"),
            ("pin-dir", "/sys/fs/bpf/egress"),
            ("lease-namespace", NAMESPACE),
            ("tunnel-update-period", "5s"),
            ("tunnel-monitor-period", "5s"),
            ("eip-eviction-timeout", "15s"),
            ("gateway-failover", "true"),
            ("probe-interval-ms", "50"),
            ("probe-detect-multiplier", "4"),
            ("vxlan-id", "100"),
            ("vxlan-port", "7789"),
            ("mtu", "0"),
            ("metrics-port", "9477"),
            ("bgp", "true"),
            ("bgp-asn", "64512"),
        ],
    );
    assert_eq!(
        flag(&f, "bgp-reflectors"),
        format!("egw-egress-gateway-reflector.{NAMESPACE}.svc")
    );
    assert_eq!(flag(&f, "bgp-reflector-port"), "179");
    assert!(!f.contains_key("log-json"));
    assert!(!f.contains_key("extra-cidr"));
    assert_eq!(flag(&f, "bgp-router-id"), "$(NODE_IP)");
    assert!(
        !f.contains_key("bgp-listen"),
        "agents must not listen on the BGP port in the host network"
    );
    assert_eq!(field_path(env_var(c, "NODE_IP")), "status.hostIP");
}

#[test]
fn agent_gets_sys_admin_instead_of_perfmon_when_asked() {
    let objs = render(&json!({"agent": {"sysAdminForBpf": true}}));
    let sc = agent(&objs).containers[0].security_context.clone().unwrap();
    let add: BTreeSet<String> = sc.capabilities.unwrap().add.unwrap().into_iter().collect();
    let want: BTreeSet<String> = ["BPF", "NET_ADMIN", "SYS_ADMIN", "NET_RAW"]
        .map(String::from)
        .into();
    assert_eq!(add, want);
    assert_eq!(sc.allow_privilege_escalation, None);
}

#[test]
fn agent_privileged_when_asked() {
    let objs = render(&json!({"agent": {"privileged": true}}));
    let c = &agent(&objs).containers[0];
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.privileged, Some(true));
    assert!(
        sc.capabilities.is_none(),
        "capabilities listed next to privileged"
    );
    assert_eq!(
        mount(c, "bpffs").mount_propagation.as_deref(),
        Some("Bidirectional")
    );
}

#[test]
fn values_reach_the_flags() {
    let objs = render(&combination("fast timers"));
    let a = &agent(&objs).containers[0];
    let f = flags(a);
    assert_eq!(
        flag(&f, "vxlan-id"),
        "16777215",
        "a large number printed in float notation?"
    );
    assert_flags(
        &f,
        &[
            ("tunnel-update-period", "200ms"),
            ("tunnel-monitor-period", "100ms"),
            ("eip-eviction-timeout", "1s"),
            ("probe-interval-ms", "100"),
            ("vxlan-port", "4790"),
            ("mtu", "8950"),
            ("metrics-port", "19477"),
        ],
    );
    assert_eq!(
        f["extra-cidr"],
        vec!["10.96.0.0/12".to_owned(), "fd00:10:96::/108".to_owned()]
    );
    assert!(f.contains_key("log-json"));
    assert_eq!(a.image.as_deref(), Some("registry.example/egress:1.2.3"));
    assert_eq!(a.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(env_var(a, "RUST_LOG").value.as_deref(), Some("debug"));
    let ports: Vec<i32> = a.ports.iter().flatten().map(|p| p.container_port).collect();
    assert!(ports.contains(&19477) && ports.contains(&4790), "{ports:?}");
    let c = &controller(&objs).containers[0];
    let f = flags(c);
    assert_eq!(flag(&f, "tunnel-monitor-period"), "100ms");
    assert_eq!(flag(&f, "eip-eviction-timeout"), "1s");
    assert_eq!(
        flag(&f, "port-block-size"),
        "4096",
        "a large number printed in float notation?"
    );
    assert_flags(
        &f,
        &[
            ("node-ip-port-range", "49152-65535"),
            ("max-ports-per-node", "40000"),
        ],
    );
    let probe_port = &c
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap()
        .port;
    assert_eq!(port(c, "metrics").container_port, 19477);
    assert_eq!(
        probe_port,
        &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into())
    );
    let svc = find(&objs, "Service", "egw-egress-gateway-agent-metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], 19477);

    // no probes flags when fast failover is off
    let objs = render(&json!({"feature": {"gatewayFailover": {"enable": false}}}));
    let f = flags(&agent(&objs).containers[0]);
    assert_eq!(flag(&f, "gateway-failover"), "false");
    assert!(!f.contains_key("probe-interval-ms"));
}

#[test]
fn controller_deployment_runs_the_reflector() {
    let objs = render(&json!({}));
    let deploy = find(&objs, "Deployment", "egw-egress-gateway-controller");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let spec = controller(&objs);
    assert_ne!(spec.host_network, Some(true));
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("egw-egress-gateway-controller")
    );
    let psc = spec.security_context.clone().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    // the non-root reflector may bind 179 in its own network namespace
    let sysctls = psc.sysctls.unwrap();
    assert_eq!(sysctls[0].name, "net.ipv4.ip_unprivileged_port_start");
    assert_eq!(sysctls[0].value, "179");
    let c = &spec.containers[0];
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.capabilities.unwrap().add, None);
    assert_eq!(c.args.as_ref().unwrap()[0], "controller");
    assert_eq!(port(c, "bgp").container_port, 179, "BGP port exposed");
    let f = flags(c);
    assert_eq!(flag(&f, "datastore"), "kubernetes");
    assert_eq!(
        flag(&f, "leader-election-lease-name"),
        "egw-egress-gateway-controller"
    );
    assert_flags(
        &f,
        &[
            ("leader-election-lease-duration", "15s"),
            ("lease-namespace", NAMESPACE),
            ("bgp-asn", "64512"),
            ("bgp-cluster-id", "0.0.0.1"),
            ("bgp-listen", "0.0.0.0:179"),
            ("bgp-router-id", "$(POD_IP)"),
            ("bgp-hold-time", "90"),
            ("bgp-keepalive-time", "30"),
            ("bgp-graceful-restart-time", "120"),
        ],
    );
    assert!(!f.contains_key("bgp-peer"));
    // the agents find the reflectors through a headless Service
    let svc = find(&objs, "Service", "egw-egress-gateway-reflector");
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["ports"][0]["port"], 179);
    assert_eq!(
        svc["spec"]["selector"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    let pdb = find(
        &objs,
        "PodDisruptionBudget",
        "egw-egress-gateway-controller",
    );
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    // a selector that picks the pods of the other component would be a bug
    let agent_labels =
        &find(&objs, "DaemonSet", "egw-egress-gateway-agent")["spec"]["selector"]["matchLabels"];
    assert_ne!(agent_labels, &deploy["spec"]["selector"]["matchLabels"]);
}

#[test]
fn bgp_values_reach_the_flags() {
    let objs = render(&combination("bgp with peers"));
    let spec = controller(&objs);
    assert_eq!(spec.host_network, Some(true));
    let c = &spec.containers[0];
    let f = flags(c);
    assert_flags(
        &f,
        &[
            ("bgp-asn", "4200000000"),
            ("bgp-router-id", "192.0.2.10"),
            ("bgp-cluster-id", "10.0.0.1"),
            ("bgp-listen", "[::]:1179"),
            ("bgp-hold-time", "9"),
            ("bgp-keepalive-time", "3"),
            ("bgp-graceful-restart-time", "300"),
        ],
    );
    assert_eq!(
        f["bgp-peer"],
        vec![
            "192.0.2.1,asn=65000,port=179".to_owned(),
            "2001:db8::1,asn=65001,port=1179".to_owned()
        ]
    );
    // port 1179 needs neither root nor a sysctl
    let psc = spec.security_context.clone().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert!(psc.sysctls.is_none());
    // host network: replicas must not share a node
    let affinity = spec.affinity.clone().unwrap().pod_anti_affinity.unwrap();
    assert!(affinity
        .required_during_scheduling_ignored_during_execution
        .is_some());
    assert_eq!(
        find(&objs, "Deployment", "egw-egress-gateway-controller")["spec"]["replicas"],
        1
    );
    assert!(
        objs.iter().all(|o| o["kind"] != "PodDisruptionBudget"),
        "a PodDisruptionBudget for one replica blocks node drains"
    );
    for spec in [agent(&objs), spec] {
        let key = env_var(&spec.containers[0], "EGRESS_BGP_PASSWORD")
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!((key.name.as_str(), key.key.as_str()), ("bgp-md5", "md5"));
    }
    let a = flags(&agent(&objs).containers[0]);
    assert_eq!(flag(&a, "bgp-reflector-port"), "1179");

    // host network on port 179: root with NET_BIND_SERVICE only, no sysctl
    let objs = render(&json!({"controller": {"hostNetwork": true}}));
    let spec = controller(&objs);
    let psc = spec.security_context.clone().unwrap();
    assert_eq!(psc.run_as_user, Some(0));
    assert!(psc.sysctls.is_none());
    let caps = spec.containers[0]
        .security_context
        .clone()
        .unwrap()
        .capabilities
        .unwrap();
    assert_eq!(caps.add, Some(vec!["NET_BIND_SERVICE".to_owned()]));
    assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
}

#[test]
fn bgp_and_metrics_can_be_turned_off() {
    let objs = render(&json!({"bgp": {"enabled": false}, "metrics": {"enabled": false}}));
    for spec in [agent(&objs), controller(&objs)] {
        let c = &spec.containers[0];
        let f = flags(c);
        assert_eq!(flag(&f, "bgp"), "false");
        assert!(
            f.keys().all(|k| !k.starts_with("bgp-")),
            "BGP flags with BGP off: {f:?}"
        );
        assert!(c
            .ports
            .iter()
            .flatten()
            .all(|p| p.name.as_deref() != Some("bgp")));
        // the health server stays for the probes
        assert!(c.liveness_probe.is_some() && c.readiness_probe.is_some());
    }
    let kinds = names(&objs);
    assert!(
        kinds.iter().all(|n| !n.starts_with("Service/")),
        "Services with BGP and metrics off: {kinds:?}"
    );
    let ds = find(&objs, "DaemonSet", "egw-egress-gateway-agent");
    assert!(ds["spec"]["template"]["metadata"]["annotations"].is_null());
    // and on by default
    let objs = render(&json!({}));
    find(&objs, "Service", "egw-egress-gateway-agent-metrics");
    find(&objs, "Service", "egw-egress-gateway-controller-metrics");
}
