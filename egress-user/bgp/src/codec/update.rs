//! UPDATE message and path attributes (RFC 4271 4.3, RFC 4760, RFC 6793,
//! RFC 4456), with RFC 7606 error handling.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytes::{BufMut, Bytes, BytesMut};

use super::as_path;
use super::reader::Reader;
use super::{CodecOptions, DecodeError};
use crate::types::{AsPath, Family, Origin, Prefix, AS_TRANS};

mod attrs;
mod mp;
mod nlri;

use attrs::{
    decode_aggregator, decode_cluster_list, decode_communities, decode_next_hop, decode_origin,
    decode_originator_id, decode_u32_value,
};
use mp::{decode_mp_reach, decode_mp_unreach, mp_reach_value, mp_unreach_value};
use nlri::{decode_prefixes, encode_prefixes};

pub const ATTR_ORIGIN: u8 = 1;
pub const ATTR_AS_PATH: u8 = 2;
pub const ATTR_NEXT_HOP: u8 = 3;
pub const ATTR_MED: u8 = 4;
pub const ATTR_LOCAL_PREF: u8 = 5;
pub const ATTR_ATOMIC_AGGREGATE: u8 = 6;
pub const ATTR_AGGREGATOR: u8 = 7;
pub const ATTR_COMMUNITIES: u8 = 8;
pub const ATTR_ORIGINATOR_ID: u8 = 9;
pub const ATTR_CLUSTER_LIST: u8 = 10;
pub const ATTR_MP_REACH: u8 = 14;
pub const ATTR_MP_UNREACH: u8 = 15;
pub const ATTR_AS4_PATH: u8 = 17;
pub const ATTR_AS4_AGGREGATOR: u8 = 18;

const FLAG_OPTIONAL: u8 = 0x80;
const FLAG_TRANSITIVE: u8 = 0x40;
const FLAG_PARTIAL: u8 = 0x20;
const FLAG_EXTENDED: u8 = 0x10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Aggregator {
    pub asn: u32,
    pub addr: Ipv4Addr,
}

/// An optional transitive attribute we do not understand, passed on as is
/// with the partial bit set (RFC 4271 5).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawAttribute {
    pub flags: u8,
    pub type_code: u8,
    pub value: Bytes,
}

/// Path attributes of one UPDATE. AS numbers are always 4-octet here:
/// AS4_PATH / AS4_AGGREGATOR are folded in on decode and produced on encode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PathAttributes {
    pub origin: Option<Origin>,
    pub as_path: AsPath,
    pub next_hop: Option<Ipv4Addr>,
    pub med: Option<u32>,
    pub local_pref: Option<u32>,
    pub atomic_aggregate: bool,
    pub aggregator: Option<Aggregator>,
    pub communities: Vec<u32>,
    pub originator_id: Option<Ipv4Addr>,
    pub cluster_list: Vec<Ipv4Addr>,
    pub unknown: Vec<RawAttribute>,
}

/// MP_REACH_NLRI (RFC 4760 3), IPv4 or IPv6 unicast.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpReach {
    pub family: Family,
    pub next_hop: IpAddr,
    /// IPv6 link-local next hop, sent after the global one (RFC 2545 3).
    pub link_local: Option<Ipv6Addr>,
    pub nlri: Vec<Prefix>,
    /// RFC 7911 path id of each prefix in `nlri`, when the session carries
    /// them for the family; empty otherwise (encoded as 0 if needed).
    pub path_ids: Vec<u32>,
}

/// MP_UNREACH_NLRI (RFC 4760 4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpUnreach {
    pub family: Family,
    pub withdrawn: Vec<Prefix>,
    /// Path id of each prefix in `withdrawn` (see [`MpReach::path_ids`]).
    pub path_ids: Vec<u32>,
}

