use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::{json, Value};

use crate::{
    agent, check_k8s_schema, combinations, controller, find, helm, helm_bin, render, render_with,
    NAMESPACE, RELEASE, VAP_API,
};

// ---------------------------------------------------------------------------
// 2. helm lint, helm template, Kubernetes schemas
// ---------------------------------------------------------------------------

fn check_all(objs: &[Value]) {
    assert!(!objs.is_empty(), "nothing rendered");
    let failures: Vec<String> = objs
        .iter()
        .filter_map(|o| {
            check_k8s_schema(o).err().map(|e| {
                format!(
                    "{}/{}: {e}",
                    o["kind"].as_str().unwrap_or("?"),
                    o["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for o in objs {
        // namespaced kinds land in the release namespace, cluster-wide ones carry none
        let cluster_wide = matches!(
            o["kind"].as_str().unwrap(),
            "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
                | "CustomResourceDefinition"
        );
        let ns = &o["metadata"]["namespace"];
        if cluster_wide {
            assert!(ns.is_null(), "{} has a namespace", o["metadata"]["name"]);
        } else {
            assert_eq!(
                ns, NAMESPACE,
                "{} is not in the release namespace",
                o["metadata"]["name"]
            );
        }
        let name = o["metadata"]["name"].as_str().unwrap();
        assert!(name.len() <= 63, "{name} is longer than 63 characters");
    }
}

#[test]
fn helm_lint_passes() {
    for (name, overrides) in combinations() {
        if let Err(e) = helm(&["lint", "--strict"], &overrides, &[]) {
            panic!("helm lint --strict failed for {name}:\n{e}");
        }
    }
}

#[test]
fn rendered_objects_match_kubernetes_schemas() {
    for (name, overrides) in combinations() {
        let objs = render_with(&overrides, &["--api-versions", VAP_API, "--include-crds"]);
        eprintln!("{name}: {} objects", objs.len());
        check_all(&objs);
    }
}

/// The round trip does catch unknown and misplaced fields (so the test above
/// can fail).
#[test]
fn schema_check_catches_unknown_and_misplaced_fields() {
    let objs = render(&json!({}));
    let deploy = find(&objs, "Deployment", "egw-egress-gateway-controller").clone();
    assert_eq!(check_k8s_schema(&deploy), Ok(()));

    let mut unknown = deploy.clone();
    unknown["spec"]["template"]["spec"]["containers"][0]["privilegd"] = json!(true);
    assert!(
        check_k8s_schema(&unknown).is_err(),
        "a misspelt field passed"
    );

    let mut misplaced = deploy.clone();
    misplaced["spec"]["template"]["spec"]["containers"][0]["hostNetwork"] = json!(true);
    assert!(
        check_k8s_schema(&misplaced).is_err(),
        "hostNetwork on a container passed"
    );

    let mut wrong_type = deploy.clone();
    wrong_type["spec"]["replicas"] = json!("two");
    assert!(
        check_k8s_schema(&wrong_type).is_err(),
        "replicas as a string passed"
    );

    let mut wrong_version = deploy;
    wrong_version["apiVersion"] = json!("extensions/v1beta1");
    assert!(
        check_k8s_schema(&wrong_version).is_err(),
        "a removed apiVersion passed"
    );
}

#[test]
fn helm_rejects_bad_values() {
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"feature": {"eipEvictionTimeout": 3}}),
            "eipEvictionTimeout",
        ),
        (json!({"agent": {"bogus": 1}}), "bogus"),
        (json!({"bogus": 1}), "bogus"),
        // the cross-value rules of the templates (the binary applies the same)
        (
            json!({"feature": {"eipEvictionTimeout": "10s"}}),
            "must be longer than feature.tunnelMonitorPeriod",
        ),
        (
            json!({"feature": {"eipEvictionTimeout": "1s", "tunnelMonitorPeriod": "500ms", "tunnelUpdatePeriod": "500ms"}}),
            "must be longer than",
        ),
        (
            json!({"feature": {"eipEvictionTimeout": "1m", "tunnelUpdatePeriod": "1m"}}),
            "must be longer than",
        ),
        (
            json!({"bgp": {"holdTime": 9, "keepaliveTime": 9}}),
            "keepaliveTime",
        ),
        (json!({"bgp": {"listenPort": 9477}}), "listenPort"),
        // no whole block in the node-IP range (the controller refuses it too)
        (
            json!({"feature": {"portBlockSize": 8192}}),
            "holds no whole block of 8192 ports",
        ),
        (
            json!({"feature": {"nodeIpPortRange": "65000-61000"}}),
            "holds no whole block",
        ),
        // one fixed router id for several reflectors
        (
            json!({"bgp": {"routerId": "192.0.2.10"}}),
            "every reflector needs its own",
        ),
        (json!({"bgp": {"listenAddress": "any"}}), "listenAddress"),
        (
            json!({"feature": {"portReleaseQuarantine": "1s"}}),
            "feature.portReleaseQuarantine (1s) must be from 2s",
        ),
        (json!({"feature": {"portReleaseQuarantine": "2h"}}), "to 1h"),
        (
            json!({"feature": {"portReleaseQuarantine": "soon"}}),
            "portReleaseQuarantine",
        ),
        // BGP over an IPv6 underlay: the reflector must listen on IPv6
        (
            json!({"bgp": {"enabled": true}, "feature": {"vxlan": {"underlay": "ipv6"}}}),
            "bgp.listenAddress (0.0.0.0) must be an IPv6 address",
        ),
        (
            json!({"feature": {"vxlan": {"underlay": "ip6"}}}),
            "underlay",
        ),
    ];
    for (overrides, expected) in cases {
        match helm(&["template", RELEASE], &overrides, &[]) {
            Ok(_) => panic!("helm template accepted {overrides}"),
            Err(e) => assert!(
                e.contains(expected),
                "{overrides}: error does not mention {expected:?}:\n{e}"
            ),
        }
    }
    // just above the limit is fine, in mixed units
    render(
        &json!({"feature": {"eipEvictionTimeout": "1m0.5s", "tunnelMonitorPeriod": "30s", "tunnelUpdatePeriod": "30000ms"}}),
    );
    render(&json!({"feature": {"eipEvictionTimeout": "1h", "tunnelUpdatePeriod": "59m"}}));
}

/// On an IPv6 underlay the reflector listens on IPv6; agents and
/// reflectors take their BGP identifiers from their (IPv6) node and pod
/// addresses, which `--bgp-router-id` accepts.
#[test]
fn bgp_over_an_ipv6_underlay_renders_ipv6_sessions() {
    let args = |spec: &PodSpec| spec.containers[0].args.clone().unwrap_or_default();
    let objs = render(&crate::combination("bgp over an IPv6 underlay"));
    let agent = args(&crate::agent(&objs));
    for want in ["--underlay=ipv6", "--bgp-router-id=$(NODE_IP)"] {
        assert!(agent.contains(&want.to_string()), "{want}: {agent:?}");
    }
    let controller = args(&crate::controller(&objs));
    for want in ["--bgp-listen=[::]:179", "--bgp-router-id=$(POD_IP)"] {
        assert!(
            controller.contains(&want.to_string()),
            "{want}: {controller:?}"
        );
    }
}

/// What the API server would refuse in a pod's security settings (rules of
/// the apiserver's validation that the typed structs cannot know).
fn apiserver_pod_rules(spec: &PodSpec) -> Result<(), String> {
    for c in &spec.containers {
        let sc = c.security_context.clone().unwrap_or_default();
        let privileged = sc.privileged == Some(true);
        let adds: Vec<String> = sc
            .capabilities
            .clone()
            .and_then(|c| c.add)
            .unwrap_or_default();
        if sc.allow_privilege_escalation == Some(false)
            && (privileged
                || adds
                    .iter()
                    .any(|a| a == "SYS_ADMIN" || a == "CAP_SYS_ADMIN"))
        {
            return Err(format!(
                "{}: allowPrivilegeEscalation false with privileged or SYS_ADMIN",
                c.name
            ));
        }
        for m in c.volume_mounts.as_deref().unwrap_or_default() {
            if m.mount_propagation.as_deref() == Some("Bidirectional") && !privileged {
                return Err(format!(
                    "{}: Bidirectional mount propagation needs a privileged container",
                    c.name
                ));
            }
        }
        let ports: BTreeSet<String> = c
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.name.clone())
            .collect();
        for probe in [&c.liveness_probe, &c.readiness_probe]
            .into_iter()
            .flatten()
        {
            if let Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(p)) =
                probe.http_get.as_ref().map(|h| h.port.clone())
            {
                if !ports.contains(&p) {
                    return Err(format!("{}: probe port {p} is not a named port", c.name));
                }
            }
        }
    }
    if spec.host_network == Some(true) {
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.clone())
            .unwrap_or_default();
        if !sysctls.is_empty() {
            return Err("namespaced sysctls are not allowed with hostNetwork".into());
        }
    }
    Ok(())
}

