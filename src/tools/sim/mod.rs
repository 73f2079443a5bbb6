//! `tokenmeter sim`: an OpenAI-compatible server that behaves like an inference engine with
//! continuous batching, so that queueing and saturation show up as they do on a GPU.
//!
//! This file holds the parameters ([`SimConfig`], every one a flag with its default), the
//! listener and the command; [`engine`] is the scheduler that times prefill and decode, and
//! [`api`] speaks the OpenAI API in vLLM's exact shape. Other code (tests, a demo) starts the
//! simulator in-process with [`start`].

pub mod api;
pub mod engine;

use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, Parser};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::parse_duration;
use api::{Rng, State};
use engine::Timing;

/// The simulator's parameters. The defaults are the documented ones in `--help`; `Default`
/// reads them from the same attributes, so there is one place they are written.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Where clients connect.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// At most this many requests run at once; the rest queue (up to 4096, then 429).
    #[arg(long, value_name = "N", default_value = "8", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_batch: u32,
    /// Prefill time per prompt token (prompt tokens are estimated as bytes / 4).
    #[arg(long, value_name = "DURATION", default_value = "50us", value_parser = parse_duration)]
    pub prefill_per_token: Duration,
    /// Fixed prefill time of each request, added to the step that admits it.
    #[arg(long, value_name = "DURATION", default_value = "5ms", value_parser = parse_duration)]
    pub prefill_base: Duration,
    /// Fixed time of one decode step (one token for every running request).
    #[arg(long, value_name = "DURATION", default_value = "10ms", value_parser = parse_duration)]
    pub decode_step: Duration,
    /// Extra decode step time for each running request, so TPOT grows with the batch.
    #[arg(long, value_name = "DURATION", default_value = "2ms", value_parser = parse_duration)]
    pub decode_step_per_request: Duration,
    /// Tokens generated when the request sets no max_tokens (finish_reason "stop").
    #[arg(long, value_name = "N", default_value = "64", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub default_max_tokens: u32,
    /// The model name served and reported.
    #[arg(long, value_name = "NAME", default_value = "sim-llama")]
    pub model: String,
    /// Share of requests answered at once with --fail-status.
    #[arg(long, value_name = "RATE", default_value = "0.0", value_parser = parse_rate)]
    pub fail_rate: f64,
    /// The status of those failures (500 or 429, say).
    #[arg(long, value_name = "STATUS", default_value = "500", value_parser = clap::value_parser!(u16).range(400..=599))]
    pub fail_status: u16,
    /// Share of requests that end with an error event after half of their tokens.
    #[arg(long, value_name = "RATE", default_value = "0.0", value_parser = parse_rate)]
    pub midstream_fail_rate: f64,
    /// Share of requests that pause for --stall once, after half of their tokens.
    #[arg(long, value_name = "RATE", default_value = "0.0", value_parser = parse_rate)]
    pub stall_rate: f64,
    /// How long a stalled request pauses; its slot stays occupied.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub stall: Duration,
    /// Share of requests whose connection is closed after half of their tokens.
    #[arg(long, value_name = "RATE", default_value = "0.0", value_parser = parse_rate)]
    pub drop_rate: f64,
    /// Seed of the fault draws, so a run reproduces.
    #[arg(long, value_name = "N", default_value = "1")]
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        #[derive(Parser)]
        struct Defaults {
            #[command(flatten)]
            config: SimConfig,
        }
        // The defaults are constants of this file; `defaults_parse` below proves they parse.
        Defaults::try_parse_from(["sim"])
            .map(|d| d.config)
            .expect("the documented defaults parse")
    }
}

impl SimConfig {
    /// The engine's part of the parameters.
    pub fn timing(&self) -> Timing {
        Timing {
            max_batch: self.max_batch as usize,
            prefill_base: self.prefill_base,
            prefill_per_token: self.prefill_per_token,
            decode_step: self.decode_step,
            decode_step_per_request: self.decode_step_per_request,
            stall: self.stall,
        }
    }
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!(
            "`{text}` is not a rate: write a number from 0 to 1"
        )),
    }
}

