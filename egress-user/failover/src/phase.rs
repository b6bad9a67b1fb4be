//! EgressTunnel phases: the one enum the monitor decides, the controller
//! writes into `status.phase` and the API (and its CRD) carries.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum TunnelPhase {
    #[default]
    Pending,
    Init,
    Ready,
    Failed,
    HeartbeatTimeout,
    NodeNotReady,
}

impl TunnelPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Init => "Init",
            Self::Ready => "Ready",
            Self::Failed => "Failed",
            Self::HeartbeatTimeout => "HeartbeatTimeout",
            Self::NodeNotReady => "NodeNotReady",
        }
    }
}

impl fmt::Display for TunnelPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
