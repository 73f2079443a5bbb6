//! Message heads, both ways: a client's request head read by the server ([`parse_request`]),
//! the server's response head written to the client ([`encode_response`]), the model server's
//! response head read by the client ([`parse_response`]). Start lines and targets are judged
//! here; every field rule comes from [`super::headers`].

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};

use super::body::Decoder;
use super::headers::{self, Codings, Connection, Hop, Invalid, MAX_HEADERS};
use super::write::put_field;

/// Request header fields whose places a head's parse keeps on the stack: most clients send
/// fewer (openai-python's requests, browsers'); more spill to the heap.
const PLACES_INLINE: usize = 24;

/// What the response depends on in the request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exchange {
    pub(crate) version: Version,
    pub(crate) head_method: bool,
    pub(crate) keep_alive: bool,
    pub(crate) trailers: bool,
}

/// A parsed request head and how its body is framed.
pub(crate) struct RequestHead {
    /// Boxed where it is parsed, for its way to the upstream (see `server::Service`).
    pub(crate) parts: Box<http::request::Parts>,
    pub(crate) body: Decoder,
    pub(crate) expect_continue: bool,
    pub(crate) exchange: Exchange,
}

/// A request the server answers itself, and the connection closes: what status, why, and what
/// was known of the request when it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) reason: &'static str,
    pub(crate) method: Option<Method>,
    pub(crate) path: Option<String>,
}

impl Refusal {
    fn new(status: StatusCode, reason: &'static str) -> Refusal {
        Refusal {
            status,
            reason,
            method: None,
            path: None,
        }
    }

    pub(crate) fn bad(reason: &'static str) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, reason)
    }

    pub(crate) fn too_large() -> Refusal {
        Refusal::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "the request head is too large",
        )
    }

    /// With the method and target, when they parsed.
    fn of(mut self, method: Option<&str>, target: Option<&str>) -> Refusal {
        self.method = method.and_then(|m| Method::from_bytes(m.as_bytes()).ok());
        self.path = target.map(|t| t.chars().take(256).collect());
        self
    }
}

