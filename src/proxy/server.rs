//! Where connections are accepted: the client listener, its drain, and the admin listener.
//!
//! The client listener serves HTTP/1.1 and h2c on one port (TCP_NODELAY on every connection).
//! On shutdown `/readyz` turns 503 at once, the listener closes, open connections are asked to
//! finish their in-flight responses, and whatever is still streaming at the drain deadline is
//! cut: an open SSE stream would otherwise hold shutdown forever.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::admin;
use super::connection;
use super::engine_metrics;
use super::generation::{Generations, Overrides, Reloaded};
use super::http1::pool::IDLE_SWEEP;
use super::listener::{self, Health};
use super::service::Proxy;
use super::shard;
use crate::config::{Config, ConfigError};

/// A started proxy: its bound addresses and the handle that drains it.
pub struct Running {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub(crate) generations: Arc<Generations>,
    pub(crate) health: Arc<Health>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
    watch_task: JoinHandle<()>,
    sampler_task: JoinHandle<()>,
    sweep_task: JoinHandle<()>,
}

impl Running {
    /// Starts draining: not ready, no new connections, in-flight responses may finish.
    pub fn shutdown(&self) {
        self.health.set_draining();
        let _ = self.shutdown.send(true);
    }

    /// Waits until the drain is over (every response ended, or the deadline passed).
    pub async fn wait(self) {
        let _ = self.task.await;
        self.admin_task.abort();
        self.watch_task.abort();
        self.sampler_task.abort();
        self.sweep_task.abort();
        // The responses that just ended queued their records: they reach their files before
        // exit, those of generations a reload replaced too.
        self.generations.close_logs();
        // What OpenTelemetry holds goes to the collector within the drain timeout: a collector
        // that does not answer holds the exit no longer than a stream would have.
        let drain = self.generations.config().timeouts.drain;
        self.generations.close_otel(drain);
    }

    /// Re-reads the configuration file and swaps in what it says, if valid.
    pub fn reload_config(&self) -> Result<Reloaded, ConfigError> {
        self.generations.reload()
    }

    /// The configuration in force, command-line overrides applied.
    pub fn config(&self) -> Config {
        self.generations.config()
    }

    /// What `/metrics` serves now, in Prometheus' text format.
    pub fn metrics_text(&self) -> String {
        String::from_utf8_lossy(&self.generations.metrics().render()).into_owned()
    }

    /// SIGHUP: reload the configuration file and reopen the record's file.
    pub fn reload(&self) {
        let _ = self.generations.reload();
        self.generations.reopen_logs();
    }
}

/// Why the proxy could not start.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// Binds both listeners and starts serving `config`; `source` is the file it came from (for
/// reloads), with `overrides` from the command line re-applied at every reload.
pub async fn start(
    config: Config,
    source: Option<PathBuf>,
    overrides: Overrides,
) -> Result<Running, StartError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| StartError(format!("cannot listen on {}: {e}", config.listen)))?;
    let admin_listener = TcpListener::bind(config.admin)
        .await
        .map_err(|e| StartError(format!("cannot listen on {} (admin): {e}", config.admin)))?;
    let listen = listener
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?;
    let admin = admin_listener
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?;
    let watch_interval = config.reload.watch_interval;
    let config_timeouts = config.timeouts;
    let upstream = config.upstream.clone();
    let shards = overrides.shards.unwrap_or(1).clamp(1, shard::MAX);
    // The `OTEL_*` variables are read once, here: a reload changes the file, not the
    // environment.
    let otel = crate::config::resolve_otel(config.otel.as_ref(), &|var| std::env::var(var).ok())
        .map_err(|e| StartError(format!("invalid OpenTelemetry settings: {e}")))?;
    let generations = Arc::new(
        Generations::new(config, source, overrides, otel).map_err(|e| StartError(e.to_string()))?,
    );
    let proxy = Proxy::new(generations.clone());
    let health = Arc::new(Health::ready());
    let (shutdown, shutdown_rx) = watch::channel(false);
    let cap = listener::Cap::new(listener::connection_cap(
        generations.config().limits.max_connections,
    ));
    let mut others = Vec::with_capacity(shards - 1);
    for index in 1..shards {
        let shard = Shard {
            index,
            listener: duplicate(&listener)
                .map_err(|e| StartError(format!("cannot share {listen} with a shard: {e}")))?,
            proxy: proxy.clone(),
            shutdown: shutdown_rx.clone(),
            generations: generations.clone(),
            cap: cap.clone(),
        };
        others.push(
            shard
                .spawn()
                .map_err(|e| StartError(format!("cannot start shard {index}: {e}")))?,
        );
    }
    let admin_task = tokio::spawn(admin::serve(
        admin_listener,
        generations.clone(),
        health.clone(),
        config_timeouts.request_head,
        config_timeouts.client_idle,
    ));
    let watch_task = tokio::spawn(generations.clone().watch(watch_interval));
    let sampler_task = tokio::spawn(engine_metrics::sample(generations.clone()));
    let sweep_task = tokio::spawn(sweep_idle_upstream(generations.clone()));
    let task = tokio::spawn({
        let generations = generations.clone();
        async move {
            accept_loop(0, listener, proxy, shutdown_rx, generations, cap).await;
            for done in others {
                let _ = done.await;
            }
        }
    });
    let live_view = format!("http://{admin}/");
    tracing::info!(%listen, %admin, %upstream, %live_view, "tokenmeter is serving");
    Ok(Running {
        listen,
        admin,
        generations,
        health,
        shutdown,
        task,
        admin_task,
        watch_task,
        sampler_task,
        sweep_task,
    })
}

