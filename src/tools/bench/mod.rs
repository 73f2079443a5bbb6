//! `tokenmeter bench`: a load generator that sweeps concurrency levels (closed loop) or offered
//! rates (open loop, Poisson arrivals) against an OpenAI-compatible chat or completions
//! endpoint, over http or https, streamed or not, optionally
//! interleaving the same load to a second endpoint (`--compare`), and reports TTFT, TPOT, ITL,
//! E2E, throughput, goodput, cost and the saturation point.
//!
//! Each response is read by the proxy's own [`StreamReader`](crate::StreamReader), so
//! bench and proxy measure with the same definitions (docs/MEASUREMENT.md). This file holds the
//! flags, the level driver and the command; [`workload`] decides what is sent and when,
//! [`request`] times one request, [`report`] turns records into tables, CSV and a verdict,
//! [`plot`] draws the curve and [`progress`] shows the run going.

pub mod plot;
pub mod progress;
pub mod report;
pub mod request;
pub mod tls;
pub mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::parse_duration;
pub use report::{Cost, LevelReport, Load, Slo};
pub use request::{Api, Endpoint, Record, Target};
pub use workload::{MaxTokens, Workload};

/// The load generator's flags.
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// The server: `http(s)://host:port` (the endpoint's path is added) or a full URL such as
    /// `https://host/v1/chat/completions` or `http://host:8000/v1/completions`.
    #[arg(long, value_name = "URL", value_parser = server_url)]
    pub url: http::Uri,
    /// A second server that gets the same requests, interleaved slot by slot with --url (A, B,
    /// B, A, ..); the level's concurrency or rate is shared by the two. The report adds what B
    /// costs over A in TTFT and ITL at p50 and p99 (the proxy's overhead benchmark).
    #[arg(long, value_name = "URL_B", value_parser = server_url)]
    pub compare: Option<http::Uri>,
    /// The API: chat completions (`messages`) or legacy completions (`prompt`). Without it, a
    /// URL whose path ends in `/completions` but not `/chat/completions` is completions, any
    /// other chat.
    #[arg(long, value_enum, value_name = "API")]
    pub endpoint: Option<Endpoint>,
    /// Ask for one JSON body instead of a stream. TTFT is then the time until the whole body
    /// has arrived (its first token cannot be seen sooner), E2E the same plus closing; TPOT
    /// and ITL are not measured.
    #[arg(long)]
    pub no_stream: bool,
    /// A header sent with every request, `-H 'Name: value'`; repeat it for more (an API key,
    /// `-H 'Authorization: Bearer sk-..'`, or a routing header such as `-H 'x-tier: gold'`).
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    pub headers: Vec<Header>,
    /// https: also trust the CA certificates in this PEM file (a private CA, a self-signed
    /// server); Mozilla's public roots stay trusted.
    #[arg(long, value_name = "FILE.pem")]
    pub ca_cert: Option<PathBuf>,
    /// https: accept any server certificate without checking it. For a test server only:
    /// anyone on the path can then read and change the traffic.
    #[arg(long)]
    pub insecure: bool,
    /// Closed loop: concurrency levels to sweep, in order.
    #[arg(long, value_name = "N,N,..", value_delimiter = ',', default_value = "1,5,10,20",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: Vec<u32>,
    /// Open loop instead: offered rates to sweep (requests/s, Poisson arrivals), in order.
    #[arg(long, value_name = "R,R,..", value_delimiter = ',', value_parser = parse_rate,
          conflicts_with = "concurrency")]
    pub rate: Vec<f64>,
    /// Requests sent at each level (to each server with --compare).
    #[arg(long, value_name = "N", default_value = "50", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub requests: u32,
    /// Stop sending new requests this long into each level; those in flight still finish.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub level_duration: Option<Duration>,
    /// Closed loop: start each level's concurrent requests this long apart (the first at
    /// once) instead of all together. Requests sent together reach the server in any order, so
    /// one counted second in flight may be the one that queues; spaced out, each arrives into
    /// the load it is counted in.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "rate")]
    pub stagger: Option<Duration>,
    /// Open loop: at most this many requests in flight; an arrival past it waits (and the
    /// report says how many did).
    #[arg(long, value_name = "N", default_value = "1024", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_in_flight: u32,
    /// Seed of the arrival gaps and the max_tokens draws, so a run reproduces.
    #[arg(long, value_name = "N", default_value = "1")]
    pub seed: u64,
    /// Prompts, one JSON object a line: {"prompt": "..."} or {"messages": [...]}, each with an
    /// optional "max_tokens"; used in order and cycled. Without it, a synthetic prompt.
    #[arg(long, value_name = "FILE.jsonl")]
    pub prompts: Option<PathBuf>,
    /// Length of the synthetic prompt, in words of about one token each.
    #[arg(long, value_name = "N", default_value = "128", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub prompt_tokens: u32,
    /// `max_tokens` of each request: N, uniform:MIN-MAX, normal:MEAN,SD or exp:MEAN (drawn
    /// with --seed, at least 1).
    #[arg(long, value_name = "N|DIST", default_value = "64", value_parser = parse_max_tokens)]
    pub max_tokens: MaxTokens,
    /// The model named in the requests.
    #[arg(long, value_name = "NAME", default_value = "sim-llama")]
    pub model: String,
    /// Write one row per request to this file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Draw TTFT p50/p99 and output tokens/s against the levels into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// SLO on time to first token, for goodput.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slo_ttft: Option<Duration>,
    /// SLO on time per output token, for goodput.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slo_tpot: Option<Duration>,
    /// SLO on end-to-end latency, for goodput.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slo_e2e: Option<Duration>,
    /// The share of a level's requests that must meet the SLO for the level to count as
    /// meeting it, for the recommendation.
    #[arg(long, value_name = "SHARE", default_value = "0.9", value_parser = parse_share)]
    pub slo_objective: f64,
    /// The price of an hour of the server, for the cost per request and per million tokens.
    #[arg(long, value_name = "PRICE", value_parser = parse_price)]
    pub cost_per_hour: Option<f64>,
    /// The currency of --cost-per-hour.
    #[arg(long, value_name = "CODE", default_value = "USD")]
    pub currency: String,
    /// Exit with status 1 when any level's share of failed requests is above this (0 to 1),
    /// after printing everything: a CI job gates on it. Above it a level's percentiles, taken
    /// over the requests that succeeded, no longer describe what its users got.
    #[arg(long, value_name = "SHARE", default_value = "0.05", value_parser = parse_share)]
    pub max_error_share: f64,
    /// A request still unfinished after this long is abandoned and counted as an error.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
}

