//! `tokenmeter demo`: the whole product in one process and under a minute. It starts the
//! simulator, tokenmeter in front of it and a bench sweep through tokenmeter, prints a table
//! that grows level by level while the sweep runs, and ends with the saturation point, the
//! proxy's own verdict next to the client's, and where the metrics, the live view and the files
//! are.
//!
//! Nothing here measures anything itself: the rows come from `bench` (the client's view) and the
//! closing verdict from the proxy's counters, so the demo shows the two agreeing.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use clap::Args;
use tokio::time::Instant;

use crate::tools::bench::report::{self, LevelReport};
use crate::tools::bench::{BenchArgs, Progress, Record};
use crate::tools::sim::SimConfig;
use crate::Overrides;
use crate::{parse_duration, AccessLog, Config, LogFormat, LogPath, Upstream};

/// The proxy's configuration in the demo: the example `chat` route and its SLO (the same as in
/// config/tokenmeter.yaml), records as CSV. Addresses and the record's path are set at start.
const DEMO_CONFIG: &str = "\
routes:
  - name: chat
    match: {path_prefix: /v1/chat/, methods: [POST]}
    slo: {ttft: 300ms, tpot: 40ms, e2e: 8s, objective: 0.99}
";

/// The example SLO, for bench's verdict (it must match [`DEMO_CONFIG`]).
const SLO_TTFT: Duration = Duration::from_millis(300);
const SLO_TPOT: Duration = Duration::from_millis(40);
const SLO_E2E: Duration = Duration::from_secs(8);

/// The demo's flags; every one has a default, so `tokenmeter demo` alone is the tour.
#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// How long the sweep sends requests; each level gets an equal share and then lets the
    /// requests in flight finish (at 32 users that tail is a few seconds).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Concurrency levels to sweep; the simulator runs at most --max-batch at once.
    #[arg(long, value_name = "N,N,..", value_delimiter = ',', default_value = "1,2,4,8,16,32",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub levels: Vec<u32>,
    /// The simulator's batch limit: the sweep should find the knee here.
    #[arg(long, value_name = "N", default_value = "8", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_batch: u32,
    /// Where tokenmeter serves /metrics and the live view; port 0 picks a free one.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub admin: SocketAddr,
    /// Where the per-request CSVs (bench's and the proxy's) and the plot are written.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// After the sweep, keep the simulator and tokenmeter running until Ctrl-C.
    #[arg(long)]
    pub serve: bool,
}

/// Prints the growing table: a status line for the level under way (on a terminal) and one row
/// per finished level.
struct Table {
    terminal: bool,
    state: Mutex<Running>,
}

struct Running {
    label: String,
    total: u32,
    done: u32,
    ttft_ms: Vec<f64>,
    errors: u32,
    last_draw: Option<Instant>,
}

impl Table {
    fn new() -> Table {
        Table {
            terminal: std::io::stdout().is_terminal(),
            state: Mutex::new(Running {
                label: String::new(),
                total: 0,
                done: 0,
                ttft_ms: Vec::new(),
                errors: 0,
                last_draw: None,
            }),
        }
    }

    fn header() -> String {
        format!(
            "{:>5} {:>7} {:>8} | {:>20} | {:>20} | {:>20} | {:>8} {:>6}\n{:>5} {:>7} {:>8} | {:>20} | {:>20} | {:>20} | {:>8} {:>6}",
            "", "", "", "TTFT ms", "TPOT ms", "E2E ms", "goodput", "",
            "users", "req/s", "tok/s", "p50   p95   p99", "p50   p95   p99", "p50   p95   p99",
            "req/s", "met"
        )
    }

    fn row(level: &LevelReport) -> String {
        let p = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
        let three =
            |q: &report::Percentiles| format!("{:>6} {:>6} {:>6}", p(q.p50), p(q.p95), p(q.p99));
        format!(
            "{:>5} {:>7.1} {:>8.0} | {:>20} | {:>20} | {:>20} | {:>8.2} {:>5.0}%{}",
            level.concurrency,
            level.requests_per_s,
            level.output_tokens_per_s,
            three(&level.ttft),
            three(&level.tpot),
            three(&level.e2e),
            level.goodput,
            level.attainment * 100.0,
            if level.errors > 0 {
                format!("  ({} errors)", level.errors)
            } else {
                String::new()
            }
        )
    }
}

