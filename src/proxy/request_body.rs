//! The request body on its way upstream, read in passing for the request's `model`.
//!
//! [`ModelSniffBody`] forwards every frame unchanged and at once; it only shows the bytes to a
//! [`ModelScanner`] until the scanner has found the top-level `model` or given up, then it is a
//! plain pass-through. Forwarding never waits for the scanner.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::measure::ModelSlot;
use crate::parse::{ModelScanner, Scan};

/// How far into a request body the scanner looks for `model` before giving up. Clients put the
/// model after the messages (Python's openai SDK does), so this must cover long prompts.
pub(crate) const MODEL_LOOKAHEAD_BYTES: usize = 8 << 20;

pin_project! {
    /// A request body that reports its `model` to the request's recorder.
    pub(crate) struct ModelSniffBody<B> {
        #[pin]
        inner: B,
        scanner: Option<ModelScanner>,
        slot: ModelSlot,
    }
}

impl<B: Body> ModelSniffBody<B> {
    pub(crate) fn new(inner: B, slot: ModelSlot) -> Self {
        // A body that is already over (a GET) names no model; say so now, not never.
        let scanner = if inner.is_end_stream() {
            slot.decide(None);
            None
        } else {
            Some(ModelScanner::new(MODEL_LOOKAHEAD_BYTES))
        };
        ModelSniffBody {
            inner,
            scanner,
            slot,
        }
    }
}

impl<B: Body<Data = Bytes>> Body for ModelSniffBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = ready!(this.inner.poll_frame(cx));
        if let Some(scanner) = this.scanner.as_mut() {
            let scan = match &polled {
                Some(Ok(frame)) => match frame.data_ref() {
                    Some(data) => scanner.feed(data),
                    None => scanner.finish(),
                },
                _ => scanner.finish(),
            };
            match scan {
                Scan::Pending => {}
                Scan::Found(model) => {
                    this.slot.decide(Some(model.as_str()));
                    *this.scanner = None;
                }
                Scan::GaveUp => {
                    this.slot.decide(None);
                    *this.scanner = None;
                }
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
