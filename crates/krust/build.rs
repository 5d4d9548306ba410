//! Links the krust binary with packed relative relocations (DT_RELR) on GNU/Linux: the
//! 2.2 MB `.rela.dyn` table that every krust process reads at start, and keeps
//! resident, becomes a bitmap of a few kilobytes. The binary then needs glibc 2.36 or
//! later (Debian 12; binutils 2.38 or later to link it).

fn main() {
    let target = |key: &str| std::env::var(key).unwrap_or_default();
    if target("CARGO_CFG_TARGET_OS") == "linux" && target("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
