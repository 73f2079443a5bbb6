//! The `tokenmeter` command: run the proxy, or one of its tools (`check`, `sim`, `bench`, ...).
//!
//! Every failure the user can fix (a bad config, a port in use) ends in one line on stderr
//! and a non-zero exit, never a panic or a backtrace.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use tokenmeter::tools::cli::fail;
use tokenmeter::{Config, ConfigError, Overrides, Running, Upstream};

/// jemalloc, with its background thread, rather than glibc's malloc: after bursts of connections
/// close, glibc keeps what they freed, more after each burst; jemalloc gives it back within its
/// decay, the same after each burst, at the same CPU per request. The figures:
/// `docs/performance.md`, "Soak and memory", and `docs/performance-history.md`.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "tokenmeter",
    version,
    about = "A sidecar reverse proxy that measures TTFT, TPOT, ITL, E2E and goodput of an LLM server",
    args_conflicts_with_subcommands = true,
    after_help = RUN_EXAMPLES
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

// Each subcommand's --help ends with examples a user can paste (tests/cli.rs checks they are
// there); they live here, beside the commands, so the argument structs stay their tools' own.
const RUN_EXAMPLES: &str = "\
Examples:
  # In front of a model server on :8000: clients on :8080, /metrics and the live view on :9464
  tokenmeter --upstream http://127.0.0.1:8000
  # With a configuration file (routes, SLOs, the per-request record), one worker thread
  tokenmeter --config tokenmeter.yaml --workers 1
  # The whole product in one process, no model server needed
  tokenmeter demo";

const CHECK_EXAMPLES: &str = "\
Examples:
  tokenmeter check tokenmeter.yaml
  tokenmeter check --config /etc/tokenmeter/tokenmeter.yaml && kubectl apply -f configmap.yaml

Prints the routes in match order with their SLOs; warns (stderr, exit 0) about a route an
earlier one makes unreachable and a route with thresholds but no objective.";

const SIM_EXAMPLES: &str = "\
Examples:
  # An engine running at most 8 requests at once, on :8000
  tokenmeter sim --listen 127.0.0.1:8000 --max-batch 8
  # One request in 20 fails with 503, one in 50 stalls for 2 s mid-stream
  tokenmeter sim --fail-rate 0.05 --fail-status 503 --stall-rate 0.02 --stall 2s";

const BENCH_EXAMPLES: &str = "\
Examples:
  # Closed loop: 1, 4 and 8 users, 24 requests each, goodput against a 300 ms TTFT
  tokenmeter bench --url http://127.0.0.1:8080 --concurrency 1,4,8 --requests 24 --slo-ttft 300ms
  # Open loop at 2, 4 and 8 requests/s, every request to a CSV, the curve to an SVG
  tokenmeter bench --url http://127.0.0.1:8080 --rate 2,4,8 --csv bench.csv --plot bench.svg
  # What the proxy adds: the same requests to the server (A) and through tokenmeter (B)
  tokenmeter bench --url http://127.0.0.1:8000 --compare http://127.0.0.1:8080 --concurrency 1,8";

const RULES_EXAMPLES: &str = "\
Examples:
  # A PrometheusRule for the Prometheus Operator
  tokenmeter rules --config tokenmeter.yaml > prometheusrule.yaml
  # Plain rule groups for prometheus.yml's rule_files, for one namespace's sidecars
  tokenmeter rules --config tokenmeter.yaml --format prometheus --selector 'namespace=\"chat\"' > rules.yaml";

const DEMO_EXAMPLES: &str = "\
Examples:
  tokenmeter demo
  # Shorter levels, files kept in ./demo, the live view kept up after the sweep
  tokenmeter demo --duration 10s --out demo --serve";

const INJECT_EXAMPLES: &str = "\
Examples:
  kubectl get deployment,service -l app=vllm -o yaml | tokenmeter inject | kubectl apply -f -
  # The two-container form, for clusters before Kubernetes 1.29
  tokenmeter inject --classic < deployment.yaml > deployment-with-tokenmeter.yaml";

