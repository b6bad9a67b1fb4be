//! The few BGP messages a fleet client sends, and the reading of the
//! UPDATEs it receives (IPv4 unicast only: NLRI, withdrawn routes,
//! MP_(UN)REACH, MULTI_EXIT_DISC).

use std::net::Ipv4Addr;

pub const OPEN: u8 = 1;
pub const UPDATE: u8 = 2;
pub const NOTIFICATION: u8 = 3;
pub const KEEPALIVE: u8 = 4;
/// Our hold time: KEEPALIVEs every 80 s from the reflector, every 30 s from us.
pub const HOLD_TIME: u16 = 240;

/// An IPv4 prefix as (network, length).
pub type Prefix4 = (Ipv4Addr, u8);

fn header(out: &mut Vec<u8>, kind: u8, body_len: usize) {
    out.extend_from_slice(&[0xff; 16]);
    out.extend_from_slice(&(19 + body_len as u16).to_be_bytes());
    out.push(kind);
}

/// OPEN with IPv4 unicast, 4-octet AS and, with `restart_time`, graceful
/// restart (RFC 4724: not restarting, IPv4 unicast with forwarding kept).
pub fn open(asn: u32, id: Ipv4Addr, restart_time: Option<u16>) -> Vec<u8> {
    let mut caps = vec![1, 4, 0, 1, 0, 1, 65, 4];
    caps.extend_from_slice(&asn.to_be_bytes());
    if let Some(t) = restart_time {
        caps.extend_from_slice(&[64, 6]);
        caps.extend_from_slice(&(t & 0x0fff).to_be_bytes());
        caps.extend_from_slice(&[0, 1, 1, 0x80]);
    }
    let mut body = vec![4];
    body.extend_from_slice(&u16::try_from(asn).unwrap_or(23456).to_be_bytes());
    body.extend_from_slice(&HOLD_TIME.to_be_bytes());
    body.extend_from_slice(&id.octets());
    body.extend_from_slice(&[caps.len() as u8 + 2, 2, caps.len() as u8]);
    body.extend_from_slice(&caps);
    let mut out = Vec::new();
    header(&mut out, OPEN, body.len());
    out.extend_from_slice(&body);
    out
}

pub fn keepalive() -> Vec<u8> {
    let mut out = Vec::new();
    header(&mut out, KEEPALIVE, 0);
    out
}

/// NOTIFICATION Cease / Administrative Reset.
pub fn cease() -> Vec<u8> {
    let mut out = Vec::new();
    header(&mut out, NOTIFICATION, 2);
    out.extend_from_slice(&[6, 4]);
    out
}

fn put_prefix(out: &mut Vec<u8>, (net, len): Prefix4) {
    out.push(len);
    out.extend_from_slice(&net.octets()[..(len as usize).div_ceil(8)]);
}

/// One UPDATE announcing `prefixes` via `next_hop` with MED `med` (the
/// fleet's generation marker), then End-of-RIB.
pub fn announce(prefixes: &[Prefix4], next_hop: Ipv4Addr, med: u32) -> Vec<u8> {
    let mut attrs = vec![0x40, 1, 1, 0, 0x40, 2, 0, 0x40, 3, 4];
    attrs.extend_from_slice(&next_hop.octets());
    attrs.extend_from_slice(&[0x80, 4, 4]);
    attrs.extend_from_slice(&med.to_be_bytes());
    attrs.extend_from_slice(&[0x40, 5, 4, 0, 0, 0, 100]);
    let mut nlri = Vec::new();
    for p in prefixes {
        put_prefix(&mut nlri, *p);
    }
    let mut out = Vec::new();
    header(&mut out, UPDATE, 4 + attrs.len() + nlri.len());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    out.extend_from_slice(&attrs);
    out.extend_from_slice(&nlri);
    header(&mut out, UPDATE, 4);
    out.extend_from_slice(&[0, 0, 0, 0]);
    out
}

/// Whether an OPEN body carries the graceful restart capability.
pub fn open_has_graceful_restart(body: &[u8]) -> bool {
    let Some(&plen) = body.get(9) else {
        return false;
    };
    let mut params = body.get(10..10 + plen as usize).unwrap_or(&[]);
    while let [kind, len, rest @ ..] = params {
        let Some(v) = rest.get(..*len as usize) else {
            return false;
        };
        if *kind == 2 {
            let mut caps = v;
            while let [code, clen, crest @ ..] = caps {
                if *code == 64 {
                    return true;
                }
                caps = crest.get(*clen as usize..).unwrap_or(&[]);
            }
        }
        params = &rest[*len as usize..];
    }
    false
}

