//! Shards: the client listener served by several single-threaded event loops, one per thread,
//! the way nginx runs one worker per core.
//!
//! A multi-threaded runtime with work stealing costs a sidecar more than it gives: at the load
//! of a model server (thousands of small frames a second, not a saturated core) a frame often
//! arrives while the other workers are parked, and the runtime wakes one to steal, so a frame
//! costs a futex wake and a context switch more (measured in `docs/performance-history.md`).
//! A shard instead serves the
//! connections it accepted from start to end on its own thread: a frame goes from the upstream
//! socket to the client socket in one task, on one thread, with one wake-up from `epoll`.
//!
//! Every shard accepts from the same listening socket (a duplicate of its descriptor registered
//! in the shard's own `epoll`), shard `k` only once `k × 512` connections are open
//! (`listener::SPILL`): one event loop serves a light load at the least CPU per frame, and more
//! join in as connections grow. Among the shards that accept, a new connection wakes them all and
//! the first to call `accept` takes it, so an idle shard tends to take it before a busy one. Upstream
//! connections are pooled per shard (see `http1/pool.rs`), so a connection is only ever driven by
//! the thread whose `epoll` watches it.

use std::cell::Cell;

/// Shards at most (the `--workers` range).
pub(crate) const MAX: usize = 256;

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(0) };
}

/// The shard this thread serves: 0 for the thread that started the proxy and any thread of
/// its runtime.
pub(crate) fn current() -> usize {
    SHARD.with(Cell::get)
}

/// Marks this thread as serving shard `index`.
pub(crate) fn enter(index: usize) {
    SHARD.with(|s| s.set(index % MAX));
}
