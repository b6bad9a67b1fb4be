//! OPEN message and capabilities (RFC 4271 4.2, RFC 5492).

use std::net::Ipv4Addr;

use bytes::{BufMut, Bytes, BytesMut};

use super::add_path::{self, AddPathFamily, CAP_ADD_PATH};
use super::ext_next_hop::{self, NextHopTuple, CAP_EXTENDED_NEXT_HOP};
use super::reader::Reader;
use super::DecodeError;
use crate::types::{AfiSafi, AS_TRANS};

pub const CAP_MULTIPROTOCOL: u8 = 1;
pub const CAP_ROUTE_REFRESH: u8 = 2;
pub const CAP_GRACEFUL_RESTART: u8 = 64;
pub const CAP_FOUR_OCTET_AS: u8 = 65;
pub const CAP_ENHANCED_ROUTE_REFRESH: u8 = 70;
pub const CAP_LONG_LIVED_GR: u8 = 71;

const PARAM_CAPABILITIES: u8 = 2;

/// One address family in the graceful restart capability (RFC 4724 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrFamily {
    pub afi_safi: AfiSafi,
    /// F bit: forwarding state was preserved across the restart.
    pub forwarding_preserved: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GracefulRestartCap {
    /// R bit: the sender has just restarted.
    pub restarting: bool,
    /// N bit (RFC 8538): the sender also handles NOTIFICATION gracefully.
    pub notification: bool,
    /// Seconds the peer should keep our routes while we come back (12 bits).
    pub restart_time: u16,
    pub families: Vec<GrFamily>,
}

/// One address family in the long-lived GR capability (RFC 9494).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlgrFamily {
    pub afi_safi: AfiSafi,
    pub forwarding_preserved: bool,
    /// Long-lived stale time in seconds (24 bits).
    pub stale_time: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Capability {
    Multiprotocol(AfiSafi),
    RouteRefresh,
    GracefulRestart(GracefulRestartCap),
    FourOctetAs(u32),
    EnhancedRouteRefresh,
    LongLivedGr(Vec<LlgrFamily>),
    /// RFC 7911: per family, whether the sender sends and receives path ids.
    AddPath(Vec<AddPathFamily>),
    /// RFC 8950: the (NLRI family, next hop AFI) pairs the sender takes.
    ExtendedNextHop(Vec<NextHopTuple>),
    Unknown {
        code: u8,
        value: Bytes,
    },
}

impl Capability {
    fn decode(code: u8, value: &[u8]) -> Result<Capability, DecodeError> {
        let bad = || DecodeError::MalformedOpen("capability value has the wrong length");
        let mut r = Reader::new(value);
        let cap = match code {
            CAP_MULTIPROTOCOL => {
                let afi = r.u16().ok_or_else(bad)?;
                let _reserved = r.u8().ok_or_else(bad)?;
                let safi = r.u8().ok_or_else(bad)?;
                Capability::Multiprotocol(AfiSafi { afi, safi })
            }
            CAP_ROUTE_REFRESH => Capability::RouteRefresh,
            CAP_ENHANCED_ROUTE_REFRESH => Capability::EnhancedRouteRefresh,
            CAP_FOUR_OCTET_AS => Capability::FourOctetAs(r.u32().ok_or_else(bad)?),
            CAP_GRACEFUL_RESTART => {
                let word = r.u16().ok_or_else(bad)?;
                let mut families = Vec::new();
                while !r.is_empty() {
                    let afi = r.u16().ok_or_else(bad)?;
                    let safi = r.u8().ok_or_else(bad)?;
                    let flags = r.u8().ok_or_else(bad)?;
                    families.push(GrFamily {
                        afi_safi: AfiSafi { afi, safi },
                        forwarding_preserved: flags & 0x80 != 0,
                    });
                }
                Capability::GracefulRestart(GracefulRestartCap {
                    restarting: word & 0x8000 != 0,
                    notification: word & 0x4000 != 0,
                    restart_time: word & 0x0fff,
                    families,
                })
            }
            CAP_LONG_LIVED_GR => {
                let mut families = Vec::new();
                while !r.is_empty() {
                    let afi = r.u16().ok_or_else(bad)?;
                    let safi = r.u8().ok_or_else(bad)?;
                    let flags = r.u8().ok_or_else(bad)?;
                    let stale_time = r.u24().ok_or_else(bad)?;
                    families.push(LlgrFamily {
                        afi_safi: AfiSafi { afi, safi },
                        forwarding_preserved: flags & 0x80 != 0,
                        stale_time,
                    });
                }
                Capability::LongLivedGr(families)
            }
            CAP_ADD_PATH => match add_path::decode(value)? {
                add_path::Decoded::Tuples(t) => return Ok(Capability::AddPath(t)),
                add_path::Decoded::Ignored => {
                    return Ok(Capability::Unknown {
                        code,
                        value: Bytes::copy_from_slice(value),
                    })
                }
            },
            CAP_EXTENDED_NEXT_HOP => {
                return ext_next_hop::decode(value).map(Capability::ExtendedNextHop)
            }
            code => {
                return Ok(Capability::Unknown {
                    code,
                    value: Bytes::copy_from_slice(value),
                })
            }
        };
        if !r.is_empty() {
            return Err(bad());
        }
        Ok(cap)
    }