/// What RFC 7606 made of a malformed attribute that did not reset the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttrOutcome {
    /// Every prefix announced in the UPDATE is to be handled as withdrawn.
    TreatAsWithdraw { type_code: u8, reason: &'static str },
    /// The attribute was dropped; the routes are used without it.
    Discarded { type_code: u8, reason: &'static str },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Update {
    /// IPv4 unicast withdrawals (IPv6 ones are in `mp_unreach`).
    pub withdrawn: Vec<Prefix>,
    /// RFC 7911 path id of each of `withdrawn` (see [`MpReach::path_ids`]).
    pub withdrawn_ids: Vec<u32>,
    pub attrs: PathAttributes,
    /// IPv4 unicast announcements (IPv6 ones are in `mp_reach`).
    pub nlri: Vec<Prefix>,
    /// Path id of each of `nlri`.
    pub nlri_ids: Vec<u32>,
    pub mp_reach: Option<MpReach>,
    pub mp_unreach: Option<MpUnreach>,
    /// RFC 7606 outcomes met while decoding; empty for a clean message.
    pub errors: Vec<AttrOutcome>,
}

enum Fault {
    Withdraw(&'static str),
    Discard(&'static str),
    Reset(DecodeError),
}

impl Update {
    /// The End-of-RIB marker for a family (RFC 4724 2).
    pub fn end_of_rib(family: Family) -> Update {
        match family {
            Family::Ipv4Unicast => Update::default(),
            f => Update {
                mp_unreach: Some(MpUnreach {
                    family: f,
                    withdrawn: Vec::new(),
                    path_ids: Vec::new(),
                }),
                ..Update::default()
            },
        }
    }

    /// Some(family) when this UPDATE is an End-of-RIB marker.
    pub fn end_of_rib_family(&self) -> Option<Family> {
        let bare = self.withdrawn.is_empty()
            && self.nlri.is_empty()
            && self.mp_reach.is_none()
            && self.attrs == PathAttributes::default()
            && self.errors.is_empty();
        if !bare {
            return None;
        }
        match &self.mp_unreach {
            None => Some(Family::Ipv4Unicast),
            Some(u) if u.withdrawn.is_empty() => Some(u.family),
            Some(_) => None,
        }
    }

    pub fn treat_as_withdraw(&self) -> bool {
        self.errors
            .iter()
            .any(|e| matches!(e, AttrOutcome::TreatAsWithdraw { .. }))
    }

    /// Prefixes announced with usable attributes, both families.
    pub fn announced(&self) -> Vec<Prefix> {
        if self.treat_as_withdraw() {
            return Vec::new();
        }
        self.reached()
    }

    fn reached(&self) -> Vec<Prefix> {
        let mut v = self.nlri.clone();
        if let Some(r) = &self.mp_reach {
            v.extend_from_slice(&r.nlri);
        }
        v
    }

    /// Every prefix to remove: withdrawals, plus the announcements when
    /// RFC 7606 said treat-as-withdraw.
    pub fn withdrawals(&self) -> Vec<Prefix> {
        let mut v = self.withdrawn.clone();
        if let Some(u) = &self.mp_unreach {
            v.extend_from_slice(&u.withdrawn);
        }
        if self.treat_as_withdraw() {
            v.extend(self.reached());
        }
        v
    }

    pub(super) fn decode(body: &[u8], opts: CodecOptions) -> Result<Update, DecodeError> {
        let parts = split_body(body)?;
        let v4 = Family::Ipv4Unicast;
        let ids = opts.add_path_rx.has(v4);
        let (withdrawn, withdrawn_ids) =
            decode_prefixes(parts.withdrawn, v4, ids).ok_or(DecodeError::InvalidNetworkField)?;
        let (nlri, nlri_ids) =
            decode_prefixes(parts.nlri, v4, ids).ok_or(DecodeError::InvalidNetworkField)?;

        let mut u = Update {
            withdrawn,
            withdrawn_ids,
            nlri,
            nlri_ids,
            ..Update::default()
        };
        let mut seen = [false; 256];
        let mut as4 = As4Attributes::default();
        decode_attribute_list(parts.attributes, opts, &mut u, &mut seen, &mut as4)?;

        if !opts.four_octet_as {
            merge_as4(&mut u, as4);
        }
        check_mandatory_present(&mut u, &seen);
        Ok(u)
    }

    pub(super) fn encode_body(&self, opts: CodecOptions, out: &mut BytesMut) {
        let ids = opts.add_path_tx.has(Family::Ipv4Unicast);
        let mut w = BytesMut::new();
        encode_prefixes(&self.withdrawn, &self.withdrawn_ids, ids, &mut w);
        out.put_u16(w.len() as u16);
        out.put_slice(&w);

        let mut attrs = BytesMut::new();
        encode_attributes(self, opts, &mut attrs);
        out.put_u16(attrs.len() as u16);
        out.put_slice(&attrs);

        encode_prefixes(&self.nlri, &self.nlri_ids, ids, out);
    }
}

/// AS4_PATH and AS4_AGGREGATOR from a 2-octet speaker, held until every
/// attribute is read because merging needs AS_PATH and AGGREGATOR too.
#[derive(Default)]
struct As4Attributes {
    path: Option<AsPath>,
    aggregator: Option<Aggregator>,
}

/// The three parts of an UPDATE body (RFC 4271 4.3), not yet decoded.
struct BodyParts<'a> {
    withdrawn: &'a [u8],
    attributes: &'a [u8],
    nlri: &'a [u8],
}

/// Cuts an UPDATE body into withdrawn routes, path attributes and NLRI.
fn split_body(body: &[u8]) -> Result<BodyParts<'_>, DecodeError> {
    let mut r = Reader::new(body);
    let list_err = |why| DecodeError::MalformedAttributeList(why);
    let wlen = r.u16().ok_or(list_err("truncated"))? as usize;
    let withdrawn = r
        .take(wlen)
        .ok_or(list_err("withdrawn length overruns message"))?;
    let alen = r.u16().ok_or(list_err("truncated"))? as usize;
    let attributes = r
        .take(alen)
        .ok_or(list_err("attribute length overruns message"))?;
    Ok(BodyParts {
        withdrawn,
        attributes,
        nlri: r.rest(),
    })
}

/// Reads every path attribute into `u`, marking its type in `seen` and
/// recording RFC 7606 outcomes on `u`; an Err resets the session.
fn decode_attribute_list(
    attributes: &[u8],
    opts: CodecOptions,
    u: &mut Update,
    seen: &mut [bool; 256],
    as4: &mut As4Attributes,
) -> Result<(), DecodeError> {
    let list_err = |why| DecodeError::MalformedAttributeList(why);
    let mut a = Reader::new(attributes);
    while !a.is_empty() {
        let Some((flags, type_code, value)) = next_attribute(&mut a) else {
            // RFC 7606 4: an attribute overrunning the attribute field.
            // Treat-as-withdraw needs every NLRI to be known; if none has
            // been found yet it may hide in the unread part.
            if u.nlri.is_empty() && u.mp_reach.is_none() && u.mp_unreach.is_none() {
                return Err(list_err("attribute overruns the attribute field"));
            }
            u.errors.push(AttrOutcome::TreatAsWithdraw {
                type_code: 0,
                reason: "attribute overruns the attribute field",
            });
            break;
        };
        if seen[type_code as usize] {
            if type_code == ATTR_MP_REACH || type_code == ATTR_MP_UNREACH {
                return Err(list_err("MP_REACH/MP_UNREACH repeated"));
            }
            // RFC 7606 3(g): keep the first, drop the rest.
            u.errors.push(AttrOutcome::Discarded {
                type_code,
                reason: "repeated attribute",
            });
            continue;
        }
        seen[type_code as usize] = true;
        let res = decode_attribute(flags, type_code, value, opts, u, as4);
        record_fault(u, type_code, res)?;
    }
    Ok(())
}

/// Files what RFC 7606 made of one attribute on `u`; a reset is passed up.
fn record_fault(u: &mut Update, type_code: u8, res: Result<(), Fault>) -> Result<(), DecodeError> {
    match res {
        Ok(()) => {}
        Err(Fault::Withdraw(reason)) => u
            .errors
            .push(AttrOutcome::TreatAsWithdraw { type_code, reason }),
        Err(Fault::Discard(reason)) => u.errors.push(AttrOutcome::Discarded { type_code, reason }),
        Err(Fault::Reset(e)) => return Err(e),
    }
    Ok(())
}

/// RFC 7606 3(d): a missing well-known mandatory attribute makes the
/// announcements unusable, but is no reason to reset the session.
fn check_mandatory_present(u: &mut Update, seen: &[bool; 256]) {
    let has_reach = !u.nlri.is_empty() || u.mp_reach.as_ref().is_some_and(|m| !m.nlri.is_empty());
    if !has_reach {
        return;
    }
    let missing = if !seen[ATTR_ORIGIN as usize] {
        Some(ATTR_ORIGIN)
    } else if !seen[ATTR_AS_PATH as usize] {
        Some(ATTR_AS_PATH)
    } else if !u.nlri.is_empty() && !seen[ATTR_NEXT_HOP as usize] {
        Some(ATTR_NEXT_HOP)
    } else {
        None
    };
    if let Some(type_code) = missing {
        u.errors.push(AttrOutcome::TreatAsWithdraw {
            type_code,
            reason: "missing well-known mandatory attribute",
        });
    }
}

/// Returns (flags, type, value) or None when the attribute overruns.
fn next_attribute<'a>(a: &mut Reader<'a>) -> Option<(u8, u8, &'a [u8])> {
    let flags = a.u8()?;
    let type_code = a.u8()?;
    let len = if flags & FLAG_EXTENDED != 0 {
        a.u16()? as usize
    } else {
        a.u8()? as usize
    };
    Some((flags, type_code, a.take(len)?))
}

