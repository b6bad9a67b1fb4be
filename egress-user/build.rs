//! Embeds the eBPF object that `cargo xtask build-ebpf` produced.
use std::{env, fs, path::PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let object = env::var_os("EGRESS_BPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../target/ebpf/egress.bpf.o"));
    println!("cargo:rerun-if-env-changed=EGRESS_BPF_OBJECT");
    println!("cargo:rerun-if-changed={}", object.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("egress.bpf.o");
    if let Err(e) = fs::copy(&object, &out) {
        panic!(
            "the eBPF object {} is missing ({e}): run `cargo xtask build-ebpf` first \
             (or set EGRESS_BPF_OBJECT to a built object)",
            object.display()
        );
    }
}
