//! Floor 4, `publish`: where finished requests go. [`metrics`] is the Prometheus registry and
//! the per-request handles into it, [`live`] the admin page's rolling windows (with its
//! percentile sketch and time rings in files of their own), and [`record`] the per-request
//! record (JSONL or CSV) written off the request path, and [`otel`] the same finished requests as
//! OpenTelemetry metrics and spans over OTLP, also off the request path; [`tls`] the TLS client
//! configuration the exporter shares with `bench`'s client.

pub(crate) mod live;
pub(crate) mod metrics;
pub(crate) mod otel;
pub(crate) mod record;
pub mod tls;
