//! A `tokenmeter` started as a child process by a bench: its stderr read to the end on a thread
//! (so the pipe never fills and blocks the proxy's logging), the line that says it is serving,
//! and the warnings and errors it logged after that. Shared by the overhead and soak benches.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::Child;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Warnings and errors a proxy logged once serving (at most 20 are kept).
#[derive(Clone, Default)]
pub(crate) struct Complaints(Arc<Mutex<Vec<String>>>);

impl Complaints {
    pub(crate) fn keep(&self, line: String) {
        if let Ok(mut kept) = self.0.lock() {
            if kept.len() < 20 {
                kept.push(line);
            }
        }
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        self.0.lock().map(|kept| kept.clone()).unwrap_or_default()
    }
}

/// Waits (30 s at most) for `child`, a started tokenmeter with stderr piped, to log that it is
/// serving; gives that line and the complaints it logs from then on. On failure the child is
/// killed and the error carries what it logged.
pub(crate) fn await_serving(child: &mut Child) -> Result<(String, Complaints), String> {
    let fail = |child: &mut Child, why: String| {
        let _ = child.kill();
        let _ = child.wait();
        Err(why)
    };
    let Some(stderr) = child.stderr.take() else {
        return fail(child, "the proxy's stderr was not piped".into());
    };
    let complaints = Complaints::default();
    let (serving_tx, serving_rx) = mpsc::channel();
    let kept = complaints.clone();
    std::thread::spawn(move || {
        let mut before_serving = Vec::new();
        let mut serving = Some(serving_tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if serving.is_some() && line.contains("tokenmeter is serving") {
                if let Some(tx) = serving.take() {
                    let _ = tx.send(Ok(line));
                }
            } else if serving.is_some() {
                before_serving.push(line);
            } else if line.contains("WARN") || line.contains("ERROR") {
                kept.keep(line);
            }
        }
        if let Some(tx) = serving {
            let _ = tx.send(Err(before_serving.join("\n")));
        }
    });
    match serving_rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(line)) => Ok((line, complaints)),
        Ok(Err(output)) => fail(child, format!("the proxy exited before serving:\n{output}")),
        Err(_) => fail(
            child,
            "the proxy did not say it was serving within 30 s".into(),
        ),
    }
}

/// The address after `key` (`listen=`, `admin=`) in the serving line.
pub(crate) fn address(line: &str, key: &str) -> Result<SocketAddr, String> {
    line.split_whitespace()
        .find_map(|field| field.strip_prefix(key))
        .and_then(|addr| addr.parse().ok())
        .ok_or_else(|| format!("no {key}ADDR in the proxy's line: {line}"))
}
