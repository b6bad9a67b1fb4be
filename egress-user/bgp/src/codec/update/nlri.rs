//! NLRI and withdrawn-routes fields: prefixes (RFC 4271 4.3), each after
//! a 4-octet path id on sessions that negotiated ADD-PATH (RFC 7911 3).

use std::net::IpAddr;

use bytes::{BufMut, BytesMut};

use crate::types::{Family, Prefix};

/// The prefixes of an NLRI field, each after a 4-octet path id when
/// `with_ids` (RFC 7911 3), and the ids (empty without them). None: the
/// field is malformed.
pub(super) fn decode_prefixes(
    mut buf: &[u8],
    family: Family,
    with_ids: bool,
) -> Option<(Vec<Prefix>, Vec<u32>)> {
    let max = match family {
        Family::Ipv4Unicast => 32,
        Family::Ipv6Unicast => 128,
    };
    let mut out = Vec::new();
    let mut ids = Vec::new();
    loop {
        if with_ids && !buf.is_empty() {
            let (id, rest) = buf.split_first_chunk::<4>()?;
            ids.push(u32::from_be_bytes(*id));
            buf = rest;
        }
        let Some((&len, rest)) = buf.split_first() else {
            break;
        };
        if len > max {
            return None;
        }
        let n = (len as usize).div_ceil(8);
        if rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        buf = rest;
        let addr = match family {
            Family::Ipv4Unicast => {
                let mut o = [0u8; 4];
                o[..n].copy_from_slice(bytes);
                IpAddr::from(o)
            }
            Family::Ipv6Unicast => {
                let mut o = [0u8; 16];
                o[..n].copy_from_slice(bytes);
                IpAddr::from(o)
            }
        };
        out.push(Prefix::new(addr, len).ok()?);
    }
    // A path id with no prefix after it.
    if ids.len() > out.len() {
        return None;
    }
    Some((out, ids))
}

fn encode_prefix(p: &Prefix, out: &mut BytesMut) {
    out.put_u8(p.len());
    out.put_slice(&p.wire_octets());
}

/// Prefixes, each after its path id when the session carries them (a
/// missing id goes as 0), without otherwise.
pub(super) fn encode_prefixes(
    prefixes: &[Prefix],
    ids: &[u32],
    with_ids: bool,
    out: &mut BytesMut,
) {
    for (i, p) in prefixes.iter().enumerate() {
        if with_ids {
            out.put_u32(ids.get(i).copied().unwrap_or(0));
        }
        encode_prefix(p, out);
    }
}
