//! Value decoders for the fixed-format path attributes (ORIGIN, NEXT_HOP,
//! MED, LOCAL_PREF, AGGREGATOR, COMMUNITIES, ORIGINATOR_ID, CLUSTER_LIST):
//! each checks one value and, when it is malformed, says what RFC 7606
//! makes of it.

use std::net::Ipv4Addr;

use super::{
    malformed, Aggregator, Fault, ATTR_AGGREGATOR, ATTR_CLUSTER_LIST, ATTR_COMMUNITIES,
    ATTR_NEXT_HOP, ATTR_ORIGIN, ATTR_ORIGINATOR_ID,
};
use crate::codec::reader::Reader;
use crate::codec::CodecOptions;
use crate::types::Origin;

/// The value as one 4-octet number; None unless it is exactly 4 octets.
fn exactly_u32(value: &[u8]) -> Option<u32> {
    let mut r = Reader::new(value);
    match r.u32() {
        Some(v) if r.is_empty() => Some(v),
        _ => None,
    }
}

/// The value as a list of 4-octet numbers; None when it is empty or not a
/// whole number of them.
fn u32_list(value: &[u8]) -> Option<Vec<u32>> {
    if value.is_empty() || !value.len().is_multiple_of(4) {
        return None;
    }
    let mut r = Reader::new(value);
    let mut list = Vec::with_capacity(value.len() / 4);
    while let Some(c) = r.u32() {
        list.push(c);
    }
    Some(list)
}

pub(super) fn decode_origin(value: &[u8]) -> Result<Origin, Fault> {
    match value {
        [v] => Origin::from_u8(*v).ok_or(Fault::Withdraw("undefined ORIGIN value")),
        _ => Err(malformed(ATTR_ORIGIN, "ORIGIN length is not 1", value)),
    }
}

pub(super) fn decode_next_hop(value: &[u8]) -> Result<Ipv4Addr, Fault> {
    let a = exactly_u32(value)
        .map(Ipv4Addr::from)
        .ok_or_else(|| malformed(ATTR_NEXT_HOP, "NEXT_HOP length is not 4", value))?;
    // RFC 4271 6.3 / RFC 7606 7.3: a semantically wrong next hop
    // makes the route unusable.
    if a.is_unspecified() || a.is_broadcast() || a.is_multicast() {
        return Err(Fault::Withdraw("NEXT_HOP is not a unicast address"));
    }
    Ok(a)
}

/// MED or LOCAL_PREF: a single 4-octet number.
pub(super) fn decode_u32_value(type_code: u8, value: &[u8]) -> Result<u32, Fault> {
    exactly_u32(value).ok_or_else(|| malformed(type_code, "length is not 4", value))
}

/// AGGREGATOR (AS number as wide as the session's) or AS4_AGGREGATOR
/// (always 4 octets), followed by the aggregator's IPv4 address.
pub(super) fn decode_aggregator(
    type_code: u8,
    value: &[u8],
    opts: CodecOptions,
) -> Result<Aggregator, Fault> {
    let width = if type_code == ATTR_AGGREGATOR && !opts.four_octet_as {
        2
    } else {
        4
    };
    if value.len() != width + 4 {
        return Err(malformed(type_code, "AGGREGATOR length", value));
    }
    let mut r = Reader::new(value);
    let asn = if width == 2 {
        r.u16().map(u32::from)
    } else {
        r.u32()
    };
    Ok(Aggregator {
        asn: asn.unwrap_or_default(),
        addr: Ipv4Addr::from(r.u32().unwrap_or_default()),
    })
}

pub(super) fn decode_communities(value: &[u8]) -> Result<Vec<u32>, Fault> {
    u32_list(value).ok_or_else(|| {
        let why = "COMMUNITIES length is not a multiple of 4";
        malformed(ATTR_COMMUNITIES, why, value)
    })
}

pub(super) fn decode_originator_id(value: &[u8]) -> Result<Ipv4Addr, Fault> {
    exactly_u32(value)
        .map(Ipv4Addr::from)
        .ok_or_else(|| malformed(ATTR_ORIGINATOR_ID, "ORIGINATOR_ID length is not 4", value))
}

pub(super) fn decode_cluster_list(value: &[u8]) -> Result<Vec<Ipv4Addr>, Fault> {
    let ids = u32_list(value).ok_or_else(|| {
        let why = "CLUSTER_LIST length is not a multiple of 4";
        malformed(ATTR_CLUSTER_LIST, why, value)
    })?;
    Ok(ids.into_iter().map(Ipv4Addr::from).collect())
}
