//! MP_REACH_NLRI and MP_UNREACH_NLRI values (RFC 4760 3 and 4), with the
//! IPv6 link-local next hop of RFC 2545 3.

use std::net::{IpAddr, Ipv6Addr};

use bytes::{BufMut, BytesMut};

use super::nlri::{decode_prefixes, encode_prefixes};
use super::{MpReach, MpUnreach, Update};
use crate::codec::reader::Reader;
use crate::codec::CodecOptions;
use crate::types::Family;

pub(super) fn decode_mp_reach(
    value: &[u8],
    opts: CodecOptions,
    u: &mut Update,
) -> Result<(), &'static str> {
    let mut r = Reader::new(value);
    let afi = r.u16().ok_or("truncated")?;
    let safi = r.u8().ok_or("truncated")?;
    let nh_len = r.u8().ok_or("truncated")? as usize;
    let nh = r.take(nh_len).ok_or("next hop overruns")?;
    let _reserved = r.u8().ok_or("truncated")?;
    let Some(family) = Family::from_afi_safi(afi, safi) else {
        // A family we never offered: nothing here can be used, nothing
        // depends on it; drop it rather than tear the session down.
        return Ok(());
    };
    let (next_hop, link_local) = match (family, nh.len()) {
        (Family::Ipv4Unicast, 4) => (
            IpAddr::from(<[u8; 4]>::try_from(nh).map_err(|_| "next hop")?),
            None,
        ),
        // RFC 8950: only where we offered the extended next hop tuple.
        (Family::Ipv4Unicast, 16 | 32) if !opts.ipv4_via_ipv6.receive => {
            return Err("IPv6 next hop for IPv4 routes without the extended next hop capability")
        }
        (Family::Ipv6Unicast | Family::Ipv4Unicast, 16) => (
            IpAddr::from(<[u8; 16]>::try_from(nh).map_err(|_| "next hop")?),
            None,
        ),
        (Family::Ipv6Unicast | Family::Ipv4Unicast, 32) => {
            let g = <[u8; 16]>::try_from(&nh[..16]).map_err(|_| "next hop")?;
            let l = <[u8; 16]>::try_from(&nh[16..]).map_err(|_| "next hop")?;
            (IpAddr::from(g), Some(Ipv6Addr::from(l)))
        }
        _ => return Err("next hop length does not fit the family"),
    };
    let ids = opts.add_path_rx.has(family);
    let (nlri, path_ids) = decode_prefixes(r.rest(), family, ids).ok_or("malformed NLRI")?;
    u.mp_reach = Some(MpReach {
        family,
        next_hop,
        link_local,
        nlri,
        path_ids,
    });
    Ok(())
}

pub(super) fn decode_mp_unreach(
    value: &[u8],
    opts: CodecOptions,
    u: &mut Update,
) -> Result<(), &'static str> {
    let mut r = Reader::new(value);
    let afi = r.u16().ok_or("truncated")?;
    let safi = r.u8().ok_or("truncated")?;
    let Some(family) = Family::from_afi_safi(afi, safi) else {
        return Ok(());
    };
    let ids = opts.add_path_rx.has(family);
    let (withdrawn, path_ids) =
        decode_prefixes(r.rest(), family, ids).ok_or("malformed withdrawn routes")?;
    u.mp_unreach = Some(MpUnreach {
        family,
        withdrawn,
        path_ids,
    });
    Ok(())
}

pub(super) fn mp_reach_value(r: &MpReach, opts: CodecOptions) -> BytesMut {
    let mut v = BytesMut::new();
    v.put_u16(r.family.afi());
    v.put_u8(r.family.safi());
    match (r.next_hop, r.link_local) {
        (IpAddr::V4(a), _) => {
            v.put_u8(4);
            v.put_slice(&a.octets());
        }
        (IpAddr::V6(g), None) => {
            v.put_u8(16);
            v.put_slice(&g.octets());
        }
        (IpAddr::V6(g), Some(l)) => {
            v.put_u8(32);
            v.put_slice(&g.octets());
            v.put_slice(&l.octets());
        }
    }
    v.put_u8(0);
    let ids = opts.add_path_tx.has(r.family);
    encode_prefixes(&r.nlri, &r.path_ids, ids, &mut v);
    v
}

pub(super) fn mp_unreach_value(w: &MpUnreach, opts: CodecOptions) -> BytesMut {
    let mut v = BytesMut::new();
    v.put_u16(w.family.afi());
    v.put_u8(w.family.safi());
    let ids = opts.add_path_tx.has(w.family);
    encode_prefixes(&w.withdrawn, &w.path_ids, ids, &mut v);
    v
}
