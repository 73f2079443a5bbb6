//! tokenmeter: a sidecar reverse proxy that measures how an LLM service feels to its users.
//!
//! A request's path through the crate, by file: accepted in [`server`], routed by [`route`],
//! forwarded by [`proxy`]
//! and [`forward`] (its body read in passing for `model` by [`request_body`] and
//! [`request_model`]), its response timed by [`timed_body`] and read by [`stream`], and judged,
//! published and logged once by [`recorder`] into [`metrics`] and [`access_log`]. [`admin`]
//! serves what was published. [`config`] is the YAML that sets it all up; [`rules`] turns
//! its SLOs into Prometheus rules.

pub mod access_log;
pub mod admin;
pub mod cli;
pub mod config;
pub mod demo;
pub mod error;
pub mod forward;
pub mod inject;
pub mod live;
pub mod loadgen;
pub mod metrics;
pub mod proxy;
pub mod recorder;
pub mod reload;
pub mod request_body;
pub mod request_model;
pub mod route;
pub mod rules;
pub mod server;
pub mod sim;
pub mod slo;
pub mod stream;
pub mod timed_body;
