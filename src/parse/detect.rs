//! Choosing, once per response, how its body is framed and which dialect speaks in it.
//!
//! Framing comes from the response's `Content-Type`. A body with any content coding but
//! `identity` is opaque: its bytes are compressed and the reader cannot see events in them, so
//! it does not try. The dialect comes from the route's pinned dialect when it has one, else from
//! the request path when the path names one API; when it does not ([`Dialect::Auto`]) the reader
//! learns the dialect from the first events of the body.

use super::event::{Dialect, Framing};

/// Chooses framing and dialect once per response, from the request path, the response
/// `Content-Type` and `Content-Encoding`, and the dialect a route pins, if any.
///
/// Content type `text/event-stream` is [`Framing::Sse`]; `application/x-ndjson`,
/// `application/jsonl` and `application/x-jsonlines` are [`Framing::Ndjson`];
/// `application/json` and any `+json` type are [`Framing::Json`]; anything else, a missing type
/// or a content coding other than `identity` is [`Framing::Opaque`].
///
/// A `pinned` dialect is taken as it is (`Auto` to always sniff, `Unknown` to never read).
/// Otherwise the path, without its query and trailing slash, decides by its end:
///
/// | path ends with | dialect |
/// |---|---|
/// | `/chat/completions` | OpenAI chat |
/// | `/completions` (not the bare `/completions`, which llama.cpp also serves) | OpenAI completions |
/// | `/responses` | OpenAI Responses |
/// | `/v1/messages` | Anthropic |
/// | `/generate_stream` | TGI |
/// | `/api/generate`, `/api/chat` | Ollama |
/// | `/completion`, `/infill` | llama.cpp |
/// | anything else, including `/generate` (TGI and SGLang both serve it) | `Auto` |
///
/// `Auto` means: the first payload decides (see the reader). An opaque body always comes with
/// [`Dialect::Unknown`], whatever the path or the pin: nothing in it can be read, so the caller
/// must judge it by bytes, never wait for an end marker it cannot see.
pub fn detect(
    path: &str,
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    pinned: Option<Dialect>,
) -> (Framing, Dialect) {
    let framing = if is_encoded(content_encoding) {
        Framing::Opaque
    } else {
        framing_of(content_type)
    };
    if framing == Framing::Opaque {
        return (Framing::Opaque, Dialect::Unknown);
    }
    (framing, pinned.unwrap_or_else(|| dialect_of(path)))
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
    let ends = |suffix: &str| ends_with_ignore_case(path, suffix);
    if ends("/chat/completions") {
        Dialect::OpenAiChat
    } else if ends("/completions") && !path.eq_ignore_ascii_case("/completions") {
        Dialect::OpenAiCompletions
    } else if ends("/responses") {
        Dialect::OpenAiResponses
    } else if ends("/v1/messages") {
        Dialect::Anthropic
    } else if ends("/generate_stream") {
        Dialect::Tgi
    } else if ends("/api/generate") || ends("/api/chat") {
        Dialect::Ollama
    } else if ends("/completion") || ends("/infill") {
        Dialect::LlamaCpp
    } else {
        Dialect::Auto
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
        let f = |ct| detect("/v1/chat/completions", ct, None, None).0;
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
        let d = |path| detect(path, Some("text/event-stream"), None, None).1;
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
        assert_eq!(d("/v1/responses"), Dialect::OpenAiResponses);
        assert_eq!(d("/v1/messages"), Dialect::Anthropic);
        assert_eq!(d("/anthropic/v1/messages"), Dialect::Anthropic);
        assert_eq!(d("/generate_stream"), Dialect::Tgi);
        assert_eq!(d("/api/generate"), Dialect::Ollama);
        assert_eq!(d("/api/chat"), Dialect::Ollama);
        assert_eq!(d("/completion"), Dialect::LlamaCpp);
        assert_eq!(d("/infill"), Dialect::LlamaCpp);
        // Served by more than one server: the payload decides.
        assert_eq!(d("/generate"), Dialect::Auto);
        assert_eq!(d("/completions"), Dialect::Auto);
        assert_eq!(d("/v1/messages/count_tokens"), Dialect::Auto);
        assert_eq!(d("/"), Dialect::Auto);
        assert_eq!(d(""), Dialect::Auto);
        assert_eq!(d("completions"), Dialect::Auto);
    }

    #[test]
    fn a_pinned_dialect_wins() {
        let d = |path, pinned| detect(path, Some("text/event-stream"), None, pinned).1;
        assert_eq!(d("/generate", Some(Dialect::SgLang)), Dialect::SgLang);
        assert_eq!(
            d("/v1/chat/completions", Some(Dialect::Auto)),
            Dialect::Auto
        );
        assert_eq!(
            d("/v1/chat/completions", Some(Dialect::Unknown)),
            Dialect::Unknown
        );
        // Nothing can be read in a compressed body, pinned or not.
        assert_eq!(
            detect(
                "/x",
                Some("text/event-stream"),
                Some("gzip"),
                Some(Dialect::Tgi)
            ),
            (Framing::Opaque, Dialect::Unknown)
        );
    }

    #[test]
    fn compressed_bodies_are_opaque() {
        let ct = Some("text/event-stream");
        let p = "/v1/chat/completions";
        assert_eq!(
            detect(p, ct, Some("gzip"), None),
            (Framing::Opaque, Dialect::Unknown)
        );
        assert_eq!(
            detect(p, ct, Some("br"), None),
            (Framing::Opaque, Dialect::Unknown)
        );
        assert_eq!(
            detect(p, ct, Some("identity"), None),
            (Framing::Sse, Dialect::OpenAiChat)
        );
        assert_eq!(
            detect(p, ct, Some(""), None),
            (Framing::Sse, Dialect::OpenAiChat)
        );
        assert_eq!(
            detect(p, ct, None, None),
            (Framing::Sse, Dialect::OpenAiChat)
        );
    }

    #[test]
    fn names_are_stable_and_read_back() {
        let names = [
            (Dialect::OpenAiChat, "openai-chat"),
            (Dialect::OpenAiCompletions, "openai-completions"),
            (Dialect::OpenAiResponses, "openai-responses"),
            (Dialect::Anthropic, "anthropic"),
            (Dialect::Tgi, "tgi"),
            (Dialect::Ollama, "ollama"),
            (Dialect::LlamaCpp, "llamacpp"),
            (Dialect::SgLang, "sglang"),
            (Dialect::Auto, "auto"),
            (Dialect::Unknown, "unknown"),
        ];
        assert_eq!(names.len(), Dialect::ALL.len());
        for (dialect, name) in names {
            assert_eq!(dialect.as_str(), name);
            assert_eq!(dialect.to_string(), name);
            assert_eq!(name.parse::<Dialect>(), Ok(dialect));
        }
        let err = "openai".parse::<Dialect>().unwrap_err();
        assert_eq!(err, crate::parse::event::UnknownDialect("openai".into()));
        let message = err.to_string();
        assert!(
            message.contains("`openai`") && message.contains("`sglang`"),
            "{message}"
        );
        assert!("OpenAI-Chat".parse::<Dialect>().is_err(), "names are exact");
    }
}
