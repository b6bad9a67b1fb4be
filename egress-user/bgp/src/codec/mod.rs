//! BGP-4 wire format (RFC 4271) with the extensions this speaker uses.
//!
//! Decoding works on byte slices with checked reads only, so malformed input
//! becomes a [`DecodeError`] (which names the NOTIFICATION to send) or, for
//! UPDATE attributes, an RFC 7606 outcome recorded on the [`Update`]; it never
//! panics.

mod add_path;
mod as_path;
mod error;
mod ext_next_hop;
mod notification;
mod open;
mod reader;
mod update;

pub use add_path::{
    negotiate as negotiate_add_path, AddPathFamilies, AddPathFamily, AddPathNegotiated,
};
pub use error::DecodeError;
pub use ext_next_hop::{negotiate as negotiate_ext_next_hop, Ipv4ViaIpv6, NextHopTuple};
pub use notification::{notif, Notification, RouteRefresh, RouteRefreshSubtype};
pub use open::{Capability, GrFamily, GracefulRestartCap, LlgrFamily, Open};
pub use update::{
    Aggregator, AttrOutcome, MpReach, MpUnreach, PathAttributes, RawAttribute, Update,
};

use bytes::{BufMut, Bytes, BytesMut};

pub const HEADER_LEN: usize = 19;
pub const MAX_MESSAGE_LEN: usize = 4096;

pub const MSG_OPEN: u8 = 1;
pub const MSG_UPDATE: u8 = 2;
pub const MSG_NOTIFICATION: u8 = 3;
pub const MSG_KEEPALIVE: u8 = 4;
pub const MSG_ROUTE_REFRESH: u8 = 5;

/// What was negotiated on a session and changes how messages are read
/// and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodecOptions {
    /// Both sides sent the 4-octet AS capability (RFC 6793).
    pub four_octet_as: bool,
    /// RFC 7911: families whose NLRI carry path ids in what we decode ...
    pub add_path_rx: AddPathFamilies,
    /// ... and in what we encode.
    pub add_path_tx: AddPathFamilies,
    /// RFC 8950: IPv4 routes with IPv6 next hops, each way.
    pub ipv4_via_ipv6: Ipv4ViaIpv6,
}

impl Default for CodecOptions {
    fn default() -> Self {
        CodecOptions {
            four_octet_as: true,
            add_path_rx: AddPathFamilies::NONE,
            add_path_tx: AddPathFamilies::NONE,
            ipv4_via_ipv6: Ipv4ViaIpv6::default(),
        }
    }
}

impl CodecOptions {
    /// Path ids both ways in `families` (tests, and a peer's view of us).
    pub fn with_add_path(self, families: AddPathFamilies) -> CodecOptions {
        CodecOptions {
            add_path_rx: families,
            add_path_tx: families,
            ..self
        }
    }
}

// UPDATE is by far the most common message, so boxing it would only add an
// allocation per message.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Open(Open),
    Update(Update),
    Notification(Notification),
    Keepalive,
    RouteRefresh(RouteRefresh),
}

impl Message {
    /// Reads one whole message (header included), as returned by [`split_frame`].
    pub fn decode(frame: &[u8], opts: CodecOptions) -> Result<Message, DecodeError> {
        let (ty, body) = check_header(frame)?;
        match ty {
            MSG_OPEN => Open::decode(body).map(Message::Open),
            MSG_UPDATE => Update::decode(body, opts).map(Message::Update),
            MSG_NOTIFICATION => Notification::decode(body).map(Message::Notification),
            MSG_KEEPALIVE => Ok(Message::Keepalive),
            MSG_ROUTE_REFRESH => RouteRefresh::decode(body).map(Message::RouteRefresh),
            other => Err(DecodeError::BadMessageType(other)),
        }
    }