impl BenchArgs {
    /// The documented defaults, against `url` (a full chat completions URL or `http://host:port`).
    pub fn new(url: &str) -> Result<BenchArgs, String> {
        #[derive(Parser)]
        struct Defaults {
            #[command(flatten)]
            args: BenchArgs,
        }
        Defaults::try_parse_from(["bench", "--url", url])
            .map(|d| d.args)
            .map_err(|e| e.to_string())
    }

    /// The SLO thresholds that were given.
    pub fn slo(&self) -> Slo {
        Slo {
            ttft: self.slo_ttft,
            tpot: self.slo_tpot,
            e2e: self.slo_e2e,
        }
    }

    /// The price, when one was given.
    pub fn cost(&self) -> Option<Cost> {
        self.cost_per_hour.map(|per_hour| Cost {
            per_hour,
            currency: self.currency.clone(),
        })
    }

    /// The levels to run, in order: the rates when given, else the concurrencies.
    pub fn loads(&self) -> Vec<Load> {
        if self.rate.is_empty() {
            self.concurrency
                .iter()
                .map(|&c| Load::Concurrency(c))
                .collect()
        } else {
            self.rate.iter().map(|&r| Load::Rate(r)).collect()
        }
    }

    /// The API the requests speak: `--endpoint`, else what `--url`'s path names.
    pub fn api(&self) -> Api {
        Api {
            endpoint: self
                .endpoint
                .unwrap_or_else(|| Endpoint::of_path(self.url.path())),
            stream: !self.no_stream,
        }
    }

