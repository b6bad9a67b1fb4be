//! What each address's grant step gave in the last pass, by a fingerprint
//! of its inputs. A change touches a few addresses of a gateway; deciding
//! every one of a thousand again on every pass was most of the
//! controller's CPU at a thousand nodes. The memo only saves work: an
//! address whose inputs hash the same gets exactly what deciding it again
//! would give (the controller's tests check the two side by side).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;
use std::sync::Arc;

use crate::api::EipPortBlocks;
use crate::datastore::Event;

use super::super::config::ControllerConfig;
use super::super::plan::{AddressFact, Plan, PortFact, TunnelGrants};

/// Everything one address's grant step adds to a plan.
#[derive(Clone, Debug, Default)]
pub(in super::super) struct AddressOutcome {
    pub fact: AddressFact,
    pub ports: Arc<[PortFact]>,
    /// (node, its grant of the address) for the nodes' EgressTunnels.
    pub grants: Vec<(String, EipPortBlocks)>,
    pub events: Vec<Event>,
}

impl AddressOutcome {
    /// Adds the outcome to the plan: its facts, events and grants.
    pub fn add_to(&self, cfg: &ControllerConfig, plan: &mut Plan) {
        self.add_facts(plan);
        for (node, grant) in &self.grants {
            let Some(t) = plan.grants_mut(node) else {
                continue;
            };
            t.insert(cfg.port_block_size, grant.clone());
        }
    }

    /// Adds its facts and events (its grants are in the plan already).
    pub fn add_facts(&self, plan: &mut Plan) {
        plan.addresses.push(self.fact.clone());
        if !self.ports.is_empty() {
            plan.ports.push(self.ports.clone());
        }
        plan.events.extend(self.events.iter().cloned());
    }

    /// Takes its grants out of the plan.
    pub fn remove_grants(&self, gw: &str, addr: &str, plan: &mut Plan) {
        for (node, _) in &self.grants {
            if let Some(t) = plan.grants_mut(node) {
                t.remove(gw, addr);
            }
        }
    }
}

/// The outcomes of the last pass by gateway and address, with the
/// fingerprint of the inputs that gave each. Entries a pass does not look
/// at are dropped at its end ([`GrantMemo::end_pass`]).
#[derive(Debug, Default)]
pub struct GrantMemo {
    last: ByAddress,
    this: ByAddress,
    /// Every node's grants as the last pass planned them.
    pub(in super::super) tunnels: BTreeMap<String, Arc<TunnelGrants>>,
    /// The nodes with entries of each address, while a view cache keeps
    /// it current (the controller's); `None`: every tunnel is read.
    pub(in super::super) holders: Option<super::HolderIndex>,
    /// Addresses decided again, and those taken from the memo, since start.
    pub decided: u64,
    pub reused: u64,
}

