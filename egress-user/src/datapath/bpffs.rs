//! Making sure a bpffs is mounted where the maps are pinned.

use std::{ffi::CString, io, os::unix::ffi::OsStrExt, path::Path};

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// True when `path` lies on a bpffs mount.
pub fn is_bpffs(path: &Path) -> io::Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated string and st a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64 == BPF_FS_MAGIC)
}

/// Mounts bpffs on /sys/fs/bpf if it is not there, then creates `pin_dir`.
pub fn ensure_pin_dir(pin_dir: &Path) -> io::Result<()> {
    let root = Path::new("/sys/fs/bpf");
    if !is_bpffs(root).unwrap_or(false) {
        std::fs::create_dir_all(root)?;
        let src = CString::new("bpf").unwrap();
        let target = CString::new("/sys/fs/bpf").unwrap();
        // SAFETY: all pointers are valid NUL-terminated strings.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                src.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("bpffs is not mounted on /sys/fs/bpf and mounting it failed ({e}); run `mount -t bpf bpf /sys/fs/bpf` as root"),
            ));
        }
    }
    std::fs::create_dir_all(pin_dir)
}