    /// Where requests to `server` (`--url` or `--compare`) go: a bare address gets the
    /// endpoint's path.
    pub fn request_uri(&self, server: &http::Uri) -> http::Uri {
        if server.path() != "/" {
            return server.clone();
        }
        let mut parts = server.clone().into_parts();
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static(
            self.api().endpoint.path(),
        ));
        http::Uri::from_parts(parts).unwrap_or_else(|_| server.clone())
    }

    /// The `--header`s, as a header map.
    pub fn header_map(&self) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for Header(name, value) in &self.headers {
            map.append(name, value.clone());
        }
        map
    }

    /// The client: http and https (rustls, Mozilla's roots plus `--ca-cert`, or no check at
    /// all with `--insecure`). Fails, in one line, on a CA file that cannot be read.
    pub fn client(&self) -> Result<request::HttpClient, String> {
        let tls = tls::client_config(self.ca_cert.as_deref(), self.insecure)?;
        let mut http = HttpConnector::new();
        // Each token is a small write; Nagle would hold back the client's request and skew
        // TTFT.
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Client::builder(TokioExecutor::new()).build(connector))
    }

    /// What the run sends: the prompts file read and checked (`FILE:LINE: problem`), or the
    /// synthetic prompt.
    pub fn workload(&self) -> Result<Workload, String> {
        let prompts = match &self.prompts {
            Some(path) => workload::load_prompts(path)?,
            None => vec![workload::Prompt::user(&synthetic_prompt(
                self.prompt_tokens,
            ))],
        };
        Ok(Workload::for_api(
            &self.model,
            prompts,
            self.max_tokens,
            self.seed,
            self.api(),
        ))
    }
}

/// A server URL, `http://` or `https://` with a host; a bare address keeps the path `/`,
/// which [`BenchArgs::request_uri`] fills in with the endpoint's.
pub fn server_url(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text
        .trim()
        .parse()
        .map_err(|e| format!("`{text}` is not a URL ({e})"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(format!(
            "`{text}` must be an http:// or https:// URL with a host"
        ));
    }
    Ok(uri)
}

/// One `--header`: its name and value, checked when parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Header(pub http::HeaderName, pub http::HeaderValue);

/// `Name: value`, as `-H` takes it.
pub fn parse_header(text: &str) -> Result<Header, String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("`{text}` is not a header: write 'Name: value'"))?;
    let name = http::HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("`{}` is not a header name", name.trim()))?;
    let value = http::HeaderValue::from_str(value.trim())
        .map_err(|_| format!("the value of `{name}` has a character a header cannot carry"))?;
    Ok(Header(name, value))
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= 1_000_000.0 => Ok(r),
        _ => Err(format!(
            "`{text}` is not a rate: write requests per second, above 0"
        )),
    }
}

fn parse_share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if (0.0..=1.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "`{text}` is not a share: write a number from 0 to 1 (0.05 is 5 %)"
        )),
    }
}

fn parse_price(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
        _ => Err(format!("`{text}` is not a price: write a number >= 0")),
    }
}

fn parse_max_tokens(text: &str) -> Result<MaxTokens, String> {
    text.parse()
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

/// What one sweep produced: each level's report, in the order the levels were given.
#[derive(Debug, Default)]
pub struct Sweep {
    /// The levels against `--url` (target A).
    pub levels: Vec<LevelReport>,
    /// The same levels against `--compare` (target B); empty without it.
    pub compared: Vec<LevelReport>,
}

/// Told how a sweep goes, as it goes: the progress bar, the plain lines, or a live table.
/// `request_done` is called from the sweep's own task, once per request, in completion order.
pub trait Progress: Send + Sync {
    fn level_started(&self, label: &str, total: u32);
    fn request_done(&self, record: &Record);
    fn level_finished(&self, report: &LevelReport);
}

/// Runs the sweep with a progress bar on a terminal, plain lines on stderr otherwise.
pub async fn run(args: &BenchArgs) -> Sweep {
    let progress = progress::for_stderr();
    run_with(args, progress.as_ref()).await
}

/// Runs the sweep, telling `progress` as it goes. A prompts file that cannot be read ends the
/// sweep before it starts, with no levels (check [`BenchArgs::workload`] first to report why).
pub async fn run_with(args: &BenchArgs, progress: &dyn Progress) -> Sweep {
    match args.workload().and_then(|w| Ok((w, args.client()?))) {
        Ok((workload, client)) => sweep(args, Arc::new(workload), client, progress).await,
        Err(e) => {
            tracing::error!(error = %e, "bench cannot start");
            Sweep::default()
        }
    }
}

async fn sweep(
    args: &BenchArgs,
    workload: Arc<Workload>,
    client: request::HttpClient,
    progress: &dyn Progress,
) -> Sweep {
    let driver = Driver {
        args,
        client,
        workload,
        headers: args.header_map(),
        api: args.api(),
        progress,
    };
    let mut result = Sweep::default();
    for load in args.loads() {
        let (a, b) = driver.level(load).await;
        result.levels.push(a);
        result.compared.extend(b);
    }
    result
}

/// What every level of a sweep shares.
struct Driver<'a> {
    args: &'a BenchArgs,
    client: request::HttpClient,
    workload: Arc<Workload>,
    headers: http::HeaderMap,
    api: Api,
    progress: &'a dyn Progress,
}

