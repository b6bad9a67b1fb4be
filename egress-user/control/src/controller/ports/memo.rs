//! What each address's grant step gave in the last pass, by a fingerprint
//! of its inputs. A change touches a few addresses of a gateway; deciding
//! every one of a thousand again on every pass was most of the
//! controller's CPU at a thousand nodes. The memo only saves work: an
//! address whose inputs hash the same gets exactly what deciding it again
//! would give (the controller's tests check the two side by side).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hasher};

use crate::api::EipPortBlocks;
use crate::datastore::Event;

use super::super::config::ControllerConfig;
use super::super::plan::{AddressFact, Plan, PortFact};

/// Everything one address's grant step adds to a plan.
#[derive(Clone, Debug, Default)]
pub(super) struct AddressOutcome {
    pub fact: AddressFact,
    pub ports: Vec<PortFact>,
    /// (node, its grant of the address) for the nodes' EgressTunnels.
    pub grants: Vec<(String, EipPortBlocks)>,
    pub events: Vec<Event>,
}

impl AddressOutcome {
    pub fn add_to(&self, cfg: &ControllerConfig, plan: &mut Plan) {
        plan.addresses.push(self.fact.clone());
        plan.ports.extend(self.ports.iter().cloned());
        plan.events.extend(self.events.iter().cloned());
        for (node, grant) in &self.grants {
            let Some(t) = plan.tunnels.get_mut(node) else {
                continue;
            };
            t.port_block_size = cfg.port_block_size;
            t.port_blocks.push(grant.clone());
        }
    }
}

/// The outcomes of the last pass by (gateway, address), with the
/// fingerprint of the inputs that gave each. Entries a pass does not look
/// at are dropped at its end ([`GrantMemo::end_pass`]).
#[derive(Debug, Default)]
pub struct GrantMemo {
    last: HashMap<(String, String), (u128, AddressOutcome)>,
    this: HashMap<(String, String), (u128, AddressOutcome)>,
    /// Addresses decided again, and those taken from the memo, since start.
    pub decided: u64,
    pub reused: u64,
}

impl GrantMemo {
    /// The outcome of `addr` for inputs of fingerprint `print`: the last
    /// pass's when it had the same, else `decide`'s.
    pub(super) fn outcome(
        &mut self,
        gw: &str,
        addr: &str,
        print: u128,
        decide: impl FnOnce() -> AddressOutcome,
    ) -> &AddressOutcome {
        let key = (gw.to_string(), addr.to_string());
        let outcome = match self.last.remove(&key) {
            Some((p, o)) if p == print => {
                self.reused += 1;
                o
            }
            _ => {
                self.decided += 1;
                decide()
            }
        };
        &self
            .this
            .entry(key)
            .insert_entry((print, outcome))
            .into_mut()
            .1
    }

    /// Forgets the addresses this pass did not look at (a gateway or an
    /// address gone), and keeps the rest for the next pass.
    pub fn end_pass(&mut self) {
        self.last = std::mem::take(&mut self.this);
    }
}

/// 128 bits of two differently seeded SipHashes: a collision, which would
/// hand an address the last pass's grants, is not to be expected.
pub(super) struct Fingerprint(DefaultHasher, DefaultHasher);

impl Fingerprint {
    pub fn new() -> Self {
        let mut second = DefaultHasher::new();
        second.write_u64(0x9e37_79b9_7f4a_7c15);
        Self(DefaultHasher::new(), second)
    }

    pub fn finish128(&self) -> u128 {
        (u128::from(self.0.finish()) << 64) | u128::from(self.1.finish())
    }
}

impl Hasher for Fingerprint {
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
        self.1.write(bytes);
    }

    fn finish(&self) -> u64 {
        self.0.finish() ^ self.1.finish()
    }
}
