use serde::{Deserialize, Serialize};

use crate::api::{API_VERSION, RECORD_API_VERSION};

/// Every kind of object the datastores hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    EgressGateway,
    EgressPolicy,
    EgressClusterPolicy,
    EgressTunnel,
    Node,
    Pod,
    Namespace,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::EgressGateway,
        Kind::EgressPolicy,
        Kind::EgressClusterPolicy,
        Kind::EgressTunnel,
        Kind::Node,
        Kind::Pod,
        Kind::Namespace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::EgressGateway => "EgressGateway",
            Kind::EgressPolicy => "EgressPolicy",
            Kind::EgressClusterPolicy => "EgressClusterPolicy",
            Kind::EgressTunnel => "EgressTunnel",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
        }
    }

    /// Lower-case plural, as in URLs and etcd keys.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::EgressGateway => "egressgateways",
            Kind::EgressPolicy => "egresspolicies",
            Kind::EgressClusterPolicy => "egressclusterpolicies",
            Kind::EgressTunnel => "egresstunnels",
            Kind::Node => "nodes",
            Kind::Pod => "pods",
            Kind::Namespace => "namespaces",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Kind::EgressGateway => "egw",
            Kind::EgressPolicy => "egp",
            Kind::EgressClusterPolicy => "egcp",
            Kind::EgressTunnel => "egt",
            Kind::Node => "no",
            Kind::Pod => "po",
            Kind::Namespace => "ns",
        }
    }

    pub fn namespaced(self) -> bool {
        matches!(self, Kind::EgressPolicy | Kind::Pod)
    }

    /// Custom resources have a status; the plain records do not.
    pub fn has_status(self) -> bool {
        self.is_custom()
    }

    pub fn is_custom(self) -> bool {
        matches!(
            self,
            Kind::EgressGateway
                | Kind::EgressPolicy
                | Kind::EgressClusterPolicy
                | Kind::EgressTunnel
        )
    }

    pub fn api_version(self) -> &'static str {
        if self.is_custom() {
            API_VERSION
        } else {
            RECORD_API_VERSION
        }
    }

    /// Parses what a user types: kind, plural, singular or short name, any case.
    pub fn parse(s: &str) -> Option<Kind> {
        let l = s.to_ascii_lowercase();
        Kind::ALL.into_iter().find(|k| {
            l == k.name().to_ascii_lowercase()
                || l == k.plural()
                || l == k.short()
                || (k.plural().ends_with('s') && l == k.plural()[..k.plural().len() - 1])
        })
    }

    /// From `apiVersion` and `kind` of a document.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| {
            k.name() == kind
                && (k.api_version() == api_version || (!k.is_custom() && api_version == "v1"))
        })
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
