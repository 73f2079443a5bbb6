//! HTTP/1.1 message bodies as they are framed on the wire (RFC 9112 §6–7), decoded in place: a
//! [`Decoder`] cuts data frames off the front of a connection's read buffer without copying
//! them, and consumes the framing between them (chunk-size lines, the CRLF after a chunk,
//! trailer fields). The client's response bodies and the server's request bodies share it; the
//! other way is [`super::write`].

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Frame, SizeHint};

/// The longest chunk-size line accepted (extensions included).
const MAX_CHUNK_LINE: usize = 4 << 10;
/// Bytes of chunk extensions in one body, all lines together (hyper's budget): extensions are
/// ignored, so a body of one-byte chunks with long extensions would otherwise cost a reader
/// unbounded work for no data.
const MAX_EXTENSION_BYTES: usize = 16 << 10;
/// Trailer fields of one body, all together, and how many.
const MAX_TRAILER_BYTES: usize = 16 << 10;
const MAX_TRAILERS: usize = super::headers::MAX_HEADERS;

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
    // upstream body, each moved on the way to the first token: the rare map must not size them.
    trailers: Option<Box<HeaderMap>>,
    /// Chunk-extension bytes read so far (see [`MAX_EXTENSION_BYTES`]).
    extension_bytes: usize,
}

impl Decoder {
    fn with(state: State) -> Decoder {
        Decoder {
            state,
            trailers: None,
            extension_bytes: 0,
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
    /// it finds malformed. Every line ends with CRLF (RFC 9112 §7.1); a bare CR or LF is
    /// malformed, as hyper has it.
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
                    let (size, extension) = chunk_size(&buf[..end])?;
                    self.extension_bytes += extension;
                    if self.extension_bytes > MAX_EXTENSION_BYTES {
                        return Err(Malformed("too many chunk-extension bytes"));
                    }
                    buf.advance(end + 1);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::Data(size)
                    };
                }
                State::DataEnd => match buf.first() {
                    None => return Ok(()),
                    Some(b'\r') if buf.len() < 2 => return Ok(()),
                    Some(b'\r') if buf[1] == b'\n' => {
                        buf.advance(2);
                        self.state = State::Size;
                    }
                    Some(_) => return Err(Malformed("no CRLF after a chunk")),
                },
                State::Trailers => {
                    match buf.first() {
                        None => return Ok(()),
                        Some(b'\r') if buf.len() < 2 => return Ok(()),
                        Some(b'\r') if buf[1] == b'\n' => {
                            buf.advance(2);
                            self.state = State::Done;
                            continue;
                        }
                        Some(_) => {}
                    }
                    let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") else {
                        if buf.len() > MAX_TRAILER_BYTES {
                            return Err(Malformed("trailers too large"));
                        }
                        return Ok(());
                    };
                    let section = end + 4;
                    if section > MAX_TRAILER_BYTES {
                        return Err(Malformed("trailers too large"));
                    }
                    self.trailers = Some(Box::new(trailers(&buf[..section])?));
                    buf.advance(section);
                    self.state = State::Done;
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

/// A chunk-size line's size and how many bytes its extensions take, the line given up to its
/// LF: `1*HEXDIG`, optional spaces or tabs, optional `;` extensions without CR or LF, then CR
/// (RFC 9112 §7.1.1). Leading zeros are allowed; a size past `u64` is not. This is hyper's
/// grammar, which the differential tests hold it to; `httparse::parse_chunk_size` is not used
/// because it takes a bare LF inside an extension and refuses more than 16 digits.
fn chunk_size(line: &[u8]) -> Result<(u64, usize), Malformed> {
    const NOT_HEX: Malformed = Malformed("a chunk size that is not hex");
    let line = line
        .strip_suffix(b"\r")
        .ok_or(Malformed("a chunk-size line without CRLF"))?;
    let (size, digits) = hex_prefix(line, usize::MAX).ok_or(NOT_HEX)?;
    if digits == 0 {
        return Err(NOT_HEX);
    }
    let rest = &line[digits..];
    let blank = rest
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let extension = &rest[blank..];
    if !(extension.is_empty() || extension[0] == b';') {
        return Err(NOT_HEX);
    }
    if extension.contains(&b'\r') {
        return Err(Malformed("a bare CR in a chunk-size line"));
    }
    Ok((size, extension.len()))
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
        // Past `max` digits, or past `u64`: not a size this reader takes.
        if digits == max || value >> 60 != 0 {
            return None;
        }
        value = value << 4 | u64::from(digit);
    }
    Some((value, bytes.len()))
}

