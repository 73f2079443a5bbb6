//! The OpenAI dialects: chat completions and legacy completions, streamed or whole.
//!
//! Chat: an event carries output when some choice's `delta` (or, in a whole body, `message`)
//! has non-empty `content`, `refusal`, `reasoning_content` or `reasoning`, or any `tool_calls`
//! (or legacy `function_call`); visible content is `content` and `refusal`, which a reader sees,
//! never reasoning or tool-call arguments. Together also sends a completions-style `text` on chat
//! chunks, beside `delta.content`: it counts as content, and the event still counts once, since
//! one event is one verdict. With `n > 1` choices interleave; an event with output in any choice
//! is one output event.
//!
//! Completions: output and content are a non-empty `choices[].text`.
//!
//! Both: `[DONE]` or any non-null `finish_reason` is the end marker (Cerebras never sends
//! `[DONE]`); `usage` may come in a trailing `choices: []` chunk, inside the finish chunk, or
//! cumulatively on every chunk; the latest is the count (with `n > 1` the trailing chunk holds
//! the sum over choices). A chunk of one choice that carries usage gives that choice's running
//! count (vLLM's `continuous_usage_stats`), so the tokens of an output event are the growth of
//! its choice's count since the choice's last output event; a chunk without choices holds a
//! total, not a running count, and is not used for that. A top-level `error` (or
//! `"object": "error"`, or an SSE event named `error`) is an error. A payload that is not JSON
//! is ignored, not an error: a stream is judged by its end marker, not by one odd line. Unknown
//! fields (`id`, `logprobs`, `obfuscation`, ...) are skipped unread.
//!
//! What explains the figures, read from the usage wherever it comes: cached prompt tokens from
//! `usage.prompt_tokens_details.cached_tokens` (OpenAI; vLLM with `--enable-prompt-tokens-details`,
//! SGLang with `--enable-cache-report`, llama.cpp always) or DeepSeek's
//! `usage.prompt_cache_hit_tokens`; reasoning tokens from
//! `usage.completion_tokens_details.reasoning_tokens` or SGLang's `usage.reasoning_tokens`.
//! llama.cpp adds its `timings` object to the last chunk (and to every chunk with
//! `timings_per_token`); vLLM's and SGLang's OpenAI servers report no timing in the body.

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::scan::{Cursor, Fields};
use super::{
    is_done, report_details, update, Alarm, Count, EngineReport, Finish, FinishReason, Index,
    OutputDetails, PromptDetails, Shape, Timings, ToolCalls, Tracks, Verdict,
};

/// One chunk of a stream, or a whole body: only the fields that matter here. Everything else
/// (`id`, `logprobs`, `system_fingerprint`, `obfuscation`, ...) is skipped by serde unread.
#[derive(Deserialize, Debug, Default, Clone, Copy)]
struct Chunk {
    #[serde(default)]
    choices: Choices,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, deserialize_with = "Alarm::error_field")]
    error: Alarm,
    #[serde(default, deserialize_with = "Alarm::object_field")]
    object: Alarm,
    /// llama.cpp's own timing, on the last chunk.
    #[serde(default)]
    timings: Option<Timings>,
}

#[derive(Deserialize, Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Usage {
    #[serde(default)]
    completion_tokens: Count,
    #[serde(default)]
    prompt_tokens: Count,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<OutputDetails>,
    /// SGLang puts its reasoning count beside the others.
    #[serde(default)]
    reasoning_tokens: Count,
    /// DeepSeek's name for cached prompt tokens.
    #[serde(default)]
    prompt_cache_hit_tokens: Count,
}

impl Usage {
    /// `usage` as serde_json reads it into this struct (`null`: `None`), or `None` (the outer)
    /// for anything it would not read the same way, which leaves the chunk to serde_json.
    fn scan(cursor: &mut Cursor, holes: &mut Holes) -> Option<Option<Usage>> {
        if cursor.peek()? == b'n' {
            cursor.null()?;
            return Some(None);
        }
        let mut members = cursor.object()?;
        // serde_json refuses a field named twice: so does this reading.
        let mut fields = Fields::default();
        let mut usage = Usage::default();
        while let Some(key) = cursor.key(&mut members)? {
            let field = match key {
                b"completion_tokens" => 0,
                b"prompt_tokens" => 1,
                b"reasoning_tokens" => 2,
                b"prompt_cache_hit_tokens" => 3,
                b"prompt_tokens_details" => 4,
                b"completion_tokens_details" => 5,
                _ => {
                    cursor.skip_value()?;
                    continue;
                }
            };
            fields.first(field)?;
            match field {
                0 => usage.completion_tokens = Count::of(holes.take(cursor, |_| Hole::Completion)?),
                1 => usage.prompt_tokens = Count::of(holes.take(cursor, |_| Hole::Prompt)?),
                2 => usage.reasoning_tokens = Count::of(cursor.raw()?),
                3 => usage.prompt_cache_hit_tokens = Count::of(cursor.raw()?),
                4 => {
                    usage.prompt_tokens_details = details(cursor, b"cached_tokens")?
                        .map(|cached_tokens| PromptDetails { cached_tokens });
                }
                _ => {
                    usage.completion_tokens_details = details(cursor, b"reasoning_tokens")?
                        .map(|reasoning_tokens| OutputDetails { reasoning_tokens });
                }
            }
        }
        Some(Some(usage))
    }

    fn report(&self, report: &mut EngineReport) {
        update(&mut report.cached_tokens, self.prompt_cache_hit_tokens.0);
        update(&mut report.reasoning_tokens, self.reasoning_tokens.0);
        report_details(
            self.prompt_tokens_details.as_ref(),
            self.completion_tokens_details.as_ref(),
            report,
        );
    }
}

