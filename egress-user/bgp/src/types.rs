//! Small value types shared by the codec, the RIB and the speaker.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Address family identifier (RFC 4760).
pub const AFI_IPV4: u16 = 1;
pub const AFI_IPV6: u16 = 2;
/// Subsequent address family identifier for unicast.
pub const SAFI_UNICAST: u8 = 1;

/// AS number put in 2-octet fields when the real one does not fit (RFC 6793).
/// A BGP identifier from an address: an IPv4 one itself, an IPv6 one its
/// last 32 bits (where nodes and pods have only IPv6 addresses, these tell
/// them apart as long as their addresses differ there, as within one /96).
pub fn router_id_from(addr: IpAddr) -> Ipv4Addr {
    match addr {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => {
            let o = a.octets();
            Ipv4Addr::new(o[12], o[13], o[14], o[15])
        }
    }
}

pub const AS_TRANS: u32 = 23456;

/// The address families this speaker carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    Ipv4Unicast,
    Ipv6Unicast,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Ipv4Unicast, Family::Ipv6Unicast];

    pub fn afi(self) -> u16 {
        match self {
            Family::Ipv4Unicast => AFI_IPV4,
            Family::Ipv6Unicast => AFI_IPV6,
        }
    }

    pub fn safi(self) -> u8 {
        SAFI_UNICAST
    }

    pub fn from_afi_safi(afi: u16, safi: u8) -> Option<Family> {
        match (afi, safi) {
            (AFI_IPV4, SAFI_UNICAST) => Some(Family::Ipv4Unicast),
            (AFI_IPV6, SAFI_UNICAST) => Some(Family::Ipv6Unicast),
            _ => None,
        }
    }
}

/// An (AFI, SAFI) pair as it appears on the wire, known or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AfiSafi {
    pub afi: u16,
    pub safi: u8,
}

impl AfiSafi {
    pub fn family(self) -> Option<Family> {
        Family::from_afi_safi(self.afi, self.safi)
    }
}

impl From<Family> for AfiSafi {
    fn from(f: Family) -> Self {
        AfiSafi {
            afi: f.afi(),
            safi: f.safi(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PrefixError {
    #[error("prefix length {0} too long for the address family")]
    TooLong(u8),
    #[error("cannot parse prefix {0:?}")]
    Syntax(String),
}

/// An IP prefix with host bits cleared, so equal networks compare equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

impl Prefix {
    pub fn new(addr: IpAddr, len: u8) -> Result<Prefix, PrefixError> {
        let addr = match addr {
            IpAddr::V4(a) => {
                if len > 32 {
                    return Err(PrefixError::TooLong(len));
                }
                let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                if len > 128 {
                    return Err(PrefixError::TooLong(len));
                }
                let mask = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - len)
                };
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Ok(Prefix { addr, len })
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// Prefix length in bits (a prefix is not a container, hence no is_empty).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u8 {
        self.len
    }

    pub fn family(&self) -> Family {
        match self.addr {
            IpAddr::V4(_) => Family::Ipv4Unicast,
            IpAddr::V6(_) => Family::Ipv6Unicast,
        }
    }

    /// The address bytes that go on the wire: only the significant octets.
    pub(crate) fn wire_octets(&self) -> Vec<u8> {
        let n = self.len.div_ceil(8) as usize;
        match self.addr {
            IpAddr::V4(a) => a.octets()[..n].to_vec(),
            IpAddr::V6(a) => a.octets()[..n].to_vec(),
        }
    }
}

/// One or two integer writes instead of the derived byte-by-byte walk
/// through `IpAddr`: the RIB hashes every prefix several times per route.
impl Hash for Prefix {
    fn hash<H: Hasher>(&self, h: &mut H) {
        match self.addr {
            IpAddr::V4(a) => h.write_u64(u64::from(u32::from(a)) << 8 | u64::from(self.len)),
            IpAddr::V6(a) => {
                let v = u128::from(a);
                h.write_u64((v >> 64) as u64);
                h.write_u64(v as u64 ^ u64::from(self.len) << 56 ^ 1);
            }
        }
    }
}

/// The hasher of the RIB's prefix-keyed tables: one folded multiply per
/// word (as foldhash and wyhash do) with a per-process random seed, a
/// fraction of the cost of SipHash for these short keys. The keys come
/// from configured neighbours, and the seed keeps collisions unguessable.
#[derive(Clone, Copy, Default)]
pub struct PrefixHash;

#[derive(Clone, Copy)]
pub struct PrefixHasher(u64);

const HASH_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

fn fold_multiply(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
}

fn hash_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64) | 1)
}

impl BuildHasher for PrefixHash {
    type Hasher = PrefixHasher;
    fn build_hasher(&self) -> PrefixHasher {
        PrefixHasher(hash_seed())
    }
}

impl Hasher for PrefixHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = fold_multiply(self.0 ^ v, HASH_MULTIPLIER);
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by prefix, with [`PrefixHash`].
pub type PrefixMap<V> = std::collections::HashMap<Prefix, V, PrefixHash>;
/// A set of prefixes, with [`PrefixHash`].
pub type PrefixSet = std::collections::HashSet<Prefix, PrefixHash>;

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix {
    type Err = PrefixError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PrefixError::Syntax(s.to_string());
        let (a, l) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let len: u8 = l.parse().map_err(|_| bad())?;
        Prefix::new(addr, len)
    }
}

