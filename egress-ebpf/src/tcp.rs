//! TCP options the datapath rewrites: the MSS of a SYN, clamped so that
//! the segments of a tunnelled flow fit the tunnel.

use aya_ebpf::programs::TcContext;

use crate::{flow::Flow, hdr::TCP_LEN};

/// Clamps the MSS option of a TCP SYN to `max`.
#[inline(never)]
pub fn clamp_mss(ctx: &mut TcContext, f: &Flow, max: u16) {
    let doff: u8 = match ctx.load(f.l4_off + 12) {
        Ok(v) => v,
        Err(_) => return,
    };
    let end = f.l4_off + ((doff >> 4) as usize) * 4;
    let mut off = f.l4_off + TCP_LEN;
    let mut n = 0;
    while n < 20 && off + 4 <= end {
        n += 1;
        let kind: u8 = match ctx.load(off) {
            Ok(v) => v,
            Err(_) => return,
        };
        if kind == 0 {
            return;
        }
        if kind == 1 {
            off += 1;
            continue;
        }
        let len: u8 = match ctx.load(off + 1) {
            Ok(v) => v,
            Err(_) => return,
        };
        if kind == 2 && len == 4 {
            let raw: [u8; 2] = match ctx.load(off + 2) {
                Ok(v) => v,
                Err(_) => return,
            };
            let mss = u16::from_be_bytes(raw);
            if mss > max {
                let new = max.to_be_bytes();
                if ctx.store(off + 2, &new, 0).is_ok() {
                    let _ = ctx.l4_csum_replace(
                        f.csum_off,
                        crate::ctx::raw16(raw),
                        crate::ctx::raw16(new),
                        2,
                    );
                }
            }
            return;
        }
        if len < 2 {
            return;
        }
        off += len as usize;
    }
}
