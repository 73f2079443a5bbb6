//! Showing a sweep as it runs: a progress bar when stderr is a terminal, plain lines
//! (`level c=5: 20/50 requests`) when it is a file or a pipe, or nothing.
//!
//! stdout stays for the report, so both go to stderr.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

use super::{LevelReport, Progress, Record};

/// The progress bar on a terminal, plain lines otherwise.
pub fn for_stderr() -> Box<dyn Progress> {
    if std::io::stderr().is_terminal() {
        Box::new(Bar::default())
    } else {
        Box::new(Lines::new(Box::new(std::io::stderr())))
    }
}

/// Shows nothing.
pub struct Silent;

impl Progress for Silent {
    fn level_started(&self, _: &str, _: u32) {}
    fn request_done(&self, _: &Record) {}
    fn level_finished(&self, _: &LevelReport) {}
}

/// One line as a level starts, one per tenth of its requests, and one when it ends.
pub struct Lines {
    out: Mutex<Box<dyn Write + Send>>,
    label: Mutex<String>,
    total: AtomicU32,
    done: AtomicU32,
}

impl Lines {
    pub fn new(out: Box<dyn Write + Send>) -> Lines {
        Lines {
            out: Mutex::new(out),
            label: Mutex::new(String::new()),
            total: AtomicU32::new(0),
            done: AtomicU32::new(0),
        }
    }

    fn line(&self, text: std::fmt::Arguments<'_>) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // Progress is a courtesy: a closed stderr must not stop the run.
        let _ = writeln!(out, "{text}");
    }

    fn label(&self) -> String {
        self.label.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Progress for Lines {
    fn level_started(&self, label: &str, total: u32) {
        label.clone_into(&mut self.label.lock().unwrap_or_else(|e| e.into_inner()));
        self.total.store(total, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        self.line(format_args!("level {label}: 0/{total} requests"));
    }

    fn request_done(&self, _: &Record) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let total = self.total.load(Ordering::Relaxed);
        let step = total.div_ceil(10).max(1);
        if done % step == 0 || done == total {
            self.line(format_args!(
                "level {}: {done}/{total} requests",
                self.label()
            ));
        }
    }

    fn level_finished(&self, report: &LevelReport) {
        self.line(format_args!(
            "level {} {}: done, {} requests in {:.2}s, {} errors",
            self.label(),
            report.target.as_str(),
            report.records.len(),
            report.wall.as_secs_f64(),
            report.errors
        ));
    }
}

/// An indicatif bar per level, cleared when the level ends.
#[derive(Default)]
pub struct Bar {
    bar: Mutex<Option<ProgressBar>>,
}

impl Progress for Bar {
    fn level_started(&self, label: &str, total: u32) {
        let bar = ProgressBar::new(u64::from(total)).with_prefix(format!("level {label}"));
        if let Ok(style) =
            ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} requests, {elapsed}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        *self.bar.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
    }

    fn request_done(&self, _: &Record) {
        if let Some(bar) = &*self.bar.lock().unwrap_or_else(|e| e.into_inner()) {
            bar.inc(1);
        }
    }

    fn level_finished(&self, report: &LevelReport) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            bar.finish_and_clear();
        }
        eprintln!(
            "level {} {}: done, {} requests in {:.2}s, {} errors",
            report.load.label(),
            report.target.as_str(),
            report.records.len(),
            report.wall.as_secs_f64(),
            report.errors
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn plain_lines_report_each_tenth_and_the_end() {
        let sink = Shared::default();
        let lines = Lines::new(Box::new(sink.clone()));
        let record = crate::tools::bench::request::Record {
            request_id: 0,
            concurrency: 5,
            rate: None,
            target: crate::tools::bench::Target::A,
            max_tokens: 1,
            start: Duration::ZERO,
            prompt_tokens: None,
            output_tokens: 1,
            token_source: crate::tools::bench::request::TokenSource::Usage,
            ttft: None,
            tpot: None,
            e2e: Duration::ZERO,
            itl: Vec::new(),
            max_itl: None,
            status: 200,
            error: None,
        };
        lines.level_started("c=5", 25);
        for _ in 0..25 {
            lines.request_done(&record);
        }
        let report = LevelReport::new(5, vec![record], Duration::from_secs(1), &Default::default());
        lines.level_finished(&report);
        let text = String::from_utf8(sink.0.lock().map(|v| v.clone()).unwrap_or_default())
            .unwrap_or_default();
        let got: Vec<&str> = text.lines().collect();
        assert_eq!(
            got,
            [
                "level c=5: 0/25 requests",
                "level c=5: 3/25 requests",
                "level c=5: 6/25 requests",
                "level c=5: 9/25 requests",
                "level c=5: 12/25 requests",
                "level c=5: 15/25 requests",
                "level c=5: 18/25 requests",
                "level c=5: 21/25 requests",
                "level c=5: 24/25 requests",
                "level c=5: 25/25 requests",
                "level c=5 A: done, 1 requests in 1.00s, 0 errors",
            ]
        );
    }
}
