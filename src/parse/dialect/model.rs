//! The model a response names (`gen_ai.response.model`), read from one event.
//!
//! Servers name the model that answered in the first event of a stream (or in the whole body):
//! a top-level `model` (OpenAI chat and completions, vLLM, SGLang, TGI's Messages API,
//! llama.cpp's OpenAI API, Ollama), `message.model` in Anthropic's `message_start`, and
//! `response.model` in the Responses API's `response.created`. The reader asks only until it
//! has an answer or the first output event has passed, so this runs about once per response,
//! never per frame.
//!
//! The reading is the strict cursor's (see `scan`): JSON that cursor does not accept before the
//! model, a key with an escape, or a `model` that is not a string gives no model, never a wrong
//! one. What follows the model is not read: the event's meaning is the dialect's to judge.

use super::scan::Cursor;

/// The longest model name kept; a longer one is not a model name and is ignored.
pub(crate) const MAX_RESPONSE_MODEL_BYTES: usize = 256;

/// The model `data` names: its top-level `model`, else `message.model`, else `response.model`.
/// `None` when none is a non-empty string of at most [`MAX_RESPONSE_MODEL_BYTES`].
pub(crate) fn response_model(data: &[u8]) -> Option<Box<str>> {
    let mut cursor = Cursor::new(data)?;
    let mut members = cursor.object()?;
    let mut nested = None;
    while let Some(key) = cursor.key(&mut members)? {
        match key {
            b"model" => return model_string(&mut cursor),
            b"message" | b"response" if nested.is_none() && cursor.peek()? == b'{' => {
                nested = inner_model(&mut cursor)?;
            }
            _ => cursor.skip_value()?,
        }
    }
    nested
}

/// The `model` member of the object at the cursor, consuming the whole object.
fn inner_model(cursor: &mut Cursor) -> Option<Option<Box<str>>> {
    let mut members = cursor.object()?;
    let mut found = None;
    while let Some(key) = cursor.key(&mut members)? {
        if key == b"model" && found.is_none() {
            // A `model` that is not a usable name: no model, not one from elsewhere.
            found = Some(model_string(cursor)?);
        } else {
            cursor.skip_value()?;
        }
    }
    Some(found)
}

/// The string value at the cursor, unescaped, when it is a usable model name.
fn model_string(cursor: &mut Cursor) -> Option<Box<str>> {
    if cursor.peek()? != b'"' {
        return None;
    }
    let raw = cursor.raw()?;
    if raw.len() > MAX_RESPONSE_MODEL_BYTES + 2 {
        return None;
    }
    // Escapes are rare in model names: serde_json undoes them on the few bytes of the string.
    let name: String = match raw.contains(&b'\\') {
        false => std::str::from_utf8(&raw[1..raw.len() - 1]).ok()?.to_owned(),
        true => serde_json::from_slice(raw).ok()?,
    };
    (!name.is_empty() && name.len() <= MAX_RESPONSE_MODEL_BYTES).then(|| name.into_boxed_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(json: &str) -> Option<String> {
        response_model(json.as_bytes()).map(String::from)
    }

    #[test]
    fn the_model_is_found_where_each_api_puts_it() {
        assert_eq!(
            model(
                r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-2024-08-06","choices":[]}"#
            ),
            Some("gpt-4o-2024-08-06".into())
        );
        assert_eq!(
            model(
                r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"claude-3-5-sonnet-20241022","content":[]}}"#
            ),
            Some("claude-3-5-sonnet-20241022".into())
        );
        assert_eq!(
            model(
                r#"{"type":"response.created","response":{"id":"r","status":"in_progress","model":"gpt-4.1"}}"#
            ),
            Some("gpt-4.1".into())
        );
        // A top-level model wins over a nested one, wherever it comes.
        assert_eq!(
            model(r#"{"message":{"model":"inner"},"model":"outer"}"#),
            Some("outer".into())
        );
        assert_eq!(model(r#"{"model":"a\/b\u0041"}"#), Some("a/bA".into()));
        // Ollama's NDJSON line, with whitespace.
        assert_eq!(
            model("{ \"model\" : \"llama3.2\", \"created_at\": \"2024\", \"response\": \"Hi\" }"),
            Some("llama3.2".into())
        );
    }

    #[test]
    fn no_model_is_better_than_a_wrong_one() {
        for json in [
            "",
            "[DONE]",
            "{}",
            r#"{"model":""}"#,
            r#"{"model":null}"#,
            r#"{"model":7}"#,
            r#"{"model":["a"]}"#,
            r#"{"response":"text","token":{"id":1}}"#,
            r#"{"choices":[{"delta":{"model":"not top level"}}]}"#,
            r#"{"message":{"model":1}}"#,
        ] {
            assert_eq!(model(json), None, "{json}");
        }
        let long = format!(
            r#"{{"model":"{}"}}"#,
            "m".repeat(MAX_RESPONSE_MODEL_BYTES + 1)
        );
        assert_eq!(model(&long), None);
        let longest = format!(r#"{{"model":"{}"}}"#, "m".repeat(MAX_RESPONSE_MODEL_BYTES));
        assert_eq!(
            model(&longest).map(|m| m.len()),
            Some(MAX_RESPONSE_MODEL_BYTES)
        );
    }

    #[test]
    fn the_reading_agrees_with_serde_json_on_every_prefix_of_a_chunk() {
        let chunk = r#"{"id":"c","object":"chat.completion.chunk","model":"m\u00e9","choices":[{"index":0,"delta":{"content":"x"}}]}"#;
        let reference = |text: &str| -> Option<String> {
            let v: serde_json::Value = serde_json::from_str(text).ok()?;
            v.get("model")?.as_str().map(String::from)
        };
        // Cut anywhere the whole is no longer JSON: the cursor answers nothing or what
        // serde_json would read from a whole text with the same start.
        for end in 0..=chunk.len() {
            if !chunk.is_char_boundary(end) {
                continue;
            }
            let text = &chunk[..end];
            let got = model(text);
            if let Some(m) = &got {
                assert_eq!(Some(m.clone()), reference(chunk), "prefix {end}");
            }
        }
        assert_eq!(model(chunk), reference(chunk));
    }
}