impl Serialize for Prefix {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Prefix {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// ORIGIN attribute values; the derived order is the decision-process order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Origin {
    Igp = 0,
    Egp = 1,
    Incomplete = 2,
}

impl Origin {
    pub fn from_u8(v: u8) -> Option<Origin> {
        match v {
            0 => Some(Origin::Igp),
            1 => Some(Origin::Egp),
            2 => Some(Origin::Incomplete),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SegmentKind {
    Set = 1,
    Sequence = 2,
    ConfedSequence = 3,
    ConfedSet = 4,
}

impl SegmentKind {
    pub fn from_u8(v: u8) -> Option<SegmentKind> {
        match v {
            1 => Some(SegmentKind::Set),
            2 => Some(SegmentKind::Sequence),
            3 => Some(SegmentKind::ConfedSequence),
            4 => Some(SegmentKind::ConfedSet),
            _ => None,
        }
    }

    /// AS_CONFED_SEQUENCE or AS_CONFED_SET (RFC 5065).
    pub fn is_confed(self) -> bool {
        matches!(self, SegmentKind::ConfedSequence | SegmentKind::ConfedSet)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AsSegment {
    pub kind: SegmentKind,
    pub asns: Vec<u32>,
}

/// AS_PATH, always held with 4-octet AS numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AsPath {
    pub segments: Vec<AsSegment>,
}

impl AsPath {
    pub fn sequence(asns: &[u32]) -> AsPath {
        if asns.is_empty() {
            return AsPath::default();
        }
        AsPath {
            segments: vec![AsSegment {
                kind: SegmentKind::Sequence,
                asns: asns.to_vec(),
            }],
        }
    }

    /// Length for the decision process: a set counts as one, confederation
    /// segments count as zero (RFC 4271 9.1.2.2, RFC 5065).
    pub fn path_len(&self) -> usize {
        self.segments
            .iter()
            .map(|s| match s.kind {
                SegmentKind::Sequence => s.asns.len(),
                SegmentKind::Set => 1,
                _ => 0,
            })
            .sum()
    }

    /// Number of AS numbers in the path, used when merging AS4_PATH.
    pub(crate) fn as_count(&self) -> usize {
        self.path_len()
    }

    pub fn contains(&self, asn: u32) -> bool {
        self.segments.iter().any(|s| s.asns.contains(&asn))
    }

    /// The AS a route was learned from: the first AS of a leading sequence.
    pub fn neighbor_as(&self) -> Option<u32> {
        match self.segments.first() {
            Some(s) if s.kind == SegmentKind::Sequence => s.asns.first().copied(),
            _ => None,
        }
    }

    /// Prepend our AS when sending to an eBGP peer.
    pub fn prepend(&mut self, asn: u32) {
        match self.segments.first_mut() {
            Some(s) if s.kind == SegmentKind::Sequence && s.asns.len() < 255 => {
                s.asns.insert(0, asn)
            }
            _ => self.segments.insert(
                0,
                AsSegment {
                    kind: SegmentKind::Sequence,
                    asns: vec![asn],
                },
            ),
        }
    }
}

impl fmt::Display for AsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for s in &self.segments {
            if !first {
                write!(f, " ")?;
            }
            first = false;
            let inner: Vec<String> = s.asns.iter().map(|a| a.to_string()).collect();
            match s.kind {
                SegmentKind::Sequence => write!(f, "{}", inner.join(" "))?,
                SegmentKind::Set => write!(f, "{{{}}}", inner.join(","))?,
                SegmentKind::ConfedSequence => write!(f, "({})", inner.join(" "))?,
                SegmentKind::ConfedSet => write!(f, "[{}]", inner.join(","))?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_hash_agrees_with_eq_and_spreads_low_bits() {
        let h = PrefixHash;
        let a: Prefix = "10.1.2.3/24".parse().unwrap();
        let b: Prefix = "10.1.2.0/24".parse().unwrap();
        assert_eq!(h.hash_one(a), h.hash_one(b));
        assert_ne!(
            h.hash_one(a),
            h.hash_one("10.1.2.0/25".parse::<Prefix>().unwrap())
        );
        // Consecutive /24s (low octet and length constant) must still
        // land in different buckets of a small table (low bits) and have
        // varied control bytes (top 7 bits).
        let hashes: Vec<u64> = (0..4096u32)
            .map(|i| {
                h.hash_one(
                    Prefix::new(IpAddr::V4(Ipv4Addr::from(0x1000_0000 + (i << 8))), 24).unwrap(),
                )
            })
            .collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|x| x & 4095).collect();
        let top: std::collections::HashSet<u64> = hashes.iter().map(|x| x >> 57).collect();
        assert!(low.len() > 2000, "{} distinct buckets", low.len());
        assert_eq!(top.len(), 128);
        let mut map: PrefixMap<u32> = PrefixMap::default();
        for i in 0..1000u32 {
            map.insert(
                Prefix::new(IpAddr::V6(Ipv6Addr::from(u128::from(i) << 80)), 48).unwrap(),
                i,
            );
        }
        assert_eq!(map.len(), 1000);
        assert_eq!(map[&"0:0:2::/48".parse::<Prefix>().unwrap()], 2);
    }

    #[test]
    fn prefix_clears_host_bits_and_parses() {
        let p: Prefix = "10.1.2.3/16".parse().unwrap();
        assert_eq!(p.to_string(), "10.1.0.0/16");
        assert_eq!(p.wire_octets(), vec![10, 1]);
        assert!("10.0.0.0/33".parse::<Prefix>().is_err());
        let v6: Prefix = "2001:db8::1/32".parse().unwrap();
        assert_eq!(v6.to_string(), "2001:db8::/32");
        assert_eq!(v6.family(), Family::Ipv6Unicast);
    }

    #[test]
    fn as_path_length_counts_sets_once_and_confeds_zero() {
        let p = AsPath {
            segments: vec![
                AsSegment {
                    kind: SegmentKind::ConfedSequence,
                    asns: vec![1, 2],
                },
                AsSegment {
                    kind: SegmentKind::Sequence,
                    asns: vec![3, 4],
                },
                AsSegment {
                    kind: SegmentKind::Set,
                    asns: vec![5, 6, 7],
                },
            ],
        };
        assert_eq!(p.path_len(), 3);
        let mut q = AsPath::sequence(&[65001]);
        q.prepend(65000);
        assert_eq!(q, AsPath::sequence(&[65000, 65001]));
        assert_eq!(q.neighbor_as(), Some(65000));
    }
}
