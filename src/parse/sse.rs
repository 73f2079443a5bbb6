//! Cutting a `text/event-stream` body into events, incrementally, by the WHATWG rules.
//!
//! Lines end in CR, LF or CRLF, and a CR that ends one frame and an LF that starts the next are
//! one line end: reading them as two would invent a blank line and dispatch an event that is not
//! there. A leading UTF-8 BOM is skipped. `:` lines are comments; `data` lines are joined with
//! `\n`; `event` names the event; every other field is ignored. A blank line dispatches the event
//! when it has a data line or a non-empty type (WHATWG drops an event without data; servers do not
//! send one, and a typed event without data is still an event of its dialect). Unlike WHATWG, an
//! event left open when the body ends is dispatched by [`SseFramer::finish`]: servers omit the
//! last blank line, and the event is real.
//!
//! The hot path copies nothing. An event whose lines all lie in the current frame — nearly every
//! event — is handed to the sink as slices of the frame: its data and type are remembered as
//! ranges of the frame until the blank line. Bytes are copied into the per-stream buffers only
//! when they must outlive the frame (an event or a line that straddles a frame boundary) or be
//! joined (several data lines). The buffers keep their capacity, so the steady state does not
//! allocate, and they never hold more than `max` bytes: an event whose data and type exceed that
//! (or whose type alone exceeds [`MAX_EVENT_TYPE_BYTES`]) is dropped as it grows, counted once,
//! and reading resumes at the next blank line. They grow by doubling but never to a capacity
//! past what they may hold, so a stream holds at most `max` plus the type's cap. Only the bytes
//! that matter are held: a comment or an ignored field split across frames is skipped, not
//! buffered. The result never depends on where the frames were cut.

use memchr::{memchr, memchr2};

use super::event::{extend_bounded, EventSink, MAX_EVENT_TYPE_BYTES};

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// The longest field name worth holding while a line is split inside it (`event`).
const NAME_MAX: usize = 5;

/// Buffers larger than this are shrunk after the event that grew them, so one large event does
/// not pin its memory for the rest of a long stream.
const KEEP_CAPACITY: usize = 64 * 1024;

/// Where the data (or type) of the event being read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// No such line yet.
    Absent,
    /// A range of the frame being scanned; only ever set, and valid, during one `scan`.
    Frame { start: usize, end: usize },
    /// In the framer's own buffer.
    Buf,
}

/// The line that the previous frame ended inside of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Partial {
    /// None: the next byte starts a line.
    None,
    /// The field name is not complete yet; `head[..len]` is its start.
    Name { head: [u8; NAME_MAX], len: usize },
    /// The value of a `data` field, appended to the data buffer as it comes. `strip`: the one
    /// space allowed after the colon may still come.
    Data { strip: bool },
    /// The value of an `event` field, into the type buffer.
    Event { strip: bool },
    /// The rest of the line does not matter: a comment, another field, an oversized event.
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// At the start of the stream, `matched` bytes of a BOM seen and held back.
    Bom {
        matched: usize,
    },
    Done,
}

pub(super) struct SseFramer {
    max: usize,
    start: Start,
    /// The last frame ended with a CR that ended a line: an LF starting the next frame belongs
    /// to that line end.
    pending_cr: bool,
    partial: Partial,
    data: Held,
    data_buf: Vec<u8>,
    kind: Held,
    kind_buf: Vec<u8>,
    /// The current event's data and type outgrew `max`; it is being skipped.
    oversized: bool,
}

impl SseFramer {
    pub(super) fn new(max: usize) -> Self {
        SseFramer {
            max,
            start: Start::Bom { matched: 0 },
            pending_cr: false,
            partial: Partial::None,
            data: Held::Absent,
            data_buf: Vec::new(),
            kind: Held::Absent,
            kind_buf: Vec::new(),
            oversized: false,
        }
    }

