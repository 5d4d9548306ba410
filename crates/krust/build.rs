//! Links the krust binary with packed relative relocations (DT_RELR; glibc ≥ 2.36 and
//! binutils ≥ 2.38, Debian 12's): the 2.2 MB `.rela.dyn` table that every krust process
//! reads at start, and keeps resident, becomes a bitmap of a few kilobytes.

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