/// What an UPDATE says, for IPv4 unicast.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub withdrawn: Vec<Prefix4>,
    pub announced: Vec<Prefix4>,
    pub med: u32,
    /// No routes and no attributes: End-of-RIB.
    pub end_of_rib: bool,
}

fn prefixes(mut b: &[u8], out: &mut Vec<Prefix4>) -> Option<()> {
    while let Some((&len, rest)) = b.split_first() {
        if len > 32 {
            return None;
        }
        let n = (len as usize).div_ceil(8);
        let mut o = [0u8; 4];
        o[..n].copy_from_slice(rest.get(..n)?);
        out.push((Ipv4Addr::from(o), len));
        b = &rest[n..];
    }
    Some(())
}

/// A message of a stream: its type, its body and its length with the
/// header.
pub type Message<'a> = (u8, &'a [u8], usize);

/// The first whole message of `buf` (a stream's bytes from a message
/// boundary): its type, its body and its length with the header. None
/// while it is not all there; an error for a length below the header's.
pub fn next_message(buf: &[u8]) -> Result<Option<Message<'_>>, String> {
    if buf.len() < 19 {
        return Ok(None);
    }
    let len = u16::from_be_bytes([buf[16], buf[17]]) as usize;
    if len < 19 {
        return Err(format!("bad message length {len}"));
    }
    if buf.len() < len {
        return Ok(None);
    }
    Ok(Some((buf[18], &buf[19..len], len)))
}

/// Reads an UPDATE body; None when it is malformed.
pub fn parse_update(body: &[u8]) -> Option<Parsed> {
    let mut p = Parsed::default();
    let wlen = u16::from_be_bytes([*body.first()?, *body.get(1)?]) as usize;
    prefixes(body.get(2..2 + wlen)?, &mut p.withdrawn)?;
    let rest = body.get(2 + wlen..)?;
    let alen = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]) as usize;
    let a = rest.get(2..2 + alen)?;
    let nlri = rest.get(2 + alen..)?;
    p.end_of_rib = wlen == 0 && alen == 0 && nlri.is_empty();
    for_each_attribute(a, |kind, v, whole| {
        match kind {
            4 => p.med = u32::from_be_bytes(v.try_into().ok()?),
            14 if v.get(..3)? == [0, 1, 1] => {
                let nh = *v.get(3)? as usize;
                prefixes(v.get(5 + nh..)?, &mut p.announced)?;
            }
            15 if v.get(..3)? == [0, 1, 1] => {
                prefixes(&v[3..], &mut p.withdrawn)?;
                p.end_of_rib |= v.len() == 3 && alen == whole && wlen == 0;
            }
            _ => {}
        }
        Some(())
    })?;
    prefixes(nlri, &mut p.announced)?;
    Some(p)
}

/// Walks a path attribute list in order: `f(type code, value, length of
/// the whole attribute with its header)` for each. None when an attribute
/// runs past the end of the list or `f` returns None (the walk stops
/// there).
pub fn for_each_attribute(
    mut a: &[u8],
    mut f: impl FnMut(u8, &[u8], usize) -> Option<()>,
) -> Option<()> {
    while !a.is_empty() {
        let (flags, kind) = (a[0], *a.get(1)?);
        let (len, hdr) = if flags & 0x10 != 0 {
            (u16::from_be_bytes([*a.get(2)?, *a.get(3)?]) as usize, 4)
        } else {
            (*a.get(2)? as usize, 3)
        };
        let v = a.get(hdr..hdr + len)?;
        f(kind, v, hdr + len)?;
        a = &a[hdr + len..];
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announce_reads_back() {
        let pfx = [
            (Ipv4Addr::new(100, 64, 3, 0), 24),
            (Ipv4Addr::new(198, 18, 0, 7), 32),
        ];
        let m = announce(&pfx, Ipv4Addr::new(10, 99, 1, 1), 3);
        let len = u16::from_be_bytes([m[16], m[17]]) as usize;
        let p = parse_update(&m[19..len]).unwrap();
        assert_eq!(
            (p.announced.as_slice(), p.med, p.end_of_rib),
            (&pfx[..], 3, false)
        );
        let eor = parse_update(&m[len + 19..]).unwrap();
        assert!(eor.end_of_rib);
        assert!(parse_update(&[0, 5, 1]).is_none());
    }

    #[test]
    fn graceful_restart_capability_is_found() {
        let id = Ipv4Addr::new(10, 0, 0, 1);
        assert!(open_has_graceful_restart(&open(65000, id, Some(120))[19..]));
        assert!(!open_has_graceful_restart(&open(65000, id, None)[19..]));
    }
}
