//! `tokenmeter bench`: a closed-loop load generator that sweeps concurrency levels against an
//! OpenAI-compatible chat endpoint and reports TTFT, TPOT, ITL, E2E, throughput, goodput and the
//! saturation point.
//!
//! Each response is read by the proxy's own [`StreamReader`], so bench and proxy measure with the
//! same definitions (docs/MEASUREMENT.md). This file holds the flags, the sweep and the command;
//! [`request`] times one request and [`report`] turns records into tables, CSV and a verdict.

pub mod report;
pub mod request;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::parse_duration;
pub use report::{LevelReport, Slo};
pub use request::Record;

/// The load generator's flags.
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// The server: `http://host:port` (the chat path is added) or a full chat completions URL.
    #[arg(long, value_name = "URL", value_parser = parse_url)]
    pub url: http::Uri,
    /// Concurrency levels to sweep, in order.
    #[arg(long, value_name = "N,N,..", value_delimiter = ',', default_value = "1,5,10,20",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: Vec<u32>,
    /// Requests sent at each level.
    #[arg(long, value_name = "N", default_value = "50", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub requests: u32,
    /// Length of the synthetic prompt, in words of about one token each.
    #[arg(long, value_name = "N", default_value = "128", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub prompt_tokens: u32,
    /// `max_tokens` of every request.
    #[arg(long, value_name = "N", default_value = "64", value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_tokens: u32,
    /// The model named in the requests.
    #[arg(long, value_name = "NAME", default_value = "sim-llama")]
    pub model: String,
    /// Write one row per request to this file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// SLO on time to first token, for goodput.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slo_ttft: Option<Duration>,
    /// SLO on time per output token, for goodput.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slo_tpot: Option<Duration>,
    /// SLO on end-to-end latency, for goodput.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slo_e2e: Option<Duration>,
    /// A request still unfinished after this long is abandoned and counted as an error.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
}

impl BenchArgs {
    /// The SLO thresholds that were given.
    pub fn slo(&self) -> Slo {
        Slo {
            ttft: self.slo_ttft,
            tpot: self.slo_tpot,
            e2e: self.slo_e2e,
        }
    }
}

fn parse_url(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text
        .trim()
        .parse()
        .map_err(|e| format!("`{text}` is not a URL ({e})"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!(
            "`{text}` must be an http:// URL with a host (https is not supported)"
        ));
    }
    // A bare server address means the OpenAI chat path, as every client library assumes.
    if uri.path() == "/" || uri.path().is_empty() {
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
        return format!("http://{authority}/v1/chat/completions")
            .parse()
            .map_err(|e| format!("`{text}` is not a URL ({e})"));
    }
    Ok(uri)
}

/// A prompt of `words` short words that the usual tokenizers (and the sim's bytes / 4) count
/// as about one token each; deterministic so that runs compare.
pub fn synthetic_prompt(words: u32) -> String {
    const WORDS: [&str; 8] = ["the", "cat", "sat", "on", "a", "mat", "and", "ran"];
    let mut prompt = String::with_capacity(words as usize * 4);
    for i in 0..words as usize {
        if i > 0 {
            prompt.push(' ');
        }
        prompt.push_str(WORDS[i % WORDS.len()]);
    }
    prompt
}

/// What one sweep produced: every record, by level, in the order the levels were given.
#[derive(Debug)]
pub struct Sweep {
    pub levels: Vec<LevelReport>,
}

/// Runs the sweep: at each level, `concurrency` workers send requests back to back until
/// `requests` have been sent.
pub async fn run(args: &BenchArgs) -> Sweep {
    let mut connector = HttpConnector::new();
    // Each token is a small write; Nagle would hold back the client's request and skew TTFT.
    connector.set_nodelay(true);
    let client: request::HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let body = Bytes::from(
        serde_json::json!({
            "model": args.model,
            "messages": [{"role": "user", "content": synthetic_prompt(args.prompt_tokens)}],
            "max_tokens": args.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string(),
    );
    let slo = args.slo();
    let mut levels = Vec::with_capacity(args.concurrency.len());
    for &concurrency in &args.concurrency {
        let next_id = Arc::new(AtomicU32::new(0));
        let started = Instant::now();
        let mut workers = JoinSet::new();
        for _ in 0..concurrency.min(args.requests) {
            let client = client.clone();
            let next_id = next_id.clone();
            let uri = args.url.clone();
            let body = body.clone();
            let (requests, timeout) = (args.requests, args.timeout);
            workers.spawn(async move {
                let mut records = Vec::new();
                loop {
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    if id >= requests {
                        return records;
                    }
                    let request = request::build(&uri, Full::new(body.clone()));
                    let mut record = request::send(&client, request, timeout).await;
                    record.request_id = id;
                    record.concurrency = concurrency;
                    records.push(record);
                }
            });
        }
        let mut records = Vec::with_capacity(args.requests as usize);
        while let Some(done) = workers.join_next().await {
            match done {
                Ok(mut part) => records.append(&mut part),
                Err(e) => tracing::warn!(error = %e, "a bench worker ended abnormally"),
            }
        }
        records.sort_by_key(|r| r.request_id);
        let wall = started.elapsed();
        levels.push(LevelReport::new(concurrency, records, wall, &slo));
    }
    Sweep { levels }
}

/// The `tokenmeter bench` command.
pub fn main(args: BenchArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokenmeter: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let sweep = runtime.block_on(run(&args));
    if let Some(path) = &args.csv {
        if let Err(e) = report::write_csv(path, &sweep.levels) {
            eprintln!("tokenmeter: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    print!("{}", report::render(&sweep.levels, &args.slo()));
    ExitCode::SUCCESS
}
