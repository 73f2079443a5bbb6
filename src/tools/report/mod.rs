//! `tokenmeter report FILE...`: why was it slow? Reads the per-request records of one or more
//! proxies (JSON lines or CSV, one file per pod, merged) and says, per route and model (and per
//! deployment, when the records come from more than one), how requests fared (percentiles,
//! goodput, attainment), where the service bends as concurrency rises (the knee by `bench`'s own
//! rule), whether the slowest requests or the violations concentrate on one pod, and why the
//! slowest requests were slow, cause by cause with the evidence from their records.
//!
//! The records are streamed, never all held: memory is bounded by the number of routes, models,
//! deployments and pods, whatever the number of records (see [`analyze`]).
//!
//! [`read`] turns files into requests one at a time and counts the lines that are not records,
//! [`analyze`] folds them into the [`Report`] (whose serialized form is the `--format json`
//! shape), [`cause`] explains one request, [`pods`] compares a deployment's pods, [`figures`]
//! holds the sketches and number formats below them all, [`table`] lays out the tables that
//! [`text`] prints for a terminal and [`html`] writes into the self-contained page. Imports go
//! one way: writers → table → analyze → cause, pods → figures, read.

pub mod analyze;
pub mod cause;
pub mod figures;
pub mod html;
pub mod pods;
pub mod read;
pub mod table;
pub mod text;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use crate::tools::cli::fail;
use crate::Config;
pub use analyze::{build, Report};
pub use read::{stream, Loaded};

/// How the report is printed on stdout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Tables for a terminal.
    #[default]
    Text,
    /// One JSON document (docs/live-view-and-report.md, "Why was it slow?", documents its shape).
    Json,
}

/// The report's flags.
#[derive(Args, Clone, Debug)]
pub struct ReportArgs {
    /// Per-request record files (JSONL or CSV, told apart by extension or first byte); several
    /// files, one per pod, are merged.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// How many of the slowest requests (by E2E) to explain.
    #[arg(long, value_name = "N", default_value = "10")]
    pub slowest: usize,
    /// What stdout gets: tables, or one JSON document.
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
    /// Also write one self-contained HTML page (tables and plots, no external resources).
    #[arg(long, value_name = "FILE.html")]
    pub html: Option<PathBuf>,
    /// The proxy's configuration: each route's SLO thresholds beside its figures, drawn on every
    /// plot, and its objective for ranking the routes worst first.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Why there is nothing to report, in one line: each file's state.
fn nothing_to_report(loaded: &Loaded) -> String {
    let states: Vec<String> = loaded
        .sources
        .iter()
        .map(|s| match s.malformed {
            0 => format!("{} is empty", s.path),
            n => format!(
                "{} has only malformed lines ({n}, the first {})",
                s.path,
                loaded
                    .problems
                    .iter()
                    .find(|p| p.path == s.path)
                    .map_or_else(String::new, ToString::to_string)
            ),
        })
        .collect();
    format!("no records: {}", states.join("; "))
}

/// Runs `tokenmeter report`: exit 0 with a report, 2 with one line when there is nothing to
/// report or a file or the configuration cannot be read.
pub fn main(args: ReportArgs) -> ExitCode {
    let config = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(config) => Some(config),
            Err(e) => return fail(&e),
        },
        None => None,
    };
    let (loaded, report) = match build(&args.files, args.slowest, config.as_ref()) {
        Ok(built) => built,
        Err(e) => return fail(&e),
    };
    let Some(report) = report else {
        return fail(&nothing_to_report(&loaded));
    };
    // Diagnostics go to stderr, so that stdout stays the report (and valid JSON).
    for source in loaded.sources.iter().filter(|s| s.records == 0) {
        match source.malformed {
            0 => eprintln!("{}: empty, no records", source.path),
            n => eprintln!("{}: no records, {n} malformed lines", source.path),
        }
    }
    if loaded.malformed > 0 {
        eprintln!(
            "{} malformed line{} skipped:",
            loaded.malformed,
            if loaded.malformed == 1 { "" } else { "s" }
        );
        for problem in &loaded.problems {
            eprintln!("  {problem}");
        }
        if loaded.malformed > loaded.problems.len() {
            eprintln!("  ...");
        }
    }
    if let Some(path) = &args.html {
        if let Err(e) = std::fs::write(path, html::page(&report)) {
            return fail(&format!("cannot write {}: {e}", path.display()));
        }
    }
    match args.format {
        OutputFormat::Text => print!("{}", text::render(&report)),
        OutputFormat::Json => match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(e) => return fail(&format!("cannot write the report as JSON: {e}")),
        },
    }
    ExitCode::SUCCESS
}