    pub(super) fn feed(&mut self, frame: &[u8], sink: &mut impl EventSink) {
        let mut frame = frame;
        if let Start::Bom { matched } = self.start {
            let want = BOM.get(matched..).unwrap_or(&[]);
            let n = want.len().min(frame.len());
            if frame.get(..n) == want.get(..n) {
                if n < want.len() {
                    // The frame ended inside what may be a BOM: hold it until we know.
                    self.start = Start::Bom {
                        matched: matched + n,
                    };
                    return;
                }
                self.start = Start::Done;
                frame = frame.get(n..).unwrap_or(&[]);
            } else {
                self.start = Start::Done;
                // What was held back was not a BOM after all but the stream's first bytes.
                self.scan(BOM.get(..matched).unwrap_or(&[]), sink);
            }
        }
        self.scan(frame, sink);
    }

    /// The body ended: the line and the event still open are complete.
    pub(super) fn finish(&mut self, sink: &mut impl EventSink) {
        if let Start::Bom { matched } = self.start {
            self.start = Start::Done;
            self.scan(BOM.get(..matched).unwrap_or(&[]), sink);
        }
        self.end_partial();
        self.pending_cr = false;
        // Nothing is held as a frame range between scans, so no frame is needed here.
        self.dispatch(&[], sink);
    }

    fn scan(&mut self, frame: &[u8], sink: &mut impl EventSink) {
        if frame.is_empty() {
            return;
        }
        if let Some(data) = self.lone_data(frame) {
            // A CR that ended the last frame was a line end of its own: no LF starts this one.
            self.pending_cr = false;
            if self.fits(data.len(), 0) {
                sink.event(&[], data);
            } else {
                sink.oversized();
            }
            return;
        }
        let mut pos = 0;
        if self.pending_cr {
            self.pending_cr = false;
            if frame.first() == Some(&b'\n') {
                pos = 1;
            }
        }
        if self.partial != Partial::None {
            match self.line_end(frame, pos) {
                None => {
                    self.push_partial(frame, pos, frame.len());
                    return;
                }
                Some((end, next)) => {
                    self.push_partial(frame, pos, end);
                    self.end_partial();
                    pos = next;
                }
            }
        }
        while let Some((end, next)) = self.line_end(frame, pos) {
            self.line(frame, pos, end, sink);
            pos = next;
        }
        if pos < frame.len() {
            self.push_partial(frame, pos, frame.len());
        }
        // Ranges into this frame die with it.
        self.detach(frame);
    }