/// Parses a request head at the front of `buf`, taking it off; `None` while it is incomplete.
pub(crate) fn parse_request(buf: &mut BytesMut) -> Result<Option<RequestHead>, Refusal> {
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let length = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut parsed,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal::too_large().of(parsed.method, parsed.path))
        }
        Err(_) => {
            return Err(
                Refusal::bad("the request head does not parse").of(parsed.method, parsed.path)
            )
        }
    };
    let refuse = |reason| Refusal::bad(reason).of(parsed.method, parsed.path);
    // Where each part lies in the buffer, so the parts can be slices of the frozen head.
    let base = buf.as_ptr() as usize;
    let span = |part: &[u8]| {
        let start = part.as_ptr() as usize - base;
        start..start + part.len()
    };
    let method_text = parsed.method.unwrap_or("");
    let method = Method::from_bytes(method_text.as_bytes())
        .map_err(|_| refuse("a method that is not a token"))?;
    let target = parsed.path.unwrap_or("");
    target_form(&method, target.as_bytes()).map_err(|Invalid(why)| refuse(why))?;
    let path = span(target.as_bytes());
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Where each field's name and value lie (the fields borrow `buf`, which the split below
    // takes): on the stack for as many fields as most requests carry, in a vector beyond.
    let count = parsed.headers.len();
    let mut inline = [[0u32; 4]; PLACES_INLINE];
    let mut spilled = Vec::new();
    let places = if count <= PLACES_INLINE {
        &mut inline[..count]
    } else {
        spilled.resize(count, [0u32; 4]);
        &mut spilled[..]
    };
    for (place, field) in places.iter_mut().zip(parsed.headers.iter()) {
        let (name, value) = (span(field.name.as_bytes()), span(field.value));
        *place = [name.start, name.end, value.start, value.end].map(|i| i as u32);
    }
    let method_at = span(method_text.as_bytes());
    let head = buf.split_to(length).freeze();
    let text = |at: std::ops::Range<usize>| std::str::from_utf8(&head[at]).ok();
    let refuse = |reason| Refusal::bad(reason).of(text(method_at.clone()), text(path.clone()));
    let uri = Uri::from_maybe_shared(head.slice(path.clone()))
        .map_err(|_| refuse("a target that is not a URI"))?;
    // One pass builds the map and reads what the connection needs from it: the map's own
    // lookups would hash a name each time.
    let mut headers = HeaderMap::with_capacity(count);
    let mut connection = Connection::default();
    let (mut transfer_coded, mut lengths) = (false, 0usize);
    let (mut expect_continue, mut expected, mut trailers) = (false, false, false);
    for &[name_start, name_end, start, end] in places.iter() {
        let name = HeaderName::from_bytes(&head[name_start as usize..name_end as usize])
            .map_err(|_| refuse("a field name that is not a token"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(start as usize..end as usize))
            .map_err(|_| refuse("a field value with a forbidden byte"))?;
        match Hop::of(name.as_str().as_bytes()) {
            Some(Hop::Connection) => connection.read(value.as_bytes()),
            Some(Hop::TransferEncoding) => transfer_coded = true,
            Some(Hop::Other) if name == header::TE => {
                trailers |=
                    headers::tokens(value.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"trailers"));
            }
            _ if name == header::CONTENT_LENGTH => lengths += 1,
            // The first `Expect` decides, as a lookup of the field would.
            _ if name == header::EXPECT && !std::mem::replace(&mut expected, true) => {
                expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
            }
            _ => {}
        }
        headers.append(name, value);
    }
    let expect_continue = expect_continue && version == Version::HTTP_11;
    let mut keep_alive = connection.persists(version == Version::HTTP_10);
    let body = if transfer_coded {
        if version == Version::HTTP_10 {
            return Err(refuse("Transfer-Encoding in an HTTP/1.0 request"));
        }
        // Only `chunked`, once: a body in another coding would reach the upstream without it
        // (the field is hop-by-hop), so such a request is not served (RFC 9112 §6.1: 501).
        let one_chunked = {
            let values = headers.get_all(header::TRANSFER_ENCODING);
            let mut codings = values.iter().flat_map(|v| headers::tokens(v.as_bytes()));
            matches!(
                (codings.next(), codings.next()),
                (Some(c), None) if c.eq_ignore_ascii_case(b"chunked")
            )
        };
        if !one_chunked {
            {
                let mut refusal = refuse("a transfer coding other than one chunked");
                refusal.status = StatusCode::NOT_IMPLEMENTED;
                return Err(refusal);
            }
        }
        // A length beside the coding must still be a length (hyper refuses it otherwise): such
        // a message is suspect enough (RFC 9112 §6.3) without one that does not parse.
        let values = headers.get_all(header::CONTENT_LENGTH).iter();
        headers::content_length(values.map(HeaderValue::as_bytes))
            .map_err(|Invalid(why)| refuse(why))?;
        if headers.remove(header::CONTENT_LENGTH).is_some() {
            // Both: the chunked framing wins and the length goes, so the upstream cannot read
            // the body by it; the connection ends after the response (RFC 9112 §6.3).
            keep_alive = false;
        }
        Decoder::chunked()
    } else {
        let values = headers.get_all(header::CONTENT_LENGTH).iter();
        // A list in one field (`5, 5`) is refused, as hyper and nginx refuse it; the same
        // length in several fields goes on as one field (RFC 9110 §8.6 allows either).
        let listed = headers.get_all(header::CONTENT_LENGTH).iter();
        if listed.into_iter().any(|v| v.as_bytes().contains(&b',')) {
            return Err(refuse("a Content-Length list"));
        }
        let length = headers::content_length(values.map(HeaderValue::as_bytes))
            .map_err(|Invalid(why)| refuse(why))?;
        if let (Some(n), true) = (length, lengths > 1) {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        Decoder::length(length.unwrap_or(0))
    };
    let head_method = method == Method::HEAD;
    // `Parts` can only be had from a `Request`; an empty one is made in its box and filled.
    let mut parts = Box::new(Request::new(()).into_parts().0);
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(Some(RequestHead {
        parts,
        body,
        expect_continue,
        exchange: Exchange {
            version,
            head_method,
            keep_alive,
            trailers,
        },
    }))
}