impl Progress for Table {
    fn level_started(&self, label: &str, total: u32) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.label = label.to_string();
        state.total = total;
        state.done = 0;
        state.errors = 0;
        state.ttft_ms.clear();
        state.last_draw = None;
    }

    fn request_done(&self, record: &Record) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.done += 1;
        match (record.error.is_some(), record.ttft) {
            (true, _) => state.errors += 1,
            (false, Some(ttft)) => state.ttft_ms.push(ttft.as_secs_f64() * 1000.0),
            (false, None) => {}
        }
        if !self.terminal {
            return;
        }
        // Redrawn a few times a second, not per request: the demo must not load the machine
        // it is measuring.
        let now = Instant::now();
        if state
            .last_draw
            .is_some_and(|t| now.duration_since(t) < Duration::from_millis(200))
        {
            return;
        }
        state.last_draw = Some(now);
        let mut sorted = state.ttft_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let p = |q: f64| report::percentile(&sorted, q).map_or(0.0, |v| v);
        print!(
            "\r\x1b[2K  {} running: {} requests done, TTFT p50 {:.0} ms, p99 {:.0} ms{}",
            state.label,
            state.done,
            p(50.0),
            p(99.0),
            if state.errors > 0 {
                format!(", {} errors", state.errors)
            } else {
                String::new()
            }
        );
        let _ = std::io::stdout().flush();
    }

    fn level_finished(&self, level: &LevelReport) {
        if self.terminal {
            print!("\r\x1b[2K");
        }
        println!("{}", Table::row(level));
        let _ = std::io::stdout().flush();
    }
}

fn proxy_metrics(proxy: &crate::Running) -> String {
    proxy.metrics_text()
}