/// One level's request slots: which request and which server each one is.
#[derive(Clone, Copy)]
struct Slots {
    targets: u32,
    total: u32,
}

impl Slots {
    /// With two targets, slot `s` sends request `s / 2` to A then B, or B then A on odd pairs,
    /// so neither target is always second and slow drift of the machine cancels out.
    fn get(self, slot: u32) -> (u32, Target) {
        if self.targets == 1 {
            return (slot, Target::A);
        }
        let target = if (slot + slot / 2) % 2 == 0 {
            Target::A
        } else {
            Target::B
        };
        (slot / 2, target)
    }
}

impl Driver<'_> {
    /// Runs one level to the end and reports it (for B too with `--compare`).
    async fn level(&self, load: Load) -> (LevelReport, Option<LevelReport>) {
        let args = self.args;
        let targets = if args.compare.is_some() { 2 } else { 1 };
        let slots = Slots {
            targets,
            total: args.requests.saturating_mul(targets),
        };
        self.progress.level_started(&load.label(), slots.total);
        let started = Instant::now();
        let deadline = args.level_duration.map(|d| started + d);
        let max_in_flight = args.max_in_flight as usize;
        let mut in_flight: JoinSet<Record> = JoinSet::new();
        let mut records = Vec::with_capacity(slots.total.min(1 << 16) as usize);
        let (mut next, mut stopped, mut capped, mut peak) = (0u32, false, 0u32, 0usize);
        let mut launch = |in_flight: &mut JoinSet<Record>, slot: u32, now: Instant| {
            let concurrency = match load {
                Load::Concurrency(c) => c,
                Load::Rate(_) => u32::try_from(in_flight.len() + 1).unwrap_or(u32::MAX),
            };
            peak = peak.max(in_flight.len() + 1);
            in_flight.spawn(self.request(slots, slot, load, concurrency, now - started));
        };
        // Closed loop: the level's concurrent requests still to start, one `stagger` apart.
        let stagger = args.stagger.filter(|s| !s.is_zero());
        let mut to_start = 0u32;
        if let Load::Concurrency(c) = load {
            let now = Instant::now();
            let at_once = if stagger.is_some() { 1 } else { c };
            while next < slots.total.min(at_once) && deadline.is_none_or(|d| now < d) {
                launch(&mut in_flight, next, now);
                next += 1;
            }
            to_start = c.saturating_sub(at_once);
        }
        let mut arrivals = match load {
            Load::Rate(rate) => Some(workload::Arrivals::new(rate, args.seed)),
            Load::Concurrency(_) => None,
        };
        let mut due = match (&mut arrivals, stagger) {
            (Some(a), _) => started + a.gap(),
            (None, Some(stagger)) => started + stagger,
            (None, None) => started,
        };
        loop {
            // Past the level's duration nothing more is sent; no need to sleep until then.
            if (arrivals.is_some() || to_start > 0) && deadline.is_some_and(|d| due >= d) {
                stopped = true;
            }
            let arrive = (arrivals.is_some() || to_start > 0)
                && !stopped
                && next < slots.total
                && in_flight.len() < max_in_flight;
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(due), if arrive => {
                    launch(&mut in_flight, next, Instant::now());
                    next += 1;
                    match (&mut arrivals, stagger) {
                        // Due times are absolute, so a late wake-up does not slow the rate.
                        (Some(a), _) => due += a.gap(),
                        (None, Some(stagger)) => {
                            to_start -= 1;
                            due += stagger;
                        }
                        (None, None) => {}
                    }
                }
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    let was_full = in_flight.len() + 1 >= max_in_flight;
                    match done {
                        Ok(record) => {
                            self.progress.request_done(&record);
                            records.push(record);
                        }
                        Err(e) => tracing::warn!(error = %e, "a bench request ended abnormally"),
                    }
                    let now = Instant::now();
                    match (load, &mut arrivals) {
                        (Load::Concurrency(_), _) => {
                            if next < slots.total && deadline.is_none_or(|d| now < d) {
                                launch(&mut in_flight, next, now);
                                next += 1;
                            }
                        }
                        (Load::Rate(_), Some(a)) if was_full => {
                            // Arrivals that fell due while every slot was taken go now, and
                            // are counted: the client, not the server, held them back.
                            while !stopped && next < slots.total && due <= now
                                && in_flight.len() < max_in_flight
                            {
                                if deadline.is_some_and(|d| due >= d) {
                                    stopped = true;
                                    break;
                                }
                                capped += 1;
                                launch(&mut in_flight, next, now);
                                next += 1;
                                due += a.gap();
                            }
                        }
                        (Load::Rate(_), _) => {}
                    }
                }
                else => break,
            }
        }
        let wall = started.elapsed();
        let (mut a, mut b): (Vec<Record>, Vec<Record>) =
            records.into_iter().partition(|r| r.target == Target::A);
        a.sort_by_key(|r| r.request_id);
        b.sort_by_key(|r| r.request_id);
        let slo = args.slo();
        let peak = u32::try_from(peak).unwrap_or(u32::MAX);
        let finish = |target, records| {
            let mut report = LevelReport::measured(load, target, records, wall, &slo);
            report.capped = capped;
            report.max_in_flight = args.max_in_flight;
            if let Load::Rate(_) = load {
                report.concurrency = peak;
            }
            self.progress.level_finished(&report);
            report
        };
        let a = finish(Target::A, a);
        let b = (targets == 2).then(|| finish(Target::B, b));
        (a, b)
    }

    /// The future that sends slot `slot` and returns its record.
    fn request(
        &self,
        slots: Slots,
        slot: u32,
        load: Load,
        concurrency: u32,
        start: Duration,
    ) -> impl std::future::Future<Output = Record> + Send + 'static {
        let (index, target) = slots.get(slot);
        let uri = match (target, &self.args.compare) {
            (Target::B, Some(b)) => b,
            _ => &self.args.url,
        };
        let (body, max_tokens) = self.workload.request(index);
        let uri = self.args.request_uri(uri);
        let request = request::build_with(&uri, Full::new(body), self.api, &self.headers);
        let client = self.client.clone();
        let (timeout, api) = (self.args.timeout, self.api);
        async move {
            let mut record = request::send_with(&client, request, api, timeout).await;
            record.request_id = index;
            record.concurrency = concurrency;
            record.rate = match load {
                Load::Rate(r) => Some(r),
                Load::Concurrency(_) => None,
            };
            record.target = target;
            record.max_tokens = max_tokens;
            record.start = start;
            record
        }
    }
}