/// A `*_details` object of usage with the one count read here, `name`, as serde_json reads it
/// into an `Option` of a struct of that count: `Some(None)` for `null`, `None` (leave the chunk to
/// serde_json) for anything but an object or null.
fn details(cursor: &mut Cursor, name: &[u8]) -> Option<Option<Count>> {
    if cursor.peek()? == b'n' {
        cursor.null()?;
        return Some(None);
    }
    let mut members = cursor.object()?;
    let mut count = None;
    while let Some(key) = cursor.key(&mut members)? {
        if key == name {
            if count.is_some() {
                return None;
            }
            count = Some(Count::of(cursor.raw()?));
        } else {
            cursor.skip_value()?;
        }
    }
    Some(Some(count.unwrap_or_default()))
}

impl Chunk {
    /// The chunk, read by the strict cursor when it can (the token chunks that are nearly all of
    /// a stream), else by serde_json; `None` when it is not a JSON object of this shape.
    /// A stream's chunks are read through its [`Template`] instead.
    fn read(data: &[u8]) -> Option<Chunk> {
        Chunk::scan(data, &mut Holes::default()).or_else(|| serde_json::from_slice(data).ok())
    }

    /// The cursor's reading (`scan`): `None` leaves the chunk to serde_json, which reads what
    /// the cursor does not: `timings`, tool calls, and anything unusual. The values whose
    /// bytes the reading does not depend on, or only through their shape, go into `holes`.
    fn scan(data: &[u8], holes: &mut Holes) -> Option<Chunk> {
        let mut cursor = Cursor::new(data)?;
        let mut members = cursor.object()?;
        let mut fields = Fields::default();
        let mut chunk = Chunk::default();
        while let Some(key) = cursor.key(&mut members)? {
            match key {
                b"choices" => {
                    fields.first(0)?;
                    chunk.choices = Choices::scan(&mut cursor, holes)?;
                }
                b"usage" => {
                    fields.first(1)?;
                    chunk.usage = Usage::scan(&mut cursor, holes)?;
                }
                b"timings" => {
                    fields.first(2)?;
                    cursor.null()?;
                }
                b"error" => {
                    fields.first(3)?;
                    chunk.error = Alarm::error(cursor.raw()?);
                }
                b"object" => {
                    fields.first(4)?;
                    chunk.object = Alarm::object(cursor.raw()?);
                }
                _ => holes.skip(&mut cursor)?,
            }
        }
        cursor.end()?;
        Some(chunk)
    }
}

/// What a chunk's reading takes from a value the cursor passed over: nothing (its bytes may be
/// any JSON value), its [`Shape`], or its count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Hole {
    #[default]
    Skipped,
    Shaped(Shape),
    Completion,
    Prompt,
}

/// The values of one chunk the reading may see change without its bytes around them changing:
/// where each is (`start..end`) and what the reading takes from it, kept inline (a template is
/// read on every event of a stream: no second heap object to fetch). At most [`MAX_HOLES`];
/// past that, or past [`MAX_TEMPLATE`] bytes, the chunk is not kept as a template.
#[derive(Debug, Default)]
struct Holes {
    list: [(u16, u16, Hole); MAX_HOLES],
    len: u8,
    overflow: bool,
}

/// Values a template may leave open; a chunk with more is read whole every time.
const MAX_HOLES: usize = 16;

impl Holes {
    fn clear(&mut self) {
        self.len = 0;
        self.overflow = false;
    }

    fn push(&mut self, start: usize, end: usize, hole: Hole) {
        let slot = self.list.get_mut(usize::from(self.len));
        match (slot, u16::try_from(start), u16::try_from(end)) {
            (Some(slot), Ok(start), Ok(end)) => {
                *slot = (start, end, hole);
                self.len += 1;
            }
            _ => self.overflow = true,
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(u16, u16, Hole)> {
        self.list[..usize::from(self.len)].iter()
    }

    /// Checks and consumes the next value, noted as the hole `kind` makes of its text; its text.
    fn take<'a>(&mut self, cursor: &mut Cursor<'a>, kind: fn(&[u8]) -> Hole) -> Option<&'a [u8]> {
        cursor.peek()?;
        let start = cursor.position();
        let raw = cursor.raw()?;
        self.push(start, cursor.position(), kind(raw));
        Some(raw)
    }

    /// A value the reading ignores.
    fn skip(&mut self, cursor: &mut Cursor) -> Option<()> {
        self.take(cursor, |_| Hole::Skipped).map(drop)
    }

    /// A value whose shape is what the reading takes.
    fn shape(&mut self, cursor: &mut Cursor) -> Option<Shape> {
        self.take(cursor, |raw| Hole::Shaped(Shape::of(raw)))
            .map(Shape::of)
    }
}

/// A stream's last chunk that the cursor read whole, with its holes and its reading. The next
/// chunk of a stream nearly always has the same bytes but for a few values (`id`, `created`,
/// the token's text, a send stamp): a chunk whose bytes outside the holes are the template's,
/// and whose holes hold values the reading takes the same way (any value where it takes
/// nothing, a string of the same shape, a count), is the same JSON document but for those
/// values, so its reading is the template's with the counts read again. Checking that is a
/// comparison of bytes and a pass over the holes' values, not a walk over every key.
#[derive(Debug, Default)]
struct Template {
    bytes: Vec<u8>,
    holes: Holes,
    /// The last chunk the cursor read whole (never `timings`, which are serde_json's to read),
    /// lent out by [`Template::read`] rather than copied.
    reading: Option<Chunk>,
    /// Whether `bytes` and `holes` are `reading`'s chunk, a template for the next ones.
    kept: bool,
}

/// Longer chunks are read whole every time rather than kept (and hole positions fit in `u16`).
const MAX_TEMPLATE: usize = 2048;

