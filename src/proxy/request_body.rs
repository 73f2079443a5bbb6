//! The request body on its way upstream: read in passing for the request's `model`, watched for
//! the client's faults, and kept (bounded) so that a request can be sent again.
//!
//! [`RequestBody`] forwards every frame unchanged and at once. On the way it
//! - shows the bytes to a [`ModelScanner`] until it has found the top-level `model` or given up;
//! - tells the request's [`Upload`] when the body is complete (the response-head timeout starts
//!   then, not while the client is still uploading) or how the client failed: a malformed body
//!   (400), a client gone midway, or a pause longer than `timeouts.request_body` (408). A client's
//!   fault is the client's: it never becomes an upstream error;
//! - when asked to, keeps the frames it forwarded ([`Retained`], at most
//!   `limits.retry_body_bytes` per request and [`RETAINED_TOTAL`] for the whole process) until the
//!   response head arrives, for [`ReplayBody`].

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use super::client_body::{ClientBody, ClientBodyError, ClientFault};
use crate::measure::ModelSlot;
use crate::parse::{ModelScanner, Scan};

/// How far into a request body the scanner looks for `model` before giving up. Clients put the
/// model after the messages (Python's openai SDK does), so this must cover long prompts.
pub(crate) const MODEL_LOOKAHEAD_BYTES: usize = 8 << 20;

/// Request bodies kept for a retry, all requests together; past it no more are kept (and those
/// requests are not retried), so hostile uploads cannot grow the process through retention.
pub(crate) const RETAINED_TOTAL: usize = 64 << 20;

/// The body the proxy sends upstream: the client's, or a kept copy sent again. The client's is
/// on the heap: a request moves through several futures on its way out (the service's, the
/// forwarder's, the connection's exchange), each move a copy of what the request holds inline.
pub(crate) type UpstreamBody = http_body_util::Either<Box<RequestBody>, ReplayBody>;

/// What the proxy knows of a request's upload while it is sent.
#[derive(Default)]
pub(crate) struct Upload {
    complete: AtomicBool,
    changed: Notify,
    fault: OnceLock<ClientFault>,
}

impl Upload {
    fn finish(&self) {
        self.complete.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    fn fail(&self, fault: ClientFault) {
        let _ = self.fault.set(fault);
        self.changed.notify_waiters();
    }

    /// How the client failed its body, if it did.
    pub(crate) fn fault(&self) -> Option<ClientFault> {
        self.fault.get().copied()
    }

    /// Resolves once the whole body has been handed upstream.
    pub(crate) async fn complete(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.complete.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }
}

/// The frames of a body kept for sending it again.
pub(crate) struct Retained {
    kept: Mutex<Kept>,
    limit: usize,
    total: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Kept {
    frames: Vec<Bytes>,
    bytes: usize,
    complete: bool,
    /// Too large, trailers, or released: the body can no longer be sent again.
    spoiled: bool,
}

impl Retained {
    pub(crate) fn new(limit: usize, total: Arc<AtomicUsize>) -> Arc<Retained> {
        Arc::new(Retained {
            kept: Mutex::new(Kept::default()),
            limit,
            total,
        })
    }

    fn keep(&self, data: &Bytes) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.spoiled {
            return;
        }
        let fits = kept.bytes + data.len() <= self.limit
            && self.total.fetch_add(data.len(), Ordering::Relaxed) + data.len() <= RETAINED_TOTAL;
        if fits {
            kept.bytes += data.len();
            kept.frames.push(data.clone());
        } else {
            self.total.fetch_sub(data.len(), Ordering::Relaxed);
            Self::spoil(&mut kept, &self.total);
        }
    }

    fn spoil(kept: &mut Kept, total: &AtomicUsize) {
        kept.spoiled = true;
        total.fetch_sub(kept.bytes, Ordering::Relaxed);
        kept.bytes = 0;
        kept.frames = Vec::new();
    }

    fn mark(&self, complete: bool) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if complete {
            kept.complete = true;
        } else {
            Self::spoil(&mut kept, &self.total);
        }
    }

    /// The body again, if what was taken of it was kept: the frames taken so far, then, when
    /// it was not all taken yet, the rest of it from `rest` (the body being sent, which goes on
    /// keeping what it forwards). A write that met a connection the server had closed can
    /// fail before the client's upload is over: the request is sent again all the same.
    pub(crate) fn resume(&self, rest: Box<RequestBody>) -> Option<ReplayBody> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        (!kept.spoiled).then(|| ReplayBody {
            frames: kept.frames.iter().cloned().collect(),
            rest: (!kept.complete).then_some(rest),
        })
    }

    /// The response head arrived: nothing more is kept, and what was is let go.
    pub(crate) fn release(&self) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        Self::spoil(&mut kept, &self.total);
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        let kept = self.kept.get_mut().unwrap_or_else(|p| p.into_inner());
        self.total.fetch_sub(kept.bytes, Ordering::Relaxed);
    }
}

