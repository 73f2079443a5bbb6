//! Links the functions a request runs next to each other (`build/hot-code.ld`, written by
//! `benches/hot_code.py`): at one user a request finds the proxy's code cold, and spread over
//! the binary one or two functions a page, the pages it touched made its TTFT longer than
//! nginx's (README, "Against nginx"). The script only moves those functions into an output
//! section of their own before `.text`; rust-lld and GNU ld both read it. Release builds for
//! Linux only: tests and debug builds link as before.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/hot-code.ld");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let release = std::env::var("PROFILE").is_ok_and(|profile| profile == "release");
    let Ok(root) = std::env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let script = Path::new(&root).join("build/hot-code.ld");
    if linux && release && script.exists() {
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", script.display());
    }
}