impl Template {
    /// The chunk read through the template when it fits, else whole by the cursor (and kept
    /// as the next template when it can be); `None` leaves it to serde_json.
    fn read(&mut self, data: &[u8]) -> Option<&Chunk> {
        if self.fit(data).is_some() {
            return self.reading.as_ref();
        }
        self.reading = None;
        self.kept = false;
        self.holes.clear();
        let chunk = Chunk::scan(data, &mut self.holes)?;
        if data.len() <= MAX_TEMPLATE && !self.holes.overflow {
            self.bytes.clear();
            self.bytes.extend_from_slice(data);
            self.kept = true;
        }
        Some(self.reading.insert(chunk))
    }

    /// `data`'s reading when it fits the template: the template's reading, its counts (the
    /// only values a hole gives it) now `data`'s. A chunk that does not fit may leave some
    /// counts changed, which the next chunk that fits reads again before it is lent out.
    fn fit(&mut self, data: &[u8]) -> Option<&Chunk> {
        let Template {
            bytes,
            holes,
            reading,
            kept,
        } = self;
        if !*kept {
            return None;
        }
        let reading = reading.as_mut()?;
        let mut cursor = Cursor::new(data)?;
        let usage = &mut reading.usage;
        let mut from = 0;
        for &(start, end, hole) in holes.iter() {
            cursor.literal_bytes(&bytes[from..start as usize])?;
            match hole {
                // Most values the reading ignores are the template's own (`id`, `model`): the
                // same bytes, known well-formed, need no reading. Not a number, which the same
                // bytes may only begin (`12` of `123`): numbers are read, and cheaply.
                Hole::Skipped => {
                    let same = &bytes[start as usize..end as usize];
                    let number = matches!(same.first(), Some(b'-' | b'0'..=b'9'));
                    if number || cursor.literal_bytes(same).is_none() {
                        cursor.skip_value()?;
                    }
                }
                Hole::Shaped(shape) => {
                    if Shape::of(cursor.raw()?) != shape {
                        return None;
                    }
                }
                Hole::Completion => usage.as_mut()?.completion_tokens = Count::of(cursor.raw()?),
                Hole::Prompt => usage.as_mut()?.prompt_tokens = Count::of(cursor.raw()?),
            }
            from = end as usize;
        }
        cursor.literal_bytes(&bytes[from..])?;
        cursor.end()?;
        Some(reading)
    }
}

/// One element of `choices`.
#[derive(Deserialize, Default)]
struct Choice {
    #[serde(default)]
    index: Index,
    #[serde(default)]
    delta: Option<Message>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    text: Shape,
    #[serde(default)]
    finish_reason: Finish,
}

impl Choice {
    fn scan(cursor: &mut Cursor, holes: &mut Holes) -> Option<Choice> {
        let mut choice = Choice::default();
        let mut fields = Fields::default();
        let mut members = cursor.object()?;
        while let Some(key) = cursor.key(&mut members)? {
            match key {
                b"index" => {
                    fields.first(0)?;
                    choice.index = Index(cursor.unsigned()?);
                }
                b"delta" => {
                    fields.first(1)?;
                    choice.delta = Message::scan_optional(cursor, holes)?;
                }
                b"message" => {
                    fields.first(2)?;
                    choice.message = Message::scan_optional(cursor, holes)?;
                }
                b"text" => {
                    fields.first(3)?;
                    choice.text = holes.shape(cursor)?;
                }
                b"finish_reason" => {
                    fields.first(4)?;
                    choice.finish_reason = Finish::of(cursor.raw()?);
                }
                _ => holes.skip(cursor)?,
            }
        }
        Some(choice)
    }
}

/// A chat `delta` (streamed) or `message` (whole body).
#[derive(Deserialize, Default)]
struct Message {
    #[serde(default)]
    content: Shape,
    #[serde(default)]
    refusal: Shape,
    #[serde(default)]
    reasoning_content: Shape,
    #[serde(default)]
    reasoning: Shape,
    #[serde(default)]
    tool_calls: ToolCalls,
    #[serde(default)]
    function_call: Shape,
}

impl Message {
    /// `null` or a message; a message with tool calls is serde_json's to read.
    fn scan_optional(cursor: &mut Cursor, holes: &mut Holes) -> Option<Option<Message>> {
        if cursor.peek()? == b'n' {
            cursor.null()?;
            return Some(None);
        }
        let mut message = Message::default();
        let mut fields = Fields::default();
        let mut members = cursor.object()?;
        while let Some(key) = cursor.key(&mut members)? {
            let (index, shape) = match key {
                b"content" => (0, &mut message.content),
                b"refusal" => (1, &mut message.refusal),
                b"reasoning_content" => (2, &mut message.reasoning_content),
                b"reasoning" => (3, &mut message.reasoning),
                b"function_call" => (4, &mut message.function_call),
                b"tool_calls" => {
                    fields.first(5)?;
                    // `null` or `[]`: no call.
                    if cursor.peek()? == b'n' {
                        cursor.null()?;
                    } else {
                        let mut calls = cursor.array()?;
                        if cursor.element(&mut calls)? {
                            return None;
                        }
                    }
                    continue;
                }
                _ => {
                    holes.skip(cursor)?;
                    continue;
                }
            };
            fields.first(index)?;
            *shape = holes.shape(cursor)?;
        }
        Some(Some(message))
    }

    fn content(&self) -> bool {
        self.content.filled() || self.refusal.filled()
    }

    fn output(&self) -> bool {
        self.content()
            || self.reasoning_content.filled()
            || self.reasoning.filled()
            || self.tool_calls.0
            || self.function_call.filled()
    }
}

/// All choices of one chunk, folded as they are read: no `Vec` is built for them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Choices {
    /// Some chat message carried output.
    message_output: bool,
    /// Some chat message carried visible content.
    message_content: bool,
    /// Some choice had a non-empty `text`.
    text: bool,
    /// The last non-null finish reason among the choices.
    finish: Option<FinishReason>,
    /// How many choices the chunk had, and the index of the last one.
    count: u32,
    index: u64,
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ChoicesVisitor)
    }
}

struct ChoicesVisitor;

