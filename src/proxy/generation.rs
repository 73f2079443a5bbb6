//! Configuration generations: the one in force, and how the next one replaces it.
//!
//! Each request takes the generation in force when it starts ([`Generations::current`]) and
//! keeps it to the end, so a reload never changes the route or SLO of a request in flight. A
//! reload (SIGHUP, or the file's content changing, which also covers Kubernetes' ConfigMap
//! symlink swap) parses and checks the new file first; a valid one is swapped in atomically, an
//! invalid one is refused with one log line and the old one keeps serving. What cannot change
//! without a restart (the listen and admin addresses) is kept, and the log says so.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use super::forward::{Forwarder, RetryCounters};
use crate::config::{Config, ConfigError, EngineMetrics, OtelSettings, Timeouts, Upstream};
use crate::measure::Meter;
use crate::policy::route::Router;
use crate::publish::metrics::Metrics;
use crate::publish::otel::{self, OtelSink};
use crate::publish::record::{self, RecordSink};

/// How long a changed configuration file must stay the same before the watcher acts on it.
const SETTLE: Duration = Duration::from_millis(50);
/// Record writers kept open after a reload moved the record elsewhere, for the requests of
/// older generations still finishing; past this many, the oldest is closed (a record it would
/// still have had is dropped and counted).
const RETIRED_LOGS: usize = 4;

/// Settings given on the command line; they win over the file at every reload.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub upstream: Option<Upstream>,
    /// Threads that serve clients, each with its own event loop (`--workers`); read once, at
    /// start. `None` or 1: the runtime that calls `start` serves them all.
    pub shards: Option<usize>,
}

impl Overrides {
    pub fn apply(&self, config: &mut Config) {
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        if let Some(admin) = self.admin {
            config.admin = admin;
        }
        if let Some(upstream) = &self.upstream {
            config.upstream = upstream.clone();
        }
    }
}

/// One configuration generation: what a request that starts under it is measured with and
/// where it is sent. A request keeps its generation to its end.
pub(crate) struct Generation {
    pub(crate) meter: Arc<Meter>,
    /// The upstream client; a reload that keeps the upstream keeps its connection pool.
    pub(crate) forwarder: Arc<Forwarder>,
    pub(crate) timeouts: Timeouts,
    /// Where the engine's own metrics are sampled, if anywhere.
    pub(crate) engine_metrics: Option<EngineMetrics>,
}

/// What a reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// A new generation is in force.
    Swapped,
    /// The file says what the running configuration already says.
    Unchanged,
}

/// The generation in force and what is needed to build the next.
pub(crate) struct Generations {
    current: ArcSwap<Generation>,
    /// The configuration in force, overrides applied.
    running: Mutex<Config>,
    /// The file the configuration came from; `None` runs on built-in defaults.
    source: Option<PathBuf>,
    overrides: Overrides,
    metrics: Arc<Metrics>,
    /// The file's text (or read error) last seen, so the watcher acts only on a change.
    last_seen: Mutex<Option<Result<String, String>>>,
    /// Record writers a reload replaced: requests of the generations before it still write to
    /// them, and at exit they are written to their end like the current one.
    retired_logs: Mutex<Vec<RecordSink>>,
}