/// Flags an attribute must carry: well-known (transitive, not optional),
/// optional non-transitive, or optional transitive.
fn expected_flags(type_code: u8) -> Option<u8> {
    match type_code {
        ATTR_ORIGIN | ATTR_AS_PATH | ATTR_NEXT_HOP | ATTR_LOCAL_PREF | ATTR_ATOMIC_AGGREGATE => {
            Some(FLAG_TRANSITIVE)
        }
        ATTR_MED | ATTR_ORIGINATOR_ID | ATTR_CLUSTER_LIST | ATTR_MP_REACH | ATTR_MP_UNREACH => {
            Some(FLAG_OPTIONAL)
        }
        ATTR_AGGREGATOR | ATTR_COMMUNITIES | ATTR_AS4_PATH | ATTR_AS4_AGGREGATOR => {
            Some(FLAG_OPTIONAL | FLAG_TRANSITIVE)
        }
        _ => None,
    }
}

/// How RFC 7606 section 7 handles a malformed instance of each attribute.
fn malformed(type_code: u8, reason: &'static str, value: &[u8]) -> Fault {
    match type_code {
        ATTR_ATOMIC_AGGREGATE | ATTR_AGGREGATOR | ATTR_AS4_PATH | ATTR_AS4_AGGREGATOR => {
            Fault::Discard(reason)
        }
        ATTR_MP_REACH | ATTR_MP_UNREACH => Fault::Reset(DecodeError::OptionalAttribute {
            type_code,
            reason,
            attr: Bytes::copy_from_slice(value),
        }),
        _ => Fault::Withdraw(reason),
    }
}

