//! Floor 5, `measure`: one request, measured. The [`recorder`] follows a request from its head to
//! its single `finish`, where it is judged (`policy`) and published (`publish`); the
//! [`timed_body`] timestamps each response frame as it is handed to the client; the
//! [`model_slot`] carries the request's `model` from the body scanner to the recorder; the
//! [`meter`] is what a configuration generation measures with.

mod engine_state;
mod meter;
mod model_slot;
mod recorder;
mod timed_body;

pub use meter::Meter;
pub(crate) use model_slot::ModelSlot;
pub use recorder::Recorder;
pub use timed_body::{TimedBody, TimedBodyError};
