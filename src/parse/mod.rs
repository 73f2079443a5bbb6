//! Floor 1, `parse`: reading bytes, nothing else. Pure code: no tokio, no hyper, nothing of the
//! rest of the crate.
//!
//! A response body is cut into events by a framer ([`sse`], [`ndjson`], [`json_body`]), each
//! event is read by its server's [`dialect`], and the [`reader`] keeps the bookkeeping between
//! the two; [`detect`](mod@detect) picks framing and dialect once per response from its head; [`event`]
//! holds the plain values they share. [`request_model`] finds the `model` of a request body.
//!
//! What explains a request's figures is read in passing too: the dialects fill the summary's
//! [`EngineReport`] (cache, reasoning, the engine's own timing), [`engine_headers`](fn@engine_headers)
//! reads TGI's timing headers, and [`exposition`] reads an engine's `/metrics` text for its
//! running and waiting requests and KV-cache usage.

mod detect;
mod dialect;
// Nothing reads TGI's headers or an engine's `/metrics` yet: the recorder and the engine-metrics
// sampler will (issue 13). Remove these two `allow`s and the one below when they do.
mod engine_headers;
mod event;
mod exposition;
mod json_body;
mod ndjson;
mod reader;
mod report;
mod request_model;
mod sse;
mod trace_context;

#[cfg(test)]
mod tests;

pub use detect::detect;
pub use event::{Dialect, FinishReason, FrameEvents, Framing, StreamSummary, MAX_EVENT_TYPE_BYTES};
pub use reader::StreamReader;
pub use request_model::{ModelScanner, Scan};
pub use trace_context::{traceparent, TraceParent};
pub use {
    engine_headers::engine_headers,
    exposition::{engine_state, EngineState, MAX_EXPOSITION_BYTES},
    report::EngineReport,
};
