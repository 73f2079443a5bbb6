//! Holding a non-streaming JSON body until it has arrived whole, within a bound.
//!
//! A whole JSON document can only be read once its last byte is in, so its frames are copied into
//! one buffer; past `max` bytes the buffer is dropped and the body is only counted as oversized.
//! Nothing here knows what the JSON means: the reader hands the body to the dialect.

/// What a finished body left to read.
pub(super) enum Body<'a> {
    /// No byte arrived.
    Empty,
    /// More than `max` bytes arrived; they were not kept.
    Oversized,
    Whole(&'a [u8]),
}

pub(super) struct JsonBody {
    max: usize,
    buf: Vec<u8>,
    seen: bool,
    oversized: bool,
}

impl JsonBody {
    pub(super) fn new(max: usize) -> Self {
        JsonBody {
            max,
            buf: Vec::new(),
            seen: false,
            oversized: false,
        }
    }

    pub(super) fn feed(&mut self, frame: &[u8]) {
        if frame.is_empty() || self.oversized {
            return;
        }
        self.seen = true;
        if self.buf.len().saturating_add(frame.len()) > self.max {
            self.oversized = true;
            // Give the memory back now: the body will not be read.
            self.buf = Vec::new();
        } else {
            super::event::extend_bounded(&mut self.buf, frame, self.max);
        }
    }

    /// The bytes the buffer holds on to.
    pub(super) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The body as it stands, read once the body has ended.
    pub(super) fn body(&self) -> Body<'_> {
        if self.oversized {
            Body::Oversized
        } else if self.seen {
            Body::Whole(&self.buf)
        } else {
            Body::Empty
        }
    }
}