    fn encode(&self, out: &mut BytesMut) {
        let mut v = BytesMut::new();
        let code = match self {
            Capability::Multiprotocol(f) => {
                v.put_u16(f.afi);
                v.put_u8(0);
                v.put_u8(f.safi);
                CAP_MULTIPROTOCOL
            }
            Capability::RouteRefresh => CAP_ROUTE_REFRESH,
            Capability::EnhancedRouteRefresh => CAP_ENHANCED_ROUTE_REFRESH,
            Capability::FourOctetAs(asn) => {
                v.put_u32(*asn);
                CAP_FOUR_OCTET_AS
            }
            Capability::GracefulRestart(gr) => {
                let mut word = gr.restart_time.min(0x0fff);
                if gr.restarting {
                    word |= 0x8000;
                }
                if gr.notification {
                    word |= 0x4000;
                }
                v.put_u16(word);
                for f in &gr.families {
                    v.put_u16(f.afi_safi.afi);
                    v.put_u8(f.afi_safi.safi);
                    v.put_u8(if f.forwarding_preserved { 0x80 } else { 0 });
                }
                CAP_GRACEFUL_RESTART
            }
            Capability::LongLivedGr(fams) => {
                for f in fams {
                    v.put_u16(f.afi_safi.afi);
                    v.put_u8(f.afi_safi.safi);
                    v.put_u8(if f.forwarding_preserved { 0x80 } else { 0 });
                    let t = f.stale_time.min(0x00ff_ffff).to_be_bytes();
                    v.put_slice(&t[1..]);
                }
                CAP_LONG_LIVED_GR
            }
            Capability::AddPath(tuples) => {
                add_path::encode(tuples, &mut v);
                CAP_ADD_PATH
            }
            Capability::ExtendedNextHop(tuples) => {
                ext_next_hop::encode(tuples, &mut v);
                CAP_EXTENDED_NEXT_HOP
            }
            Capability::Unknown { code, value } => {
                v.put_slice(value);
                *code
            }
        };
        out.put_u8(code);
        out.put_u8(v.len() as u8);
        out.put_slice(&v);
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Open {
    /// The 2-octet "My Autonomous System" field (AS_TRANS for large ASNs).
    pub my_as: u16,
    pub hold_time: u16,
    pub bgp_id: Ipv4Addr,
    pub capabilities: Vec<Capability>,
}

impl Open {
    /// Builds an OPEN for `asn`, adding the 4-octet AS capability.
    pub fn new(
        asn: u32,
        hold_time: u16,
        bgp_id: Ipv4Addr,
        mut capabilities: Vec<Capability>,
    ) -> Open {
        if !capabilities
            .iter()
            .any(|c| matches!(c, Capability::FourOctetAs(_)))
        {
            capabilities.push(Capability::FourOctetAs(asn));
        }
        let my_as = u16::try_from(asn).unwrap_or(AS_TRANS as u16);
        Open {
            my_as,
            hold_time,
            bgp_id,
            capabilities,
        }
    }

    /// The sender's real AS number.
    pub fn asn(&self) -> u32 {
        self.four_octet_as().unwrap_or(self.my_as as u32)
    }

    pub fn four_octet_as(&self) -> Option<u32> {
        self.capabilities.iter().find_map(|c| match c {
            Capability::FourOctetAs(a) => Some(*a),
            _ => None,
        })
    }

    pub fn graceful_restart(&self) -> Option<&GracefulRestartCap> {
        self.capabilities.iter().find_map(|c| match c {
            Capability::GracefulRestart(g) => Some(g),
            _ => None,
        })
    }

    pub fn long_lived_gr(&self) -> Option<&[LlgrFamily]> {
        self.capabilities.iter().find_map(|c| match c {
            Capability::LongLivedGr(g) => Some(g.as_slice()),
            _ => None,
        })
    }

    /// The ADD-PATH tuples (RFC 7911); empty without the capability.
    pub fn add_path(&self) -> &[AddPathFamily] {
        self.capabilities
            .iter()
            .find_map(|c| match c {
                Capability::AddPath(t) => Some(t.as_slice()),
                _ => None,
            })
            .unwrap_or(&[])
    }

    /// The extended next hop tuples (RFC 8950); empty without the capability.
    pub fn extended_next_hop(&self) -> &[NextHopTuple] {
        self.capabilities
            .iter()
            .find_map(|c| match c {
                Capability::ExtendedNextHop(t) => Some(t.as_slice()),
                _ => None,
            })
            .unwrap_or(&[])
    }

    pub fn route_refresh(&self) -> bool {
        self.capabilities
            .iter()
            .any(|c| matches!(c, Capability::RouteRefresh))
    }

    pub fn enhanced_route_refresh(&self) -> bool {
        self.capabilities
            .iter()
            .any(|c| matches!(c, Capability::EnhancedRouteRefresh))
    }

    /// Address families announced; without any multiprotocol capability a
    /// speaker carries IPv4 unicast only (RFC 4760 8).
    pub fn families(&self) -> Vec<AfiSafi> {
        let v: Vec<AfiSafi> = self
            .capabilities
            .iter()
            .filter_map(|c| match c {
                Capability::Multiprotocol(f) => Some(*f),
                _ => None,
            })
            .collect();
        if v.is_empty() {
            vec![crate::types::Family::Ipv4Unicast.into()]
        } else {
            v
        }
    }

    pub(super) fn decode(body: &[u8]) -> Result<Open, DecodeError> {
        let short = || DecodeError::MalformedOpen("truncated");
        let mut r = Reader::new(body);
        let version = r.u8().ok_or_else(short)?;
        if version != 4 {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let my_as = r.u16().ok_or_else(short)?;
        let hold_time = r.u16().ok_or_else(short)?;
        let bgp_id = Ipv4Addr::from(r.u32().ok_or_else(short)?);
        let opt_len = r.u8().ok_or_else(short)? as usize;
        if opt_len != r.remaining() {
            return Err(DecodeError::MalformedOpen("optional parameters length"));
        }
        // RFC 4271 6.2: hold times of one or two seconds are refused.
        if hold_time == 1 || hold_time == 2 {
            return Err(DecodeError::UnacceptableHoldTime(hold_time));
        }
        if bgp_id.is_unspecified() {
            return Err(DecodeError::BadBgpIdentifier);
        }
        let mut capabilities = Vec::new();
        while !r.is_empty() {
            let ptype = r.u8().ok_or_else(short)?;
            let plen = r.u8().ok_or_else(short)? as usize;
            let pval = r.take(plen).ok_or_else(short)?;
            if ptype != PARAM_CAPABILITIES {
                return Err(DecodeError::UnsupportedOptionalParameter(ptype));
            }
            let mut c = Reader::new(pval);
            while !c.is_empty() {
                let code = c.u8().ok_or_else(short)?;
                let clen = c.u8().ok_or_else(short)? as usize;
                let cval = c.take(clen).ok_or_else(short)?;
                capabilities.push(Capability::decode(code, cval)?);
            }
        }
        Ok(Open {
            my_as,
            hold_time,
            bgp_id,
            capabilities,
        })
    }

    pub(super) fn encode_body(&self, out: &mut BytesMut) {
        out.put_u8(4);
        out.put_u16(self.my_as);
        out.put_u16(self.hold_time);
        out.put_u32(u32::from(self.bgp_id));
        // One capabilities parameter per capability is the most widely
        // accepted layout (some old speakers choke on several in one).
        let mut params = BytesMut::new();
        for c in &self.capabilities {
            let mut one = BytesMut::new();
            c.encode(&mut one);
            params.put_u8(PARAM_CAPABILITIES);
            params.put_u8(one.len() as u8);
            params.put_slice(&one);
        }
        if params.len() > 255 {
            // Too many for one parameter each: share a single parameter.
            let mut all = BytesMut::new();
            for c in &self.capabilities {
                c.encode(&mut all);
            }
            params.clear();
            params.put_u8(PARAM_CAPABILITIES);
            params.put_u8(all.len().min(255) as u8);
            params.put_slice(&all[..all.len().min(255)]);
        }
        out.put_u8(params.len().min(255) as u8);
        out.put_slice(&params);
    }
}
