//! Link settings for release builds of `sluice-dp`, both there to keep an
//! idle data plane's resident memory small (see `bench/README.md`):
//!
//! * The functions a data plane runs (start-up and snapshot swaps first,
//!   then the rest by when it first runs) are laid out side by side at the
//!   start of `.text`, in the order `link/symbol-order.txt` lists them. The
//!   kernel maps a binary's code in as it runs, with its neighbours around
//!   each page; scattered over the whole binary, the code a data plane runs
//!   makes several times its own size resident, packed together little more.
//! * Relative relocations are packed (DT_RELR): the loader reads all of them
//!   at start-up, and packed they are a small fraction of plain RELA.

use std::env;
use std::process::Command;

fn main() {
    let order = "link/symbol-order.txt";
    println!("cargo:rerun-if-changed={order}");
    println!("cargo:rerun-if-changed=build.rs");
    // Both flags are LLD's, which rustc links with by default on this target
    // (since Rust 1.90); other targets and the dev profile keep the defaults.
    let release = env::var("PROFILE").is_ok_and(|p| p == "release");
    let target = env::var("TARGET").unwrap_or_default();
    if !release || target != "x86_64-unknown-linux-gnu" {
        return;
    }
    let dir = env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    // A name this build does not have (the list comes from an earlier build)
    // only loses its place; it is no error.
    println!("cargo:rustc-link-arg-bin=sluice-dp=-Wl,--symbol-ordering-file={dir}/{order}");
    println!("cargo:rustc-link-arg-bin=sluice-dp=-Wl,--no-warn-symbol-ordering");
    if glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bin=sluice-dp=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the glibc linked against reads DT_RELR (2.36 and later). The
/// binary then asks for it by version, so an older loader refuses it with a
/// clear error instead of running it unrelocated.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(output) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else { return false };
    let text = String::from_utf8_lossy(&output.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else { return false };
    let mut numbers = version.split('.').map(|n| n.parse::<u32>().ok());
    match (numbers.next().flatten(), numbers.next().flatten()) {
        (Some(have_major), Some(have_minor)) => (have_major, have_minor) >= (major, minor),
        _ => false,
    }
}