impl Generations {
    /// The first generation, from a configuration already loaded and checked.
    pub(crate) fn new(
        config: Config,
        source: Option<PathBuf>,
        overrides: Overrides,
        otel: Option<OtelSettings>,
    ) -> std::io::Result<Generations> {
        let metrics = Arc::new(Metrics::new(&config));
        let otel = match otel {
            Some(settings) => Some(
                otel::start(
                    settings,
                    &config.upstream,
                    &config.identity,
                    metrics.registry(),
                )
                .map_err(|e| {
                    std::io::Error::new(e.kind(), format!("invalid OpenTelemetry settings: {e}"))
                })?,
            ),
            None => None,
        };
        let generation = build(&config, None, None, &metrics, otel).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot open the access log: {e}"))
        })?;
        let last_seen = source.as_ref().map(|path| crate::config::read_file(path));
        Ok(Generations {
            current: ArcSwap::from_pointee(generation),
            running: Mutex::new(config),
            source,
            overrides,
            metrics,
            last_seen: Mutex::new(last_seen),
            retired_logs: Mutex::new(Vec::new()),
        })
    }

    /// At exit, once every response has ended: writes the record's writers to their end (the
    /// current one and those a reload replaced), all within one [`record::CLOSE_WITHIN`].
    /// Whether everything queued was written (or counted as dropped) in time.
    pub(crate) fn close_logs(&self) -> bool {
        let deadline = Instant::now() + record::CLOSE_WITHIN;
        let retired =
            std::mem::take(&mut *self.retired_logs.lock().unwrap_or_else(|p| p.into_inner()));
        let current = self.current().meter.access_log.clone();
        let mut closed = true;
        for log in retired.iter().chain(&current) {
            closed &= log.close_within(deadline.saturating_duration_since(Instant::now()));
        }
        closed
    }

    /// At exit, after the records: exports what OpenTelemetry holds, within `within`.
    /// Whether it was exported (or counted as dropped) in time; `true` when export is off.
    pub(crate) fn close_otel(&self, within: Duration) -> bool {
        let otel = self.current().meter.otel.clone();
        otel.is_none_or(|o| o.close_within(within))
    }

    /// The generation a new request takes.
    pub(crate) fn current(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The configuration in force.
    pub(crate) fn config(&self) -> Config {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Re-reads the file and swaps in what it says, if it is valid (SIGHUP).
    pub(crate) fn reload(&self) -> Result<Reloaded, ConfigError> {
        let Some(path) = &self.source else {
            return Ok(Reloaded::Unchanged);
        };
        let text = crate::config::read_file(path);
        *self.last_seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(text.clone());
        self.apply(text)
    }

    /// Reopens the per-request record's file, for logrotate (SIGHUP).
    pub(crate) fn reopen_logs(&self) {
        if let Some(log) = &self.current().meter.access_log {
            log.reopen();
            // Records finished from now on queue behind the reopen, so they reach the new file.
            tracing::info!("access log reopen queued");
        }
    }

    /// Reloads whenever the file's content changes; reading it is cheap next to the interval.
    pub(crate) async fn watch(self: Arc<Self>, interval: Duration) {
        let Some(path) = self.source.clone() else {
            return;
        };
        if interval.is_zero() {
            return;
        }
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let read = |path: PathBuf| async move {
            tokio::task::spawn_blocking(move || crate::config::read_file(&path))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        };
        loop {
            ticks.tick().await;
            let text = read(path.clone()).await;
            if self
                .last_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                == Some(&text)
            {
                continue;
            }
            // A file written in place can be read half-written (an empty file would mean "all
            // defaults"): act on a change only once two reads a moment apart agree.
            tokio::time::sleep(SETTLE).await;
            if read(path.clone()).await != text {
                continue;
            }
            {
                let mut last = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
                if last.as_ref() == Some(&text) {
                    continue;
                }
                *last = Some(text.clone());
            }
            tracing::info!(file = %path.display(), "configuration file changed");
            // Errors are logged and counted inside; the old configuration keeps serving.
            let _ = self.apply(text);
        }
    }

    fn apply(&self, text: Result<String, String>) -> Result<Reloaded, ConfigError> {
        let origin = self
            .source
            .as_ref()
            .map_or_else(|| "<defaults>".to_string(), |p| p.display().to_string());
        let result = text
            .map_err(|e| ConfigError {
                origin: origin.clone(),
                message: format!("cannot read the file: {e}"),
            })
            .and_then(|text| Config::parse(&text, &origin))
            .and_then(|config| self.swap(config, &origin));
        match &result {
            Ok(Reloaded::Swapped) => {
                self.metrics.count_reload(true);
                tracing::info!(file = %origin, "configuration reloaded");
            }
            Ok(Reloaded::Unchanged) => self.metrics.count_reload(true),
            Err(e) => {
                self.metrics.count_reload(false);
                tracing::error!("{e}; the previous configuration keeps serving");
            }
        }
        result
    }

    fn swap(&self, mut config: Config, origin: &str) -> Result<Reloaded, ConfigError> {
        self.overrides.apply(&mut config);
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for (what, old, new) in [
            ("listen", running.listen, config.listen),
            ("admin", running.admin, config.admin),
        ] {
            if old != new {
                tracing::warn!(
                    "{what}: {new} needs a restart to take effect; still serving on {old}"
                );
            }
        }
        if config.otel != running.otel {
            tracing::warn!("otel: a change needs a restart to take effect; exporting as before");
        }
        config.listen = running.listen;
        config.admin = running.admin;
        if config == *running {
            return Ok(Reloaded::Unchanged);
        }
        let previous = self.current();
        let generation = build(
            &config,
            Some(&running),
            Some(&previous),
            &self.metrics,
            previous.meter.otel.clone(),
        )
        .map_err(|e| ConfigError {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        self.metrics.reconfigure(&config);
        if let Some(old) = &previous.meter.access_log {
            let kept = generation
                .meter
                .access_log
                .as_ref()
                .is_some_and(|new| new.same_writer(old));
            if !kept {
                self.retire_log(old.clone());
            }
        }
        self.current.store(Arc::new(generation));
        *running = config;
        Ok(Reloaded::Swapped)
    }

    /// Keeps a record writer a reload replaced, for the requests still finishing on it.
    fn retire_log(&self, log: RecordSink) {
        let mut retired = self.retired_logs.lock().unwrap_or_else(|p| p.into_inner());
        retired.push(log);
        if retired.len() > RETIRED_LOGS {
            let oldest = retired.remove(0);
            // Not on the reload's thread: closing waits for the writer.
            let _ = std::thread::Builder::new()
                .name("tokenmeter-access-log-retire".into())
                .spawn(move || oldest.close());
        }
    }
}

/// Builds a generation, reusing what did not change: the upstream client (and its pool) and the
/// record's writer.
fn build(
    config: &Config,
    before: Option<&Config>,
    previous: Option<&Generation>,
    metrics: &Arc<Metrics>,
    otel: Option<OtelSink>,
) -> std::io::Result<Generation> {
    let same = |f: &dyn Fn(&Config) -> bool| before.is_some_and(f);
    let access_log = match (previous, &config.access_log) {
        (Some(p), log) if same(&|b| b.access_log == *log && b.identity == config.identity) => {
            p.meter.access_log.clone()
        }
        (_, Some(log)) => Some(record::start(
            log,
            &config.identity,
            metrics.access_log_dropped.clone(),
        )?),
        (_, None) => None,
    };
    let forwarder = match previous {
        Some(p)
            if same(&|b| {
                b.upstream == config.upstream
                    && b.timeouts == config.timeouts
                    && b.limits == config.limits
            }) =>
        {
            p.forwarder.clone()
        }
        _ => Arc::new(Forwarder::new(
            &config.upstream,
            &config.timeouts,
            &config.limits,
            RetryCounters {
                not_sent: metrics.upstream_retries("not_sent"),
                closed: metrics.upstream_retries("closed"),
            },
        )),
    };
    let mut meter = Meter::new(
        Router::new(&config.routes),
        metrics.clone(),
        access_log,
        previous.map_or_else(Default::default, |p| p.meter.live.clone()),
        config.stream.max_event_bytes,
        previous.map_or_else(Default::default, |p| p.meter.in_flight_total.clone()),
        previous.map_or_else(Default::default, |p| p.meter.engine.clone()),
    );
    meter.otel = otel;
    Ok(Generation {
        meter: Arc::new(meter),
        forwarder,
        timeouts: config.timeouts,
        engine_metrics: config.engine_metrics.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::record::Record;

    /// A reload that moves the record to another file leaves the old writer to the requests
    /// still finishing on the old generation; at exit, what they queued there is written to
    /// its end, and the writer is stopped (a record after that is dropped and counted).
    #[test]
    fn records_queued_on_a_replaced_log_are_written_at_exit() {
        let dir = std::env::temp_dir().join(format!("tm-retired-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, file) = (
            dir.join("a.jsonl"),
            dir.join("b.jsonl"),
            dir.join("tokenmeter.yaml"),
        );
        let text = |log: &std::path::Path| {
            format!(
                "upstream: http://127.0.0.1:9\naccess_log: {{path: {}}}\n",
                log.display()
            )
        };
        std::fs::write(&file, text(&a)).unwrap();
        let config = Config::parse(&text(&a), "test").unwrap();
        let generations = Generations::new(config, Some(file.clone()), Overrides::default(), None)
            .expect("the first generation");
        // A request in flight keeps the generation it started with.
        let old = generations.current();
        std::fs::write(&file, text(&b)).unwrap();
        assert!(matches!(generations.reload(), Ok(Reloaded::Swapped)));
        let old_log = old.meter.access_log.clone().expect("a record writer");
        let burst = 2_000;
        for _ in 0..burst {
            old_log.send(Record::example());
        }
        assert!(generations.close_logs(), "closed in time");
        let lines = |path: &std::path::Path| {
            std::fs::read_to_string(path)
                .map(|t| t.lines().count())
                .unwrap_or(0)
        };
        assert_eq!(lines(&a), burst, "every record queued on the old file");
        assert_eq!(lines(&b), 0);
        let dropped = &generations.metrics().access_log_dropped;
        assert_eq!(dropped.get(), 0);
        old_log.send(Record::example());
        assert_eq!(dropped.get(), 1, "the old writer was stopped at exit");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
