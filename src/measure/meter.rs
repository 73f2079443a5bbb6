//! What every request of one configuration generation is measured with: its routes, its limits
//! and the sinks it publishes to (metrics, the live view, the per-request record).

use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use prometheus::IntGauge;

use super::engine_state::EngineCell;
use crate::config::Config;
use crate::policy::route::{RouteInfo, Router};
use crate::publish::live::LiveStats;
use crate::publish::metrics::{InFlight, Metrics};
use crate::publish::otel::OtelSink;
use crate::publish::record::RecordSink;

/// The routes a request is judged by and where it is published; one per configuration
/// generation, shared by every request that started under it.
pub struct Meter {
    pub(crate) router: Router,
    /// Each route's in-flight gauge, resolved once (a labelled lookup is a hash and a lock).
    in_flight: Vec<(Arc<RouteInfo>, IntGauge)>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) access_log: Option<RecordSink>,
    /// OpenTelemetry export, when switched on: one per process, carried across reloads.
    pub(crate) otel: Option<OtelSink>,
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
    /// A meter for `router`, publishing to these sinks.
    pub(crate) fn new(
        router: Router,
        metrics: Arc<Metrics>,
        access_log: Option<RecordSink>,
        live: Arc<LiveStats>,
        max_event_bytes: usize,
        in_flight_total: Arc<AtomicI64>,
        engine: Arc<EngineCell>,
    ) -> Meter {
        let in_flight = router
            .routes()
            .map(|route| (route.clone(), metrics.in_flight_gauge(&route.name)))
            .collect();
        Meter {
            router,
            in_flight,
            metrics,
            access_log,
            otel: None,
            live,
            max_event_bytes,
            in_flight_total,
            engine,
        }
    }

    /// Counts a request in flight on `route` until the guard is dropped.
    pub(crate) fn in_flight(&self, route: &Arc<RouteInfo>) -> InFlight {
        let gauge = self
            .in_flight
            .iter()
            .find(|(r, _)| Arc::ptr_eq(r, route))
            .map(|(_, gauge)| gauge.clone());
        InFlight::new(gauge.unwrap_or_else(|| self.metrics.in_flight_gauge(&route.name)))
    }

    /// A meter of its own, outside any proxy: the default routes, a registry of its own and no
    /// per-request record. For tests and benchmarks that drive a [`Recorder`](super::Recorder)
    /// directly.
    pub fn detached(max_event_bytes: usize) -> Meter {
        let config = Config::default();
        Meter::new(
            Router::new(&config.routes),
            Arc::new(Metrics::new(&config)),
            None,
            Default::default(),
            max_event_bytes,
            Default::default(),
            Default::default(),
        )
    }
}
