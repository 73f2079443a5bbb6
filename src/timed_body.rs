//! The response body as the client receives it, timestamped frame by frame.
//!
//! [`TimedBody`] forwards every frame of the upstream body unchanged, in the same poll, and shows
//! its data to the request's [`Recorder`] by reference at the moment it is handed to hyper, which
//! writes it to the client connection at once. It forwards `is_end_stream` and `size_hint`, and
//! finishes the recorder exactly once: at the end, on an upstream error, or (through the
//! recorder's `Drop`) when the client goes away and hyper drops the body.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::recorder::{End, Recorder};

pin_project! {
    /// A response body that times what it hands on.
    pub struct TimedBody<B> {
        #[pin]
        inner: B,
        recorder: Recorder,
    }
}

impl<B: Body<Data = Bytes>> TimedBody<B> {
    /// Wraps a response body; an empty one (HEAD, 204, 304) finishes the request at once,
    /// because hyper may never poll it.
    pub fn new(inner: B, mut recorder: Recorder) -> Self {
        if inner.is_end_stream() {
            recorder.finish(End::Complete, Instant::now());
        }
        TimedBody { inner, recorder }
    }
}

impl<B: Body<Data = Bytes>> Body for TimedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        // Timestamp only frames that are ready, never on Pending.
        let polled = ready!(this.inner.as_mut().poll_frame(cx));
        let now = Instant::now();
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.recorder.on_data(data, now);
                }
                // hyper stops polling once the body says it has ended, so finish now.
                if this.inner.is_end_stream() {
                    this.recorder.finish(End::Complete, now);
                }
            }
            Some(Err(_)) => this.recorder.finish(End::UpstreamBroken, now),
            None => this.recorder.finish(End::Complete, now),
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
