//! The places the HTTP/1.1 stack goes around tokio's socket API, all here, each with a test that
//! fails if tokio's behaviour under it changes:
//!
//! - [`forget_readable`]: clears tokio's read readiness after a read that drained the socket,
//!   as tokio's own `poll_read` does after a short read; relies on readiness being re-armed by
//!   the next edge (new bytes, a close) and not by the clearing itself.
//! - [`send_vectored`]: a `writev` on the raw socket without asking tokio's readiness first;
//!   relies on a `WouldBlock` from it leaving tokio believing the socket writable, so that the
//!   caller's next `try_write_vectored` through tokio meets the `WouldBlock` itself and clears
//!   the readiness, after which `poll_write_ready` waits for real.
//! - [`is_open`]: whether a connection that sat idle is still open, without a system call while
//!   tokio has seen nothing arrive (its readiness polled with a no-op waker), else one
//!   `recv(MSG_PEEK)`.
//! - [`Watcher`]: a waker that notes that the client's socket woke the task, so a streaming
//!   response polls the client's socket only after it did.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// Forgets that `stream` is readable: call after a read that left room in the buffer, so took
/// all the socket held. Bytes that arrive afterwards raise a new readiness event.
pub(crate) fn forget_readable(stream: &TcpStream) {
    let _ = stream.try_io(Interest::READABLE, || {
        Err::<(), _>(io::ErrorKind::WouldBlock.into())
    });
}

/// One `writev` on the raw socket, whatever tokio believes of its readiness.
pub(crate) fn send_vectored(stream: &TcpStream, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    socket2::SockRef::from(stream).send_vectored(slices)
}

/// Whether the peer has not closed an idle connection nor sent anything unasked.
pub(crate) fn is_open(stream: &TcpStream) -> bool {
    let mut quiet = Context::from_waker(Waker::noop());
    if stream.poll_read_ready(&mut quiet).is_pending() {
        return true;
    }
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    match socket2::SockRef::from(stream).peek(&mut byte) {
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        Ok(_) => false,
    }
}

/// The waker a client's socket holds while a response streams: it notes that the socket woke
/// the task, then wakes the task.
pub(crate) struct Watcher {
    waker: Waker,
    shared: Arc<WatchWake>,
    /// The socket holds `waker`: until it is woken, polling the socket again finds nothing new.
    pub(crate) armed: bool,
}

struct WatchWake {
    woken: AtomicBool,
    /// The task's waker when the watcher was made (a new one is made if it changes).
    task: Waker,
}

impl Watcher {
    pub(crate) fn new(task: &Waker) -> Watcher {
        let shared = Arc::new(WatchWake {
            woken: AtomicBool::new(false),
            task: task.clone(),
        });
        Watcher {
            waker: Waker::from(Arc::clone(&shared)),
            shared,
            armed: false,
        }
    }

    /// Whether this watcher wakes `task`.
    pub(crate) fn wakes(&self, task: &Waker) -> bool {
        self.shared.task.will_wake(task)
    }

    /// Whether the socket woke the task since the last call (and forgets it).
    pub(crate) fn take_woken(&self) -> bool {
        self.shared.woken.swap(false, Ordering::AcqRel)
    }

    /// The waker to hand the socket.
    pub(crate) fn waker(&self) -> &Waker {
        &self.waker
    }
}

impl Wake for WatchWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake_by_ref();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Poll;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (far, _) = listener.accept().await.unwrap();
        (near, far)
    }

    fn read_ready_now(stream: &TcpStream) -> bool {
        let mut quiet = Context::from_waker(Waker::noop());
        stream.poll_read_ready(&mut quiet).is_ready()
    }

    /// Cleared readiness must come back with the next bytes: if it did not, a connection would
    /// sleep forever with a request waiting in its socket.
    #[tokio::test]
    async fn forgotten_readiness_returns_with_new_bytes() {
        let (near, mut far) = pair().await;
        far.write_all(b"one").await.unwrap();
        near.readable().await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(near.try_read(&mut buf).unwrap(), 3);
        forget_readable(&near);
        assert!(!read_ready_now(&near), "tokio kept the readiness");
        far.write_all(b"two").await.unwrap();
        tokio::time::timeout(DEADLINE, near.readable())
            .await
            .expect("new bytes make the socket readable again")
            .unwrap();
        assert_eq!(near.try_read(&mut buf).unwrap(), 3);
    }

    /// A raw write that meets a full socket leaves tokio believing it writable; the caller's
    /// write through tokio then meets `WouldBlock` itself, and only after that does tokio wait
    /// for room and wake the task when the peer reads.
    #[tokio::test]
    async fn a_full_socket_is_waited_for_through_tokio_after_a_raw_write() {
        let (near, mut far) = pair().await;
        let block = vec![7u8; 64 << 10];
        let mut sent = 0usize;
        loop {
            match send_vectored(&near, &[IoSlice::new(&block)]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let mut quiet = Context::from_waker(Waker::noop());
        assert!(
            near.poll_write_ready(&mut quiet).is_ready(),
            "tokio saw the raw write's WouldBlock"
        );
        let through = near.try_write_vectored(&[IoSlice::new(&block)]);
        assert_eq!(through.unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(near.poll_write_ready(&mut quiet).is_pending());
        let drained = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < sent {
                got += far.read(&mut buf).await.unwrap();
            }
            far
        });
        tokio::time::timeout(DEADLINE, near.writable())
            .await
            .expect("woken when the peer read")
            .unwrap();
        drop(drained.await.unwrap());
    }

    /// Open while quiet; not open once the peer sent something unasked or closed.
    #[tokio::test]
    async fn an_idle_connection_is_open_until_the_peer_speaks_or_closes() {
        let (near, mut far) = pair().await;
        assert!(is_open(&near));
        far.write_all(b"x").await.unwrap();
        tokio::time::timeout(DEADLINE, near.readable())
            .await
            .unwrap()
            .unwrap();
        assert!(!is_open(&near), "unasked bytes");
        let (near, far) = pair().await;
        drop(far);
        tokio::time::timeout(DEADLINE, near.readable())
            .await
            .unwrap()
            .unwrap();
        assert!(!is_open(&near), "closed");
        // Readiness left over from an earlier drained read is checked with a peek, not trusted.
        let (near, mut far) = pair().await;
        far.write_all(b"y").await.unwrap();
        near.readable().await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(near.try_read(&mut buf).unwrap(), 1);
        assert!(read_ready_now(&near));
        assert!(is_open(&near));
    }

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The watcher's waker, handed to tokio, is woken by the socket and wakes the task.
    #[tokio::test]
    async fn a_watcher_notes_the_sockets_wake_and_wakes_the_task() {
        let (near, mut far) = pair().await;
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(count.clone());
        let watcher = Watcher::new(&task);
        assert!(watcher.wakes(&task));
        assert!(!watcher.take_woken());
        let mut cx = Context::from_waker(watcher.waker());
        assert!(matches!(near.poll_read_ready(&mut cx), Poll::Pending));
        far.write_all(b"z").await.unwrap();
        tokio::time::timeout(DEADLINE, near.readable())
            .await
            .unwrap()
            .unwrap();
        assert!(watcher.take_woken());
        assert!(!watcher.take_woken());
        assert!(count.0.load(Ordering::SeqCst) >= 1);
    }
}