    /// The data of a frame that is one whole event of one `data` line (`data: {..}\n\n`) and
    /// starts where no line or event is open: nearly every frame of a stream, read with one
    /// search for a line end instead of line by line.
    fn lone_data<'a>(&self, frame: &'a [u8]) -> Option<&'a [u8]> {
        if self.partial != Partial::None
            || self.data != Held::Absent
            || self.kind != Held::Absent
            || self.oversized
        {
            return None;
        }
        let line = frame.strip_prefix(b"data:")?.strip_suffix(b"\n\n")?;
        if memchr2(b'\r', b'\n', line).is_some() {
            return None;
        }
        Some(line.strip_prefix(b" ").unwrap_or(line))
    }

    /// Finds the end of the line starting at `from`: the index of its terminator and where the
    /// next line starts. Notes a CR that ends the frame, whose LF may start the next one.
    fn line_end(&mut self, frame: &[u8], from: usize) -> Option<(usize, usize)> {
        let rest = frame.get(from..)?;
        let i = memchr2(b'\r', b'\n', rest)?;
        let end = from + i;
        let next = if rest.get(i) == Some(&b'\r') {
            match frame.get(end + 1) {
                Some(b'\n') => end + 2,
                Some(_) => end + 1,
                None => {
                    self.pending_cr = true;
                    end + 1
                }
            }
        } else {
            end + 1
        };
        Some((end, next))
    }

    /// A line wholly inside the frame: `frame[start..end]`, without its terminator.
    fn line(&mut self, frame: &[u8], start: usize, end: usize, sink: &mut impl EventSink) {
        let line = frame.get(start..end).unwrap_or(&[]);
        match line.first() {
            None => return self.dispatch(frame, sink),
            Some(b':') => return,
            Some(_) => {}
        }
        let (name, mut value) = match memchr(b':', line) {
            Some(i) => (line.get(..i).unwrap_or(&[]), start + i + 1),
            None => (line, end),
        };
        if value < end && frame.get(value) == Some(&b' ') {
            value += 1;
        }
        match name {
            b"data" => self.data_in_frame(frame, value, end),
            b"event" => self.event_in_frame(value, end),
            _ => {}
        }
    }

    fn data_in_frame(&mut self, frame: &[u8], start: usize, end: usize) {
        if self.oversized {
            return;
        }
        let len = end.saturating_sub(start);
        let kind_len = self.kind_len();
        match self.data {
            Held::Absent => {
                if self.fits(len, kind_len) {
                    self.data = Held::Frame { start, end };
                } else {
                    self.mark_oversized();
                }
            }
            Held::Frame { start: s0, end: e0 } => {
                if self.fits(e0.saturating_sub(s0) + 1 + len, kind_len) {
                    // A second data line: the two must be joined, so they move to the buffer.
                    self.data_buf.clear();
                    self.put_data(frame.get(s0..e0).unwrap_or(&[]));
                    self.put_data(b"\n");
                    self.put_data(frame.get(start..end).unwrap_or(&[]));
                    self.data = Held::Buf;
                } else {
                    self.mark_oversized();
                }
            }
            Held::Buf => {
                if self.fits(self.data_buf.len() + 1 + len, kind_len) {
                    self.put_data(b"\n");
                    self.put_data(frame.get(start..end).unwrap_or(&[]));
                } else {
                    self.mark_oversized();
                }
            }
        }
    }

    fn event_in_frame(&mut self, start: usize, end: usize) {
        if self.oversized {
            return;
        }
        if self.fits(self.data_len(), end.saturating_sub(start)) {
            self.kind = Held::Frame { start, end };
        } else {
            self.mark_oversized();
        }
    }

    /// Bytes `frame[start..end]` of a line that does not end in this frame (or, at a frame's
    /// start, of one that began in an earlier frame).
    fn push_partial(&mut self, frame: &[u8], start: usize, end: usize) {
        // What this line adds goes to the buffers, after what the event already has.
        self.detach(frame);
        let mut bytes = frame.get(start..end).unwrap_or(&[]);
        // At most two rounds: the end of the name, then the start of the value.
        loop {
            match self.partial {
                Partial::None => match bytes.first() {
                    None => return,
                    Some(b':') => {
                        self.partial = Partial::Skip;
                        return;
                    }
                    Some(_) => {
                        self.partial = Partial::Name {
                            head: [0; NAME_MAX],
                            len: 0,
                        }
                    }
                },
                Partial::Name { mut head, len } => {
                    let Some(colon) = memchr(b':', bytes) else {
                        if len + bytes.len() > NAME_MAX {
                            self.partial = Partial::Skip;
                        } else {
                            copy_into(&mut head, len, bytes);
                            self.partial = Partial::Name {
                                head,
                                len: len + bytes.len(),
                            };
                        }
                        return;
                    };
                    let (tail, rest) = bytes.split_at(colon);
                    if len + tail.len() > NAME_MAX {
                        self.partial = Partial::Skip;
                        return;
                    }
                    copy_into(&mut head, len, tail);
                    match head.get(..len + tail.len()).unwrap_or(&[]) {
                        b"data" => self.begin_data(),
                        b"event" => self.begin_event(),
                        _ => {
                            self.partial = Partial::Skip;
                            return;
                        }
                    }
                    bytes = rest.get(1..).unwrap_or(&[]);
                }
                Partial::Data { strip } => {
                    let value = strip_space(bytes, strip);
                    if !bytes.is_empty() {
                        self.partial = Partial::Data { strip: false };
                    }
                    self.append_data(value);
                    return;
                }
                Partial::Event { strip } => {
                    let value = strip_space(bytes, strip);
                    if !bytes.is_empty() {
                        self.partial = Partial::Event { strip: false };
                    }
                    self.append_kind(value);
                    return;
                }
                Partial::Skip => return,
            }
        }
    }

    /// The line begun in an earlier frame ended.
    fn end_partial(&mut self) {
        if let Partial::Name { head, len } = self.partial {
            // A field name with no colon is a field with an empty value.
            match head.get(..len).unwrap_or(&[]) {
                b"data" => self.begin_data(),
                b"event" => self.begin_event(),
                _ => {}
            }
        }
        self.partial = Partial::None;
    }

    /// A data line starts whose value will arrive in pieces. Called only after `detach`.
    fn begin_data(&mut self) {
        self.partial = Partial::Data { strip: true };
        if self.oversized {
            self.partial = Partial::Skip;
            return;
        }
        match self.data {
            Held::Absent | Held::Frame { .. } => {
                self.data_buf.clear();
                self.data = Held::Buf;
            }
            Held::Buf => {
                if self.fits(self.data_buf.len() + 1, self.kind_len()) {
                    self.put_data(b"\n");
                } else {
                    self.mark_oversized();
                }
            }
        }
    }

    fn append_data(&mut self, value: &[u8]) {
        if self.oversized || value.is_empty() {
            return;
        }
        if self.fits(self.data_buf.len() + value.len(), self.kind_len()) {
            self.put_data(value);
        } else {
            self.mark_oversized();
        }
    }

    /// An event line starts whose value will arrive in pieces; it replaces any earlier type.
    fn begin_event(&mut self) {
        self.partial = Partial::Event { strip: true };
        if self.oversized {
            self.partial = Partial::Skip;
            return;
        }
        self.kind_buf.clear();
        self.kind = Held::Buf;
    }

    fn append_kind(&mut self, value: &[u8]) {
        if self.oversized || value.is_empty() {
            return;
        }
        if self.fits(self.data_len(), self.kind_buf.len() + value.len()) {
            self.put_kind(value);
        } else {
            self.mark_oversized();
        }
    }

    /// A blank line (or the end of the body): the event is complete.
    fn dispatch(&mut self, frame: &[u8], sink: &mut impl EventSink) {
        if self.oversized {
            sink.oversized();
        } else if self.data != Held::Absent || self.kind_len() > 0 {
            let data = held(self.data, frame, &self.data_buf);
            let kind = held(self.kind, frame, &self.kind_buf);
            sink.event(kind, data);
        }
        self.data = Held::Absent;
        self.kind = Held::Absent;
        self.oversized = false;
        self.data_buf.clear();
        self.kind_buf.clear();
        if self.data_buf.capacity() > KEEP_CAPACITY {
            self.data_buf.shrink_to(KEEP_CAPACITY);
        }
        if self.kind_buf.capacity() > KEEP_CAPACITY {
            self.kind_buf.shrink_to(KEEP_CAPACITY);
        }
    }

    /// Copies what the event holds as ranges of `frame` into the buffers, before `frame` goes.
    fn detach(&mut self, frame: &[u8]) {
        if let Held::Frame { start, end } = self.data {
            self.data_buf.clear();
            self.put_data(frame.get(start..end).unwrap_or(&[]));
            self.data = Held::Buf;
        }
        if let Held::Frame { start, end } = self.kind {
            self.kind_buf.clear();
            self.put_kind(frame.get(start..end).unwrap_or(&[]));
            self.kind = Held::Buf;
        }
    }

    fn mark_oversized(&mut self) {
        self.oversized = true;
        self.data = Held::Absent;
        self.kind = Held::Absent;
        self.data_buf.clear();
        self.kind_buf.clear();
        if matches!(self.partial, Partial::Data { .. } | Partial::Event { .. }) {
            self.partial = Partial::Skip;
        }
    }

    /// Whether an event with this much data and type stays within the limit. The same sums are
    /// checked whether the bytes are in the frame or buffered, so the verdict does not depend on
    /// where frames were cut.
    fn fits(&self, data_len: usize, kind_len: usize) -> bool {
        data_len.saturating_add(kind_len) <= self.max && kind_len <= MAX_EVENT_TYPE_BYTES
    }

    /// Appends to the data buffer, which never needs more than `max` bytes.
    fn put_data(&mut self, bytes: &[u8]) {
        extend_bounded(&mut self.data_buf, bytes, self.max);
    }

    /// Appends to the type buffer, which never needs more than the type's cap.
    fn put_kind(&mut self, bytes: &[u8]) {
        extend_bounded(
            &mut self.kind_buf,
            bytes,
            self.max.min(MAX_EVENT_TYPE_BYTES),
        );
    }

    /// The bytes the buffers hold on to.
    pub(super) fn capacity(&self) -> usize {
        self.data_buf.capacity() + self.kind_buf.capacity()
    }

    fn data_len(&self) -> usize {
        held_len(self.data, &self.data_buf)
    }

    fn kind_len(&self) -> usize {
        held_len(self.kind, &self.kind_buf)
    }
}

