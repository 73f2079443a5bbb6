//! What every subcommand shares: a runtime to run on, logs on stderr, and failing with one line.
//!
//! Each command (`tokenmeter`, `sim`, `bench`, `demo`) is a future run to completion here; a
//! failure the user can fix is one line on stderr and exit 2, never a panic.

use std::future::Future;
use std::process::ExitCode;

/// Prints `tokenmeter: {error}` on stderr and returns exit code 2.
pub fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("tokenmeter: {error}");
    ExitCode::from(2)
}

/// Runs `command` on a multi-threaded runtime.
pub fn block_on(command: impl Future<Output = ExitCode>) -> ExitCode {
    block_on_workers(command, None)
}

/// Runs `command` on a runtime with `workers` threads: one is a single-threaded runtime (no
/// work stealing, no cross-thread wake-ups); `None` is one per available CPU.
pub fn block_on_workers(
    command: impl Future<Output = ExitCode>,
    workers: Option<usize>,
) -> ExitCode {
    let runtime = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    match runtime {
        Ok(runtime) => runtime.block_on(command),
        Err(e) => fail(&format!("cannot start the runtime: {e}")),
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (`info` by default); colour only for a person at a
/// terminal, plain text for log collectors. A second call keeps the first subscriber.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