/// A request target's form (RFC 9112 §3.2): origin-form (`/path?query`) and absolute-form
/// (`http://host/path`) for any method, asterisk-form (`*`) for OPTIONS only, authority-form
/// (`host:port`) for CONNECT only. Anything else (`models`, `example.com:80` with GET) is not a
/// target this server can forward: a guess at its meaning is how two hops disagree.
fn target_form(method: &Method, target: &[u8]) -> Result<(), Invalid> {
    const NEITHER: Invalid =
        Invalid("a request target that is neither origin-form nor absolute-form");
    match target.first() {
        Some(b'/') => Ok(()),
        Some(b'*') if target.len() == 1 && method == Method::OPTIONS => Ok(()),
        _ if method == Method::CONNECT => Ok(()),
        _ => {
            let absolute = target.iter().position(|&b| b == b':').is_some_and(|colon| {
                let scheme = &target[..colon];
                (scheme.eq_ignore_ascii_case(b"http") || scheme.eq_ignore_ascii_case(b"https"))
                    && target[colon + 1..].starts_with(b"//")
                    && target.len() > colon + 3
            });
            if absolute {
                Ok(())
            } else {
                Err(NEITHER)
            }
        }
    }
}

/// How a response body is framed on the wire to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Out {
    /// No body (HEAD, 1xx, 204, 304).
    None,
    /// The response's own `Content-Length`.
    Length(u64),
    /// A size the body knows: `Content-Length` added.
    Exact(u64),
    Chunked,
    /// Until the connection closes (HTTP/1.0 without a known length).
    Close,
}

impl Out {
    /// How a response to `exchange` with `status`, the headers' declared length (already
    /// judged by [`headers::content_length`]) and the body's exact size is framed. A HEAD
    /// answer says the length a GET would have only when it was declared: a body's size is
    /// that of the HEAD answer's empty body, not the GET's (RFC 9110 §9.3.2).
    pub(crate) fn of(
        status: StatusCode,
        declared: Option<u64>,
        exact: Option<u64>,
        exchange: &Exchange,
    ) -> Out {
        if no_body(status) {
            return Out::None;
        }
        match (declared, exact) {
            (Some(n), _) => Out::Length(n),
            _ if exchange.head_method => Out::None,
            (None, Some(n)) => Out::Exact(n),
            (None, None) if exchange.version == Version::HTTP_11 => Out::Chunked,
            (None, None) => Out::Close,
        }
    }
}

