//! HTTP/1.1 message bodies as they are framed on the wire (RFC 9112 §6–7), decoded in place: a
//! [`Decoder`] cuts data frames off the front of a connection's read buffer without copying
//! them, and consumes the framing between them (chunk-size lines, the CRLF after a chunk,
//! trailer fields). The upstream client's response bodies and the server's request bodies share
//! it. The other way, a [`WriteQueue`] holds what goes out (a head, frames with their chunk
//! framing) and writes it with vectored writes, never copying a frame: the upstream client's
//! requests and the server's responses share it.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Frame, SizeHint};
use tokio::net::TcpStream;

/// Buffers in one `writev`.
const MAX_SLICES: usize = 64;
/// Slices of a write when few pieces are queued (up to two frames' worth).
const FEW_SLICES: usize = 8;
/// Bytes queued ahead of a socket past which no more frames are taken from a body: a peer that
/// does not read holds back the other side, not the proxy's memory.
pub(crate) const GATHER_BYTES: usize = 16 << 10;

/// The longest chunk-size line accepted (extensions included).
const MAX_CHUNK_LINE: usize = 4 << 10;
/// Trailer fields of one body, all together.
const MAX_TRAILER_BYTES: usize = 16 << 10;

/// Framing that breaks the protocol; names what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Where the decoding of a body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes are left (`Content-Length`).
    Length(u64),
    /// Until the connection closes.
    Close,
    /// Chunked: a chunk-size line is next.
    Size,
    /// Chunked: this many bytes of the current chunk are left.
    Data(u64),
    /// Chunked: the CRLF after a chunk's data is next.
    DataEnd,
    /// Chunked: trailer fields, up to an empty line.
    Trailers,
    /// The body is over.
    Done,
}

/// Decodes one body from a read buffer the caller fills.
#[derive(Debug)]
pub(crate) struct Decoder {
    state: State,
    // Boxed: trailers are rare, and a decoder is in every request head, request body and
    // upstream body, each moved on the way to the first token (inline, 96 of its 120 bytes).
    trailers: Option<Box<HeaderMap>>,
    trailer_bytes: usize,
}

impl Decoder {
    fn with(state: State) -> Decoder {
        Decoder {
            state,
            trailers: None,
            trailer_bytes: 0,
        }
    }

    /// A body with no bytes at all.
    pub(crate) fn empty() -> Decoder {
        Decoder::with(State::Done)
    }

    /// A body of exactly `n` bytes.
    pub(crate) fn length(n: u64) -> Decoder {
        Decoder::with(if n == 0 {
            State::Done
        } else {
            State::Length(n)
        })
    }

    /// A chunked body.
    pub(crate) fn chunked() -> Decoder {
        Decoder::with(State::Size)
    }

    /// A body that ends when the connection closes.
    pub(crate) fn until_close() -> Decoder {
        Decoder::with(State::Close)
    }