/// A trailer section (its fields and the empty line that ends it), parsed as a head's fields
/// are (`httparse`, fuzzed upstream): a field that does not parse is malformed, as in a head.
fn trailers(section: &[u8]) -> Result<HeaderMap, Malformed> {
    const BAD: Malformed = Malformed("a malformed trailer field");
    let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILERS];
    let parsed = match httparse::parse_headers(section, &mut fields) {
        // All of the section, up to its CRLF CRLF: a bare LF that ended it sooner is malformed.
        Ok(httparse::Status::Complete((len, parsed))) if len == section.len() => parsed,
        Ok(httparse::Status::Complete(_)) => return Err(BAD),
        Ok(httparse::Status::Partial) => return Err(BAD),
        Err(httparse::Error::TooManyHeaders) => return Err(Malformed("too many trailer fields")),
        Err(_) => return Err(BAD),
    };
    let mut map = HeaderMap::with_capacity(parsed.len());
    for field in parsed {
        let name = HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| BAD)?;
        let value = HeaderValue::from_bytes(field.value).map_err(|_| BAD)?;
        map.append(name, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    /// One chunk of a generated body: its data, the size's case, an extension, leading zeros.
    #[derive(Debug, Clone)]
    struct Chunk {
        data: Vec<u8>,
        upper: bool,
        extension: bool,
        zeros: bool,
    }

    fn chunk() -> impl Strategy<Value = Chunk> {
        (
            proptest::collection::vec(any::<u8>(), 1..300),
            any::<bool>(),
            proptest::bool::weighted(0.2),
            proptest::bool::weighted(0.1),
        )
            .prop_map(|(data, upper, extension, zeros)| Chunk {
                data,
                upper,
                extension,
                zeros,
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
            if c.zeros {
                wire.extend_from_slice(b"000");
            }
            wire.extend_from_slice(size.as_bytes());
            if c.extension {
                wire.extend_from_slice(b" ;name=value");
            }
            wire.extend_from_slice(b"\r\n");
            wire.extend_from_slice(&c.data);
            wire.extend_from_slice(b"\r\n");
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

    /// A bare CR or LF in chunk framing was read as a line end: a front end that reads the same
    /// bytes otherwise (the classic two-hop desync) would see another body. No such body may be
    /// read as complete, however the bytes are cut.
    #[test]
    fn bare_cr_and_lf_in_chunk_framing_are_refused() {
        for wire in [
            &b"5\r\r\nhello\r\n0\r\n\r\n"[..],
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhello\r\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nx: 1\n\r\n",
            b"5\r\nhello\r\n0\r\nno colon\r\n\r\n",
            b"5\r\nhello\r\n0\r\n x: folded\r\n\r\n",
            b"5\r\nhello\r\n0\n\r\n",
        ] {
            for cut in 0..wire.len() {
                let mut decoder = Decoder::chunked();
                let got = frames(&mut decoder, &[&wire[..cut], &wire[cut..]]);
                assert!(
                    got.is_err() || !decoder.is_done(),
                    "{:?} cut at {cut} read as a whole body",
                    String::from_utf8_lossy(wire)
                );
            }
        }
    }

    /// Extensions are read and thrown away; past a budget per body they are refused, however
    /// they are spread over chunks.
    #[test]
    fn chunk_extensions_have_a_budget_per_body() {
        let ext = format!(";{}", "e".repeat(1000));
        let mut wire = Vec::new();
        for _ in 0..16 {
            wire.extend_from_slice(format!("1{ext}\r\nx\r\n").as_bytes());
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        assert!(frames(&mut Decoder::chunked(), &[&wire]).is_ok());
        let mut over = wire[..wire.len() - 5].to_vec();
        over.extend_from_slice(format!("1{ext}\r\nx\r\n0\r\n\r\n").as_bytes());
        assert_eq!(
            frames(&mut Decoder::chunked(), &[&over]).unwrap_err(),
            Malformed("too many chunk-extension bytes")
        );
    }

    #[test]
    fn a_close_ends_only_a_close_delimited_body_cleanly() {
        assert!(Decoder::until_close().close());
        assert!(!Decoder::length(3).close());
        assert!(!Decoder::chunked().close());
    }

    #[test]
    fn chunk_size_lines_are_read_as_hex_with_extensions_ignored() {
        for (line, size, extension) in [
            ("0\r", 0, 0),
            ("1a\r", 26, 0),
            ("1A\r", 26, 0),
            ("Ff;name=value\r", 255, 11),
            ("10 \t;ext\r", 16, 4),
            ("0000000000000000001\r", 1, 0),
            ("ffffffffffffffff\r", u64::MAX, 0),
        ] {
            assert_eq!(
                chunk_size(line.as_bytes()),
                Ok((size, extension)),
                "{line:?}"
            );
        }
        for line in [
            "",
            "\r",
            "1",
            "1\r\r",
            ";ext\r",
            "g\r",
            "1 2\r",
            "-1\r",
            "+1\r",
            "0x10\r",
            "10000000000000000\r",
            "1;a\rb\r",
        ] {
            assert!(chunk_size(line.as_bytes()).is_err(), "{line:?}");
        }
    }
}