/// The `tokenmeter bench` command.
pub fn main(args: BenchArgs) -> ExitCode {
    // A bad prompts file is the user's to fix: say where, before any request is sent.
    let workload = match args.workload() {
        Ok(w) => Arc::new(w),
        Err(e) => return crate::tools::cli::fail(&e),
    };
    crate::tools::cli::block_on(async move {
        // Built inside the runtime: the connector's resolver needs one.
        let client = match args.client() {
            Ok(c) => c,
            Err(e) => return crate::tools::cli::fail(&e),
        };
        let progress = progress::for_stderr();
        let sweep = sweep(&args, workload, client, progress.as_ref()).await;
        drop(progress);
        finish(&args, &sweep)
    })
}

/// Writes the files asked for and prints the tables.
fn finish(args: &BenchArgs, sweep: &Sweep) -> ExitCode {
    if let Some(path) = &args.csv {
        if let Err(e) = report::write_sweep_csv(path, sweep) {
            return crate::tools::cli::fail(&format!("cannot write {}: {e}", path.display()));
        }
    }
    if let Some(path) = &args.plot {
        if let Err(e) = plot::write_svg_with(path, sweep, &args.slo()) {
            return crate::tools::cli::fail(&format!("cannot write {}: {e}", path.display()));
        }
    }
    print!("{}", report::render_sweep(sweep, args));
    let failing: Vec<String> = report::failing_levels(&sweep.levels, args.max_error_share)
        .into_iter()
        .chain(report::failing_levels(
            &sweep.compared,
            args.max_error_share,
        ))
        .map(|(level, share)| format!("{} ({:.0} % failed)", level.load, share * 100.0))
        .collect();
    if failing.is_empty() {
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "tokenmeter: bench: failed requests above --max-error-share {:.0} % at {}",
        args.max_error_share * 100.0,
        failing.join(", ")
    );
    ExitCode::from(EXIT_ERRORS)
}

/// The exit status when a level failed more than `--max-error-share` of its requests (2 is
/// a command that could not run at all: bad flags, an unreadable prompts file).
pub const EXIT_ERRORS: u8 = 1;