    /// Whether the body is over and every frame has been taken.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done && self.trailers.is_none()
    }

    /// The connection closed: the end of a close-delimited body (true), a cut-short body for
    /// any other framing (false).
    pub(crate) fn close(&mut self) -> bool {
        let clean = matches!(self.state, State::Close | State::Done);
        self.state = State::Done;
        clean
    }

    /// Gives up on the body (an error was reported): nothing more is decoded.
    pub(crate) fn abandon(&mut self) {
        self.state = State::Done;
        self.trailers = None;
    }

    /// The next frame `buf` holds whole, if any: data cut off its front, or the trailers once
    /// the body is over.
    pub(crate) fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Frame<Bytes>>, Malformed> {
        if buf.is_empty() && self.state != State::Done {
            // Nothing to decode: the poll after each frame of a stream comes here.
            return Ok(None);
        }
        if self.state == State::Size {
            if let Some(data) = whole_chunk(buf) {
                // As below: what follows, when here, is moved over.
                if !buf.is_empty() {
                    let _ = self.advance(buf);
                }
                return Ok(Some(Frame::data(data)));
            }
        }
        self.advance(buf)?;
        match self.state {
            State::Done => Ok(self.trailers.take().map(|t| Frame::trailers(*t))),
            State::Length(_) | State::Close | State::Data(_) if buf.is_empty() => Ok(None),
            State::Length(left) => {
                let (data, rest) = take_up_to(buf, left);
                self.state = if rest == 0 {
                    State::Done
                } else {
                    State::Length(rest)
                };
                Ok(Some(Frame::data(data)))
            }
            State::Close => Ok(Some(Frame::data(buf.split().freeze()))),
            State::Data(left) => {
                let (data, rest) = take_up_to(buf, left);
                self.state = if rest == 0 {
                    State::DataEnd
                } else {
                    State::Data(rest)
                };
                // Move over what follows (the CRLF, the last chunk, the trailers) when it is
                // here already, so the frame that ends the body says so. A malformed rest is
                // left where it is, for the next call to report.
                let _ = self.advance(buf);
                Ok(Some(Frame::data(data)))
            }
            // Framing that is not all here yet.
            State::Size | State::DataEnd | State::Trailers => Ok(None),
        }
    }

    /// Consumes the framing between data (the CRLF after a chunk, chunk-size lines, trailer
    /// fields up to the empty line) as far as `buf` holds it whole; consumes nothing of a part
    /// it finds malformed.
    pub(crate) fn advance(&mut self, buf: &mut BytesMut) -> Result<(), Malformed> {
        loop {
            match self.state {
                State::Size => {
                    let Some(end) = memchr::memchr(b'\n', buf) else {
                        if buf.len() > MAX_CHUNK_LINE {
                            return Err(Malformed("a chunk-size line too long"));
                        }
                        return Ok(());
                    };
                    let size = chunk_size(&buf[..end])?;
                    buf.advance(end + 1);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::Data(size)
                    };
                }
                State::DataEnd => match buf.first() {
                    None => return Ok(()),
                    Some(b'\n') => {
                        buf.advance(1);
                        self.state = State::Size;
                    }
                    Some(b'\r') if buf.len() < 2 => return Ok(()),
                    Some(b'\r') if buf[1] == b'\n' => {
                        buf.advance(2);
                        self.state = State::Size;
                    }
                    Some(_) => return Err(Malformed("no CRLF after a chunk")),
                },
                State::Trailers => {
                    let Some(end) = memchr::memchr(b'\n', buf) else {
                        if buf.len() > MAX_TRAILER_BYTES {
                            return Err(Malformed("trailers too large"));
                        }
                        return Ok(());
                    };
                    let line = &buf[..end];
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    if line.is_empty() {
                        buf.advance(end + 1);
                        self.state = State::Done;
                        continue;
                    }
                    self.trailer_bytes += end + 1;
                    if self.trailer_bytes > MAX_TRAILER_BYTES {
                        return Err(Malformed("trailers too large"));
                    }
                    if let Some((name, value)) = trailer(line) {
                        self.trailers
                            .get_or_insert_with(Box::default)
                            .append(name, value);
                    }
                    buf.advance(end + 1);
                }
                State::Length(_) | State::Close | State::Data(_) | State::Done => return Ok(()),
            }
        }
    }

    /// At most how many bytes of the body are still to come, when the framing says
    /// (`Content-Length`), so a reader can stop at the body's end.
    pub(crate) fn left(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Done => SizeHint::with_exact(0),
            State::Length(left) => SizeHint::with_exact(left),
            _ => SizeHint::default(),
        }
    }
}

/// A chunk `buf` holds whole in its plainest form (a size line of hex digits and CRLF, the
/// data, CRLF), its data cut off the front of `buf` with the framing around it: a stream's
/// usual chunk in one step instead of three states. `None` (nothing consumed) for anything
/// else (a last chunk, extensions, a bare LF, a chunk not all here, a malformed one), which
/// the general path reads.
fn whole_chunk(buf: &mut BytesMut) -> Option<Bytes> {
    // Eight digits at most: a larger chunk is not a stream's frame.
    let (size, digits) = hex_prefix(buf, 8)?;
    if digits == 0 || size == 0 {
        return None;
    }
    let size = size as usize;
    let start = digits + 2;
    let end = start + size;
    if buf.len() < end + 2 || buf[digits..start] != *b"\r\n" || buf[end..end + 2] != *b"\r\n" {
        return None;
    }
    buf.advance(start);
    let data = buf.split_to(size).freeze();
    buf.advance(2);
    Some(data)
}

