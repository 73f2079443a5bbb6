//! The `tokenmeter` binary the benchmarks run: the one `cargo build --release` makes, which is
//! the one users run.
//!
//! `cargo bench` builds the package's binary with the dev-dependencies' features as well (the
//! benches need them, and cargo unifies features across one build): tokio's `test-util`, which
//! the tests' paused clocks need, makes every `Instant::now` and every timer turn ask the
//! runtime whether its clock is paused (+6.7 % instructions per event and +2.4 % per request
//! under `benches/footprint.py`). So the benches build the binary on their own, into
//! `target/shipping` (cargo rebuilds it only when the source changes), unless
//! `TOKENMETER_BENCH_BINARY` names one.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The binary to measure, built on the first call.
pub(crate) fn binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY.get_or_init(build).clone()
}

fn build() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("TOKENMETER_BENCH_BINARY").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| manifest.join("target"), PathBuf::from)
        .join("shipping");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!(
        "bench: building tokenmeter as `cargo build --release` does, into {}",
        target.display()
    );
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "--bin", "tokenmeter"])
        .arg("--manifest-path")
        .arg(manifest.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .map_err(|e| format!("cannot run cargo to build tokenmeter: {e}"))?;
    if !status.success() {
        return Err(format!("`cargo build --release` failed ({status})"));
    }
    Ok(target.join("release").join("tokenmeter"))
}
