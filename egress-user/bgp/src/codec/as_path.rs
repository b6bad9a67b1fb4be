//! AS_PATH and AS4_PATH on the wire (RFC 4271 4.3, RFC 6793), and the real
//! path rebuilt from both on a session without 4-octet AS numbers.

use bytes::{BufMut, BytesMut};

use super::reader::Reader;
use crate::types::{AsPath, AsSegment, SegmentKind, AS_TRANS};

/// The most AS numbers one segment holds (its count is one octet).
const SEGMENT_MAX: usize = 255;

/// Reads AS_PATH segments with AS numbers of `width` octets (2 or 4).
pub(super) fn decode(value: &[u8], width: usize) -> Option<AsPath> {
    let mut r = Reader::new(value);
    let mut segments = Vec::new();
    while !r.is_empty() {
        let kind = SegmentKind::from_u8(r.u8()?)?;
        let count = r.u8()? as usize;
        // RFC 7606 7.2: an empty segment is malformed.
        if count == 0 {
            return None;
        }
        let mut asns = Vec::with_capacity(count);
        for _ in 0..count {
            let asn = if width == 2 {
                r.u16()? as u32
            } else {
                r.u32()?
            };
            asns.push(asn);
        }
        segments.push(AsSegment { kind, asns });
    }
    Some(AsPath { segments })
}

/// Reads AS4_PATH as RFC 6793 6 asks: None when malformed, which includes
/// an empty attribute (it must carry at least one AS number; shorter
/// non-empty values already fail to parse). Confederation segments must not
/// be in it: they are dropped and the rest is used.
pub(super) fn decode_as4(value: &[u8]) -> Option<AsPath> {
    if value.is_empty() {
        return None;
    }
    let mut path = decode(value, 4)?;
    path.segments.retain(|s| !s.kind.is_confed());
    Some(path)
}

/// Writes segments with AS numbers of `width` octets; numbers that do not
/// fit two octets become AS_TRANS.
pub(super) fn encode(segments: &[AsSegment], width: usize) -> BytesMut {
    let mut v = BytesMut::new();
    for s in segments {
        for chunk in s.asns.chunks(SEGMENT_MAX) {
            v.put_u8(s.kind as u8);
            v.put_u8(chunk.len() as u8);
            for &asn in chunk {
                if width == 2 {
                    v.put_u16(u16::try_from(asn).unwrap_or(AS_TRANS as u16));
                } else {
                    v.put_u32(asn);
                }
            }
        }
    }
    v
}

/// The AS4_PATH to send beside a 2-octet AS_PATH (RFC 6793 4.2.2), or None
/// when there is nothing two octets cannot carry, so that an empty AS4_PATH
/// is never sent.
///
/// It holds the path after its last confederation segment. When
/// confederation segments only lead, as they should, that is the whole path
/// without them, as 4.2.2 asks. When one sits further in, it is the part the
/// receiver can put back behind the leading part of AS_PATH (4.2.3 keeps a
/// confederation segment next to what it takes from there), so that the
/// path survives the trip; AS numbers in front of it stay AS_TRANS.
pub(super) fn as4_path(path: &AsPath) -> Option<BytesMut> {
    let start = path
        .segments
        .iter()
        .rposition(|s| s.kind.is_confed())
        .map_or(0, |i| i + 1);
    let tail = &path.segments[start..];
    let wide = tail
        .iter()
        .any(|s| s.asns.iter().any(|&a| a > u16::MAX as u32));
    wide.then(|| encode(tail, 4))
}

/// RFC 6793 4.2.3: the real path from the AS_PATH and AS4_PATH of a route
/// that came through a speaker without 4-octet AS numbers. AS4_PATH holds
/// the path as it was when it last left a speaker that had them; AS_PATH's
/// leading AS numbers beyond that count were added since.
pub(super) fn merge(as_path: &AsPath, as4_path: AsPath) -> AsPath {
    let have = as_path.as_count();
    let want = as4_path.as_count();
    // A longer AS4_PATH cannot be right: it is ignored.
    if want > have {
        return as_path.clone();
    }
    let (mut segments, cut) = leading_part(as_path, have - want);
    let mut rest = as4_path.segments.into_iter().peekable();
    // A sequence cut short goes on with the AS4_PATH's first sequence: on
    // the wire they were one segment.
    if let (true, Some(last), Some(next)) = (cut, segments.last_mut(), rest.peek()) {
        let joins =
            next.kind == SegmentKind::Sequence && last.asns.len() + next.asns.len() <= SEGMENT_MAX;
        if joins {
            last.asns.extend_from_slice(&next.asns);
            rest.next();
        }
    }
    segments.extend(rest);
    AsPath { segments }
}

/// The leading segments of `path` that hold `keep` AS numbers, and whether
/// the last of them is a sequence cut short. A confederation segment comes
/// along when it leads or follows a segment taken whole (4.2.3); counting
/// stops at the first segment not wanted.
fn leading_part(path: &AsPath, mut keep: usize) -> (Vec<AsSegment>, bool) {
    let mut out = Vec::new();
    for s in &path.segments {
        if s.kind.is_confed() {
            out.push(s.clone());
            continue;
        }
        if keep == 0 {
            break;
        }
        let count = if s.kind == SegmentKind::Set {
            1
        } else {
            s.asns.len()
        };
        if count <= keep {
            keep -= count;
            out.push(s.clone());
            continue;
        }
        // Only a sequence counts more than one, so only a sequence is cut.
        out.push(AsSegment {
            kind: s.kind,
            asns: s.asns[..keep].to_vec(),
        });
        return (out, true);
    }
    (out, false)
}

#[cfg(test)]
mod tests;
