//! tokenmeter: a sidecar reverse proxy that measures how an LLM service feels to its users.
//!
//! The crate is built in floors; each uses only the floors below it (`tests/architecture.rs`
//! checks it), so a request's path reads from the top of this list to the bottom and back:
//!
//! | floor | holds |
//! |---|---|
//! | `tools` | the subcommands: sim, bench, demo, rules, inject, report; users of this public API only |
//! | `proxy` | accept loop and health, the service, forwarding, the request body, admin, reload |
//! | `measure` | the recorder (one `finish`), the timed body, the model slot, the meter |
//! | `publish` | Prometheus metrics, the live view, the per-request record |
//! | `policy` | routes, SLO verdicts, the plain values of a finished request |
//! | `config` | the YAML schema, every default, validation |
//! | `parse` | SSE/NDJSON/JSON framing, the dialects, the request `model` scanner: pure code |
//!
//! What is exported here is the whole public API: running the proxy ([`start`]), its
//! configuration ([`Config`]), the stream reader ([`StreamReader`]) that `bench` shares with the
//! proxy, and the measuring body ([`Recorder`], [`TimedBody`]) for tests and benchmarks that
//! drive it without a network.

#![forbid(unsafe_code)]

mod config;
mod measure;
mod parse;
mod policy;
mod proxy;
mod publish;

pub mod tools;

pub use config::{
    parse_duration, AccessLog, Config, ConfigError, Cost, EngineMetrics, HeaderMatch, Identity,
    LogFormat, LogPath, Match, Otel, Route, Slo, Upstream,
};
pub use measure::{Meter, Recorder, TimedBody, TimedBodyError};
pub use parse::{
    detect, Dialect, FinishReason, FrameEvents, Framing, ModelScanner, Scan, StreamReader,
    StreamSummary, MAX_EVENT_TYPE_BYTES,
};
pub use proxy::{accept, start, Overrides, Reloaded, Running, StartError};
/// The live view's percentile sketch, for `report` to summarise records in bounded memory with
/// the same accuracy (crate-internal: not part of the public API).
pub(crate) use publish::live::sketch;
pub use publish::live::PAGE as LIVE_PAGE;
/// The OpenTelemetry exporter started and fed from plain values, for `benches/otel_export.rs`
/// (not part of the public API).
#[doc(hidden)]
pub use publish::otel::bench_hook as otel_bench;
/// The per-request record's columns, in order (the CSV header).
pub use publish::record::COLUMNS as RECORD_COLUMNS;
pub use publish::tls;