impl<'de> Visitor<'de> for ChoicesVisitor {
    type Value = Choices;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of choices or null")
    }

    fn visit_unit<E>(self) -> Result<Choices, E> {
        Ok(Choices::default())
    }

    fn visit_none<E>(self) -> Result<Choices, E> {
        Ok(Choices::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
        let mut all = Choices::default();
        while let Some(choice) = seq.next_element::<Choice>()? {
            all.add(&choice);
        }
        Ok(all)
    }
}

impl Choices {
    /// Folds one more choice in.
    fn add(&mut self, choice: &Choice) {
        for message in [&choice.delta, &choice.message].into_iter().flatten() {
            self.message_output |= message.output();
            self.message_content |= message.content();
        }
        self.text |= choice.text.filled();
        self.count = self.count.saturating_add(1);
        self.index = choice.index.0;
        if choice.finish_reason.0.is_some() {
            self.finish = choice.finish_reason.0;
        }
    }

    /// `null` or an array of choices, read by the cursor.
    fn scan(cursor: &mut Cursor, holes: &mut Holes) -> Option<Choices> {
        let mut all = Choices::default();
        if cursor.peek()? == b'n' {
            cursor.null()?;
            return Some(all);
        }
        let mut elements = cursor.array()?;
        while cursor.element(&mut elements)? {
            all.add(&Choice::scan(cursor, holes)?);
        }
        Some(all)
    }
}

/// Which fields of a choice count, per dialect.
#[derive(Clone, Copy)]
enum Flavour {
    Chat,
    Completions,
}

/// A chat or completions stream: the running counts of its choices.
#[derive(Debug, Default)]
pub(in crate::parse) struct OpenAi {
    tracks: Tracks,
    template: Template,
}

impl OpenAi {
    pub(super) fn chat_event(
        &mut self,
        event_type: &[u8],
        data: &[u8],
        report: &mut EngineReport,
    ) -> Verdict {
        self.event(Flavour::Chat, event_type, data, report)
    }

    pub(super) fn completions_event(
        &mut self,
        event_type: &[u8],
        data: &[u8],
        report: &mut EngineReport,
    ) -> Verdict {
        self.event(Flavour::Completions, event_type, data, report)
    }

    fn event(
        &mut self,
        flavour: Flavour,
        event_type: &[u8],
        data: &[u8],
        report: &mut EngineReport,
    ) -> Verdict {
        let base = Verdict {
            error: event_type == b"error",
            ..Verdict::default()
        };
        if is_done(data) {
            return Verdict { end: true, ..base };
        }
        let whole;
        let chunk = match self.template.read(data) {
            Some(chunk) => chunk,
            None => match serde_json::from_slice(data) {
                Ok(chunk) => {
                    whole = chunk;
                    &whole
                }
                Err(_) => return base,
            },
        };
        let mut verdict = read(flavour, chunk, base, report);
        let running = chunk.usage.as_ref().and_then(|u| u.completion_tokens.0);
        if let (Some(count), 1) = (running, chunk.choices.count) {
            verdict.tokens = self
                .tracks
                .count(chunk.choices.index, count, verdict.output);
        }
        verdict
    }
}

pub(super) fn chat_body(body: &[u8], report: &mut EngineReport) -> Verdict {
    parse(Flavour::Chat, body, report)
}

pub(super) fn completions_body(body: &[u8], report: &mut EngineReport) -> Verdict {
    parse(Flavour::Completions, body, report)
}

fn parse(flavour: Flavour, json: &[u8], report: &mut EngineReport) -> Verdict {
    match Chunk::read(json) {
        Some(chunk) => read(flavour, &chunk, Verdict::default(), report),
        None => Verdict::default(),
    }
}

