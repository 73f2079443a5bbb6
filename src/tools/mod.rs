//! Floor 7, `tools`: the subcommands around the proxy. They use the crate's public API only
//! (what `lib.rs` exports), never a floor's internals, and nothing below uses them.
//!
//! [`sim`] is a simulated inference server, [`bench`](mod@bench) a load generator, [`demo`] both
//! with the proxy between them, [`rules`] turns SLOs into Prometheus rules, [`inject`] adds the
//! sidecar to Kubernetes YAML, [`report`] explains the slow requests in per-request records, [`check`]
//! validates a configuration and warns about routes that cannot work as meant;
//! [`cli`] is what every subcommand shares, [`palette`] the colours of every plot they draw.

pub mod bench;
pub mod check;
pub mod cli;
pub mod demo;
pub mod inject;
pub mod palette;
pub mod report;
pub mod rules;
pub mod sim;
