//! What every request of one configuration generation is measured with: its routes, its limits
//! and the sinks it publishes to (metrics, the live view, the per-request record).

use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use super::engine_state::EngineCell;
use crate::config::Config;
use crate::policy::route::Router;
use crate::publish::live::LiveStats;
use crate::publish::metrics::Metrics;
use crate::publish::record::RecordSink;

/// The routes a request is judged by and where it is published; one per configuration
/// generation, shared by every request that started under it.
pub struct Meter {
    pub(crate) router: Router,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) access_log: Option<RecordSink>,
    /// The live view's windows: one per process, carried across reloads.
    pub(crate) live: Arc<LiveStats>,
    /// Events larger than this are forwarded but not parsed.
    pub(crate) max_event_bytes: usize,
    /// Requests in flight in the whole process, whatever their route: one per process, carried
    /// across reloads.
    pub(crate) in_flight_total: Arc<AtomicI64>,
    /// The engine's state from its own metrics, stamped on each request at arrival; one per
    /// process, carried across reloads.
    pub(crate) engine: Arc<EngineCell>,
}

impl Meter {
    /// A meter of its own, outside any proxy: the default routes, a registry of its own and no
    /// per-request record. For tests and benchmarks that drive a [`Recorder`](super::Recorder)
    /// directly.
    pub fn detached(max_event_bytes: usize) -> Meter {
        let config = Config::default();
        Meter {
            router: Router::new(&config.routes),
            metrics: Arc::new(Metrics::new(&config)),
            access_log: None,
            live: Default::default(),
            max_event_bytes,
            in_flight_total: Default::default(),
            engine: Default::default(),
        }
    }
}
