//! Every header-field rule of the HTTP/1.1 stack, once, for both sides: the server reading a
//! client's request head and the client reading the model server's response head apply the
//! same functions, so a field cannot mean one thing on one side and another on the other.
//!
//! - [`content_length`]: strict `1*DIGIT` (RFC 9110 §8.6), a list or repeated field of one value
//!   normalised to that value, anything else refused;
//! - [`Hop`] and [`strip_hop_by_hop`]: the fields that belong to one connection (RFC 9110
//!   §7.6.1), read for the framing and never forwarded, and those a `Connection` field names;
//! - [`Connection`]: what `Connection` tokens say (close, keep-alive, names of other fields),
//!   never able to name `Host` or a framing field the proxy writes itself;
//! - [`Codings`]: what `Transfer-Encoding` says (RFC 9112 §6.1): chunked last, or other codings;
//! - [`trailer_allowed`]: the fields a trailer section may not carry (RFC 9110 §6.5.1);
//! - [`MAX_HEADERS`]: how many fields a head may have, on both sides.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Header fields a head may carry, request or response (hyper's default too).
pub(crate) const MAX_HEADERS: usize = 100;

/// Why a head's fields cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Invalid(pub(crate) &'static str);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// The one `Content-Length` parser (RFC 9110 §8.6): each value of each field is a list of
/// `1*DIGIT` items; every item must be the same number, which is the length. No sign, no
/// whitespace inside a number, no empty item, nothing over `u64` (hyper's CVE-2021-32715 was a
/// `+` read as a digit). `None`: no field at all.
pub(crate) fn content_length<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<u64>, Invalid> {
    let mut length = None;
    for value in values {
        for item in value.split(|&b| b == b',') {
            let n = digits(item.trim_ascii())
                .ok_or(Invalid("a Content-Length that is not a number"))?;
            match length {
                Some(l) if l != n => return Err(Invalid("Content-Length values that differ")),
                _ => length = Some(n),
            }
        }
    }
    Ok(length)
}

/// A decimal number of ASCII digits only, that fits a `u64`.
fn digits(item: &[u8]) -> Option<u64> {
    if item.is_empty() {
        return None;
    }
    item.iter().try_fold(0u64, |n, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// The tokens of a comma-separated field value (RFC 9110 §5.6.1), trimmed, empty ones left out.
pub(crate) fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// The fields that belong to one connection and are never forwarded (RFC 9110 §7.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hop {
    Connection,
    TransferEncoding,
    /// `Keep-Alive`, `Proxy-Connection`, `TE`, `Upgrade`: read where needed (`TE`), never sent on.
    Other,
}

impl Hop {
    /// Whether `name` (any case) is hop-by-hop, and which.
    pub(crate) fn of(name: &[u8]) -> Option<Hop> {
        // By length first: most names are none of these, and most lengths match none.
        let is = |hop: &[u8]| name.eq_ignore_ascii_case(hop);
        match name.len() {
            2 if is(b"te") => Some(Hop::Other),
            7 if is(b"upgrade") => Some(Hop::Other),
            10 if is(b"connection") => Some(Hop::Connection),
            10 if is(b"keep-alive") => Some(Hop::Other),
            16 if is(b"proxy-connection") => Some(Hop::Other),
            17 if is(b"transfer-encoding") => Some(Hop::TransferEncoding),
            _ => None,
        }
    }
}

/// What the `Connection` fields of a head say.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Connection {
    /// `close`.
    pub(crate) close: bool,
    /// `keep-alive` (what an HTTP/1.0 peer says to keep the connection open).
    pub(crate) keep_alive: bool,
    /// It names other fields, which go with the hop.
    pub(crate) names_fields: bool,
}

impl Connection {
    /// Reads one `Connection` field's value into what was read so far.
    pub(crate) fn read(&mut self, value: &[u8]) {
        for token in tokens(value) {
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else {
                self.names_fields = true;
            }
        }
    }

    /// Whether the connection stays open after this message: HTTP/1.1 unless `close`; HTTP/1.0
    /// only with `keep-alive` and without `close` (RFC 9112 §9.3).
    pub(crate) fn persists(&self, http_10: bool) -> bool {
        if http_10 {
            self.keep_alive && !self.close
        } else {
            !self.close
        }
    }
}

/// Fields a `Connection` token may not remove: the proxy makes sure of `Host` and writes the
/// framing itself, so a client or server naming them cannot take them from the other hop
/// (RFC 9112 §3.2: an HTTP/1.1 request without `Host` is invalid).
fn survives_connection(name: &HeaderName) -> bool {
    name == header::HOST || name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING
}

