//! Floor 1, `parse`: reading bytes, nothing else. Pure code: no tokio, no hyper, nothing of the
//! rest of the crate.
//!
//! A response body is cut into events by a framer ([`sse`], [`ndjson`], [`json_body`]), each
//! event is read by its server's [`dialect`], and the [`reader`] keeps the bookkeeping between
//! the two; [`detect`](mod@detect) picks framing and dialect once per response from its head; [`event`]
//! holds the plain values they share. [`request_model`] finds the `model` of a request body.

mod detect;
mod dialect;
mod event;
mod json_body;
mod ndjson;
mod reader;
mod request_model;
mod sse;

#[cfg(test)]
mod tests;

pub use detect::detect;
pub use event::{Dialect, FinishReason, FrameEvents, Framing, StreamSummary, MAX_EVENT_TYPE_BYTES};
pub use reader::StreamReader;
pub use request_model::{ModelScanner, Scan};