#[test]
fn apiserver_rules_hold_for_every_combination() {
    for (name, overrides) in combinations() {
        let objs = render(&overrides);
        for spec in [agent(&objs), controller(&objs)] {
            if let Err(e) = apiserver_pod_rules(&spec) {
                panic!("{name}: {e}");
            }
        }
    }
    // and the rules do catch the two classic mistakes
    let mut spec = agent(&render(&json!({})));
    spec.containers[0].volume_mounts.as_mut().unwrap()[0].mount_propagation =
        Some("Bidirectional".into());
    assert!(apiserver_pod_rules(&spec).is_err());
    let mut spec = agent(&render(&json!({"agent": {"sysAdminForBpf": true}})));
    spec.containers[0]
        .security_context
        .as_mut()
        .unwrap()
        .allow_privilege_escalation = Some(false);
    assert!(apiserver_pod_rules(&spec).is_err());
}

#[test]
fn notes_render() {
    let version = helm::helm_version(helm_bin()).unwrap();
    if version.starts_with("v3.") {
        // helm 3's `install --dry-run=client` still asks a cluster for its version
        eprintln!("note: NOTES.txt is rendered with helm 4 only; {version} given");
        return;
    }
    let out = helm(&["install", RELEASE, "--dry-run=client"], &json!({}), &[])
        .unwrap_or_else(|e| panic!("helm install --dry-run=client: {e}"));
    let notes = out.split("NOTES:").nth(1).expect("NOTES printed");
    assert!(notes.contains("kubectl get egresstunnels"), "{notes}");
    assert!(notes.contains("no upstream peers"), "{notes}");
    assert!(notes.contains("EIPs move after 15s"), "{notes}");
}