/// Removes a head's fields that belong to one connection (RFC 9110 §7.6.1): those named by
/// `Connection` (but [`survives_connection`]), and the fixed set. One pass over the names finds
/// which of the fixed set are there (most heads carry none), and only those are removed.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut present = [false; 3];
    let mut any = false;
    for name in headers.keys() {
        if let Some(hop) = Hop::of(name.as_str().as_bytes()) {
            present[hop as usize] = true;
            any = true;
        }
    }
    if !any {
        return;
    }
    if present[Hop::Connection as usize] {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| tokens(v.as_bytes()))
            .filter_map(|name| HeaderName::from_bytes(name).ok())
            .filter(|name| !survives_connection(name))
            .collect();
        for name in named {
            headers.remove(name);
        }
        headers.remove(header::CONNECTION);
    }
    if present[Hop::TransferEncoding as usize] {
        headers.remove(header::TRANSFER_ENCODING);
    }
    if present[Hop::Other as usize] {
        const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
        const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
        for name in [PROXY_CONNECTION, KEEP_ALIVE, header::TE, header::UPGRADE] {
            headers.remove(name);
        }
    }
}

/// Removes the fields a `Connection` value names from `headers` (but [`survives_connection`]):
/// for a head whose hop-by-hop fields were left out of the map as it was parsed.
pub(crate) fn remove_named<'a>(headers: &mut HeaderMap, values: impl Iterator<Item = &'a [u8]>) {
    for name in values.flat_map(tokens) {
        if let Ok(name) = HeaderName::from_bytes(name) {
            if !survives_connection(&name) {
                headers.remove(name);
            }
        }
    }
}

/// What the `Transfer-Encoding` fields of a message say (RFC 9112 §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codings {
    /// `chunked` alone, however often repeated at the end: one chunked framing (a sender that
    /// repeats it did not chunk twice; nothing is ever chunked twice on the way on).
    Chunked,
    /// Other codings, then `chunked`: the body is chunked over bytes in those codings.
    OthersThenChunked,
    /// `chunked` is not last (or there is no coding): a response runs to the close; a request
    /// cannot be framed (RFC 9112 §6.3).
    NotChunkedLast,
    /// `chunked` before another coding and again at the end: chunked twice, which no sender may
    /// do; the message's framing is invalid.
    ChunkedTwice,
}

/// Reads the values of a message's `Transfer-Encoding` fields, in order.
pub(crate) fn codings<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Codings {
    // One pass, nothing collected: how many `chunked` end the list, whether other codings
    // came, and whether a `chunked` came before one of them.
    let (mut run, mut others, mut chunked_then_other) = (0usize, false, false);
    for coding in values.into_iter().flat_map(tokens) {
        if coding.eq_ignore_ascii_case(b"chunked") {
            run += 1;
        } else {
            chunked_then_other |= run > 0;
            run = 0;
            others = true;
        }
    }
    match (run, others) {
        (0, _) => Codings::NotChunkedLast,
        (_, false) => Codings::Chunked,
        _ if chunked_then_other => Codings::ChunkedTwice,
        _ => Codings::OthersThenChunked,
    }
}

/// The codings of `Transfer-Encoding` values besides every `chunked`, joined (`gzip` of
/// `gzip, chunked`): the field is hop-by-hop and goes, but the body's bytes stay in those
/// codings, so the next hop's framing must name them again, then one `chunked`.
pub(crate) fn codings_besides_chunked<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Option<HeaderValue> {
    let others: Vec<&[u8]> = values
        .into_iter()
        .flat_map(tokens)
        .filter(|c| !c.eq_ignore_ascii_case(b"chunked"))
        .collect();
    if others.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&others.join(&b", "[..])).ok()
}