/// gateway -> address -> (fingerprint, outcome).
type ByAddress = HashMap<String, HashMap<String, (u128, AddressOutcome)>>;

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
        let kept = self.last.get_mut(gw).and_then(|m| m.remove_entry(addr));
        let (key, outcome) = match kept {
            Some((key, (p, o))) if p == print => {
                self.reused += 1;
                (key, o)
            }
            _ => {
                self.decided += 1;
                (addr.to_string(), decide())
            }
        };
        self.keep(gw, key, (print, outcome))
    }

    /// Keeps `entry` for address `key` of `gw` for the next pass.
    fn keep(&mut self, gw: &str, key: String, entry: (u128, AddressOutcome)) -> &AddressOutcome {
        // No allocation of the gateway's name per address once it is there.
        if !self.this.contains_key(gw) {
            self.this.insert(gw.to_string(), HashMap::new());
        }
        let this = self.this.get_mut(gw).expect("inserted above");
        &this.entry(key).insert_entry(entry).into_mut().1
    }

    /// The addresses of gateway `gw` the last pass looked at and this one
    /// has not yet.
    pub(in super::super) fn last_addresses<'a>(
        &'a self,
        gw: &str,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.last
            .get(gw)
            .into_iter()
            .flat_map(|m| m.keys().map(String::as_str))
    }

    /// The last pass's outcome of `addr` of `gw`, if it looked at it.
    pub(in super::super) fn last_outcome(&self, gw: &str, addr: &str) -> Option<&AddressOutcome> {
        self.last.get(gw)?.get(addr).map(|(_, o)| o)
    }

    /// The fingerprint of the inputs the last pass decided `addr` of `gw`
    /// from, if it looked at it.
    pub(in super::super) fn last_print(&self, gw: &str, addr: &str) -> Option<u128> {
        self.last.get(gw)?.get(addr).map(|(p, _)| *p)
    }

    /// Whether the last pass looked at `addr` of `gw` (and this one has not
    /// yet).
    pub(in super::super) fn looked_at(&self, gw: &str, addr: &str) -> bool {
        self.last.get(gw).is_some_and(|m| m.contains_key(addr))
    }

    /// The last pass's outcome of `addr`, kept for this pass as it was
    /// (its inputs are known not to have changed); `None` when the last
    /// pass did not look at it.
    pub(in super::super) fn carry(&mut self, gw: &str, addr: &str) -> Option<&AddressOutcome> {
        let (key, kept) = self.last.get_mut(gw)?.remove_entry(addr)?;
        self.reused += 1;
        Some(self.keep(gw, key, kept))
    }

    /// Forgets the addresses this pass did not look at (a gateway or an
    /// address gone), and keeps the rest for the next pass.
    pub fn end_pass(&mut self) {
        self.last = std::mem::take(&mut self.this);
    }
}

/// 128 bits of two multiply-rotate hashes with different odd constants
/// (in the manner of rustc's FxHash, over 8-byte words): far cheaper than
/// SipHash over the tens of thousands of grants a pass looks at. The inputs
/// are the cluster's own objects, not chosen to collide; a collision would
/// hand one address the last pass's grants for as long as it lasts.
pub(super) struct Fingerprint {
    a: u64,
    b: u64,
}

impl Fingerprint {
    const K1: u64 = 0x517c_c1b7_2722_0a95;
    const K2: u64 = 0x9e37_79b9_7f4a_7c15;

    pub fn new() -> Self {
        Self { a: 0, b: 1 }
    }

    fn word(&mut self, w: u64) {
        self.a = (self.a.rotate_left(5) ^ w).wrapping_mul(Self::K1);
        self.b = (self.b.rotate_left(23) ^ w).wrapping_mul(Self::K2);
    }

    pub fn finish128(&self) -> u128 {
        (u128::from(self.a) << 64) | u128::from(self.b)
    }
}

impl Hasher for Fingerprint {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            // The length keeps "ab" + "" apart from "a" + "b".
            self.word(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.word(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.word(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.word(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.word(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.word(i as u64);
    }

    fn finish(&self) -> u64 {
        self.a ^ self.b
    }
}

#[cfg(test)]
mod tests {
    use super::Fingerprint;
    use std::hash::Hash;

    fn print(v: impl Hash) -> u128 {
        let mut h = Fingerprint::new();
        v.hash(&mut h);
        h.finish128()
    }

    #[test]
    fn inputs_that_differ_get_different_prints() {
        let a = print(("w1", Some((vec![16u16, 17], vec![17u16], false))));
        assert_eq!(
            a,
            print(("w1", Some((vec![16u16, 17], vec![17u16], false))))
        );
        for other in [
            print(("w1", Some((vec![17u16, 16], vec![17u16], false)))),
            print(("w1", Some((vec![16u16, 17], vec![17u16], true)))),
            print(("w1", Some((vec![16u16], vec![17u16, 17], false)))),
            print(("w2", Some((vec![16u16, 17], vec![17u16], false)))),
            print(("w1", None::<(Vec<u16>, Vec<u16>, bool)>)),
        ] {
            assert_ne!(a, other);
        }
        assert_ne!(print(("ab", "")), print(("a", "b")));
        assert_ne!(print((0u32, 1u32)), print((1u32, 0u32)));
    }
}