/// Decodes one attribute into `u`, or into `as4` for the AS4_* ones; an Err
/// is what RFC 7606 makes of it.
fn decode_attribute(
    flags: u8,
    type_code: u8,
    value: &[u8],
    opts: CodecOptions,
    u: &mut Update,
    as4: &mut As4Attributes,
) -> Result<(), Fault> {
    let Some(want) = expected_flags(type_code) else {
        return decode_unrecognized(flags, type_code, value, &mut u.attrs);
    };
    check_flags(flags, want, type_code, value)?;
    let attrs = &mut u.attrs;
    match type_code {
        ATTR_ORIGIN => attrs.origin = Some(decode_origin(value)?),
        ATTR_AS_PATH => {
            let width = if opts.four_octet_as { 4 } else { 2 };
            attrs.as_path =
                as_path::decode(value, width).ok_or(Fault::Withdraw("malformed AS_PATH"))?;
        }
        ATTR_AS4_PATH => {
            let p = as_path::decode_as4(value).ok_or(Fault::Discard("malformed AS4_PATH"))?;
            // RFC 6793 4.1: between two 4-octet speakers AS4_PATH is ignored.
            if !opts.four_octet_as {
                as4.path = Some(p);
            }
        }
        ATTR_NEXT_HOP => attrs.next_hop = Some(decode_next_hop(value)?),
        ATTR_MED => attrs.med = Some(decode_u32_value(type_code, value)?),
        ATTR_LOCAL_PREF => attrs.local_pref = Some(decode_u32_value(type_code, value)?),
        ATTR_ATOMIC_AGGREGATE => {
            if !value.is_empty() {
                let why = "ATOMIC_AGGREGATE length is not 0";
                return Err(malformed(type_code, why, value));
            }
            attrs.atomic_aggregate = true;
        }
        ATTR_AGGREGATOR => attrs.aggregator = Some(decode_aggregator(type_code, value, opts)?),
        ATTR_AS4_AGGREGATOR => {
            let agg = decode_aggregator(type_code, value, opts)?;
            if !opts.four_octet_as {
                as4.aggregator = Some(agg);
            }
        }
        ATTR_COMMUNITIES => attrs.communities.extend(decode_communities(value)?),
        ATTR_ORIGINATOR_ID => attrs.originator_id = Some(decode_originator_id(value)?),
        ATTR_CLUSTER_LIST => attrs.cluster_list.extend(decode_cluster_list(value)?),
        ATTR_MP_REACH => {
            decode_mp_reach(value, opts, u).map_err(|why| malformed(type_code, why, value))?
        }
        ATTR_MP_UNREACH => {
            decode_mp_unreach(value, opts, u).map_err(|why| malformed(type_code, why, value))?
        }
        _ => unreachable!("expected_flags covers exactly the known types"),
    }
    Ok(())
}

