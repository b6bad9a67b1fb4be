//! API objects of the egress gateway.
//!
//! Field names follow spidernet egressgateway's `v1beta1` so users can move
//! over; the API group is this project's own ([`GROUP`]). The custom resource
//! types serve both datastores: as CRDs on Kubernetes and as JSON records under
//! a key prefix on etcd. [`NodeRecord`], [`PodRecord`] and [`NamespaceRecord`]
//! are the plain records a cluster without Kubernetes registers (agents and
//! `egress pod add`); on Kubernetes they are read from core/v1 objects.

mod common;
mod gateway;
mod policy;
mod records;
mod tunnel;

pub use common::{Condition, LabelSelector, LabelSelectorRequirement};
pub use gateway::{
    EgressGateway, EgressGatewaySpec, EgressGatewayStatus, EipStatus, GatewayMode,
    GatewayNodeStatus, IpUsage, Ippools, NodeSelector, PolicyRef,
};
pub use policy::{
    AllocatorPolicy, AppliedTo, ClusterAppliedTo, EgressClusterPolicy, EgressClusterPolicySpec,
    EgressIp, EgressPolicy, EgressPolicySpec, EgressPolicyStatus, PolicyEip, DEFAULT_PRIORITY,
};
pub use records::{NamespaceRecord, NodeRecord, PodRecord};
pub use tunnel::{
    EgressTunnel, EgressTunnelSpec, EgressTunnelStatus, EipEpoch, EipPortBlocks, EipPortUse,
    Parent, PolicyOverCapacity, TunnelInfo, TunnelPhase,
};

/// The API group of every custom resource of this project.
pub const GROUP: &str = "egressgateway.egress.dev";
/// The one served and stored version.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of the custom resources.
pub const API_VERSION: &str = "egressgateway.egress.dev/v1beta1";
/// `apiVersion` of the standalone records (nodes, pods, namespaces).
pub const RECORD_API_VERSION: &str = "standalone.egress.dev/v1";

use kube::CustomResourceExt;

/// The CRDs generated from the types, in a fixed order.
pub fn crds(
) -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    vec![
        EgressGateway::crd(),
        EgressPolicy::crd(),
        EgressClusterPolicy::crd(),
        EgressTunnel::crd(),
    ]
}

/// One CRD as the YAML file kept in `charts/egress-gateway/crds/`.
pub fn crd_files() -> Vec<(String, String)> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.spec.names.plural.clone();
            let yaml = serde_yaml::to_string(&crd).expect("a CRD serialises");
            (format!("{name}.yaml"), yaml)
        })
        .collect()
}

/// Every CRD as one multi-document YAML stream (what `egress crd` prints).
pub fn crds_yaml() -> String {
    crd_files()
        .into_iter()
        .map(|(_, y)| format!("---\n{y}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/egress-gateway/crds")
    }

    /// The CRDs in charts/ are generated: this fails when they drift from
    /// the types. `UPDATE_CRDS=1 cargo test -p egress-control crds_in_chart`
    /// rewrites them.
    #[test]
    fn crds_in_chart_match_the_types() {
        let dir = chart_dir();
        if std::env::var_os("UPDATE_CRDS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            for (name, yaml) in crd_files() {
                std::fs::write(dir.join(name), yaml).unwrap();
            }
        }
        for (name, yaml) in crd_files() {
            let path = dir.join(&name);
            let on_disk = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_CRDS=1)", path.display()));
            assert!(
                on_disk == yaml,
                "{} differs from what the types generate: run `UPDATE_CRDS=1 cargo test -p egress-control crds_in_chart`",
                path.display()
            );
        }
    }

    #[test]
    fn crds_have_group_short_names_and_columns() {
        for crd in crds() {
            assert_eq!(crd.spec.group, GROUP);
            let names = &crd.spec.names;
            assert!(
                names.short_names.as_ref().is_some_and(|s| !s.is_empty()),
                "{}",
                names.kind
            );
            let v = &crd.spec.versions[0];
            assert_eq!(v.name, VERSION);
            assert!(v
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some());
            assert!(v
                .additional_printer_columns
                .as_ref()
                .is_some_and(|c| c.len() >= 3));
        }
    }

    #[test]
    fn spidernet_field_names_round_trip() {
        let y = r#"
apiVersion: egressgateway.egress.dev/v1beta1
kind: EgressPolicy
metadata: {name: p, namespace: default}
spec:
  egressGatewayName: egw
  egressIP: {ipv4: 10.6.1.21, useNodeIP: false, allocatorPolicy: rr}
  appliedTo: {podSelector: {matchLabels: {app: web}}}
  destSubnet: [10.0.0.0/8]
  priority: 5
"#;
        let p: EgressPolicy = serde_yaml::from_str(y).unwrap();
        assert_eq!(p.spec.egress_ip.ipv4, "10.6.1.21");
        assert_eq!(p.spec.egress_ip.allocator_policy, AllocatorPolicy::Rr);
        assert_eq!(p.spec.priority, Some(5));
        let back = serde_json::to_value(&p).unwrap();
        assert_eq!(back["spec"]["egressIP"]["useNodeIP"], false);
        assert_eq!(
            back["spec"]["appliedTo"]["podSelector"]["matchLabels"]["app"],
            "web"
        );
        let g: EgressGateway = serde_yaml::from_str(
            "apiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressGateway\nmetadata: {name: g}\nspec:\n  ippools: {ipv4: [10.6.1.21-10.6.1.30], ipv4DefaultEIP: 10.6.1.21}\n  nodeSelector: {selector: {matchLabels: {egress: 'true'}}}\n",
        )
        .unwrap();
        assert_eq!(g.spec.ippools.ipv4_default_eip, "10.6.1.21");
    }
}