fn read(flavour: Flavour, chunk: &Chunk, base: Verdict, report: &mut EngineReport) -> Verdict {
    if let Some(usage) = &chunk.usage {
        usage.report(report);
    }
    if let Some(timings) = &chunk.timings {
        timings.report(report);
    }
    let choices = &chunk.choices;
    let (output, content) = match flavour {
        Flavour::Chat => {
            let content = choices.message_content || choices.text;
            (content || choices.message_output, content)
        }
        Flavour::Completions => (choices.text, choices.text),
    };
    let (usage_output_tokens, usage_prompt_tokens) = match &chunk.usage {
        Some(usage) => (usage.completion_tokens.0, usage.prompt_tokens.0),
        None => (None, None),
    };
    Verdict {
        output,
        content,
        end: choices.finish.is_some(),
        error: base.error || chunk.error.0 || chunk.object.0,
        finish: choices.finish,
        usage_output_tokens,
        usage_prompt_tokens,
        tokens: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(data: &str) -> Verdict {
        OpenAi::default().chat_event(b"", data.as_bytes(), &mut EngineReport::default())
    }

    fn chat_event(event_type: &[u8], data: &[u8]) -> Verdict {
        OpenAi::default().chat_event(event_type, data, &mut EngineReport::default())
    }

    fn completions_event(event_type: &[u8], data: &[u8]) -> Verdict {
        OpenAi::default().completions_event(event_type, data, &mut EngineReport::default())
    }

    /// What a whole stream of chat payloads reports beyond its output.
    fn chat_report(events: &[&str]) -> EngineReport {
        let mut s = OpenAi::default();
        let mut report = EngineReport::default();
        for data in events {
            s.chat_event(b"", data.as_bytes(), &mut report);
        }
        report
    }

    #[test]
    fn chat_output_kinds() {
        let v = chat(r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#);
        assert!(v.output && v.content && !v.end);

        let v = chat(r#"{"choices":[{"index":0,"delta":{"content":"\"\u00e9\n"}}]}"#);
        assert!(v.output && v.content, "escaped content is content");

        let v = chat(r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#);
        assert!(v.output && !v.content, "reasoning is output, not content");

        let v = chat(r#"{"choices":[{"delta":{"reasoning":"hmm","content":null}}]}"#);
        assert!(v.output && !v.content);

        let v = chat(r#"{"choices":[{"delta":{"refusal":"I can't"}}]}"#);
        assert!(v.output && v.content, "a refusal is read by the user");

        let v = chat(
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]}}]}"#,
        );
        assert!(
            v.output && !v.content,
            "a tool call is output even with empty arguments"
        );

        let v = chat(r#"{"choices":[{"delta":{"function_call":{"arguments":"{"}}}]}"#);
        assert!(v.output && !v.content);
    }

    #[test]
    fn chat_events_without_output() {
        for data in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":null,"content":""}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
            r#"{"choices":null}"#,
            r#"{}"#,
            "[DONE]",
            "not json",
            "",
        ] {
            let v = chat(data);
            assert!(!v.output && !v.content && !v.error, "{data}");
        }
    }

    #[test]
    fn chat_end_markers() {
        assert!(chat("[DONE]").end);
        assert!(chat(" [DONE] ").end);
        assert!(!chat("[DONE]x").end);
        let v = chat(r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#);
        assert!(v.end);
        assert_eq!(v.finish, Some(FinishReason::Length));
        let v = chat(r#"{"choices":[{"delta":{"content":"x"},"finish_reason":null}]}"#);
        assert!(!v.end);
        assert_eq!(v.finish, None);
        let v = chat(r#"{"choices":[{"delta":{"content":"x"},"finish_reason":""}]}"#);
        assert!(!v.end, "an empty finish reason is no reason");
    }

    #[test]
    fn chat_usage_anywhere() {
        let v = chat(r#"{"choices":[],"usage":{"prompt_tokens":79,"completion_tokens":1}}"#);
        assert_eq!(
            (v.usage_output_tokens, v.usage_prompt_tokens),
            (Some(1), Some(79))
        );
        let v = chat(
            r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}"#,
        );
        assert!(v.output);
        assert_eq!(v.usage_output_tokens, Some(3));
        let v = chat(r#"{"choices":[{"delta":{"content":"a"}}],"usage":null}"#);
        assert_eq!(v.usage_output_tokens, None);
    }

    #[test]
    fn chat_errors() {
        let v = chat(r#"{"error":{"message":"overloaded","type":"server_error"}}"#);
        assert!(v.error && !v.output);
        let v = chat(r#"{"object":"error","message":"boom","type":"BadRequestError"}"#);
        assert!(v.error);
        let v = chat_event(b"error", br#"{"message":"boom"}"#);
        assert!(v.error);
        let v = chat(r#"{"choices":[{"delta":{"content":"x"}}],"error":null}"#);
        assert!(!v.error && v.content);
        let v = chat(r#"{"object":"chat.completion.chunk","choices":[]}"#);
        assert!(!v.error);
    }

    #[test]
    fn interleaved_choices_are_one_event() {
        let v = chat(
            r#"{"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"reasoning":"r"}},{"index":2,"delta":{},"finish_reason":"stop"}]}"#,
        );
        assert!(v.output && !v.content && v.end);
        assert_eq!(v.finish, Some(FinishReason::Stop));
    }

    #[test]
    fn together_text_and_delta() {
        let v = chat(
            r#"{"choices":[{"index":0,"text":"Deep","finish_reason":null,"delta":{"token_id":34564,"role":"assistant","content":"Deep","tool_calls":null}}]}"#,
        );
        assert!(v.output && v.content);
    }

    #[test]
    fn completions() {
        let c = |data: &str| completions_event(b"", data.as_bytes());
        let v = c(r#"{"choices":[{"text":" +","index":0,"logprobs":null,"finish_reason":null}]}"#);
        assert!(v.output && v.content && !v.end);
        let v = c(r#"{"choices":[{"text":"","index":0,"finish_reason":"length"}]}"#);
        assert!(!v.output && v.end);
        assert_eq!(v.finish, Some(FinishReason::Length));
        let v = c(r#"{"choices":[{"delta":{"content":"x"}}]}"#);
        assert!(!v.output, "completions read text only");
        assert!(c("[DONE]").end);
    }

    /// vLLM's continuous usage stats: each chunk carries its choice's running count, so an event
    /// that carried two tokens (speculative decoding) says so; the trailing total is no step.
    #[test]
    fn continuous_usage_gives_tokens_per_event() {
        let mut s = OpenAi::default();
        let mut report = EngineReport::default();
        let mut ev = |data: &str| s.chat_event(b"", data.as_bytes(), &mut report);
        let role = ev(
            r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0}}"#,
        );
        assert_eq!((role.output, role.tokens), (false, None));
        let one = ev(
            r#"{"choices":[{"index":0,"delta":{"content":"The"}}],"usage":{"prompt_tokens":9,"completion_tokens":1}}"#,
        );
        assert_eq!((one.output, one.tokens), (true, Some(1)));
        let three = ev(
            r#"{"choices":[{"index":0,"delta":{"content":" sky is"}}],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#,
        );
        assert_eq!(three.tokens, Some(2));
        assert_eq!(three.usage_output_tokens, Some(3));
        let finish = ev(
            r#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":4}}"#,
        );
        assert!(!finish.output && finish.end);
        let total = ev(r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}"#);
        assert_eq!((total.tokens, total.usage_output_tokens), (None, Some(4)));
    }

    /// Usage only at the end, inside the last content chunk (Together): no earlier count, so the
    /// event's tokens are unknown rather than the whole answer.
    #[test]
    fn final_usage_is_not_a_step() {
        let mut s = OpenAi::default();
        let v = s.chat_event(
            b"",
            br#"{"choices":[{"index":0,"delta":{"content":" and"},"finish_reason":"length"}],"usage":{"prompt_tokens":26,"completion_tokens":20}}"#,
            &mut EngineReport::default(),
        );
        assert!(v.output && v.end);
        assert_eq!((v.tokens, v.usage_output_tokens), (None, Some(20)));
    }

    #[test]
    fn obfuscation_padding_is_ignored() {
        let v = chat(
            r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"obfuscation":"q9Zk2"}"#,
        );
        assert!(v.output && v.content);
        let v = chat(
            r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"obfuscation":"Ab"}"#,
        );
        assert!(!v.output && v.end);
    }

    #[test]
    fn whole_chat_body() {
        let body = br#"{
          "id": "chatcmpl-123",
          "object": "chat.completion",
          "created": 1727346171,
          "model": "gpt-4o-2024-08-06",
          "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there!", "refusal": null},
            "logprobs": null,
            "finish_reason": "stop"
          }],
          "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}
        }"#;
        let v = chat_body(body, &mut EngineReport::default());
        assert!(v.output && v.content && v.end && !v.error);
        assert_eq!(v.finish, Some(FinishReason::Stop));
        assert_eq!(v.usage_output_tokens, Some(12));
        assert_eq!(v.usage_prompt_tokens, Some(9));

        let body = br#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":50,"completion_tokens":15}}"#;
        let v = chat_body(body, &mut EngineReport::default());
        assert!(v.output && !v.content);
        assert_eq!(v.finish, Some(FinishReason::ToolCalls));

        let body = br#"{"error":{"message":"The model `x` does not exist","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;
        let v = chat_body(body, &mut EngineReport::default());
        assert!(v.error && !v.output);
    }

    /// OpenAI's usage with prompt caching and reasoning (an o-series model): the counts are in
    /// the details; an event without usage leaves what an earlier one said.
    #[test]
    fn cached_and_reasoning_tokens_from_the_details() {
        let r = chat_report(&[
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"usage":null}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":192,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}"#,
            "[DONE]",
        ]);
        assert_eq!(r.cached_tokens, Some(1920));
        assert_eq!(r.reasoning_tokens, Some(192));
        assert_eq!(r.source, None, "usage counts name no engine");
        assert_eq!(
            (r.prefill, r.total, r.cache_creation_tokens),
            (None, None, None)
        );
    }

    #[test]
    fn usage_without_details_reports_nothing() {
        let r = chat_report(&[
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null}}"#,
        ]);
        assert!(r.is_empty(), "{r:?}");
        let r = chat_report(&[
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":null}}}"#,
        ]);
        assert!(r.is_empty(), "{r:?}");
    }

    /// SGLang puts `reasoning_tokens` beside the counts; DeepSeek names its cache hits
    /// differently.
    #[test]
    fn other_servers_names_for_the_same_counts() {
        let r = chat_report(&[
            r#"{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"total_tokens":40,"completion_tokens":28,"prompt_tokens_details":{"cached_tokens":8},"reasoning_tokens":20}}"#,
        ]);
        assert_eq!((r.cached_tokens, r.reasoning_tokens), (Some(8), Some(20)));
        let r = chat_report(&[
            r#"{"choices":[],"usage":{"prompt_tokens":74,"completion_tokens":11,"total_tokens":85,"prompt_cache_hit_tokens":64,"prompt_cache_miss_tokens":10}}"#,
        ]);
        assert_eq!(r.cached_tokens, Some(64));
    }

    /// vLLM's continuous usage stats repeat the usage on every chunk: the latest wins.
    #[test]
    fn the_latest_usage_wins() {
        let r = chat_report(&[
            r#"{"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":9,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"b"}}],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"c"}}]}"#,
        ]);
        assert_eq!(r.cached_tokens, Some(8));
    }

    /// llama.cpp's last chunk of `/v1/chat/completions` (`to_json_oaicompat_chat_stream`): usage
    /// with the cached count, and the server's `timings`.
    #[test]
    fn llamacpp_timings_on_the_last_chunk() {
        let r = chat_report(&[
            r#"{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1760000000,"id":"chatcmpl-x","model":"gpt-3.5-turbo","system_fingerprint":"b6700-abc","object":"chat.completion.chunk"}"#,
            r#"{"choices":[],"created":1760000000,"id":"chatcmpl-x","model":"gpt-3.5-turbo","system_fingerprint":"b6700-abc","object":"chat.completion.chunk","usage":{"completion_tokens":16,"prompt_tokens":41,"total_tokens":57,"prompt_tokens_details":{"cached_tokens":32}},"timings":{"cache_n":32,"prompt_n":9,"prompt_ms":61.25,"prompt_per_token_ms":6.8,"prompt_per_second":146.9,"predicted_n":16,"predicted_ms":412.5,"predicted_per_token_ms":27.5,"predicted_per_second":36.36}}"#,
            "[DONE]",
        ]);
        assert_eq!(r.cached_tokens, Some(32));
        assert_eq!(r.prompt_processed, Some(9));
        assert_eq!(r.prefill, Some(std::time::Duration::from_micros(61_250)));
        assert_eq!(r.decode, Some(std::time::Duration::from_micros(412_500)));
        assert_eq!(r.source, Some(crate::parse::report::Engine::LlamaCpp));
    }

    #[test]
    fn whole_bodies_report_too() {
        let mut r = EngineReport::default();
        completions_body(
            br#"{"choices":[{"text":"x","index":0,"logprobs":null,"finish_reason":"length"}],"object":"text_completion","usage":{"completion_tokens":1,"prompt_tokens":5,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":4}},"timings":{"cache_n":4,"prompt_n":1,"prompt_ms":3,"predicted_n":1,"predicted_ms":0.001}}"#,
            &mut r,
        );
        assert_eq!((r.cached_tokens, r.prompt_processed), (Some(4), Some(1)));
        assert_eq!(r.prefill, Some(std::time::Duration::from_millis(3)));
        assert_eq!(r.decode, Some(std::time::Duration::from_micros(1)));
        let mut r = EngineReport::default();
        chat_body(
            br#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1200,"completion_tokens":80,"prompt_tokens_details":{"cached_tokens":1024},"completion_tokens_details":{"reasoning_tokens":64}}}"#,
            &mut r,
        );
        assert_eq!(
            (r.cached_tokens, r.reasoning_tokens),
            (Some(1024), Some(64))
        );
    }

    #[test]
    fn whole_completions_body() {
        let body = br#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"\n\nThis is a test.","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
        let v = completions_body(body, &mut EngineReport::default());
        assert!(v.output && v.content && v.end);
        assert_eq!(v.finish, Some(FinishReason::Length));
        assert_eq!(v.usage_output_tokens, Some(7));
    }

    /// The cursor's reading of a payload, checked against serde_json's: when the cursor reads a
    /// chunk, serde_json must read the same one (the cursor gives up on whatever it does not read
    /// as serde_json would). Returns whether the cursor read it.
    fn cursor_agrees(data: &[u8]) -> bool {
        let Some(scanned) = Chunk::scan(data, &mut Holes::default()) else {
            return false;
        };
        let text = String::from_utf8_lossy(data);
        let read = serde_json::from_slice::<Chunk>(data)
            .unwrap_or_else(|e| panic!("the cursor read what serde_json refuses ({e}): {text}"));
        assert_eq!(scanned.choices, read.choices, "{text}");
        assert_eq!(
            (scanned.error, scanned.object),
            (read.error, read.object),
            "{text}"
        );
        assert_eq!(scanned.usage, read.usage, "{text}");
        assert!(read.timings.is_none(), "{text}");
        true
    }

    /// Every `data:` payload of every captured and written stream, read once.
    fn captured_payloads() -> &'static [Vec<u8>] {
        static PAYLOADS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
        PAYLOADS.get_or_init(read_payloads)
    }

    fn read_payloads() -> Vec<Vec<u8>> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut payloads = Vec::new();
        for dir in ["../shared/fixtures/streams", "tests/fixtures/streams"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let text = std::fs::read(entry.path()).unwrap_or_default();
                for line in text.split(|&b| b == b'\n') {
                    if let Some(data) = line.strip_prefix(b"data:") {
                        let data = data.strip_prefix(b" ").unwrap_or(data);
                        payloads.push(data.strip_suffix(b"\r").unwrap_or(data).to_vec());
                    }
                }
            }
        }
        payloads
    }

    #[test]
    fn the_cursor_reads_token_chunks_as_serde_json_does() {
        let payloads = captured_payloads();
        assert!(payloads.len() > 100, "fixtures not found");
        let read = payloads.iter().filter(|p| cursor_agrees(p)).count();
        // Token chunks are most of what the captured streams carry.
        assert!(read * 2 > payloads.len(), "{read} of {}", payloads.len());
        for data in [
            r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null,"tool_calls":[]}}],"usage":null}"#,
            r#"{"choices":[{"index":1,"text":" x","finish_reason":"length"},{"index":0,"message":{"content":null,"reasoning":"r"}}]}"#,
            r#"{"choices":null,"object":"error","error":{"message":"boom"}}"#,
            r#" {"choices":[],"error":"","object":"x","timings":null} "#,
            // Usage: the final chunk of most streams, and every chunk of vLLM's with
            // `continuous_usage_stats`.
            r#"{"choices":[],"usage":{"completion_tokens":3}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":79,"completion_tokens":1,"total_tokens":80,"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":12}}}"#,
            r#"{"usage":{"prompt_tokens":"7","completion_tokens":20.0,"prompt_tokens_details":null,"reasoning_tokens":-1,"prompt_cache_hit_tokens":{}},"choices":[{"delta":{"content":"x"}}]}"#,
            r#"{"choices":[],"usage":{"completion_tokens_details":{}}}"#,
        ] {
            assert!(cursor_agrees(data.as_bytes()), "{data}");
        }
        for data in [
            // Left to serde_json: timings, tool calls, escaped keys, a field twice, odd types, a
            // number where an index is not a plain count.
            r#"{"choices":[],"usage":{"completion_tokens":3,"completion_tokens":4}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}}"#,
            r#"{"choices":[],"usage":[3,4]}"#,
            r#"{"choices":[],"usage":{"completion_tokens_details":[2]}}"#,
            r#"{"choices":[],"timings":{"predicted_n":3}}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#,
            r#"{"ch\u006fices":[{"delta":{"content":"x"}}]}"#,
            r#"{"choices":[],"choices":[]}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"index":-1,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":1.0,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[[0]]}"#,
            r#"{"choices":{}}"#,
            r#"[{"choices":[]}]"#,
            "[DONE]",
        ] {
            assert!(fresh(data.as_bytes()).is_none(), "{data}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Broken, cut and spliced chunks: whatever the cursor still reads, serde_json reads
        /// the same way.
        #[test]
        fn the_cursor_never_reads_more_than_serde_json(
            pick in 0usize..64,
            edits in proptest::collection::vec((0usize..400, 0usize..24, 0u8..4), 1..4),
        ) {
            const BASES: [&str; 4] = [
                r#"{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}"#,
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null}}],"object":"chat.completion.chunk"}"#,
                r#"{"choices":[{"text":"\n\u00e9x","index":2,"finish_reason":"stop"}],"error":null}"#,
                r#"{"choices":[{"delta":{"reasoning_content":"hm","tool_calls":null},"finish_reason":""}],"x":[1,-2.5e3,{"y":[true,false]}]}"#,
            ];
            let payloads = captured_payloads();
            let mut data = if pick < BASES.len() || payloads.is_empty() {
                BASES[pick % BASES.len()].as_bytes().to_vec()
            } else {
                payloads[pick % payloads.len()].clone()
            };
            mutate(&mut data, &edits);
            cursor_agrees(&data);
        }
    }

    /// Applies `(position, symbol, kind)` edits to a payload: a byte replaced, inserted or
    /// removed, or the payload cut, with bytes that matter to JSON.
    fn mutate(data: &mut Vec<u8>, edits: &[(usize, usize, u8)]) {
        const ALPHABET: &[u8] = b"{}[]\",:\\ 0-.eE19nutlfa\xff\x01";
        for &(at, symbol, kind) in edits {
            let at = at % (data.len() + 1);
            let byte = ALPHABET[symbol % ALPHABET.len()];
            match kind {
                0 if at < data.len() => data[at] = byte,
                1 => data.insert(at, byte),
                2 if at < data.len() => {
                    data.remove(at);
                }
                _ => data.truncate(at),
            }
        }
    }

    /// Two readings of one payload agree: both refused, or the same chunk.
    fn same_reading(a: Option<&Chunk>, b: Option<&Chunk>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                (a.choices, a.error, a.object) == (b.choices, b.error, b.object)
                    && a.usage == b.usage
                    && a.timings.is_none() == b.timings.is_none()
            }
            _ => false,
        }
    }

    fn fresh(data: &[u8]) -> Option<Chunk> {
        Chunk::scan(data, &mut Holes::default())
    }

    #[test]
    fn a_chunk_that_fits_the_template_is_read_as_from_its_first_byte() {
        let mut template = Template::default();
        let first = br#"{"id":"c1","object":"chat.completion.chunk","created":123,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}"#;
        assert!(template.read(first).is_some());
        // Another id, stamp and token, logprobs now an object: the same reading, by the template.
        let next = br#"{"id":"c22","object":"chat.completion.chunk","created":1234,"model":"m","choices":[{"index":0,"delta":{"content":"b\n\u00e9"},"logprobs":{"content":[]},"finish_reason":null}]}"#;
        let fitted = template.fit(next).expect("fits the template");
        assert!(fitted.choices.message_content);
        assert!(same_reading(Some(fitted), fresh(next).as_ref()));
        // What the reading depends on changed: read whole, and the result is the chunk's own.
        for (data, why) in [
            (&br#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":null}]}"#[..], "empty content"),
            (br#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":null},"logprobs":null,"finish_reason":null}]}"#, "null content"),
            (br#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":"stop"}]}"#, "a finish reason"),
            (br#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":1,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}"#, "another choice"),
            (br#"{"id":"c1","object":"error","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}"#, "an error object"),
        ] {
            let mut template = Template::default();
            assert!(template.read(first).is_some());
            assert!(template.fit(data).is_none(), "{why}");
            assert!(
                same_reading(template.read(data), fresh(data).as_ref()),
                "{why}"
            );
        }
        // Broken where a hole is, or around one: refused, as read whole.
        let mut template = Template::default();
        assert!(template.read(first).is_some());
        for data in [
            &br#"{"id":"c1","object":"chat.completion.chunk","created":12a,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}"#[..],
            br#"{"id":"c1,"object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}"#,
            b"{\"id\":\"\xff\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"logprobs\":null,\"finish_reason\":null}]}",
            br#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]} x"#,
            br#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":nul,"finish_reason":null}]}"#,
            br#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a	b"},"logprobs":null,"finish_reason":null}]}"#,
        ] {
            assert!(template.fit(data).is_none(), "{}", String::from_utf8_lossy(data));
            assert!(fresh(data).is_none(), "{}", String::from_utf8_lossy(data));
        }
    }

    #[test]
    fn a_count_in_a_hole_is_each_chunks_own() {
        // vLLM's continuous usage stats: usage on every chunk, its counts growing.
        let mut template = Template::default();
        let first = br#"{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}"#;
        assert_eq!(
            template
                .read(first)
                .unwrap()
                .usage
                .unwrap()
                .completion_tokens,
            Count(Some(1))
        );
        let next = br#"{"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
        let fitted = template.fit(next).expect("fits the template");
        assert_eq!(fitted.usage.unwrap().completion_tokens, Count(Some(2)));
        assert_eq!(fitted.usage.unwrap().prompt_tokens, Count(Some(5)));
        // A count serde_json reads as none (not a whole number) is none here too.
        let odd = br#"{"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":5,"completion_tokens":2.5}}"#;
        assert!(same_reading(template.fit(odd), fresh(odd).as_ref()));
        // `usage` null in the template: a usage object later does not fit.
        let mut template = Template::default();
        assert!(template
            .read(br#"{"choices":[{"delta":{"content":"a"}}],"usage":null}"#)
            .is_some());
        let with = br#"{"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":2}}"#;
        assert!(template.fit(with).is_none());
        assert!(same_reading(template.read(with), fresh(with).as_ref()));
    }

    #[test]
    fn a_chunk_with_too_many_holes_is_not_kept() {
        let mut template = Template::default();
        let fields: String = (0..=MAX_HOLES).map(|i| format!(r#""f{i}":{i},"#)).collect();
        let data = format!(r#"{{{fields}"choices":[{{"delta":{{"content":"a"}}}}]}}"#);
        assert!(template.read(data.as_bytes()).is_some());
        assert!(template.fit(data.as_bytes()).is_none());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]

        /// A stream of chunks like one captured chunk, some edited or broken: each read through
        /// the template exactly as it is read from its first byte (which the tests above tie
        /// to serde_json).
        #[test]
        fn reading_through_the_template_reads_as_reading_whole(
            pick in 0usize..64,
            chunks in proptest::collection::vec(
                proptest::collection::vec((0usize..400, 0usize..24, 0u8..4), 0..3),
                1..6,
            ),
        ) {
            let payloads = captured_payloads();
            let base = if payloads.is_empty() {
                br#"{"id":"x","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,"delta":{"content":"a"}}]}"#.to_vec()
            } else {
                payloads[pick % payloads.len()].clone()
            };
            let mut template = Template::default();
            for edits in std::iter::once(Vec::new()).chain(chunks) {
                let mut data = base.clone();
                mutate(&mut data, &edits);
                let templated = template.read(&data);
                proptest::prop_assert!(
                    same_reading(templated, fresh(&data).as_ref()),
                    "{}",
                    String::from_utf8_lossy(&data)
                );
            }
        }
    }
}