    /// Appends the message with its header. Fails only when an UPDATE does
    /// not fit in 4096 octets, which the caller avoids by splitting NLRI.
    pub fn encode(&self, opts: CodecOptions, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        out.put_slice(&[0xff; 16]);
        out.put_u16(0); // length, patched below
        let ty = match self {
            Message::Open(m) => {
                out.put_u8(MSG_OPEN);
                m.encode_body(out);
                MSG_OPEN
            }
            Message::Update(m) => {
                out.put_u8(MSG_UPDATE);
                m.encode_body(opts, out);
                MSG_UPDATE
            }
            Message::Notification(m) => {
                out.put_u8(MSG_NOTIFICATION);
                m.encode_body(out);
                MSG_NOTIFICATION
            }
            Message::Keepalive => {
                out.put_u8(MSG_KEEPALIVE);
                MSG_KEEPALIVE
            }
            Message::RouteRefresh(m) => {
                out.put_u8(MSG_ROUTE_REFRESH);
                m.encode_body(out);
                MSG_ROUTE_REFRESH
            }
        };
        let len = out.len() - start;
        if len > MAX_MESSAGE_LEN {
            out.truncate(start);
            return Err(EncodeError::TooLong { ty, len });
        }
        out[start + 16..start + 18].copy_from_slice(&(len as u16).to_be_bytes());
        Ok(())
    }

    /// [`Message::encode`] for an UPDATE held by reference (the RIB's
    /// packed UPDATEs are encoded without a copy).
    pub fn encode_update(
        u: &Update,
        opts: CodecOptions,
        out: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        let start = out.len();
        out.put_slice(&[0xff; 16]);
        out.put_u16(0);
        out.put_u8(MSG_UPDATE);
        u.encode_body(opts, out);
        let len = out.len() - start;
        if len > MAX_MESSAGE_LEN {
            out.truncate(start);
            return Err(EncodeError::TooLong {
                ty: MSG_UPDATE,
                len,
            });
        }
        out[start + 16..start + 18].copy_from_slice(&(len as u16).to_be_bytes());
        Ok(())
    }

    pub fn to_bytes(&self, opts: CodecOptions) -> Result<Bytes, EncodeError> {
        let mut b = BytesMut::new();
        self.encode(opts, &mut b)?;
        Ok(b.freeze())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    #[error("message type {ty} would be {len} octets, over the 4096 limit")]
    TooLong { ty: u8, len: usize },
}

/// Validates marker, length and type, and returns (type, body).
fn check_header(frame: &[u8]) -> Result<(u8, &[u8]), DecodeError> {
    if frame.len() < HEADER_LEN {
        return Err(DecodeError::BadMessageLength(frame.len() as u16));
    }
    if frame[..16].iter().any(|&b| b != 0xff) {
        return Err(DecodeError::ConnectionNotSynchronized);
    }
    let len = u16::from_be_bytes([frame[16], frame[17]]);
    let ty = frame[18];
    let min = match ty {
        MSG_OPEN => 29,
        MSG_UPDATE => 23,
        MSG_NOTIFICATION => 21,
        MSG_KEEPALIVE => 19,
        MSG_ROUTE_REFRESH => 23,
        _ => HEADER_LEN,
    };
    let len_ok = (len as usize) >= min
        && (len as usize) <= MAX_MESSAGE_LEN
        && (ty != MSG_KEEPALIVE || len == 19)
        && len as usize == frame.len();
    if !len_ok {
        // RFC 7313: a ROUTE-REFRESH of the wrong length has its own code.
        if ty == MSG_ROUTE_REFRESH && (len as usize) == frame.len() && len >= 19 {
            return Err(DecodeError::RouteRefreshLength(len));
        }
        return Err(DecodeError::BadMessageLength(len));
    }
    Ok((ty, &frame[HEADER_LEN..]))
}

/// Takes one complete message off the front of a receive buffer.
///
/// Returns `Ok(None)` until a whole message has arrived. Only the length and
/// marker are checked here, so that a bad header is reported as soon as it is
/// seen rather than after waiting for bytes that will never come.
pub fn split_frame(buf: &mut BytesMut) -> Result<Option<Bytes>, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    if buf[..16].iter().any(|&b| b != 0xff) {
        return Err(DecodeError::ConnectionNotSynchronized);
    }
    let len = u16::from_be_bytes([buf[16], buf[17]]) as usize;
    if !(HEADER_LEN..=MAX_MESSAGE_LEN).contains(&len) {
        return Err(DecodeError::BadMessageLength(len as u16));
    }
    if buf.len() < len {
        return Ok(None);
    }
    Ok(Some(buf.split_to(len).freeze()))
}

#[cfg(test)]
pub(crate) mod tests;