/// The sum of one family's samples in a text exposition, optionally of one route only.
fn sum_family(exposition: &str, family: &str, route: Option<&str>) -> f64 {
    let route = route.map(|r| format!("route=\"{r}\""));
    exposition
        .lines()
        .filter(|line| line.starts_with(family))
        .filter(|line| route.as_ref().is_none_or(|r| line.contains(r.as_str())))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits (at most two seconds) until `path` holds `rows` lines.
async fn wait_for_rows(path: &Path, rows: usize) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let lines = std::fs::read(path).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
        if lines >= rows {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn bench_args(url: &str, levels: &[u32], per_level: Duration) -> BenchArgs {
    let mut args = BenchArgs::new(url).expect("the proxy's own address is a valid URL");
    args.concurrency = levels.to_vec();
    // The level's time share ends it, not a request count.
    args.requests = 100_000;
    args.level_duration = Some(per_level);
    args.timeout = Duration::from_secs(30);
    args.slo_ttft = Some(SLO_TTFT);
    args.slo_tpot = Some(SLO_TPOT);
    args.slo_e2e = Some(SLO_E2E);
    args
}

async fn demo(args: DemoArgs) -> Result<(), String> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("tokenmeter-demo"));
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let records = out.join("proxy-records.csv");
    let bench_csv = out.join("bench.csv");
    // The proxy's configuration beside its records, so `report --config` can show the SLO.
    let config_file = out.join("tokenmeter.yaml");
    std::fs::write(&config_file, DEMO_CONFIG)
        .map_err(|e| format!("cannot write {}: {e}", config_file.display()))?;
    // Each run starts its files afresh, so the CSVs hold this run only.
    for file in [&records, &bench_csv] {
        if let Err(e) = std::fs::remove_file(file) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(format!("cannot replace {}: {e}", file.display()));
            }
        }
    }

    let sim = crate::tools::sim::start(SimConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        max_batch: args.max_batch,
        ..SimConfig::default()
    })
    .await
    .map_err(|e| format!("cannot start the simulator: {e}"))?;

    let mut config =
        Config::parse(DEMO_CONFIG, "the demo's configuration").map_err(|e| e.to_string())?;
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.admin = args.admin;
    config.upstream = Upstream::parse(&format!("http://{}", sim.addr))?;
    config.access_log = Some(AccessLog {
        path: LogPath::File(records.clone()),
        format: LogFormat::Csv,
    });
    config.reload.watch_interval = Duration::ZERO;
    let proxy = match crate::start(config.clone(), None, Overrides::default()).await {
        Ok(proxy) => proxy,
        // The documented admin port may be taken (another tokenmeter); any free one will do.
        Err(_) if args.admin.port() != 0 => {
            config.admin.set_port(0);
            crate::start(config, None, Overrides::default())
                .await
                .map_err(|e| e.to_string())?
        }
        Err(e) => return Err(e.to_string()),
    };

    let levels = &args.levels;
    let per_level = args.duration / levels.len().max(1) as u32;
    println!(
        "tokenmeter demo: a simulated inference server (continuous batching, at most {} running at once),\n\
         tokenmeter in front of it, and a load sweep of {} concurrent users through tokenmeter, ~{:.0}s each.\n",
        args.max_batch,
        levels.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        per_level.as_secs_f64(),
    );
    println!(
        "  live view   http://{}/   (open it now: it refreshes every second)",
        proxy.admin
    );
    println!("  metrics     http://{}/metrics", proxy.admin);
    println!(
        "  the proxy   http://{}/v1/chat/completions   (try it with curl or any OpenAI client)\n",
        proxy.listen
    );
    println!(
        "SLO of route \"chat\": TTFT <= {} ms, TPOT <= {} ms, E2E <= {} s; goodput = requests/s meeting all three.\n",
        SLO_TTFT.as_millis(),
        SLO_TPOT.as_millis(),
        SLO_E2E.as_secs()
    );
    println!("{}", Table::header());

    let url = format!("http://{}/v1/chat/completions", proxy.listen);
    let bench = bench_args(&url, levels, per_level);
    let table = Table::new();
    let sweep = crate::tools::bench::run_with(&bench, &table).await;
    report::write_sweep_csv(&bench_csv, &sweep)
        .map_err(|e| format!("cannot write {}: {e}", bench_csv.display()))?;
    let plot = out.join("latency-throughput.svg");
    crate::tools::bench::plot::write_svg(&plot, &sweep)
        .map_err(|e| format!("cannot write {}: {e}", plot.display()))?;

    let mut summary = String::new();
    let _ = writeln!(summary);
    match report::saturation(&sweep.levels) {
        Some(knee) => {
            let _ = writeln!(
                summary,
                "Saturation: past {knee} concurrent users, output tokens/s stops growing while p99 TTFT keeps rising:\n\
                 the extra users only queue. The simulator runs {} at once; that is the knee.",
                args.max_batch
            );
        }
        None => {
            let _ = writeln!(
                summary,
                "Saturation: throughput kept growing across these levels; the knee lies beyond {} users.",
                levels.last().copied().unwrap_or(0)
            );
        }
    }
    let sent: usize = sweep.levels.iter().map(|l| l.records.len()).sum();
    let proxy_finished = sum_family(&proxy_metrics(&proxy), "tokenmeter_requests_total{", None);
    // Records reach the file through the proxy's writer thread; give it a moment to catch up
    // so the CSV the summary points at is complete.
    wait_for_rows(&records, proxy_finished as usize + 1).await;
    let good: usize = sweep.levels.iter().map(|l| l.good).sum();
    let exposition = proxy_metrics(&proxy);
    let proxy_good = sum_family(
        &exposition,
        "tokenmeter_slo_good_requests_total{",
        Some("chat"),
    );
    let proxy_eligible = sum_family(
        &exposition,
        "tokenmeter_slo_eligible_requests_total{",
        Some("chat"),
    );
    let _ = writeln!(
        summary,
        "\nThe client saw {good} of {sent} requests meet the SLO; tokenmeter, measuring at the proxy, judged \
         {proxy_good:.0} of {proxy_eligible:.0} good\n(it stamps each chunk as it hands it on, so its TTFT is the \
         client's minus the network hop)."
    );
    let _ = writeln!(summary, "\nFiles:");
    let _ = writeln!(
        summary,
        "  {}   one row per request, as bench measured it",
        bench_csv.display()
    );
    let _ = writeln!(
        summary,
        "  {}   one record per request, as tokenmeter measured it",
        records.display()
    );
    let _ = writeln!(
        summary,
        "  {}   TTFT p50/p99 and output tokens/s against users",
        plot.display()
    );
    let _ = writeln!(
        summary,
        "  {}   the proxy's configuration (the chat route and its SLO)",
        config_file.display()
    );
    let _ = writeln!(
        summary,
        "\nNext: the proxy's records as one page (the bend, the slowest requests and why):\n  {}\n\
         then `tokenmeter bench --help` to drive your own server, `config/tokenmeter.yaml` for routes and SLOs.",
        report_command(&records, &config_file, &out.join("report.html"))
    );
    print!("{summary}");

    if args.serve {
        println!(
            "\nStill serving (live view http://{}/); Ctrl-C to stop.",
            proxy.admin
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    proxy.shutdown();
    proxy.wait().await;
    sim.shutdown();
    Ok(())
}

/// The command that turns the demo's records into the HTML report, ready to paste.
fn report_command(records: &Path, config: &Path, html: &Path) -> String {
    format!(
        "tokenmeter report {} --config {} --html {}",
        shell_word(records),
        shell_word(config),
        shell_word(html)
    )
}

/// A path as one shell word: as it is when it holds nothing a shell would split or expand.
fn shell_word(path: &Path) -> String {
    let text = path.display().to_string();
    let plain = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%,=".contains(&b));
    if plain && !text.is_empty() {
        text
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// The `tokenmeter demo` command.
pub fn main(args: DemoArgs) -> ExitCode {
    if args.levels.is_empty() {
        return crate::tools::cli::fail(&"--levels needs at least one level");
    }
    crate::tools::cli::block_on(async move {
        match demo(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => crate::tools::cli::fail(&e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_config_parses_and_matches_the_bench_slo() {
        let config = Config::parse(DEMO_CONFIG, "demo").expect("valid");
        let chat = config
            .routes
            .iter()
            .find(|r| r.name == "chat")
            .expect("a chat route");
        let slo = chat.slo.as_ref().expect("an SLO");
        assert_eq!(slo.ttft, Some(SLO_TTFT));
        assert_eq!(slo.tpot, Some(SLO_TPOT));
        assert_eq!(slo.e2e, Some(SLO_E2E));
    }

    #[test]
    fn paths_in_the_next_command_are_single_shell_words() {
        assert_eq!(
            shell_word(Path::new("/tmp/tokenmeter-demo/a.csv")),
            "/tmp/tokenmeter-demo/a.csv"
        );
        assert_eq!(
            shell_word(Path::new("/tmp/my demo/a.csv")),
            "'/tmp/my demo/a.csv'"
        );
        assert_eq!(shell_word(Path::new("/tmp/it's")), "'/tmp/it'\\''s'");
    }

    #[test]
    fn sum_family_adds_one_family_of_one_route() {
        let text = "\
tokenmeter_slo_good_requests_total{model=\"a\",route=\"chat\"} 3
tokenmeter_slo_good_requests_total{model=\"b\",route=\"chat\"} 2
tokenmeter_slo_good_requests_total{model=\"a\",route=\"other\"} 100
tokenmeter_slo_eligible_requests_total{model=\"a\",route=\"chat\"} 7
";
        let good = "tokenmeter_slo_good_requests_total{";
        assert_eq!(sum_family(text, good, Some("chat")), 5.0);
        assert_eq!(sum_family(text, good, None), 105.0);
        assert_eq!(
            sum_family(
                text,
                "tokenmeter_slo_eligible_requests_total{",
                Some("chat")
            ),
            7.0
        );
    }
}