/// Statuses whose responses never have a body (RFC 9110 §6.4.1).
pub(crate) fn no_body(status: StatusCode) -> bool {
    status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// Statuses whose responses may not carry `Content-Length` (RFC 9110 §8.6).
fn no_length(status: StatusCode) -> bool {
    status.is_informational() || status == StatusCode::NO_CONTENT
}

/// The most [`encode_response`] writes besides the fields, the reason phrase and the transfer
/// codings: the status line's frame and CRLF, a `date` field, the longest framing field
/// (`content-length` with 20 digits), `connection: keep-alive` and the blank line.
const ADDED_FIELDS: usize = 15 + 37 + 38 + 24 + 2;

/// The response head for the client, with the fields the framing and the connection need; the
/// answer's own hop-by-hop and framing fields never go through (the framing is the server's).
///
/// `codings`: transfer codings the body's bytes are in besides chunked (see
/// [`TransferCodings`]), named before the one `chunked`. An HTTP/1.0 client, which has no
/// transfer codings, gets the bytes as they are.
pub(crate) fn encode_response(
    version: Version,
    status: StatusCode,
    headers: &HeaderMap,
    framing: Out,
    keep: bool,
    asked_keep_alive: bool,
    codings: Option<&TransferCodings>,
) -> Bytes {
    // Room for all of it at once: the status line, the fields, and what is added below (a
    // date, the framing, `connection`), so the head is never reallocated on its way out.
    let reason = status.canonical_reason().unwrap_or("");
    let codings_len = codings.map_or(0, |TransferCodings(c)| c.len() + 2);
    let mut out = Vec::with_capacity(
        ADDED_FIELDS
            + reason.len()
            + codings_len
            + headers
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len() + 4)
                .sum::<usize>(),
    );
    let room = out.capacity();
    out.extend_from_slice(if version == Version::HTTP_10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    let length_goes = matches!(framing, Out::Length(_)) && !no_length(status);
    // Whether the answer has a date, seen on the way: a lookup would hash the name again.
    let mut dated = false;
    for (name, value) in headers {
        if Hop::of(name.as_str().as_bytes()).is_some() {
            continue;
        }
        if name == header::CONTENT_LENGTH && !(length_goes || (status == StatusCode::NOT_MODIFIED))
        {
            continue;
        }
        dated |= name == header::DATE;
        put_field(&mut out, name, value);
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        date::write(&mut out);
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Out::Exact(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(n.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Out::Chunked => {
            out.extend_from_slice(b"transfer-encoding: ");
            if let Some(TransferCodings(codings)) = codings {
                out.extend_from_slice(codings.as_bytes());
                out.extend_from_slice(b", ");
            }
            out.extend_from_slice(b"chunked\r\n");
        }
        Out::None | Out::Length(_) | Out::Close => {}
    }
    if !keep {
        out.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::HTTP_10 && asked_keep_alive {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    debug_assert!(
        out.len() <= room,
        "the head outgrew its buffer: {} > {room}",
        out.len()
    );
    Bytes::from(out)
}

/// The `date` field's value, formatted once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }

    pub(super) fn write(out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        CACHED.with(|cached| {
            let mut cached = cached.borrow_mut();
            if cached.0 != second {
                *cached = (second, httpdate::fmt_http_date(now));
            }
            out.extend_from_slice(cached.1.as_bytes());
        });
    }
}

/// The end of a body: for a chunked one, the last chunk, and the trailers if the client takes
/// them, but never a field a trailer may not carry (RFC 9110 §6.5.1).
pub(crate) fn encode_last_chunk(trailers: Option<HeaderMap>, send_trailers: bool) -> Option<Bytes> {
    let trailers = trailers.filter(|t| send_trailers && !t.is_empty())?;
    let mut out = b"0\r\n".to_vec();
    for (name, value) in &trailers {
        if headers::trailer_allowed(name) {
            put_field(&mut out, name, value);
        }
    }
    out.extend_from_slice(b"\r\n");
    Some(Bytes::from(out))
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    Close,
}

/// The transfer codings an upstream applied besides `chunked` (`gzip` of `Transfer-Encoding:
/// gzip, chunked`), kept in the response's extensions: the field is hop-by-hop and goes, but
/// the body's bytes stay in those codings, so the client's framing must name them again.
#[derive(Debug, Clone)]
pub(crate) struct TransferCodings(pub(crate) HeaderValue);

/// Parses a final response head off the front of `buf` (1xx answers are dropped); `None` until
/// a whole head is buffered. Gives the head, how its body is framed, and whether the
/// connection may be kept. The head's hop-by-hop fields are read here for the framing and the
/// connection and never enter the map; a `Content-Length` that stays is one field of one value.
// Not inlined: inlined into the exchange, its header fields would make every request's future
// larger, copied to the heap on every request.
#[inline(never)]
pub(crate) fn parse_response(
    buf: &mut BytesMut,
    is_head: bool,
) -> Result<Option<(Response<()>, Framing, bool)>, Invalid> {
    loop {
        // Nothing read yet (the request was just sent): no head to look for.
        if buf.is_empty() {
            return Ok(None);
        }
        // Uninitialised: filling every field first costs more than parsing a short head.
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            buf,
            &mut fields,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(Invalid("too many header fields")),
            Err(_) => return Err(Invalid("a malformed response head")),
        };
        let code = parsed.code.unwrap_or(0);
        // RFC 9110 §15: three digits, 100 to 599; anything else is not a status to forward.
        if !(100..=599).contains(&code) {
            return Err(Invalid("a status code out of range"));
        }
        let status =
            StatusCode::from_u16(code).map_err(|_| Invalid("a status code out of range"))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(Invalid("101 Switching Protocols (no upgrades)"));
        }
        if status.is_informational() {
            buf.advance(len);
            continue;
        }
        let version = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        let mut headers = HeaderMap::with_capacity(parsed.headers.len());
        let mut connection = Connection::default();
        let (mut transfer_coded, mut lengths) = (false, 0usize);
        for field in parsed.headers.iter() {
            let name = field.name.as_bytes();
            match Hop::of(name) {
                Some(Hop::Connection) => connection.read(field.value),
                Some(Hop::TransferEncoding) => transfer_coded = true,
                Some(Hop::Other) => {}
                None => {
                    let name =
                        HeaderName::from_bytes(name).map_err(|_| Invalid("a header name"))?;
                    let value = HeaderValue::from_bytes(field.value)
                        .map_err(|_| Invalid("a header value"))?;
                    lengths += usize::from(name == header::CONTENT_LENGTH);
                    headers.append(name, value);
                }
            }
            continue;
        }
        let transfer = || {
            parsed
                .headers
                .iter()
                .filter(|f| Hop::of(f.name.as_bytes()) == Some(Hop::TransferEncoding))
                .map(|f| f.value)
        };
        // 1xx answers were skipped above: what `no_body` adds to HEAD is 204 and 304.
        let bodiless = is_head || no_body(status);
        let mut codings = None;
        let faulty = transfer_coded && version == Version::HTTP_10;
        if faulty && !bodiless {
            // Faulty framing (RFC 9112 §6.1): not read, and the connection not kept.
            return Err(Invalid("Transfer-Encoding in an HTTP/1.0 response"));
        }
        let framing = if transfer_coded {
            // The transfer coding wins over a length (RFC 9112 §6.3), which goes, or the client
            // would stop reading at the wrong place.
            headers.remove(header::CONTENT_LENGTH);
            let read = headers::codings(transfer());
            if read == Codings::ChunkedTwice {
                return Err(Invalid("a body chunked more than once"));
            }
            if read != Codings::Chunked {
                codings = headers::codings_besides_chunked(transfer()).map(TransferCodings);
            }
            match read {
                _ if bodiless => Framing::Empty,
                Codings::Chunked | Codings::OthersThenChunked => Framing::Chunked,
                Codings::NotChunkedLast | Codings::ChunkedTwice => Framing::Close,
            }
        } else {
            let values = headers.get_all(header::CONTENT_LENGTH).iter();
            let length = headers::content_length(values.map(HeaderValue::as_bytes))?;
            if let Some(n) = length {
                if lengths > 1 || headers[header::CONTENT_LENGTH].as_bytes().contains(&b',') {
                    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
                }
            }
            match length {
                _ if bodiless => Framing::Empty,
                Some(0) => Framing::Empty,
                Some(n) => Framing::Length(n),
                None => Framing::Close,
            }
        };
        if connection.names_fields {
            // Fields the upstream named as its connection's own go too.
            let named = parsed
                .headers
                .iter()
                .filter(|f| Hop::of(f.name.as_bytes()) == Some(Hop::Connection))
                .map(|f| f.value);
            headers::remove_named(&mut headers, named);
        }
        // A bodiless answer with faulty framing is read (it has no body) but closes after.
        let keep_alive = connection.persists(version == Version::HTTP_10) && !faulty;
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = version;
        if let Some(codings) = codings.filter(|_| framing != Framing::Empty) {
            response.extensions_mut().insert(codings);
        }
        *response.headers_mut() = headers;
        buf.advance(len);
        return Ok(Some((response, framing, keep_alive)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str) -> Result<RequestHead, Refusal> {
        let mut buf = BytesMut::from(text.as_bytes());
        parse_request(&mut buf).map(|head| head.expect("a whole head"))
    }

    /// A target that is no form a proxy can forward was rewritten to `/` and answered 200.
    #[test]
    fn only_origin_and_absolute_form_targets_are_served() {
        for ok in [
            "GET / HTTP/1.1\r\nhost: x\r\n\r\n",
            "GET /v1/models?x=1 HTTP/1.1\r\nhost: x\r\n\r\n",
            "GET http://x/v1/models HTTP/1.1\r\nhost: x\r\n\r\n",
            "GET HTTPS://x:8/ HTTP/1.1\r\nhost: x\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n",
            "CONNECT x:443 HTTP/1.1\r\nhost: x\r\n\r\n",
        ] {
            assert!(request(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "GET models HTTP/1.1\r\nhost: x\r\n\r\n",
            "GET example.com:80 HTTP/1.1\r\nhost: x\r\n\r\n",
            "GET * HTTP/1.1\r\nhost: x\r\n\r\n",
            "GET http:/x HTTP/1.1\r\nhost: x\r\n\r\n",
            "GET ftp://x/ HTTP/1.1\r\nhost: x\r\n\r\n",
        ] {
            let refusal = request(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} served"));
            assert_eq!(refusal.status, StatusCode::BAD_REQUEST, "{bad:?}");
            assert_eq!(refusal.method, Some(Method::GET));
        }
    }

    /// `Content-Length: 5, 5` went on as it came: a list is refused, as hyper and nginx refuse
    /// it, and two fields of one value go on as one.
    #[test]
    fn a_repeated_length_goes_on_as_one_value() {
        for text in [
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 05\r\nContent-Length: 5\r\n\r\n",
        ] {
            let head = request(text).unwrap();
            let values: Vec<_> = head
                .parts
                .headers
                .get_all(header::CONTENT_LENGTH)
                .iter()
                .collect();
            assert_eq!(values, ["5"], "{text:?}");
            assert_eq!(head.body.left(), Some(5));
        }
        for text in [
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5, 6\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
        ] {
            assert_eq!(request(text).err().unwrap().status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn refusals_say_what_was_known() {
        let refusal = request("POST /v1/x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n")
            .err()
            .unwrap();
        assert_eq!(refusal.status, StatusCode::NOT_IMPLEMENTED);
        assert_eq!(refusal.method, Some(Method::POST));
        assert_eq!(refusal.path.as_deref(), Some("/v1/x"));
        let refusal = request("GET / HTTP/1.1\r\nbad header\r\n\r\n")
            .err()
            .unwrap();
        assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
    }

    /// Parses one response head (to a GET).
    fn response(text: &str) -> Result<(Response<()>, Framing, bool), Invalid> {
        let mut buf = BytesMut::from(text.as_bytes());
        let parsed = parse_response(&mut buf, false)?.expect("a whole head");
        assert!(buf.is_empty(), "the head was consumed: {buf:?}");
        Ok(parsed)
    }

    fn names(response: &Response<()>) -> Vec<&str> {
        let mut names: Vec<_> = response.headers().keys().map(|k| k.as_str()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_response_heads_hop_by_hop_fields_are_read_and_left_behind() {
        let (response, framing, keep_alive) = response(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop, content-length\r\nKeep-Alive: timeout=5\r\n\
             x-hop: 1\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\nupgrade: h2c\r\n\
             proxy-connection: keep-alive\r\ncontent-type: text/event-stream\r\n\
             x-request-id: abc\r\nx-hop-not: 2\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            names(&response),
            ["content-type", "x-hop-not", "x-request-id"]
        );
        assert_eq!(framing, Framing::Chunked);
        assert!(keep_alive);
        assert!(response.extensions().get::<TransferCodings>().is_none());
    }

    /// A response with both framings used to reach the client with the Content-Length, which
    /// cut its body short; `chunked` said twice was sent on twice over a body chunked once.
    #[test]
    fn transfer_encoding_wins_and_chunked_is_one_framing() {
        for text in [
            "HTTP/1.1 200 OK\r\ncontent-length: 10\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nContent-Length: 10\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, Chunked\r\n\r\n",
        ] {
            let (response, framing, _) = response(text).unwrap();
            assert!(response.headers().is_empty(), "{text}: {response:?}");
            assert_eq!(framing, Framing::Chunked, "{text}");
            assert!(
                response.extensions().get::<TransferCodings>().is_none(),
                "{text}"
            );
        }
        let (_, framing, _) =
            response("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n").unwrap();
        assert_eq!(framing, Framing::Close);
        assert!(
            response("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip, chunked\r\n\r\n")
                .is_err()
        );
        let codings = |text: &str| {
            response(text)
                .unwrap()
                .0
                .extensions()
                .get::<TransferCodings>()
                .map(|TransferCodings(v)| v.clone())
        };
        assert_eq!(
            codings(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            .unwrap(),
            "gzip"
        );
        assert_eq!(
            codings("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked, chunked\r\n\r\n")
                .unwrap(),
            "gzip"
        );
        assert_eq!(
            codings("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n").unwrap(),
            "gzip"
        );
    }

    /// `+5` was read as 5 (hyper's CVE-2021-32715) and `5, 5` reached the client as two fields.
    #[test]
    fn a_response_length_is_strict_and_one_field() {
        for bad in ["+5", "-5", "5 5", "0x5", "5, 6", "", "lots"] {
            let text = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert!(response(&text).is_err(), "{bad:?}");
        }
        assert!(
            response("HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n").is_err()
        );
        for text in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\n",
        ] {
            let (response, framing, _) = response(text).unwrap();
            let values: Vec<_> = response
                .headers()
                .get_all(header::CONTENT_LENGTH)
                .iter()
                .collect();
            assert_eq!(values, ["5"]);
            assert_eq!(framing, Framing::Length(5));
        }
    }

    #[test]
    fn the_connection_field_and_version_say_whether_it_stays_open() {
        let keeps = |text: &str| response(text).unwrap().2;
        assert!(keeps("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(!keeps(
            "HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!keeps(
            "HTTP/1.1 200 OK\r\nconnection: x-a, close\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!keeps("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(keeps(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!keeps(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        ));
        // HTTP/1.0 with Transfer-Encoding: faulty framing, not read (RFC 9112 §6.1); it stayed
        // in the pool.
        assert!(response(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        .is_err());
    }

    /// A status outside 100-599 was forwarded (and 600 recorded `ok`).
    #[test]
    fn a_status_out_of_range_is_invalid() {
        for code in ["600", "099", "000", "999"] {
            let text = format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n");
            assert!(response(&text).is_err(), "{code}");
        }
        assert!(response("HTTP/1.1 599 X\r\ncontent-length: 0\r\n\r\n").is_ok());
    }

    fn exchange(head_method: bool) -> Exchange {
        Exchange {
            version: Version::HTTP_11,
            head_method,
            keep_alive: true,
            trailers: true,
        }
    }

    /// A HEAD answer got a `content-length: 0` the GET would not have had, and a 204 kept the
    /// upstream's length.
    #[test]
    fn head_and_204_answers_carry_no_invented_length() {
        let ok = StatusCode::OK;
        assert_eq!(Out::of(ok, None, Some(0), &exchange(true)), Out::None);
        assert_eq!(
            Out::of(ok, Some(7), Some(0), &exchange(true)),
            Out::Length(7)
        );
        assert_eq!(Out::of(ok, None, Some(3), &exchange(false)), Out::Exact(3));
        assert_eq!(
            Out::of(StatusCode::NO_CONTENT, Some(0), Some(0), &exchange(false)),
            Out::None
        );
        let mut fields = HeaderMap::new();
        fields.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        let head = encode_response(
            Version::HTTP_11,
            StatusCode::NO_CONTENT,
            &fields,
            Out::None,
            true,
            true,
            None,
        );
        assert!(
            !String::from_utf8_lossy(&head).contains("content-length"),
            "{head:?}"
        );
        let head = encode_response(
            Version::HTTP_11,
            ok,
            &HeaderMap::new(),
            Out::None,
            true,
            true,
            None,
        );
        assert!(
            !String::from_utf8_lossy(&head).contains("content-length"),
            "{head:?}"
        );
        fields.insert(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        let head = encode_response(
            Version::HTTP_11,
            ok,
            &fields,
            Out::Length(7),
            true,
            true,
            None,
        );
        assert!(
            String::from_utf8_lossy(&head).contains("content-length: 7\r\n"),
            "{head:?}"
        );
    }

    /// `content-length`, `transfer-encoding` and `host` passed to the client as trailers.
    #[test]
    fn forbidden_trailer_fields_are_not_sent() {
        let mut trailers = HeaderMap::new();
        for (name, value) in [
            ("content-length", "10"),
            ("transfer-encoding", "chunked"),
            ("host", "evil"),
            ("x-checksum", "1"),
        ] {
            trailers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let last = encode_last_chunk(Some(trailers), true).unwrap();
        assert_eq!(&last[..], b"0\r\nx-checksum: 1\r\n\r\n");
    }
}