/// Whether a field may be sent in a trailer section (RFC 9110 §6.5.1): none that frames the
/// message, routes it, controls it or authenticates it, none that is hop-by-hop.
pub(crate) fn trailer_allowed(name: &HeaderName) -> bool {
    use http::header as h;
    if Hop::of(name.as_str().as_bytes()).is_some() {
        return false;
    }
    ![
        h::CONTENT_LENGTH,
        h::HOST,
        h::TRAILER,
        h::CONTENT_TYPE,
        h::CONTENT_ENCODING,
        h::CONTENT_RANGE,
        h::AUTHORIZATION,
        h::PROXY_AUTHORIZATION,
        h::PROXY_AUTHENTICATE,
        h::WWW_AUTHENTICATE,
        h::SET_COOKIE,
        h::COOKIE,
        h::CACHE_CONTROL,
        h::EXPECT,
        h::MAX_FORWARDS,
        h::PRAGMA,
        h::RANGE,
        h::AGE,
        h::EXPIRES,
        h::DATE,
        h::LOCATION,
        h::RETRY_AFTER,
        h::VARY,
        h::WARNING,
    ]
    .contains(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn length(values: &[&str]) -> Result<Option<u64>, Invalid> {
        content_length(values.iter().map(|v| v.as_bytes()))
    }

    #[test]
    fn content_length_is_strict_digits_and_one_value() {
        assert_eq!(length(&[]), Ok(None));
        assert_eq!(length(&["5"]), Ok(Some(5)));
        assert_eq!(length(&["0"]), Ok(Some(0)));
        assert_eq!(length(&["5, 5"]), Ok(Some(5)));
        assert_eq!(length(&["5", "5"]), Ok(Some(5)));
        assert_eq!(length(&[" 007 "]), Ok(Some(7)));
        assert_eq!(length(&["18446744073709551615"]), Ok(Some(u64::MAX)));
        // CVE-2021-32715 was a sign read as part of the number.
        for bad in [
            "+5",
            "-5",
            "5 5",
            "0x5",
            "5,",
            ",5",
            "",
            "5;",
            "five",
            "18446744073709551616",
            "١",
        ] {
            assert!(length(&[bad]).is_err(), "{bad:?}");
        }
        assert_eq!(
            length(&["5", "6"]),
            Err(Invalid("Content-Length values that differ"))
        );
        assert!(length(&["5, 6"]).is_err());
    }

    #[test]
    fn transfer_codings_are_read_as_one_list() {
        let read = |values: &[&str]| codings(values.iter().map(|v| v.as_bytes()));
        assert_eq!(read(&["chunked"]), Codings::Chunked);
        assert_eq!(read(&["Chunked "]), Codings::Chunked);
        assert_eq!(read(&["chunked", "chunked"]), Codings::Chunked);
        assert_eq!(read(&["chunked, chunked"]), Codings::Chunked);
        assert_eq!(read(&["gzip, chunked"]), Codings::OthersThenChunked);
        assert_eq!(read(&["gzip", "chunked"]), Codings::OthersThenChunked);
        assert_eq!(read(&["chunked, gzip"]), Codings::NotChunkedLast);
        assert_eq!(read(&["chunked, gzip, chunked"]), Codings::ChunkedTwice);
        assert_eq!(read(&["gzip"]), Codings::NotChunkedLast);
        assert_eq!(read(&[""]), Codings::NotChunkedLast);
        assert_eq!(read(&[" , "]), Codings::NotChunkedLast);
        let besides =
            |values: &[&str]| codings_besides_chunked(values.iter().map(|v| v.as_bytes()));
        assert_eq!(besides(&["x-a,gzip ,chunked"]).unwrap(), "x-a, gzip");
        assert_eq!(besides(&["gzip", "Chunked"]).unwrap(), "gzip");
        assert!(besides(&["chunked", "chunked"]).is_none());
    }

    #[test]
    fn connection_tokens_say_close_keep_alive_and_named_fields() {
        let mut c = Connection::default();
        c.read(b"Keep-Alive, x-hop");
        assert!(c.keep_alive && c.names_fields && !c.close);
        assert!(c.persists(true) && c.persists(false));
        c.read(b"close");
        assert!(!c.persists(true) && !c.persists(false));
        assert!(!Connection::default().persists(true));
        assert!(Connection::default().persists(false));
    }

    /// `Connection: host` stripped `Host` after the proxy made sure there was one: the upstream
    /// got an HTTP/1.1 request without it.
    #[test]
    fn hop_by_hop_fields_go_but_never_host_nor_framing() {
        let mut h = HeaderMap::new();
        h.append(
            "connection",
            HeaderValue::from_static("keep-alive, x-hop, host"),
        );
        h.append(
            "connection",
            HeaderValue::from_static("content-length, Transfer-Encoding"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("upgrade", HeaderValue::from_static("h2c"));
        h.insert("proxy-connection", HeaderValue::from_static("close"));
        h.insert("host", HeaderValue::from_static("upstream"));
        h.insert("content-length", HeaderValue::from_static("3"));
        h.insert("authorization", HeaderValue::from_static("Bearer x"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", "content-length", "host"]);
    }

    #[test]
    fn trailers_never_carry_framing_routing_or_hop_fields() {
        for name in [
            "content-length",
            "transfer-encoding",
            "host",
            "connection",
            "te",
            "trailer",
            "authorization",
            "content-type",
            "set-cookie",
        ] {
            assert!(!trailer_allowed(&HeaderName::from_static(name)), "{name}");
        }
        for name in ["x-checksum", "grpc-status", "server-timing"] {
            assert!(trailer_allowed(&HeaderName::from_static(name)), "{name}");
        }
    }
}