/// Up to `left` bytes cut off the front of `buf` (no copy), and how many are left after them.
fn take_up_to(buf: &mut BytesMut, left: u64) -> (Bytes, u64) {
    let n = (buf.len() as u64).min(left);
    (buf.split_to(n as usize).freeze(), left - n)
}

/// A chunk-size line's size (extensions after `;` ignored): at most 15 hex digits, then
/// optional whitespace and extensions.
fn chunk_size(line: &[u8]) -> Result<u64, Malformed> {
    const NOT_HEX: Malformed = Malformed("a chunk size that is not hex");
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (size, digits) = hex_prefix(line, 15).ok_or(NOT_HEX)?;
    if digits == 0 {
        return Err(NOT_HEX);
    }
    let rest = line[digits..].trim_ascii_start();
    if !(rest.is_empty() || rest.starts_with(b";")) {
        return Err(NOT_HEX);
    }
    Ok(size)
}

/// The hex number `bytes` begins with and how many digits it has (0 for none); `None` if it
/// has more than `max`.
fn hex_prefix(bytes: &[u8], max: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (digits, &b) in bytes.iter().enumerate() {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Some((value, digits)),
        };
        if digits == max {
            return None;
        }
        value = value << 4 | u64::from(digit);
    }
    Some((value, bytes.len()))
}

/// One trailer field, if it is a valid one (invalid ones are dropped, not fatal).
fn trailer(line: &[u8]) -> Option<(HeaderName, HeaderValue)> {
    let colon = memchr::memchr(b':', line)?;
    let name = HeaderName::from_bytes(&line[..colon]).ok()?;
    let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii()).ok()?;
    Some((name, value))
}

