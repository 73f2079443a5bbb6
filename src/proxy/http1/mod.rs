//! HTTP/1.1, the proxy's own, by concern (as hyper's `proto/h1` and pingora's `http/v1` are):
//! every rule the proxy applies to HTTP/1.1 bytes is in this module, once.
//!
//! | module | holds |
//! |---|---|
//! | [`headers`] | every header-field rule both sides use: `Content-Length`, `Transfer-Encoding`, `Connection`, hop-by-hop fields, trailer fields, the field count |
//! | [`head`] | request and response heads: start lines, targets, which framing a head gives its body |
//! | [`body`] | bodies on the way in: the length, chunked and close-delimited decoder |
//! | [`request_body`] | a client's request body read from its socket as the upstream takes it, `100 Continue`; how a client fails its body |
//! | [`write`] | what goes out: heads and bodies (chunk framing) gathered into vectored writes |
//! | [`socket`] | the places the stack goes around tokio's socket API, each pinned by a test |
//! | [`server`] | the server side: a client's connection, its requests and the answers |
//! | [`client`] | the client side: a request to the model server, up to its response head |
//! | [`pool`] | the model server's keep-alive connections, and the response body that gives one back |
//!
//! HTTP/2 is hyper's (`proxy/connection.rs`); the rules there are hyper's own.

pub(crate) mod body;
pub(crate) mod client;
pub(crate) mod head;
pub(crate) mod headers;
pub(crate) mod pool;
pub(crate) mod request_body;
pub(crate) mod server;
pub(crate) mod socket;
pub(crate) mod write;

#[cfg(test)]
mod differential;
