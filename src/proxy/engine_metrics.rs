//! Sampling the engine's own Prometheus metrics (`engine_metrics` in the config): once per
//! interval, a bounded scrape of its `/metrics`, read for running and waiting requests and
//! KV-cache usage, stored where every request reads it at arrival.
//!
//! It costs the proxy nothing when it fails: an engine without metrics, a slow or broken scrape
//! or a text naming none of the gauges tokenmeter knows is one counted result
//! (`tokenmeter_engine_metrics_scrapes_total{result}`), and requests are then stamped with
//! nothing rather than with stale values. It never runs per request.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::generation::Generations;
use crate::config::EngineMetrics;
use crate::parse::{engine_state, MAX_EXPOSITION_BYTES};

/// The longest one scrape may take, whatever the interval.
const MAX_SCRAPE_TIME: Duration = Duration::from_secs(5);
/// How many intervals a successful scrape stays valid for stamping requests.
const FRESH_INTERVALS: u32 = 3;
/// How often an absent `engine_metrics` is looked for again (a reload may add it).
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How a scrape ended: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scrape {
    Ok,
    Connect,
    Timeout,
    Status,
    TooLarge,
    UnknownFormat,
}

impl Scrape {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scrape::Ok => "ok",
            Scrape::Connect => "connect",
            Scrape::Timeout => "timeout",
            Scrape::Status => "status",
            Scrape::TooLarge => "too_large",
            Scrape::UnknownFormat => "unknown_format",
        }
    }
}

/// Samples the engine's metrics for as long as the proxy runs, following reloads.
pub(crate) async fn sample(generations: Arc<Generations>) {
    loop {
        let generation = generations.current();
        let Some(config) = generation.engine_metrics.clone() else {
            tokio::time::sleep(IDLE_CHECK).await;
            continue;
        };
        let started = Instant::now();
        let within = config.interval.min(MAX_SCRAPE_TIME);
        let result = match tokio::time::timeout(within, scrape(&config)).await {
            Err(_) => Err(Scrape::Timeout),
            Ok(result) => result,
        };
        let outcome = match result {
            Ok(text) => match engine_state(&text) {
                Ok(state) if state.engine.is_some() => {
                    generation.meter.engine.store(
                        &state,
                        Instant::now(),
                        config.interval * FRESH_INTERVALS,
                    );
                    Scrape::Ok
                }
                Ok(_) => Scrape::UnknownFormat,
                Err(_) => Scrape::TooLarge,
            },
            Err(failed) => failed,
        };
        if outcome != Scrape::Ok {
            tracing::debug!(url = %config.url, result = outcome.as_str(), "engine metrics scrape failed");
        }
        generations.metrics().count_engine_scrape(outcome.as_str());
        tokio::time::sleep_until(started + config.interval).await;
    }
}

/// One GET of the metrics page, its body at most [`MAX_EXPOSITION_BYTES`].
async fn scrape(config: &EngineMetrics) -> Result<Bytes, Scrape> {
    let stream = TcpStream::connect(config.url.authority.as_str())
        .await
        .map_err(|_| Scrape::Connect)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| Scrape::Connect)?;
    let driver = tokio::spawn(connection);
    let request = http::Request::get(config.url.path.as_str())
        .header(http::header::HOST, config.url.authority.as_str())
        .header(http::header::ACCEPT, "text/plain")
        .body(Empty::<Bytes>::new())
        .map_err(|_| Scrape::Connect)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|_| Scrape::Connect)?;
    if !response.status().is_success() {
        driver.abort();
        return Err(Scrape::Status);
    }
    let body = Limited::new(response.into_body(), MAX_EXPOSITION_BYTES)
        .collect()
        .await;
    driver.abort();
    match body {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Scrape::TooLarge),
        Err(_) => Err(Scrape::Connect),
    }
}
