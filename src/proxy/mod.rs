//! Floor 6, `proxy`: the HTTP around the measurement. The [`server`] binds the listeners and
//! drains them; the [`listener`] accepts connections and says whether the proxy is ready; a
//! [`connection`] speaks HTTP/1.1 with the proxy's own server ([`http1`], where every HTTP/1.1
//! rule lives; what a client sends is a [`client_body`]) or HTTP/2 with hyper's; the [`service`] takes one
//! request through: a [`Recorder`](crate::measure::Recorder) started,
//! the [`request_body`] read in passing for `model`, the request sent by [`forward`], the
//! response handed back timed (the upstream client is the proxy's own, [`http1::client`]); each [`shard`] is a thread that serves the clients it accepted.
//! A connection's waits (for a client's next request, for an upstream's response head) run on
//! one [`lazy_timer`] for the connection's life.
//! [`admin`] serves what was published; [`generation`] is the configuration in force and its
//! reload; [`error`] is the one place errors become HTTP.

pub(crate) mod admin;
pub(crate) mod client_body;
pub(crate) mod connection;
pub(crate) mod engine_metrics;
pub(crate) mod error;
pub(crate) mod forward;
pub(crate) mod generation;
pub(crate) mod http1;
pub(crate) mod lazy_timer;
pub(crate) mod listener;
pub(crate) mod request_body;
pub(crate) mod server;
pub(crate) mod service;
pub(crate) mod shard;

pub use generation::{Overrides, Reloaded};
pub use listener::accept;
pub use server::{start, Running, StartError};

/// Any error a body or service may end with, boxed.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
