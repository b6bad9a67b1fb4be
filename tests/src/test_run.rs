//! BPF_PROG_TEST_RUN on a loaded program: one run on a crafted packet,
//! its verdict and the packet it left. aya does not pass the run's flags
//! or a context through, so this calls bpf(2) itself.

use std::os::fd::{AsFd, AsRawFd};

use anyhow::{anyhow, bail, Result};
use aya::programs::{SchedClassifier, Xdp};

/// Runs the TC program `prog` of `ebpf` once on `pkt` with
/// BPF_PROG_TEST_RUN (loading it first if needed): (verdict, output frame).
pub fn run_classifier(ebpf: &mut aya::Ebpf, prog: &str, pkt: &[u8]) -> Result<(u32, Vec<u8>)> {
    run_classifier_with(ebpf, prog, pkt, 0)
}

/// `BPF_F_TEST_SKB_CHECKSUM_COMPLETE` (Linux 6.11): the kernel gives the
/// test skb `CHECKSUM_COMPLETE` with `skb->csum` summed over the packet,
/// and after the run fails it with `EBADMSG` unless `skb->csum` still sums
/// the output packet. This is the state of a packet from a NIC that
/// checksums in hardware (mlx5, ice, ...); a program that rewrites such a
/// packet must carry `skb->csum` along.
pub const TEST_CHECKSUM_COMPLETE: u32 = 1 << 2;

/// [`run_classifier`] on a CHECKSUM_COMPLETE skb ([`TEST_CHECKSUM_COMPLETE`]):
/// fails unless the program leaves `skb->csum` right.
pub fn run_classifier_complete(
    ebpf: &mut aya::Ebpf,
    prog: &str,
    pkt: &[u8],
) -> Result<(u32, Vec<u8>)> {
    run_classifier_with(ebpf, prog, pkt, TEST_CHECKSUM_COMPLETE)
}

/// Like [`run_classifier`], with BPF_PROG_TEST_RUN `flags`. An `EBADMSG`
/// from [`TEST_CHECKSUM_COMPLETE`] comes back as an error saying so.
pub fn run_classifier_with(
    ebpf: &mut aya::Ebpf,
    prog: &str,
    pkt: &[u8],
    flags: u32,
) -> Result<(u32, Vec<u8>)> {
    let p: &mut SchedClassifier = ebpf
        .program_mut(prog)
        .ok_or_else(|| anyhow!("no program {prog}"))?
        .try_into()?;
    if p.fd().is_err() {
        p.load()?;
    }
    let fd = p.fd()?.as_fd().as_raw_fd();
    test_run(prog, fd, pkt, flags, None)
}

/// Runs the XDP program `prog` once on `pkt` as if it had arrived on the
/// interface `ingress_ifindex` of the calling thread's network namespace
/// (queue 0): (verdict, output frame). Its FIB lookups see that
/// namespace's routes and neighbours.
pub fn run_xdp(
    ebpf: &mut aya::Ebpf,
    prog: &str,
    pkt: &[u8],
    ingress_ifindex: u32,
) -> Result<(u32, Vec<u8>)> {
    let p: &mut Xdp = ebpf
        .program_mut(prog)
        .ok_or_else(|| anyhow!("no program {prog}"))?
        .try_into()?;
    if p.fd().is_err() {
        p.load()?;
    }
    let fd = p.fd()?.as_fd().as_raw_fd();
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex,
    // rx_queue_index, egress_ifindex. The kernel wants data 0 and
    // data_end the packet's length.
    let md: [u32; 6] = [0, pkt.len() as u32, 0, ingress_ifindex, 0, 0];
    test_run(prog, fd, pkt, 0, Some(&md))
}

/// The `test` member of `union bpf_attr` (uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct TestAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// bpf(BPF_PROG_TEST_RUN, attr).
fn prog_test_run(attr: &mut TestAttr) -> std::io::Result<()> {
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    // SAFETY: attr is a valid bpf_attr prefix whose buffers outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            attr as *mut TestAttr,
            std::mem::size_of::<TestAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn test_run(
    prog: &str,
    fd: i32,
    pkt: &[u8],
    flags: u32,
    ctx: Option<&[u32]>,
) -> Result<(u32, Vec<u8>)> {
    let mut out = vec![0u8; pkt.len() + 256];
    let mut attr = TestAttr {
        prog_fd: fd as u32,
        data_size_in: pkt.len() as u32,
        data_size_out: out.len() as u32,
        data_in: pkt.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        flags,
        ..TestAttr::default()
    };
    if let Some(c) = ctx {
        attr.ctx_in = c.as_ptr() as u64;
        attr.ctx_size_in = std::mem::size_of_val(c) as u32;
    }
    if let Err(err) = prog_test_run(&mut attr) {
        if err.raw_os_error() == Some(libc::EBADMSG) {
            bail!("{prog}: skb->csum no longer sums the packet the program left (EBADMSG)");
        }
        bail!("{prog}: BPF_PROG_TEST_RUN: {err}");
    }
    out.truncate(attr.data_size_out as usize);
    Ok((attr.retval, out))
}

/// `BPF_F_TEST_XDP_LIVE_FRAMES` (Linux 5.18): the frames are not handed
/// back but sent on: `XDP_TX` out of the device they "arrived" on.
const TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

/// Runs the XDP program `fd` on `repeat` copies of `frame` as if they
/// arrived on `ifindex` of the calling thread's namespace, in live-frames
/// mode: what it sends with `XDP_TX` leaves by that device for real, in
/// batches of `batch`. A traffic generator: returns the kernel's time
/// per frame (ns).
pub fn run_xdp_live(fd: i32, frame: &[u8], ifindex: u32, repeat: u32, batch: u32) -> Result<u32> {
    let md: [u32; 6] = [0, frame.len() as u32, 0, ifindex, 0, 0];
    let mut attr = TestAttr {
        prog_fd: fd as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat,
        ctx_in: md.as_ptr() as u64,
        ctx_size_in: std::mem::size_of_val(&md) as u32,
        flags: TEST_XDP_LIVE_FRAMES,
        batch_size: batch,
        ..TestAttr::default()
    };
    if let Err(err) = prog_test_run(&mut attr) {
        bail!("BPF_PROG_TEST_RUN (live frames): {err}");
    }
    Ok(attr.duration)
}