/// A started simulator; dropping it (or [`RunningSim::shutdown`]) stops it and cuts its
/// connections.
pub struct RunningSim {
    pub addr: SocketAddr,
    accept: JoinHandle<()>,
    engine: JoinHandle<()>,
    state: Arc<State>,
}

impl RunningSim {
    /// From now on, every generation request waits `delay` before it is queued, so its TTFT
    /// and E2E grow by `delay`: a running server turned slow (zero turns it back). For tests
    /// and demos of SLO alerts; there is no flag for it.
    pub fn set_extra_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.state.extra_delay_us.store(micros, Ordering::Relaxed);
    }

    /// From now on, this share of requests (0 to 1, clamped) is answered with the configured
    /// error status: a running server that starts failing. For tests of fleet alerts; there is
    /// no flag for changing it while running.
    pub fn set_fail_rate(&self, rate: f64) {
        let rate = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(0.0, 1.0)
        };
        self.state
            .fail_rate_bits
            .store(rate.to_bits(), Ordering::Relaxed);
    }

    pub fn shutdown(&self) {
        self.accept.abort();
        self.engine.abort();
    }
}

impl Drop for RunningSim {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Binds `config.listen` and starts serving.
pub async fn start(config: SimConfig) -> io::Result<RunningSim> {
    let listener = TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let (jobs, engine) = engine::spawn(config.timing());
    let state = Arc::new(State {
        rng: Mutex::new(Rng::new(config.seed)),
        jobs,
        next_id: AtomicU64::new(0),
        extra_delay_us: AtomicU64::new(0),
        fail_rate_bits: AtomicU64::new(config.fail_rate.to_bits()),
        config,
    });
    let accept = tokio::spawn(accept_loop(listener, state.clone()));
    Ok(RunningSim {
        addr,
        accept,
        engine,
        state,
    })
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());
    // Kept here so aborting this task (shutdown) cuts every connection; finished ones are reaped.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            stream = crate::accept(&listener) => {
                let state = state.clone();
                let service = service_fn(move |request| api::handle(request, state.clone()));
                let connection = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned();
                connections.spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "sim connection ended with an error");
                    }
                });
            }
        }
    }
}

/// The `tokenmeter sim` command: serve until SIGINT or SIGTERM.
pub fn main(config: SimConfig) -> ExitCode {
    crate::tools::cli::init_logging();
    crate::tools::cli::block_on(async {
        let listen = config.listen;
        let model = config.model.clone();
        let running = match start(config).await {
            Ok(running) => running,
            Err(e) => return crate::tools::cli::fail(&format!("cannot listen on {listen}: {e}")),
        };
        tracing::info!(listen = %running.addr, %model, "tokenmeter sim is serving");
        if let Err(e) = stop_signal().await {
            return crate::tools::cli::fail(&format!("cannot listen for signals: {e}"));
        }
        tracing::info!("shutdown signal received");
        running.shutdown();
        ExitCode::SUCCESS
    })
}

async fn stop_signal() -> io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => Ok(()),
            r = tokio::signal::ctrl_c() => r,
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse() {
        let config = SimConfig::default();
        assert_eq!(config.max_batch, 8);
        assert_eq!(config.prefill_per_token, Duration::from_micros(50));
        assert_eq!(config.stall, Duration::from_secs(2));
        assert_eq!(config.model, "sim-llama");
        assert_eq!(config.fail_rate, 0.0);
    }

    #[test]
    fn rates_outside_zero_to_one_are_refused() {
        assert!(parse_rate("1.5").is_err());
        assert!(parse_rate("-0.1").is_err());
        assert_eq!(parse_rate("0.25"), Ok(0.25));
    }
}