/// A type we do not know (RFC 4271 5, 6.3): well-known resets the session,
/// optional transitive is passed on with Partial set, optional
/// non-transitive is dropped.
fn decode_unrecognized(
    flags: u8,
    type_code: u8,
    value: &[u8],
    attrs: &mut PathAttributes,
) -> Result<(), Fault> {
    if flags & FLAG_OPTIONAL == 0 {
        return Err(Fault::Reset(DecodeError::UnrecognizedWellKnown {
            type_code,
            attr: Bytes::copy_from_slice(value),
        }));
    }
    if flags & FLAG_TRANSITIVE != 0 {
        attrs.unknown.push(RawAttribute {
            flags: (flags | FLAG_PARTIAL) & !FLAG_EXTENDED,
            type_code,
            value: Bytes::copy_from_slice(value),
        });
    }
    // Unknown optional non-transitive attributes are quietly ignored.
    Ok(())
}

/// Optional and Transitive must be what the type says (RFC 7606 3(c));
/// Partial may only be set on optional transitive types (RFC 4271 4.3).
fn check_flags(flags: u8, want: u8, type_code: u8, value: &[u8]) -> Result<(), Fault> {
    let partial_allowed = want == FLAG_OPTIONAL | FLAG_TRANSITIVE;
    if flags & 0xc0 != want || (!partial_allowed && flags & FLAG_PARTIAL != 0) {
        return Err(malformed(
            type_code,
            "attribute flags conflict with the type",
            value,
        ));
    }
    Ok(())
}

/// RFC 6793 4.2.3: rebuild the real path from AS_PATH and AS4_PATH sent by
/// a speaker that only does 2-octet AS numbers (or relayed through one).
fn merge_as4(u: &mut Update, as4: As4Attributes) {
    if let Some(agg4) = as4.aggregator {
        match u.attrs.aggregator {
            Some(a) if a.asn == AS_TRANS => u.attrs.aggregator = Some(agg4),
            // AGGREGATOR from a true 2-octet aggregator: AS4_* are stale.
            Some(_) => return,
            None => {}
        }
    }
    if let Some(as4_path) = as4.path {
        u.attrs.as_path = as_path::merge(&u.attrs.as_path, as4_path);
    }
}

fn put_attr(out: &mut BytesMut, flags: u8, type_code: u8, value: &[u8]) {
    if value.len() > 255 {
        out.put_u8(flags | FLAG_EXTENDED);
        out.put_u8(type_code);
        out.put_u16(value.len() as u16);
    } else {
        out.put_u8(flags & !FLAG_EXTENDED);
        out.put_u8(type_code);
        out.put_u8(value.len() as u8);
    }
    out.put_slice(value);
}