/// Why a request body ended in an error.
#[derive(Debug)]
pub(crate) enum RequestBodyError {
    Client(ClientBodyError),
    Stalled(Duration),
}

impl std::fmt::Display for RequestBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestBodyError::Client(e) => write!(f, "the client's request body failed: {e}"),
            RequestBodyError::Stalled(after) => write!(
                f,
                "the client sent nothing of its request body for {}",
                humantime::format_duration(*after)
            ),
        }
    }
}

impl std::error::Error for RequestBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RequestBodyError::Client(e) => Some(e),
            RequestBodyError::Stalled(_) => None,
        }
    }
}

pin_project! {
    /// The client's request body on its way upstream.
    pub(crate) struct RequestBody {
        #[pin]
        inner: ClientBody,
        scanner: Option<ModelScanner>,
        slot: ModelSlot,
        upload: Arc<Upload>,
        retained: Option<Arc<Retained>>,
        stall_after: Duration,
        // Armed while the body waits for the client; allocated on the first wait only.
        stall: Option<Pin<Box<Sleep>>>,
        waiting: bool,
        done: bool,
    }
}

impl RequestBody {
    pub(crate) fn new(
        inner: ClientBody,
        slot: ModelSlot,
        upload: Arc<Upload>,
        stall_after: Duration,
    ) -> Self {
        // A body that is already over (a GET) names no model; say so now, not never.
        let done = inner.is_end_stream();
        let scanner = if done {
            slot.decide(None);
            upload.finish();
            None
        } else {
            Some(ModelScanner::new(MODEL_LOOKAHEAD_BYTES))
        };
        RequestBody {
            inner,
            scanner,
            slot,
            upload,
            retained: None,
            stall_after,
            stall: None,
            waiting: false,
            done,
        }
    }

    /// Keeps what is forwarded from now on in `retained`.
    pub(crate) fn retain(&mut self, retained: Arc<Retained>) {
        if self.done {
            retained.mark(true);
        }
        self.retained = Some(retained);
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let mut this = self.project();
        let polled = match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(polled) => polled,
            Poll::Pending => {
                if !*this.waiting {
                    *this.waiting = true;
                    let deadline = Instant::now() + *this.stall_after;
                    match this.stall.as_mut() {
                        Some(stall) => stall.as_mut().reset(deadline),
                        None => *this.stall = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                }
                if let Some(stall) = this.stall.as_mut() {
                    ready!(stall.as_mut().poll(cx));
                }
                this.upload.fail(ClientFault::Stalled);
                *this.scanner = None;
                return Poll::Ready(Some(Err(RequestBodyError::Stalled(*this.stall_after))));
            }
        };
        *this.waiting = false;
        let scan = match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if let Some(retained) = this.retained.as_ref() {
                        retained.keep(data);
                    }
                    this.scanner.as_mut().map(|s| s.feed(data).clone())
                } else {
                    // Trailers cannot be sent again as they came.
                    if let Some(retained) = this.retained.as_ref() {
                        retained.mark(false);
                    }
                    this.scanner.as_mut().map(|s| s.finish().clone())
                }
            }
            _ => this.scanner.as_mut().map(|s| s.finish().clone()),
        };
        match scan {
            None | Some(Scan::Pending) => {}
            Some(Scan::Found(model)) => {
                this.slot.decide_shared(Some(model));
                *this.scanner = None;
            }
            Some(Scan::GaveUp) => {
                this.slot.decide(None);
                *this.scanner = None;
            }
        }
        let ended = match &polled {
            None => true,
            Some(Ok(_)) => this.inner.is_end_stream(),
            Some(Err(e)) => {
                this.upload.fail(e.fault());
                false
            }
        };
        if ended && !*this.done {
            *this.done = true;
            if let Some(retained) = this.retained.as_ref() {
                retained.mark(true);
            }
            this.upload.finish();
        }
        Poll::Ready(polled.map(|r| r.map_err(RequestBodyError::Client)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A kept request body, sent again: the frames kept, then the rest of the body when it was not
/// all taken before the first attempt failed.
pub(crate) struct ReplayBody {
    frames: VecDeque<Bytes>,
    rest: Option<Box<RequestBody>>,
}

#[cfg(test)]
impl ReplayBody {
    /// A body of these frames.
    pub(crate) fn of(frames: Vec<Bytes>) -> ReplayBody {
        ReplayBody {
            frames: frames.into(),
            rest: None,
        }
    }
}

impl Body for ReplayBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest.as_mut()).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let kept = self.frames.iter().map(|f| f.len() as u64).sum();
        match &self.rest {
            None => SizeHint::with_exact(kept),
            Some(rest) => {
                let mut hint = rest.size_hint();
                hint.set_lower(hint.lower() + kept);
                if let Some(upper) = hint.upper() {
                    hint.set_upper(upper + kept);
                }
                hint
            }
        }
    }
}
