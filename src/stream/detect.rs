//! Choosing, once per response, how its body is framed and which dialect speaks in it.
//!
//! Framing comes from the response's `Content-Type`, the dialect from the request path. A body
//! with any content coding but `identity` is opaque: its bytes are compressed and the reader
//! cannot see events in them, so it does not try.

use super::{Dialect, Framing};

/// Chooses framing and dialect once per response, from the request path and the response
/// `Content-Type` and `Content-Encoding`.
///
/// Content type `text/event-stream` is [`Framing::Sse`]; `application/x-ndjson`,
/// `application/jsonl` and `application/x-jsonlines` are [`Framing::Ndjson`];
/// `application/json` and any `+json` type are [`Framing::Json`]; anything else, a missing type
/// or a content coding other than `identity` is [`Framing::Opaque`]. The dialect is read from the
/// path without its query: `.../chat/completions` is [`Dialect::OpenAiChat`],
/// `.../completions` is [`Dialect::OpenAiCompletions`].
///
/// An opaque body always comes with [`Dialect::Unknown`], whatever the path: nothing in it can be
/// read, so the caller must judge it by bytes, never wait for an end marker it cannot see.
pub fn detect(
    path: &str,
    content_type: Option<&str>,
    content_encoding: Option<&str>,
) -> (Framing, Dialect) {
    let framing = if is_encoded(content_encoding) {
        Framing::Opaque
    } else {
        framing_of(content_type)
    };
    if framing == Framing::Opaque {
        return (Framing::Opaque, Dialect::Unknown);
    }
    (framing, dialect_of(path))
}

fn is_encoded(content_encoding: Option<&str>) -> bool {
    match content_encoding {
        None => false,
        Some(coding) => {
            let coding = coding.trim();
            !(coding.is_empty() || coding.eq_ignore_ascii_case("identity"))
        }
    }
}

fn framing_of(content_type: Option<&str>) -> Framing {
    let Some(content_type) = content_type else {
        return Framing::Opaque;
    };
    // Parameters (`; charset=utf-8`) do not change the framing.
    let essence = content_type.split(';').next().unwrap_or("").trim();
    let is = |name: &str| essence.eq_ignore_ascii_case(name);
    if is("text/event-stream") {
        Framing::Sse
    } else if is("application/x-ndjson") || is("application/jsonl") || is("application/x-jsonlines")
    {
        Framing::Ndjson
    } else if is("application/json") || ends_with_ignore_case(essence, "+json") {
        Framing::Json
    } else {
        Framing::Opaque
    }
}

fn dialect_of(path: &str) -> Dialect {
    let path = path.split(['?', '#']).next().unwrap_or("");
    // A trailing slash names the same resource for the servers we front.
    let path = path.trim_end_matches('/');
    if ends_with_ignore_case(path, "/chat/completions") {
        Dialect::OpenAiChat
    } else if ends_with_ignore_case(path, "/completions") {
        Dialect::OpenAiCompletions
    } else {
        Dialect::Unknown
    }
}

fn ends_with_ignore_case(s: &str, suffix: &str) -> bool {
    let (s, suffix) = (s.as_bytes(), suffix.as_bytes());
    s.len() >= suffix.len()
        && s.get(s.len() - suffix.len()..)
            .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_follows_content_type() {
        let f = |ct| detect("/v1/chat/completions", ct, None).0;
        assert_eq!(f(Some("text/event-stream")), Framing::Sse);
        assert_eq!(f(Some("text/event-stream; charset=utf-8")), Framing::Sse);
        assert_eq!(f(Some("Text/Event-Stream")), Framing::Sse);
        assert_eq!(f(Some("application/x-ndjson")), Framing::Ndjson);
        assert_eq!(f(Some("application/jsonl")), Framing::Ndjson);
        assert_eq!(f(Some("application/x-jsonlines")), Framing::Ndjson);
        assert_eq!(f(Some("application/json")), Framing::Json);
        assert_eq!(f(Some("application/json; charset=utf-8")), Framing::Json);
        assert_eq!(f(Some("application/problem+json")), Framing::Json);
        assert_eq!(f(Some("text/plain")), Framing::Opaque);
        assert_eq!(f(Some("")), Framing::Opaque);
        assert_eq!(f(None), Framing::Opaque);
    }

    #[test]
    fn dialect_follows_path_without_query() {
        let d = |path| detect(path, Some("text/event-stream"), None).1;
        assert_eq!(d("/v1/chat/completions"), Dialect::OpenAiChat);
        assert_eq!(
            d("/openai/v1/chat/completions?api-version=2"),
            Dialect::OpenAiChat
        );
        assert_eq!(d("/v1/chat/completions/"), Dialect::OpenAiChat);
        assert_eq!(d("/v1/completions"), Dialect::OpenAiCompletions);
        assert_eq!(
            d("/v1/completions?x=/chat/completions"),
            Dialect::OpenAiCompletions
        );
        assert_eq!(d("/v1/messages"), Dialect::Unknown);
        assert_eq!(d("/generate_stream"), Dialect::Unknown);
        assert_eq!(d("/"), Dialect::Unknown);
        assert_eq!(d(""), Dialect::Unknown);
        assert_eq!(d("completions"), Dialect::Unknown);
    }

    #[test]
    fn compressed_bodies_are_opaque() {
        let ct = Some("text/event-stream");
        let p = "/v1/chat/completions";
        assert_eq!(
            detect(p, ct, Some("gzip")),
            (Framing::Opaque, Dialect::Unknown)
        );
        assert_eq!(
            detect(p, ct, Some("br")),
            (Framing::Opaque, Dialect::Unknown)
        );
        assert_eq!(
            detect(p, ct, Some("identity")),
            (Framing::Sse, Dialect::OpenAiChat)
        );
        assert_eq!(detect(p, ct, Some("")), (Framing::Sse, Dialect::OpenAiChat));
        assert_eq!(detect(p, ct, None), (Framing::Sse, Dialect::OpenAiChat));
    }

    #[test]
    fn names_are_stable() {
        assert_eq!(Dialect::OpenAiChat.as_str(), "openai-chat");
        assert_eq!(Dialect::OpenAiCompletions.as_str(), "openai-completions");
        assert_eq!(Dialect::Unknown.as_str(), "unknown");
    }
}
