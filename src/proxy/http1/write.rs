//! What goes out on an HTTP/1.1 connection: a [`WriteQueue`] holds a head and the frames of a
//! body with their chunk framing, and writes them with vectored writes, never copying a frame.
//! The client's requests and the server's responses share it; the way in is [`super::body`].

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::{HeaderName, HeaderValue};
use tokio::net::TcpStream;

/// Buffers in one `writev`.
const MAX_SLICES: usize = 64;
/// Slices of a write when few pieces are queued (up to two frames' worth).
const FEW_SLICES: usize = 8;
/// Bytes queued ahead of a socket past which no more frames are taken from a body: a peer that
/// does not read holds back the other side, not the proxy's memory.
pub(crate) const GATHER_BYTES: usize = 16 << 10;

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
            let sent = super::socket::send_vectored(stream, &slices);
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
                self.write_front(|slices| super::socket::send_vectored(stream, slices))
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
    use std::time::Duration;

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