const REPORT_EXAMPLES: &str = "\
Examples:
  # Tables on the terminal, from every pod's records merged
  tokenmeter report /var/log/tokenmeter/pod-*.jsonl
  # With the SLOs beside the figures, the 20 slowest requests explained
  tokenmeter report records.jsonl --config tokenmeter.yaml --slowest 20
  # One self-contained HTML page, or JSON for a script
  tokenmeter report records.jsonl --html report.html
  tokenmeter report records.jsonl --format json > report.json";

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file and exit 0 (valid) or 2 (invalid).
    #[command(after_help = CHECK_EXAMPLES)]
    Check(tokenmeter::tools::check::CheckArgs),
    /// Run a simulated OpenAI-compatible inference server (continuous batching, faults).
    #[command(after_help = SIM_EXAMPLES)]
    Sim(tokenmeter::tools::sim::SimConfig),
    /// Sweep concurrency levels or request rates against a chat endpoint and report latency,
    /// throughput, goodput and cost; --compare measures what a second endpoint adds.
    // Boxed: its many flags would otherwise make every variant of this enum as large.
    #[command(after_help = BENCH_EXAMPLES)]
    Bench(Box<tokenmeter::tools::bench::BenchArgs>),
    /// Print Prometheus recording and alerting rules for the configuration's SLOs.
    #[command(after_help = RULES_EXAMPLES)]
    Rules(tokenmeter::tools::rules::RulesArgs),
    /// The tour: the sim, tokenmeter in front of it and a load sweep, in one process.
    #[command(after_help = DEMO_EXAMPLES)]
    Demo(tokenmeter::tools::demo::DemoArgs),
    /// Add the tokenmeter sidecar to Kubernetes YAML on stdin (Deployments, StatefulSets and
    /// the Services selecting them) and write it to stdout.
    #[command(after_help = INJECT_EXAMPLES)]
    Inject(tokenmeter::tools::inject::InjectArgs),
    /// Why was it slow? Per route and model: percentiles, goodput, the bend against concurrency
    /// and the slowest requests with their likely causes, from per-request record files.
    #[command(after_help = REPORT_EXAMPLES)]
    Report(tokenmeter::tools::report::ReportArgs),
}

/// Running the proxy (the default command).
#[derive(Args)]
struct RunArgs {
    /// The YAML configuration; without it the embedded defaults are used.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where clients connect [default: 0.0.0.0:8080].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// The model server [default: http://127.0.0.1:8000].
    #[arg(long, value_name = "URL", value_parser = parse_upstream)]
    upstream: Option<Upstream>,
    /// Where /metrics, /healthz and /readyz are served [default: 0.0.0.0:9464].
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// Threads serving clients, each with its own event loop, like nginx's workers (also
    /// TOKENMETER_WORKERS) [default: one per available CPU, as the cgroup's CPU limit allows].
    /// The first serves every connection until 512 are open; then the next one joins in.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    workers: Option<u16>,
}

fn parse_upstream(text: &str) -> Result<Upstream, String> {
    Upstream::parse(text)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Check(args)) => tokenmeter::tools::check::main(args),
        Some(Command::Sim(config)) => tokenmeter::tools::sim::main(config),
        Some(Command::Bench(args)) => tokenmeter::tools::bench::main(*args),
        Some(Command::Rules(args)) => tokenmeter::tools::rules::main(args),
        Some(Command::Demo(args)) => tokenmeter::tools::demo::main(args),
        Some(Command::Inject(args)) => tokenmeter::tools::inject::main(args),
        Some(Command::Report(args)) => tokenmeter::tools::report::main(args),
        None => run(cli.run),
    }
}

fn overrides(args: &RunArgs) -> Overrides {
    Overrides {
        listen: args.listen,
        admin: args.admin,
        upstream: args.upstream.clone(),
        shards: Some(workers(args)),
    }
}

/// `--workers`, else TOKENMETER_WORKERS, else one per CPU this process may use.
fn workers(args: &RunArgs) -> usize {
    args.workers
        .map(usize::from)
        .or_else(|| {
            std::env::var("TOKENMETER_WORKERS")
                .ok()
                .and_then(|w| w.parse().ok())
        })
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
}

fn load(args: &RunArgs) -> Result<Config, ConfigError> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    overrides(args).apply(&mut config);
    if config.listen == config.admin && config.listen.port() != 0 {
        return Err(ConfigError {
            origin: "the command line".into(),
            message: format!("--admin {} is also the listen address", config.admin),
        });
    }
    Ok(config)
}

fn run(args: RunArgs) -> ExitCode {
    tokenmeter::tools::cli::init_logging();
    let config = match load(&args) {
        Ok(config) => config,
        Err(e) => return fail(&e),
    };
    // The first shard, the admin port and the housekeeping run on this thread; the other
    // shards get threads of their own (`Overrides::shards`).
    tokenmeter::tools::cli::block_on_workers(
        async {
            let running =
                match tokenmeter::start(config, args.config.clone(), overrides(&args)).await {
                    Ok(running) => running,
                    Err(e) => return fail(&e),
                };
            if let Err(e) = serve_signals(&running).await {
                return fail(&format!("cannot listen for signals: {e}"));
            }
            tracing::info!("shutdown signal received");
            running.shutdown();
            running.wait().await;
            ExitCode::SUCCESS
        },
        Some(1),
    )
}

/// Reloads on SIGHUP; returns on SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C).
async fn serve_signals(running: &Running) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
                _ = hup.recv() => {
                    tracing::info!("SIGHUP: reloading the configuration and reopening the access log");
                    running.reload();
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = running;
        tokio::signal::ctrl_c().await
    }
}