/// Appends one header field as `name: value` and CRLF.
pub(crate) fn put_field(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// One buffer on its way out.
enum Piece {
    Bytes(Bytes),
    Static(&'static [u8]),
    /// A chunk-size line: hex digits and CRLF, `start..end` of the array left to write.
    Line([u8; 18], u8, u8),
}

impl Piece {
    fn as_slice(&self) -> &[u8] {
        match self {
            Piece::Bytes(b) => b,
            Piece::Static(s) => s,
            Piece::Line(line, start, end) => &line[*start as usize..*end as usize],
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            Piece::Bytes(b) => b.advance(n),
            Piece::Static(s) => *s = &s[n..],
            Piece::Line(_, start, _) => *start += n as u8,
        }
    }

    fn chunk_line(len: usize) -> Piece {
        let (line, end) = size_line(len);
        Piece::Line(line, 0, end as u8)
    }
}

/// The size line of a chunk of `len` bytes (hex digits and CRLF), and how long it is.
fn size_line(len: usize) -> ([u8; 18], usize) {
    let mut line = [0u8; 18];
    let digits = format_hex(len, &mut line);
    line[digits] = b'\r';
    line[digits + 1] = b'\n';
    (line, digits + 2)
}

/// The bytes of a chunk of `len` data bytes on the wire: size line, data, CRLF.
fn chunk_len(len: usize) -> usize {
    hex_digits(len) + 2 + len + 2
}

fn hex_digits(n: usize) -> usize {
    ((usize::BITS - n.leading_zeros()).div_ceil(4)).max(1) as usize
}

/// Writes `n` in hex at the front of `out`; how many digits.
fn format_hex(n: usize, out: &mut [u8; 18]) -> usize {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let digits = hex_digits(n);
    for i in 0..digits {
        out[digits - 1 - i] = HEX[(n >> (4 * i)) & 0xF];
    }
    digits
}

/// What is queued for a socket: written with vectored writes, frames as they are.
#[derive(Default)]
pub(crate) struct WriteQueue {
    pieces: VecDeque<Piece>,
    queued: usize,
    written: u64,
    /// The chunk the last frame went into, while none of it has been written: where its size
    /// line is in `pieces`, and its length.
    open: Option<(usize, usize)>,
    /// A chunk's data queued alone (nothing else is): a streamed response's usual frame. It is
    /// written with its size line made on the stack and its CRLF, the pieces untouched; what a
    /// write leaves of it, or anything queued after it, moves it into the pieces.
    lone: Option<Bytes>,
}

impl WriteQueue {
    pub(crate) fn with_capacity(pieces: usize) -> WriteQueue {
        WriteQueue {
            pieces: VecDeque::with_capacity(pieces),
            ..WriteQueue::default()
        }
    }

    pub(crate) fn bytes(&mut self, bytes: Bytes) {
        self.unlone();
        self.open = None;
        self.push(Piece::Bytes(bytes));
    }

    pub(crate) fn fixed(&mut self, bytes: &'static [u8]) {
        self.unlone();
        self.open = None;
        self.push(Piece::Static(bytes));
    }

    /// The lone chunk, if any, as pieces (an open chunk, so a frame queued next joins it).
    fn unlone(&mut self) {
        if let Some(data) = self.lone.take() {
            let len = data.len();
            self.queued -= chunk_len(len);
            self.push(Piece::chunk_line(len));
            self.push(Piece::Bytes(data));
            self.push(Piece::Static(b"\r\n"));
            // Nothing else is queued while a chunk is lone: its size line is the first piece.
            self.open = Some((0, len));
        }
    }

    fn push(&mut self, piece: Piece) {
        let len = piece.as_slice().len();
        if len > 0 {
            self.queued += len;
            self.pieces.push_back(piece);
        }
    }

    /// A frame of a body: as it is, or in a chunk (size line, frames, CRLF). Frames queued
    /// together leave as one chunk, as nginx sends what it read at once: the bytes a client
    /// decodes are the same, and a client that hands each chunk on separately (hyper's body
    /// channel wakes its reader once per chunk) gets them in one go.
    pub(crate) fn data(&mut self, data: Bytes, chunked: bool) {
        if data.is_empty() {
            return;
        }
        if !chunked {
            self.unlone();
            self.open = None;
            self.push(Piece::Bytes(data));
            return;
        }
        if self.pieces.is_empty() && self.lone.is_none() {
            self.queued += chunk_len(data.len());
            self.lone = Some(data);
            return;
        }
        self.unlone();
        if let Some((line, len)) = self.open {
            // Grow the open chunk: a new size line, and its CRLF moves after this frame.
            let total = len + data.len();
            let before = self.pieces[line].as_slice().len();
            self.pieces[line] = Piece::chunk_line(total);
            self.queued = self.queued + self.pieces[line].as_slice().len() - before;
            // Nothing was queued after the open chunk's CRLF (anything else closes it).
            if let Some(crlf) = self.pieces.pop_back() {
                self.queued -= crlf.as_slice().len();
            }
            self.push(Piece::Bytes(data));
            self.push(Piece::Static(b"\r\n"));
            self.open = Some((line, total));
            return;
        }
        let line = self.pieces.len();
        let len = data.len();
        self.push(Piece::chunk_line(len));
        self.push(Piece::Bytes(data));
        self.push(Piece::Static(b"\r\n"));
        self.open = Some((line, len));
    }

    /// Whether another frame may be taken: its pieces fit in one `writev` and fewer than
    /// [`GATHER_BYTES`] are queued.
    pub(crate) fn has_room(&self) -> bool {
        // A lone chunk is three pieces once another frame joins it.
        self.pieces.len() + 3 * usize::from(self.lone.is_some()) + 3 <= MAX_SLICES
            && self.queued < GATHER_BYTES
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pieces.is_empty() && self.lone.is_none()
    }

    /// Bytes queued and not yet written.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queued
    }

    /// What is queued, as one buffer.
    #[cfg(test)]
    fn queued_bytes(&self) -> Vec<u8> {
        let lone = self.lone.iter().flat_map(|data| {
            let (line, end) = size_line(data.len());
            [&line[..end], data, b"\r\n"].concat()
        });
        self.pieces
            .iter()
            .flat_map(|p| p.as_slice().to_vec())
            .chain(lone)
            .collect()
    }

    /// Bytes written so far.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Writes until nothing is queued (`Ready(Ok)`) or the socket is full (`Pending`).
    ///
    /// Writes go straight to the socket. Asking tokio first whether the socket is writable
    /// reads its readiness record, which nothing else a frame does touches (no event comes for
    /// a socket that is not full): a cache miss on every frame, for an answer that is nearly
    /// always yes. Once the socket turns out full, the rest of the poll writes through tokio's
    /// readiness, which registers the task to be woken when there is room.
    pub(crate) fn poll_write(
        &mut self,
        stream: &TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        // What is written from here on may cut into the open chunk: it is closed.
        self.open = None;
        let mut direct = true;
        if let Some(data) = &self.lone {
            let (line, end) = size_line(data.len());
            let slices = [
                IoSlice::new(&line[..end]),
                IoSlice::new(data),
                IoSlice::new(b"\r\n"),
            ];
            let total = end + data.len() + 2;
            let sent = socket2::SockRef::from(stream).send_vectored(&slices);
            if let Ok(n) = sent {
                if n == total {
                    self.lone = None;
                    self.queued -= total;
                    self.written += total as u64;
                    return Poll::Ready(Ok(()));
                }
            }
            // Part of it, or nothing: the rest as pieces, written as any others are, and closed
            // to later frames.
            self.unlone();
            self.open = None;
            match sent {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.consume(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => direct = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        while !self.pieces.is_empty() {
            let written = if direct {
                self.write_front(|slices| socket2::SockRef::from(stream).send_vectored(slices))
            } else {
                ready!(stream.poll_write_ready(cx))?;
                self.write_front(|slices| stream.try_write_vectored(slices))
            };
            match written {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.consume(n),
                // tokio may still think the socket writable; its own write finds out, and
                // forgets that, so the next wait is a real one.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => direct = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// One vectored write of the front of the queue, with `write`.
    fn write_front(
        &self,
        write: impl FnOnce(&[IoSlice<'_>]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        // A frame is three pieces: most writes need a few slots, not the whole array.
        if self.pieces.len() <= FEW_SLICES {
            write_gathered::<FEW_SLICES>(&self.pieces, write)
        } else {
            write_gathered::<MAX_SLICES>(&self.pieces, write)
        }
    }

    /// Takes `n` written bytes off the front of the queue.
    fn consume(&mut self, mut n: usize) {
        self.queued -= n;
        self.written += n as u64;
        while n > 0 {
            let Some(front) = self.pieces.front_mut() else {
                break;
            };
            let len = front.as_slice().len();
            if n >= len {
                n -= len;
                self.pieces.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
        if self.pieces.is_empty() {
            // Back to the ring's start: popping moves it on, and each frame would otherwise
            // land on the next slots round the ring, whose cache lines are cold.
            self.pieces.clear();
        }
    }
}

/// One vectored write of the front of `pieces`, at most `N` of them.
fn write_gathered<const N: usize>(
    pieces: &VecDeque<Piece>,
    write: impl FnOnce(&[IoSlice<'_>]) -> io::Result<usize>,
) -> io::Result<usize> {
    let mut slices = [IoSlice::new(&[]); N];
    let (front, back) = pieces.as_slices();
    let mut count = 0;
    for (slot, piece) in slices.iter_mut().zip(front.iter().chain(back)) {
        *slot = IoSlice::new(piece.as_slice());
        count += 1;
    }
    write(&slices[..count])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn frames(decoder: &mut Decoder, pieces: &[&[u8]]) -> Result<Vec<Frame<Bytes>>, Malformed> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            while let Some(frame) = decoder.next(&mut buf)? {
                out.push(frame);
            }
        }
        Ok(out)
    }

    #[test]
    fn chunked_in_pieces_with_extensions_and_trailers() {
        let mut d = Decoder::chunked();
        let got = frames(
            &mut d,
            &[
                b"5;ext=1\r\nhel",
                b"lo\r\n3\r",
                b"\nabc\r\n0\r\nx-a: 1\r\n",
                b"\r\n",
            ],
        )
        .unwrap();
        let data: Vec<u8> = got
            .iter()
            .filter_map(|f| f.data_ref())
            .flat_map(|d| d.to_vec())
            .collect();
        assert_eq!(data, b"helloabc");
        let trailers = got.last().unwrap().trailers_ref().unwrap();
        assert_eq!(trailers["x-a"], "1");
        assert!(d.is_done());
    }

    /// One chunk of a generated body: its data, the size's case, an extension, a bare LF.
    #[derive(Debug, Clone)]
    struct Chunk {
        data: Vec<u8>,
        upper: bool,
        extension: bool,
        bare_lf: bool,
    }

    fn chunk() -> impl Strategy<Value = Chunk> {
        (
            proptest::collection::vec(any::<u8>(), 1..300),
            any::<bool>(),
            proptest::bool::weighted(0.2),
            proptest::bool::weighted(0.1),
        )
            .prop_map(|(data, upper, extension, bare_lf)| Chunk {
                data,
                upper,
                extension,
                bare_lf,
            })
    }

    fn encode(chunks: &[Chunk], trailer: bool) -> Vec<u8> {
        let mut wire = Vec::new();
        for c in chunks {
            let size = if c.upper {
                format!("{:X}", c.data.len())
            } else {
                format!("{:x}", c.data.len())
            };
            wire.extend_from_slice(size.as_bytes());
            if c.extension {
                wire.extend_from_slice(b";name=value");
            }
            let eol: &[u8] = if c.bare_lf { b"\n" } else { b"\r\n" };
            wire.extend_from_slice(eol);
            wire.extend_from_slice(&c.data);
            wire.extend_from_slice(eol);
        }
        wire.extend_from_slice(b"0\r\n");
        if trailer {
            wire.extend_from_slice(b"x-t: 1\r\n");
        }
        wire.extend_from_slice(b"\r\nNEXT");
        wire
    }

    proptest! {
        /// Chunked bodies of every framing the decoder accepts, arriving in any pieces, decode to
        /// their chunks' data, their trailers and the bytes after them; fed whole, every chunk is
        /// one frame; whichever piece holds the last chunk, the body is over when it is read.
        #[test]
        fn chunked_bodies_decode_whole_or_in_pieces(
            chunks in proptest::collection::vec(chunk(), 0..12),
            trailer in any::<bool>(),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..6),
        ) {
            let wire = encode(&chunks, trailer);
            let expected: Vec<u8> = chunks.iter().flat_map(|c| c.data.clone()).collect();
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
            at.push(0);
            at.push(wire.len());
            at.sort_unstable();
            at.dedup();
            let pieces: Vec<&[u8]> = at.windows(2).map(|w| &wire[w[0]..w[1]]).collect();
            let mut whole = Decoder::chunked();
            let mut pieced = Decoder::chunked();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for piece in &pieces {
                buf.extend_from_slice(piece);
                while let Some(frame) = pieced.next(&mut buf).unwrap() {
                    got.push(frame);
                }
            }
            let data: Vec<u8> = got.iter().filter_map(|f| f.data_ref()).flat_map(|d| d.to_vec()).collect();
            prop_assert_eq!(&data, &expected);
            prop_assert!(pieced.is_done());
            prop_assert_eq!(&buf[..], b"NEXT");
            prop_assert_eq!(got.iter().any(|f| f.is_trailers()), trailer);
            let all = frames(&mut whole, &[&wire]).unwrap();
            let sizes: Vec<usize> = all.iter().filter_map(|f| f.data_ref()).map(|d| d.len()).collect();
            prop_assert_eq!(sizes, chunks.iter().map(|c| c.data.len()).collect::<Vec<_>>());
            prop_assert!(whole.is_done());
        }

        /// Cut anywhere, a chunk is never taken whole before its closing CRLF is here, and a
        /// wrong byte where the CRLF belongs is reported, not passed as data.
        #[test]
        fn a_chunk_is_taken_whole_only_with_its_framing(
            data in proptest::collection::vec(any::<u8>(), 1..64),
            cut in any::<proptest::sample::Index>(),
        ) {
            let mut wire = format!("{:x}\r\n", data.len()).into_bytes();
            wire.extend_from_slice(&data);
            wire.extend_from_slice(b"\r\n");
            let at = cut.index(wire.len());
            let mut buf = BytesMut::from(&wire[..at]);
            let mut d = Decoder::chunked();
            let mut taken = 0;
            while let Some(frame) = d.next(&mut buf).unwrap() {
                taken += frame.data_ref().map_or(0, |d| d.len());
            }
            // Data may stream before its chunk ends, but never more than is here.
            prop_assert!(taken <= at.saturating_sub(wire.len() - data.len() - 2));
            let mut bad = wire.clone();
            let last = bad.len() - 2;
            bad[last] = b'X';
            prop_assert_eq!(
                frames(&mut Decoder::chunked(), &[&bad]).unwrap_err(),
                Malformed("no CRLF after a chunk")
            );
        }
    }

    #[test]
    fn the_last_data_frame_knows_the_body_is_over_when_the_end_is_buffered() {
        let mut d = Decoder::chunked();
        let mut buf = BytesMut::from(&b"3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1"[..]);
        let frame = d.next(&mut buf).unwrap().unwrap();
        assert_eq!(frame.data_ref().unwrap(), &b"abc"[..]);
        assert!(d.is_done());
        // What follows the body is left for the next message.
        assert_eq!(&buf[..], b"GET / HTTP/1.1");
    }

    #[test]
    fn a_length_body_stops_at_its_end() {
        let mut d = Decoder::length(4);
        let mut buf = BytesMut::from(&b"abcdEFG"[..]);
        assert_eq!(
            d.next(&mut buf).unwrap().unwrap().data_ref().unwrap(),
            &b"abcd"[..]
        );
        assert!(d.is_done());
        assert_eq!(&buf[..], b"EFG");
    }

    #[test]
    fn bad_framing_is_named() {
        assert_eq!(
            frames(&mut Decoder::chunked(), &[b"zz\r\n"]).unwrap_err(),
            Malformed("a chunk size that is not hex")
        );
        assert_eq!(
            frames(&mut Decoder::chunked(), &[b"1\r\naXY"]).unwrap_err(),
            Malformed("no CRLF after a chunk")
        );
        let long = vec![b'1'; MAX_CHUNK_LINE + 1];
        assert!(frames(&mut Decoder::chunked(), &[&long]).is_err());
    }

    #[test]
    fn a_close_ends_only_a_close_delimited_body_cleanly() {
        assert!(Decoder::until_close().close());
        assert!(!Decoder::length(3).close());
        assert!(!Decoder::chunked().close());
    }

    #[test]
    fn chunk_size_lines_are_read_as_hex_with_extensions_ignored() {
        for (line, size) in [
            ("0", 0),
            ("1a", 26),
            ("1A\r", 26),
            ("Ff;name=value", 255),
            ("10 \t;ext", 16),
            ("fffffffffffffff", (1 << 60) - 1),
        ] {
            assert_eq!(chunk_size(line.as_bytes()), Ok(size), "{line:?}");
        }
        for line in [
            "",
            "\r",
            ";ext",
            "g",
            "1 2",
            "-1",
            "+1",
            "0x10",
            "1000000000000000",
        ] {
            assert!(chunk_size(line.as_bytes()).is_err(), "{line:?}");
        }
    }

    #[test]
    fn chunk_sizes_are_hex() {
        for (n, hex) in [(1, "1"), (15, "F"), (16, "10"), (4096, "1000"), (0, "0")] {
            let Piece::Line(line, start, end) = Piece::chunk_line(n) else {
                unreachable!()
            };
            assert_eq!(
                &line[start as usize..end as usize],
                format!("{hex}\r\n").as_bytes()
            );
        }
    }

    #[test]
    fn frames_queued_together_leave_as_one_chunk() {
        let mut queue = WriteQueue::default();
        queue.bytes(Bytes::from_static(b"HEAD\r\n\r\n"));
        queue.data(Bytes::from_static(b"data: a\n\n"), true);
        queue.data(Bytes::from(vec![b'x'; 300]), true);
        queue.data(Bytes::from_static(b"data: b\n\n"), true);
        let mut want = b"HEAD\r\n\r\n13E\r\ndata: a\n\n".to_vec();
        want.extend_from_slice(&[b'x'; 300]);
        want.extend_from_slice(b"data: b\n\n\r\n");
        assert_eq!(queue.queued_bytes(), want);
        assert_eq!(queue.queued(), want.len());
        // Anything else queued closes the chunk: the last chunk, or a write.
        queue.fixed(b"0\r\n\r\n");
        queue.data(Bytes::from_static(b"z"), true);
        assert!(queue.queued_bytes().ends_with(b"0\r\n\r\n1\r\nz\r\n"));
        let mut queue = WriteQueue::default();
        queue.data(Bytes::from_static(b"abc"), false);
        queue.data(Bytes::from_static(b"de"), false);
        assert_eq!(queue.queued_bytes(), b"abcde");
    }

    /// A loopback connection: the side the queue writes to, and its peer.
    async fn connected() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn a_chunk_partly_written_is_not_grown() {
        let (client, mut server) = connected().await;
        let mut queue = WriteQueue::default();
        queue.data(Bytes::from_static(b"one"), true);
        std::future::poll_fn(|cx| queue.poll_write(&client, cx))
            .await
            .unwrap();
        queue.data(Bytes::from_static(b"two"), true);
        queue.data(Bytes::from_static(b"three"), true);
        std::future::poll_fn(|cx| queue.poll_write(&client, cx))
            .await
            .unwrap();
        drop(client);
        let mut got = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut server, &mut got)
            .await
            .unwrap();
        assert_eq!(got, b"3\r\none\r\n8\r\ntwothree\r\n");
    }

    /// A chunk queued alone goes out in one write when the socket takes it; when it takes part,
    /// the rest waits as any queued bytes do, and no frame queued meanwhile joins the chunk
    /// that is partly out: the peer decodes every frame, in order, framed as it should be.
    #[tokio::test]
    async fn a_lone_chunk_written_in_part_keeps_its_framing() {
        let (client, server) = connected().await;
        let mut queue = WriteQueue::default();
        queue.data(Bytes::from_static(b"one"), true);
        assert_eq!(queue.queued_bytes(), b"3\r\none\r\n");
        assert_eq!(queue.queued(), 8);
        std::future::poll_fn(|cx| queue.poll_write(&client, cx))
            .await
            .unwrap();
        assert!(queue.is_empty());
        assert_eq!(queue.written(), 8);
        // More than loopback's socket buffers hold, in one frame.
        let big = vec![b'x'; 8 << 20];
        queue.data(Bytes::from(big.clone()), true);
        let first = std::future::poll_fn(|cx| Poll::Ready(queue.poll_write(&client, cx))).await;
        assert!(first.is_pending(), "8 MiB fit in a socket nobody reads");
        assert!(queue.written() > 8);
        queue.data(Bytes::from_static(b"two"), true);
        let mut want = b"3\r\none\r\n800000\r\n".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"\r\n3\r\ntwo\r\n");
        let got = write_out_while_read(&mut queue, &client, server, want.len()).await;
        assert_eq!(queue.written(), want.len() as u64);
        assert!(got == want, "the bytes arrived changed");
    }

    /// Writes all `queue` holds while the peer reads `len` bytes; what the peer read.
    async fn write_out_while_read(
        queue: &mut WriteQueue,
        client: &TcpStream,
        mut server: TcpStream,
        len: usize,
    ) -> Vec<u8> {
        let reader = tokio::spawn(async move {
            let mut got = vec![0; len];
            tokio::io::AsyncReadExt::read_exact(&mut server, &mut got)
                .await
                .unwrap();
            got
        });
        tokio::time::timeout(
            Duration::from_secs(30),
            std::future::poll_fn(|cx| queue.poll_write(client, cx)),
        )
        .await
        .expect("woken when the socket had room")
        .unwrap();
        reader.await.unwrap()
    }

    /// A socket whose peer stops reading fills: the queue waits (and is woken) for room, and
    /// what reaches the peer once it reads is everything, in order.
    #[tokio::test]
    async fn a_full_socket_is_waited_for_and_loses_nothing() {
        let (client, server) = connected().await;
        let mut queue = WriteQueue::default();
        let mut want = Vec::new();
        // More than loopback's socket buffers hold, in frames of different bytes.
        for i in 0..512u32 {
            let frame = vec![(i % 251) as u8; 64 << 10];
            want.extend_from_slice(&frame);
            queue.data(Bytes::from(frame), false);
        }
        let first = std::future::poll_fn(|cx| Poll::Ready(queue.poll_write(&client, cx))).await;
        assert!(first.is_pending(), "32 MiB fit in a socket nobody reads");
        assert!(queue.written() > 0);
        let total = want.len();
        let got = write_out_while_read(&mut queue, &client, server, total).await;
        assert_eq!(queue.written(), total as u64);
        assert!(got == want, "the bytes arrived changed");
    }
}