/// Every [`IDLE_SWEEP`], closes the upstream connections that sat idle too long or that the
/// server closed (a pool replaced by a reload closes its own when its last request ends).
async fn sweep_idle_upstream(generations: Arc<Generations>) {
    let mut ticks = tokio::time::interval(IDLE_SWEEP);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        generations.current().forwarder.sweep_idle();
    }
}

/// The client listener's connection settings from a configuration.
fn client_limits(config: &Config) -> connection::Limits {
    connection::Limits {
        request_head: config.timeouts.request_head,
        client_idle: config.timeouts.client_idle,
        max_head_bytes: config.limits.max_request_head_bytes,
        max_streams: config.limits.max_concurrent_streams,
    }
}

/// Another descriptor of the client listener, for a shard to register in its own `epoll`.
fn duplicate(listener: &TcpListener) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::SockRef::from(listener).try_clone()?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// A shard other than the first: a thread with a single-threaded runtime that accepts from the
/// client listener and serves what it accepted until the drain is over.
struct Shard {
    index: usize,
    listener: std::net::TcpListener,
    proxy: Proxy,
    shutdown: watch::Receiver<bool>,
    generations: Arc<Generations>,
    cap: Arc<listener::Cap>,
}

impl Shard {
    /// Starts the shard's thread; the receiver resolves when its drain is over.
    fn spawn(self) -> std::io::Result<oneshot::Receiver<()>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (done, finished) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("tokenmeter-shard-{}", self.index))
            .spawn(move || {
                shard::enter(self.index);
                runtime.block_on(async move {
                    match TcpListener::from_std(self.listener) {
                        Ok(listener) => {
                            accept_loop(
                                self.index,
                                listener,
                                self.proxy,
                                self.shutdown,
                                self.generations,
                                self.cap,
                            )
                            .await
                        }
                        Err(e) => {
                            tracing::error!(error = %e, shard = self.index, "a shard cannot accept")
                        }
                    }
                });
                // The drain is over: what is left on this runtime (refusals being written) goes.
                drop(runtime);
                let _ = done.send(());
            })?;
        Ok(finished)
    }
}

/// Shard `index`'s accept loop and drain.
async fn accept_loop(
    index: usize,
    listener: TcpListener,
    proxy: Proxy,
    shutdown: watch::Receiver<bool>,
    generations: Arc<Generations>,
    cap: Arc<listener::Cap>,
) {
    let config = generations.config();
    let connections = listener::serve_listener(
        listener,
        cap,
        index * listener::SPILL,
        client_limits(&config),
        move |_conn| proxy.clone(),
        shutdown,
    )
    .await;
    // The drain deadline in force when shutdown begins, reloads included.
    listener::drain(connections, generations.config().timeouts.drain).await;
}