/// Path attributes in type-code order, the passed-on unknown ones last.
fn encode_attributes(u: &Update, opts: CodecOptions, out: &mut BytesMut) {
    let a = &u.attrs;
    if let Some(o) = a.origin {
        put_attr(out, FLAG_TRANSITIVE, ATTR_ORIGIN, &[o as u8]);
    }
    encode_as_path(u, opts, out);
    if let Some(nh) = a.next_hop {
        put_attr(out, FLAG_TRANSITIVE, ATTR_NEXT_HOP, &nh.octets());
    }
    if let Some(m) = a.med {
        put_attr(out, FLAG_OPTIONAL, ATTR_MED, &m.to_be_bytes());
    }
    if let Some(lp) = a.local_pref {
        put_attr(out, FLAG_TRANSITIVE, ATTR_LOCAL_PREF, &lp.to_be_bytes());
    }
    if a.atomic_aggregate {
        put_attr(out, FLAG_TRANSITIVE, ATTR_ATOMIC_AGGREGATE, &[]);
    }
    if let Some(agg) = a.aggregator {
        let v = aggregator_value(agg, opts);
        put_attr(out, FLAG_OPTIONAL | FLAG_TRANSITIVE, ATTR_AGGREGATOR, &v);
    }
    if !a.communities.is_empty() {
        let mut v = BytesMut::new();
        for c in &a.communities {
            v.put_u32(*c);
        }
        put_attr(out, FLAG_OPTIONAL | FLAG_TRANSITIVE, ATTR_COMMUNITIES, &v);
    }
    if let Some(o) = a.originator_id {
        put_attr(out, FLAG_OPTIONAL, ATTR_ORIGINATOR_ID, &o.octets());
    }
    if !a.cluster_list.is_empty() {
        let mut v = BytesMut::new();
        for c in &a.cluster_list {
            v.put_slice(&c.octets());
        }
        put_attr(out, FLAG_OPTIONAL, ATTR_CLUSTER_LIST, &v);
    }
    if let Some(r) = &u.mp_reach {
        put_attr(out, FLAG_OPTIONAL, ATTR_MP_REACH, &mp_reach_value(r, opts));
    }
    if let Some(w) = &u.mp_unreach {
        put_attr(
            out,
            FLAG_OPTIONAL,
            ATTR_MP_UNREACH,
            &mp_unreach_value(w, opts),
        );
    }
    if !opts.four_octet_as {
        encode_as4_attributes(a, out);
    }
    for raw in &a.unknown {
        put_attr(out, raw.flags, raw.type_code, &raw.value);
    }
}

fn encode_as_path(u: &Update, opts: CodecOptions, out: &mut BytesMut) {
    let a = &u.attrs;
    // AS_PATH is mandatory with any announcement; an empty one is valid.
    // An MP_REACH without NLRI announces nothing: as on decode, it does not
    // call for one (the RIB never sends such a thing; it only comes back).
    let announcing = !u.nlri.is_empty() || u.mp_reach.as_ref().is_some_and(|m| !m.nlri.is_empty());
    if announcing || !a.as_path.segments.is_empty() {
        let width = if opts.four_octet_as { 4 } else { 2 };
        put_attr(
            out,
            FLAG_TRANSITIVE,
            ATTR_AS_PATH,
            &as_path::encode(&a.as_path.segments, width),
        );
    }
}

/// AGGREGATOR with the AS number as wide as the session's; one that does
/// not fit in 2 octets goes as AS_TRANS.
fn aggregator_value(agg: Aggregator, opts: CodecOptions) -> BytesMut {
    let mut v = BytesMut::new();
    if opts.four_octet_as {
        v.put_u32(agg.asn);
    } else {
        v.put_u16(u16::try_from(agg.asn).unwrap_or(AS_TRANS as u16));
    }
    v.put_u32(u32::from(agg.addr));
    v
}

/// RFC 6793 4.2.2: carry the real numbers past a 2-octet speaker.
fn encode_as4_attributes(a: &PathAttributes, out: &mut BytesMut) {
    if let Some(v) = as_path::as4_path(&a.as_path) {
        put_attr(out, FLAG_OPTIONAL | FLAG_TRANSITIVE, ATTR_AS4_PATH, &v);
    }
    if let Some(agg) = a.aggregator.filter(|g| g.asn > u16::MAX as u32) {
        let mut v = BytesMut::new();
        v.put_u32(agg.asn);
        v.put_u32(u32::from(agg.addr));
        put_attr(
            out,
            FLAG_OPTIONAL | FLAG_TRANSITIVE,
            ATTR_AS4_AGGREGATOR,
            &v,
        );
    }
}
