//! Cutting a newline-delimited JSON body into events: one event per non-blank line.
//!
//! Lines end in LF; a CR before it is dropped (CRLF is tolerated), and a line of nothing but
//! spaces, tabs and CRs is no event. A last line without its LF is flushed by
//! [`NdjsonFramer::finish`]. As for SSE, a line that lies wholly in the frame is handed over as a
//! slice of it; only a line split across frames is copied, into a buffer that keeps its capacity
//! and never holds (nor reserves) more than `max` bytes. A line longer than `max` (counted with
//! its CR, so the verdict is the same wherever the frames were cut) is skipped and counted once.

use memchr::memchr;

use super::event::{extend_bounded, EventSink};

/// Buffers larger than this are shrunk after the line that grew them.
const KEEP_CAPACITY: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// The next byte starts a line.
    Start,
    /// A line began in an earlier frame; its bytes so far are in the buffer.
    Buffered,
    /// A line began in an earlier frame and outgrew the limit; its bytes are being skipped.
    Skipping,
}

pub(super) struct NdjsonFramer {
    max: usize,
    line: Line,
    buf: Vec<u8>,
}

impl NdjsonFramer {
    pub(super) fn new(max: usize) -> Self {
        NdjsonFramer {
            max,
            line: Line::Start,
            buf: Vec::new(),
        }
    }

    pub(super) fn feed(&mut self, frame: &[u8], sink: &mut impl EventSink) {
        let mut pos = 0;
        if self.line != Line::Start {
            let Some(i) = memchr(b'\n', frame) else {
                self.push(frame);
                return;
            };
            self.push(frame.get(..i).unwrap_or(&[]));
            self.end_buffered(sink);
            pos = i + 1;
        }
        while let Some(i) = frame.get(pos..).and_then(|rest| memchr(b'\n', rest)) {
            emit(self.max, frame.get(pos..pos + i).unwrap_or(&[]), sink);
            pos += i + 1;
        }
        if let Some(tail) = frame.get(pos..).filter(|tail| !tail.is_empty()) {
            self.line = Line::Buffered;
            self.buf.clear();
            self.push(tail);
        }
    }

    /// The body ended: a last line without LF is complete.
    pub(super) fn finish(&mut self, sink: &mut impl EventSink) {
        if self.line != Line::Start {
            self.end_buffered(sink);
        }
    }

    /// The bytes the buffer holds on to.
    pub(super) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.line != Line::Buffered {
            return;
        }
        if self.buf.len().saturating_add(bytes.len()) > self.max {
            self.line = Line::Skipping;
            self.buf.clear();
        } else {
            extend_bounded(&mut self.buf, bytes, self.max);
        }
    }

    fn end_buffered(&mut self, sink: &mut impl EventSink) {
        match self.line {
            Line::Buffered => emit(self.max, &self.buf, sink),
            Line::Skipping => sink.oversized(),
            Line::Start => {}
        }
        self.line = Line::Start;
        self.buf.clear();
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf.shrink_to(KEEP_CAPACITY);
        }
    }
}

/// One complete line, without its LF.
fn emit(max: usize, line: &[u8], sink: &mut impl EventSink) {
    if line.len() > max {
        sink.oversized();
        return;
    }
    if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
        return;
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    sink.event(b"", line);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::{split_at_points, Ev, Recorder};
    use super::*;

    fn frames_of(frames: &[&[u8]], max: usize) -> Vec<Ev> {
        let mut framer = NdjsonFramer::new(max);
        let mut sink = Recorder::default();
        for frame in frames {
            framer.feed(frame, &mut sink);
        }
        framer.finish(&mut sink);
        sink.events
    }

    fn line(data: &str) -> Ev {
        Ev::Event {
            kind: Vec::new(),
            data: data.as_bytes().to_vec(),
        }
    }

    #[test]
    fn lines_are_events() {
        let bytes = b"{\"a\":1}\n{\"b\":2}\r\n\n \t\r\n{\"c\":3}";
        let want = [line("{\"a\":1}"), line("{\"b\":2}"), line("{\"c\":3}")];
        assert_eq!(frames_of(&[bytes], 99), want);
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(frames_of(&bytewise, 99), want);
    }

    #[test]
    fn long_line_is_skipped_and_the_next_is_read() {
        let bytes = b"0123456789\nok\n0123456789";
        let want = [Ev::Oversized, line("ok"), Ev::Oversized];
        assert_eq!(frames_of(&[bytes], 9), want);
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(frames_of(&bytewise, 9), want);
        assert_eq!(frames_of(&[bytes], 10)[0], line("0123456789"));
    }

    #[test]
    fn whole_lines_are_not_copied() {
        let mut framer = NdjsonFramer::new(99);
        let mut sink = Recorder::default();
        framer.feed(b"{}\n{}\n", &mut sink);
        assert_eq!(framer.buf.capacity(), 0);
        assert_eq!(sink.events.len(), 2);
    }

    /// Lines and the size limit, over the whole input at once.
    fn reference(input: &[u8], max: usize) -> Vec<Ev> {
        let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
        if input.last() == Some(&b'\n') || input.is_empty() {
            lines.pop();
        }
        lines
            .into_iter()
            .filter_map(|l| {
                if l.len() > max {
                    Some(Ev::Oversized)
                } else if l.iter().all(|b| b" \t\r".contains(b)) {
                    None
                } else {
                    Some(line_bytes(l.strip_suffix(b"\r").unwrap_or(l)))
                }
            })
            .collect()
    }

    fn line_bytes(data: &[u8]) -> Ev {
        Ev::Event {
            kind: Vec::new(),
            data: data.to_vec(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn matches_the_reference(
            bytes in proptest::collection::vec(
                prop_oneof![Just(b'\n'), Just(b'\r'), Just(b' '), Just(b'{'), any::<u8>()],
                0..200,
            ),
            points in proptest::collection::vec(any::<usize>(), 0..20),
            max in prop_oneof![Just(usize::MAX), 0usize..30],
        ) {
            let want = reference(&bytes, max);
            let points: Vec<usize> = points.iter().map(|p| p % (bytes.len() + 1)).collect();
            let frames = split_at_points(&bytes, &points);
            prop_assert_eq!(frames_of(&frames, max), want.clone());
            prop_assert_eq!(frames_of(&[&bytes], max), want);
        }
    }
}