fn held<'a>(at: Held, frame: &'a [u8], buf: &'a [u8]) -> &'a [u8] {
    match at {
        Held::Absent => &[],
        Held::Frame { start, end } => frame.get(start..end).unwrap_or(&[]),
        Held::Buf => buf,
    }
}

fn held_len(at: Held, buf: &[u8]) -> usize {
    match at {
        Held::Absent => 0,
        Held::Frame { start, end } => end.saturating_sub(start),
        Held::Buf => buf.len(),
    }
}

fn strip_space(bytes: &[u8], strip: bool) -> &[u8] {
    match bytes.split_first() {
        Some((b' ', rest)) if strip => rest,
        _ => bytes,
    }
}

/// `head[at..] = bytes`, as far as it goes (callers have checked that it fits).
fn copy_into(head: &mut [u8; NAME_MAX], at: usize, bytes: &[u8]) {
    for (dst, src) in head.iter_mut().skip(at).zip(bytes) {
        *dst = *src;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::{split_at_points, Ev, Recorder};
    use super::*;

    fn frames_of(frames: &[&[u8]], max: usize) -> Vec<Ev> {
        let mut framer = SseFramer::new(max);
        let mut sink = Recorder::default();
        for frame in frames {
            framer.feed(frame, &mut sink);
        }
        framer.finish(&mut sink);
        sink.events
    }

    /// Reads `bytes` as one frame, one byte per frame and cut at every single point, and checks
    /// that all agree with `want`.
    fn check(bytes: &[u8], want: &[Ev]) {
        assert_eq!(frames_of(&[bytes], 1 << 16), want, "one frame");
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(frames_of(&bytewise, 1 << 16), want, "one byte per frame");
        for cut in 1..bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(frames_of(&[a, b], 1 << 16), want, "cut at {cut}");
        }
    }

    fn ev(kind: &str, data: &str) -> Ev {
        Ev::Event {
            kind: kind.as_bytes().to_vec(),
            data: data.as_bytes().to_vec(),
        }
    }

    #[test]
    fn line_ends_of_every_kind() {
        let want = [ev("", "a"), ev("", "b"), ev("", "c")];
        check(b"data: a\n\ndata: b\r\n\r\ndata: c\r\r", &want);
        check(b"data: a\r\rdata: b\r\rdata: c\r\r", &want);
        check(b"data: a\r\n\r\ndata: b\n\rdata: c\n\n", &want);
    }

    /// A CR ending one frame and the LF starting the next are one line end: read as two, they
    /// would make a blank line and dispatch an event in the middle of this one.
    #[test]
    fn crlf_split_across_frames_is_one_line_end() {
        let got = frames_of(&[b"data: x\r", b"\ndata: y\r\n\r\n"], 1 << 16);
        assert_eq!(got, [ev("", "x\ny")]);
        let got = frames_of(&[b"data: x\r", b"\n\r\n"], 1 << 16);
        assert_eq!(got, [ev("", "x")]);
        let got = frames_of(&[b"data: x\r", b"\n", b"\r", b"\n"], 1 << 16);
        assert_eq!(got, [ev("", "x")]);
        // Two CRs are two line ends, wherever they are cut.
        let got = frames_of(&[b"data: x\r", b"\r", b"data: y\n\n"], 1 << 16);
        assert_eq!(got, [ev("", "x"), ev("", "y")]);
    }

    #[test]
    fn multi_line_data_is_joined_with_lf() {
        check(
            b"data: {\"a\":\ndata:  1}\ndata\ndata:\n\n",
            &[ev("", "{\"a\":\n 1}\n\n")],
        );
    }

    #[test]
    fn comments_are_not_events() {
        check(
            b": ping\n\n:\n\ndata: a\n: inside\ndata: b\n\n: bye",
            &[ev("", "a\nb")],
        );
    }

    /// A comment split across frames is skipped, not buffered, however long it is.
    #[test]
    fn long_split_comment_is_not_buffered() {
        let mut framer = SseFramer::new(16);
        let mut sink = Recorder::default();
        framer.feed(b": ", &mut sink);
        for _ in 0..1000 {
            framer.feed(&[b' '; 1000], &mut sink);
        }
        framer.feed(b"\ndata: x\n\n", &mut sink);
        assert_eq!(sink.events, [ev("", "x")]);
        assert_eq!(framer.data_buf.capacity(), 0);
    }

    #[test]
    fn event_types() {
        check(
            b"event: message_start\ndata: {}\n\nevent: ping\n\nevent: a\nevent: b\ndata: 1\n\nevent:\n\n",
            &[ev("message_start", "{}"), ev("ping", ""), ev("b", "1")],
        );
    }

    #[test]
    fn other_fields_are_ignored() {
        check(
            b"id: 1\nretry: 10\ndatax: no\nevents: no\ndata: yes\nid\n\nid: 2\n\n",
            &[ev("", "yes")],
        );
    }

    #[test]
    fn final_event_without_blank_line_is_flushed() {
        check(b"data: a\n\ndata: b\n", &[ev("", "a"), ev("", "b")]);
        check(b"data: a\n\ndata: b", &[ev("", "a"), ev("", "b")]);
        check(b"data: a\n\ndata", &[ev("", "a"), ev("", "")]);
        check(b"data: a\n\nevent: e", &[ev("", "a"), ev("e", "")]);
        check(b"data: a\n\n: c", &[ev("", "a")]);
    }

    #[test]
    fn bom_is_skipped_once() {
        check(b"\xEF\xBB\xBFdata: a\n\n", &[ev("", "a")]);
        // A second BOM is not at the stream's start: it is part of a field name.
        check(
            b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n",
            &[ev("", "b")],
        );
        // Bytes that began like a BOM and were not one are the stream's own.
        check(b"\xEFdata: a\n\n", &[]);
        check(b"\xEF\xBB\n\ndata: a\n\n", &[ev("", "a")]);
        check(b"\xEF", &[]);
        assert_eq!(
            frames_of(&[b"\xEF", b"\xBB", b"", b"\xBF", b"data: a"], 99),
            [ev("", "a")]
        );
    }

    #[test]
    fn data_without_space() {
        check(b"data:{\"x\":1}\n\n", &[ev("", "{\"x\":1}")]);
        check(b"data:  two\n\n", &[ev("", " two")]);
        check(b"data:\n\n", &[ev("", "")]);
    }

    #[test]
    fn empty_frames_change_nothing() {
        let got = frames_of(&[b"", b"data: a\r", b"", b"\n", b"", b"\n", b""], 99);
        assert_eq!(got, [ev("", "a")]);
    }

    #[test]
    fn oversized_event_is_skipped_and_the_next_is_read() {
        let bytes = b"data: 0123456789\ndata: 0123456789\n\ndata: ok\n\nevent: 0123456789012345678901\ndata: x\n\n";
        let want = [Ev::Oversized, ev("", "ok"), Ev::Oversized];
        for max in [12, 20] {
            assert_eq!(frames_of(&[bytes], max), want, "max {max}");
            let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(frames_of(&bytewise, max), want, "max {max}, byte-wise");
        }
        // Exactly at the limit is not over it: "0123456789\n0123456789" is 21 bytes.
        assert_eq!(
            frames_of(&[b"data: 0123456789\ndata: 0123456789\n\n"], 21),
            [ev("", "0123456789\n0123456789")]
        );
    }

    /// The buffers never grow past the limit, however long a split event is.
    #[test]
    fn memory_stays_bounded() {
        let mut framer = SseFramer::new(1024);
        let mut sink = Recorder::default();
        framer.feed(b"data: ", &mut sink);
        for _ in 0..10_000 {
            framer.feed(&[b'x'; 100], &mut sink);
            assert!(framer.data_buf.len() <= 1024);
        }
        framer.feed(b"\n\n", &mut sink);
        assert_eq!(sink.events, [Ev::Oversized]);
        assert!(framer.data_buf.capacity() <= KEEP_CAPACITY);
    }

    /// An event type longer than its cap makes the event oversized, whatever the limit, so the
    /// type buffer never holds more than the cap.
    #[test]
    fn long_event_types_are_oversized() {
        let long = "e".repeat(MAX_EVENT_TYPE_BYTES + 1);
        let at_cap = "e".repeat(MAX_EVENT_TYPE_BYTES);
        let bytes = format!("event: {long}\ndata: x\n\nevent: {at_cap}\ndata: y\n\n");
        let want = [Ev::Oversized, ev(&at_cap, "y")];
        assert_eq!(frames_of(&[bytes.as_bytes()], 1 << 16), want);
        let bytewise: Vec<&[u8]> = bytes.as_bytes().chunks(1).collect();
        let mut framer = SseFramer::new(1 << 16);
        let mut sink = Recorder::default();
        for frame in bytewise {
            framer.feed(frame, &mut sink);
            assert!(framer.kind_buf.capacity() <= MAX_EVENT_TYPE_BYTES);
        }
        framer.finish(&mut sink);
        assert_eq!(sink.events, want);
    }

    /// The buffers grow by doubling but never past the limit: one split event of exactly the
    /// limit leaves a buffer of exactly the limit.
    #[test]
    fn buffers_never_reserve_past_the_limit() {
        let mut framer = SseFramer::new(1000);
        let mut sink = Recorder::default();
        framer.feed(b"data: ", &mut sink);
        for _ in 0..100 {
            framer.feed(&[b'x'; 10], &mut sink);
            assert!(framer.capacity() <= 1000);
        }
        assert_eq!(framer.data_buf.capacity(), 1000);
        framer.feed(b"\n\n", &mut sink);
        assert_eq!(sink.events.len(), 1);
    }

    /// The buffer is not touched when every event lies inside its frame: the zero-copy path.
    #[test]
    fn whole_events_are_not_copied() {
        let mut framer = SseFramer::new(1 << 16);
        let mut sink = Recorder::default();
        framer.feed(b"data: a\n\nevent: e\ndata: b\n\n", &mut sink);
        assert_eq!(framer.data_buf.capacity(), 0);
        assert_eq!(framer.kind_buf.capacity(), 0);
        assert_eq!(sink.events, [ev("", "a"), ev("e", "b")]);
    }

    #[test]
    fn garbage_never_panics() {
        let garbage: &[&[u8]] = &[
            b"\xff\xfe\x00\r\r\n\n:::\x80\ndata:\xc3",
            b"\xa9\n\n\r",
            b"\x00",
            b"event:\xf0\x9f\x92\ndata",
            b"\x96\r\n\r\ndata: \xff\n\n",
        ];
        let got = frames_of(garbage, 8);
        let raw = |data: &[u8]| Ev::Event {
            kind: Vec::new(),
            data: data.to_vec(),
        };
        assert_eq!(got, [raw("\u{e9}".as_bytes()), raw(b"\xff")]);
        assert_eq!(got, reference(&garbage.concat(), 8));
    }

    /// The WHATWG rules written plainly over the whole input, with the two choices this project
    /// makes (typed events without data dispatch; the open event is flushed at the end) and the
    /// size limit.
    fn reference(input: &[u8], max: usize) -> Vec<Ev> {
        let input = input.strip_prefix(&BOM).unwrap_or(input);
        let mut lines = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < input.len() {
            match input[i] {
                b'\r' => {
                    lines.push(&input[start..i]);
                    if input.get(i + 1) == Some(&b'\n') {
                        i += 1;
                    }
                    start = i + 1;
                }
                b'\n' => {
                    lines.push(&input[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
            i += 1;
        }
        if start < input.len() {
            lines.push(&input[start..]);
        }
        lines.push(b"");

        let mut out = Vec::new();
        let mut data: Option<Vec<u8>> = None;
        let mut kind: Vec<u8> = Vec::new();
        let mut oversized = false;
        for line in lines {
            if line.is_empty() {
                if oversized {
                    out.push(Ev::Oversized);
                } else if data.is_some() || !kind.is_empty() {
                    out.push(Ev::Event {
                        kind: kind.clone(),
                        data: data.clone().unwrap_or_default(),
                    });
                }
                data = None;
                kind.clear();
                oversized = false;
                continue;
            }
            if line[0] == b':' || oversized {
                continue;
            }
            let (name, value) = match line.iter().position(|&b| b == b':') {
                Some(i) => (&line[..i], &line[i + 1..]),
                None => (line, &line[line.len()..]),
            };
            let value = value.strip_prefix(b" ").unwrap_or(value);
            match name {
                b"data" => match &mut data {
                    Some(d) => {
                        d.push(b'\n');
                        d.extend_from_slice(value);
                    }
                    None => data = Some(value.to_vec()),
                },
                b"event" => kind = value.to_vec(),
                _ => continue,
            }
            if data.as_ref().map_or(0, Vec::len) + kind.len() > max
                || kind.len() > MAX_EVENT_TYPE_BYTES
            {
                oversized = true;
            }
        }
        out
    }

    #[test]
    fn reference_joins_like_whatwg() {
        // The reference's own joining must be right for it to judge anything.
        assert_eq!(reference(b"data\ndata: b\n\n", 99), [ev("", "\nb")]);
        assert_eq!(reference(b"data: a\ndata\n\n", 99), [ev("", "a\n")]);
    }

    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"data: ".to_vec()),
            Just(b"data:".to_vec()),
            Just(b"data".to_vec()),
            Just(b"dat".to_vec()),
            Just(b"event: ".to_vec()),
            Just(b"event:".to_vec()),
            Just(b"event".to_vec()),
            Just(b"eventx:".to_vec()),
            Just(b":".to_vec()),
            Just(b"id: 1".to_vec()),
            Just(b"\n".to_vec()),
            Just(b"\r".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b" ".to_vec()),
            Just(b"  ".to_vec()),
            Just(b"abc".to_vec()),
            Just(b"0123456789".to_vec()),
            Just(vec![0xEF, 0xBB, 0xBF]),
            Just(vec![0xEF, 0xBB]),
            proptest::collection::vec(any::<u8>(), 0..6),
        ]
    }

    fn bom_prefix() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(vec![]),
            Just(vec![0xEF, 0xBB, 0xBF]),
            Just(vec![0xEF]),
            Just(vec![0xEF, 0xBB]),
        ]
    }

    /// A frame of whole events, most of them one `data` line each (what servers send), or
    /// anything else.
    fn event_frame() -> impl Strategy<Value = Vec<u8>> {
        let value = proptest::collection::vec(
            prop_oneof![Just(b' '), Just(b'x'), Just(b'{'), Just(b'\r'), Just(b'\n')],
            0..8,
        );
        prop_oneof![
            4 => (prop_oneof![Just("data:"), Just("data: "), Just("data:  ")], value)
                .prop_map(|(field, value)| [field.as_bytes(), &value, b"\n\n"].concat()),
            1 => proptest::collection::vec(piece(), 0..6).prop_map(|pieces| pieces.concat()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Frames that are whole events, read one `data` line at a time or line by line, hand
        /// over what the reference reads.
        #[test]
        fn whole_event_frames_match_the_reference(
            frames in proptest::collection::vec(event_frame(), 0..12),
            max in prop_oneof![Just(usize::MAX), 0usize..6],
        ) {
            let bytes = frames.concat();
            let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(frames_of(&frames, max), reference(&bytes, max));
        }

        /// The incremental framer, zero-copy path, buffers and all, hands over exactly the events
        /// that the plain reference reads, wherever the frames are cut.
        #[test]
        fn matches_the_reference(
            prefix in bom_prefix(),
            pieces in proptest::collection::vec(piece(), 0..40),
            points in proptest::collection::vec(any::<usize>(), 0..20),
            max in prop_oneof![Just(usize::MAX), 0usize..40],
        ) {
            let bytes = [prefix, pieces.concat()].concat();
            let want = reference(&bytes, max);
            let points: Vec<usize> = points.iter().map(|p| p % (bytes.len() + 1)).collect();
            let frames = split_at_points(&bytes, &points);
            prop_assert_eq!(frames_of(&frames, max), want.clone());
            prop_assert_eq!(frames_of(&[&bytes], max), want);
        }
    }
}
