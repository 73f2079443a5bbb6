//! The OpenAI Responses API (`/v1/responses`): typed SSE events, streamed or whole.
//!
//! An event's type is its SSE `event:` name, or the payload's own `type` when a proxy dropped the
//! name. Output is any `response.*.delta` event with a non-empty `delta`: output text, refusal,
//! reasoning text and summaries, function-call and tool-input arguments, audio. Visible content
//! is output text and refusal deltas only. Lifecycle events (`response.created`,
//! `...in_progress`, `...added`, `...done`) carry nothing and are not even parsed. The end
//! marker is `response.completed` (finish `stop`, or `tool_calls` when the stream streamed a
//! function call) or `response.incomplete` (finish from `incomplete_details.reason`:
//! `max_output_tokens` is `length`, `content_filter` is `content_filter`); there is no `[DONE]`.
//! Usage (`output_tokens`, `input_tokens`) comes only with those terminal events, inside
//! `response`. `error` events and `response.failed` mean failure.
//!
//! A whole body is a `response` object: its `output` items say whether anything was generated
//! (a message with text or a refusal is content; reasoning and function calls are output), its
//! `status` and `incomplete_details` the finish, its `usage` the counts.
//!
//! The usage also says what explains the figures: `input_tokens_details.cached_tokens` and
//! `output_tokens_details.reasoning_tokens`. llama.cpp's `/v1/responses` adds its `timings`
//! object beside `response` in the `response.completed` event.

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::{
    report_details, Alarm, Count, EngineReport, Finish, FinishReason, Name, OutputDetails,
    PromptDetails, Shape, Timings, Verdict,
};

/// What a Responses stream remembers: whether it streamed a function call, which makes the
/// completed response's finish `tool_calls`.
#[derive(Debug, Default)]
pub(in crate::parse) struct Responses {
    tool_call: bool,
}

/// Any event's payload, when the type must come from it; the fields of a delta event and of a
/// terminal event are both here, as one parse serves either.
#[derive(Deserialize)]
struct Payload<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Name<'a>,
    #[serde(default)]
    delta: Shape,
    #[serde(default)]
    response: Option<Response>,
    #[serde(default)]
    timings: Option<Timings>,
}

/// A delta event's payload, when the SSE name already said what it is.
#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    delta: Shape,
}

/// A terminal event's payload.
#[derive(Deserialize)]
struct Terminal {
    #[serde(default)]
    response: Option<Response>,
    /// llama.cpp's own timing.
    #[serde(default)]
    timings: Option<Timings>,
}

/// The `response` object of a terminal event, or a whole body.
#[derive(Deserialize, Default)]
struct Response {
    #[serde(default, deserialize_with = "status")]
    status: Status,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    incomplete_details: Option<Incomplete>,
    #[serde(default)]
    output: Output,
    #[serde(default, deserialize_with = "Alarm::error_field")]
    error: Alarm,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Status {
    #[default]
    Other,
    Completed,
    Incomplete,
    Failed,
}

fn status<'de, D: Deserializer<'de>>(d: D) -> Result<Status, D::Error> {
    let name = Name::deserialize(d)?;
    Ok(match name.0 {
        b"completed" => Status::Completed,
        b"incomplete" => Status::Incomplete,
        b"failed" | b"cancelled" => Status::Failed,
        _ => Status::Other,
    })
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    output_tokens: Count,
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    input_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct Incomplete {
    #[serde(default)]
    reason: Finish,
}

impl Response {
    /// The output and prompt counts; the cached and reasoning counts go into `report`.
    fn usage(&self, report: &mut EngineReport) -> (Option<u64>, Option<u64>) {
        match &self.usage {
            Some(u) => {
                report_details(
                    u.input_tokens_details.as_ref(),
                    u.output_tokens_details.as_ref(),
                    report,
                );
                (u.output_tokens.0, u.input_tokens.0)
            }
            None => (None, None),
        }
    }

    /// Why a response that reached a terminal state stopped. `tool_call`: a function call was
    /// generated, which is why a completed response stopped.
    fn finish(&self, status: Status, tool_call: bool) -> Option<FinishReason> {
        match status {
            Status::Completed if tool_call => Some(FinishReason::ToolCalls),
            Status::Completed => Some(FinishReason::Stop),
            Status::Incomplete => Some(
                self.incomplete_details
                    .as_ref()
                    .and_then(|d| d.reason.0)
                    .unwrap_or(FinishReason::Other),
            ),
            Status::Failed => Some(FinishReason::Error),
            Status::Other => None,
        }
    }
}

/// What kind of event a type names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `response.*.delta`: `content` for output text and refusals, `tool` for arguments of a
    /// function or tool call.
    Delta {
        content: bool,
        tool: bool,
    },
    Terminal(Status),
    Error,
    Lifecycle,
}

fn kind(name: &[u8]) -> Kind {
    match name {
        b"response.completed" => Kind::Terminal(Status::Completed),
        b"response.incomplete" => Kind::Terminal(Status::Incomplete),
        b"response.failed" => Kind::Terminal(Status::Failed),
        b"error" => Kind::Error,
        _ if name.starts_with(b"response.") && name.ends_with(b".delta") => Kind::Delta {
            content: matches!(
                name,
                b"response.output_text.delta" | b"response.refusal.delta"
            ),
            tool: matches!(
                name,
                b"response.function_call_arguments.delta"
                    | b"response.custom_tool_call_input.delta"
                    | b"response.mcp_call_arguments.delta"
            ),
        },
        _ => Kind::Lifecycle,
    }
}

impl Responses {
    pub(super) fn event(
        &mut self,
        event_type: &[u8],
        data: &[u8],
        report: &mut EngineReport,
    ) -> Verdict {
        if event_type.is_empty() {
            // No SSE name: the payload says what it is.
            let Ok(p) = serde_json::from_slice::<Payload>(data) else {
                return Verdict::default();
            };
            if let Some(t) = &p.timings {
                t.report(report);
            }
            return self.read(kind(p.kind.0), p.delta, p.response.as_ref(), report);
        }
        match kind(event_type) {
            Kind::Lifecycle => Verdict::default(),
            Kind::Error => Verdict {
                error: true,
                ..Verdict::default()
            },
            k @ Kind::Delta { .. } => match serde_json::from_slice::<Delta>(data) {
                Ok(d) => self.read(k, d.delta, None, report),
                Err(_) => Verdict::default(),
            },
            k @ Kind::Terminal(_) => {
                let t = serde_json::from_slice::<Terminal>(data).ok();
                if let Some(timings) = t.as_ref().and_then(|t| t.timings.as_ref()) {
                    timings.report(report);
                }
                self.read(
                    k,
                    Shape::Absent,
                    t.as_ref().and_then(|t| t.response.as_ref()),
                    report,
                )
            }
        }
    }

    fn read(
        &mut self,
        kind: Kind,
        delta: Shape,
        response: Option<&Response>,
        report: &mut EngineReport,
    ) -> Verdict {
        match kind {
            Kind::Delta { content, tool } => {
                let output = delta.filled();
                self.tool_call |= tool && output;
                Verdict {
                    output,
                    content: content && output,
                    ..Verdict::default()
                }
            }
            Kind::Terminal(status) => {
                let (usage_output_tokens, usage_prompt_tokens) =
                    response.map_or((None, None), |r| r.usage(report));
                let finish = match response {
                    Some(r) => r.finish(status, self.tool_call),
                    None => Response::default().finish(status, self.tool_call),
                };
                Verdict {
                    end: true,
                    error: status == Status::Failed,
                    finish,
                    usage_output_tokens,
                    usage_prompt_tokens,
                    ..Verdict::default()
                }
            }
            Kind::Error => Verdict {
                error: true,
                ..Verdict::default()
            },
            Kind::Lifecycle => Verdict::default(),
        }
    }
}

/// A whole (non-streaming) response object, or an error body.
pub(super) fn body(body: &[u8], report: &mut EngineReport) -> Verdict {
    let Ok(r) = serde_json::from_slice::<Response>(body) else {
        return Verdict::default();
    };
    let (usage_output_tokens, usage_prompt_tokens) = r.usage(report);
    let error = r.error.0 || r.status == Status::Failed;
    Verdict {
        output: r.output.output,
        content: r.output.content,
        end: true,
        error,
        finish: r.finish(r.status, r.output.tool_call),
        usage_output_tokens,
        usage_prompt_tokens,
        tokens: None,
    }
}

/// The `output` items of a whole response, folded as they are read.
#[derive(Debug, Default)]
struct Output {
    output: bool,
    content: bool,
    tool_call: bool,
}

/// One output item: a message with content parts, reasoning, a function or tool call.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Name<'a>,
    #[serde(default)]
    content: Parts,
}

/// The content parts of a message item, as "is any of them visible text".
#[derive(Debug, Default)]
struct Parts(bool);

#[derive(Deserialize)]
struct Part {
    #[serde(default)]
    text: Shape,
    #[serde(default)]
    refusal: Shape,
}

impl<'de> Deserialize<'de> for Parts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Parts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("content parts")
            }
            fn visit_unit<E>(self) -> Result<Parts, E> {
                Ok(Parts(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Parts, A::Error> {
                let mut any = false;
                while let Some(p) = seq.next_element::<Part>()? {
                    any |= p.text.filled() || p.refusal.filled();
                }
                Ok(Parts(any))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Output {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Output;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("output items")
            }
            fn visit_unit<E>(self) -> Result<Output, E> {
                Ok(Output::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Output, A::Error> {
                let mut all = Output::default();
                while let Some(item) = seq.next_element::<Item>()? {
                    match item.kind.0 {
                        b"message" => {
                            all.output |= item.content.0;
                            all.content |= item.content.0;
                        }
                        // Reasoning, web searches and the like were generated but are not text
                        // the user reads; a function call is why the response stopped.
                        name => {
                            all.output = true;
                            all.tool_call |= matches!(
                                name,
                                b"function_call" | b"custom_tool_call" | b"mcp_call"
                            );
                        }
                    }
                }
                Ok(all)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(s: &mut Responses, name: &str, data: &str) -> Verdict {
        s.event(
            name.as_bytes(),
            data.as_bytes(),
            &mut EngineReport::default(),
        )
    }

    fn body(json: &[u8]) -> Verdict {
        super::body(json, &mut EngineReport::default())
    }

    /// The Responses API's usage details, and llama.cpp's `timings` beside `response`.
    #[test]
    fn terminal_usage_details_and_timings() {
        let mut s = Responses::default();
        let mut r = EngineReport::default();
        s.event(
            b"response.completed",
            br#"{"type":"response.completed","sequence_number":20,"response":{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":7112,"input_tokens_details":{"cached_tokens":3072},"output_tokens":463,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":7575}}}"#,
            &mut r,
        );
        assert_eq!(
            (r.cached_tokens, r.reasoning_tokens),
            (Some(3072), Some(64))
        );
        assert_eq!(r.source, None);

        let mut r = EngineReport::default();
        Responses::default().event(
            b"",
            br#"{"type":"response.completed","response":{"id":"resp_2","object":"response","status":"completed","output":[],"usage":{"input_tokens":20,"output_tokens":8,"total_tokens":28,"input_tokens_details":{"cached_tokens":16}}},"timings":{"cache_n":16,"prompt_n":4,"prompt_ms":9.5,"predicted_n":8,"predicted_ms":120.0}}"#,
            &mut r,
        );
        assert_eq!((r.cached_tokens, r.prompt_processed), (Some(16), Some(4)));
        assert_eq!(r.decode, Some(std::time::Duration::from_millis(120)));
        assert_eq!(r.source, Some(crate::parse::report::Engine::LlamaCpp));

        let mut r = EngineReport::default();
        super::body(
            br#"{"id":"resp_3","object":"response","status":"completed","output":[],"usage":{"input_tokens":5,"output_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}"#,
            &mut r,
        );
        assert_eq!((r.cached_tokens, r.reasoning_tokens), (Some(0), Some(0)));
    }

    #[test]
    fn deltas_are_output_and_text_is_content() {
        let mut s = Responses::default();
        let v = ev(
            &mut s,
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"Hi","logprobs":[],"sequence_number":4}"#,
        );
        assert!(v.output && v.content);
        let v = ev(
            &mut s,
            "response.reasoning_summary_text.delta",
            r#"{"type":"response.reasoning_summary_text.delta","delta":"Thinking","summary_index":0}"#,
        );
        assert!(v.output && !v.content);
        let v = ev(
            &mut s,
            "response.reasoning_text.delta",
            r#"{"delta":"hmm"}"#,
        );
        assert!(v.output && !v.content);
        let v = ev(&mut s, "response.refusal.delta", r#"{"delta":"No."}"#);
        assert!(v.output && v.content);
        let v = ev(&mut s, "response.output_text.delta", r#"{"delta":""}"#);
        assert!(!v.output, "an empty delta carries nothing");
        assert!(!s.tool_call);
        let v = ev(
            &mut s,
            "response.function_call_arguments.delta",
            r#"{"delta":"{\"city\""}"#,
        );
        assert!(v.output && !v.content);
        assert!(s.tool_call);
    }

    #[test]
    fn lifecycle_events_carry_nothing() {
        let mut s = Responses::default();
        for name in [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.done",
            "response.output_item.done",
            "response.function_call_arguments.done",
        ] {
            // Not even parsed: garbage is fine.
            assert_eq!(ev(&mut s, name, "{not json"), Verdict::default(), "{name}");
        }
    }

    #[test]
    fn completed_carries_usage_and_ends() {
        let mut s = Responses::default();
        let v = ev(
            &mut s,
            "response.completed",
            r#"{"type":"response.completed","response":{"id":"r","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}],"usage":{"input_tokens":7,"output_tokens":42,"output_tokens_details":{"reasoning_tokens":0}}}}"#,
        );
        assert!(v.end && !v.error && !v.output);
        assert_eq!(v.finish, Some(FinishReason::Stop));
        assert_eq!(
            (v.usage_output_tokens, v.usage_prompt_tokens),
            (Some(42), Some(7))
        );
    }

    #[test]
    fn incomplete_maps_its_reason() {
        for (reason, want) in [
            ("max_output_tokens", FinishReason::Length),
            ("content_filter", FinishReason::ContentFilter),
            ("something_new", FinishReason::Other),
        ] {
            let mut s = Responses::default();
            let data = format!(
                r#"{{"type":"response.incomplete","response":{{"status":"incomplete","incomplete_details":{{"reason":"{reason}"}},"usage":{{"input_tokens":3,"output_tokens":16}}}}}}"#
            );
            let v = ev(&mut s, "response.incomplete", &data);
            assert!(v.end && !v.error);
            assert_eq!(v.finish, Some(want));
            assert_eq!(v.usage_output_tokens, Some(16));
        }
    }

    #[test]
    fn failures() {
        let mut s = Responses::default();
        let v = ev(
            &mut s,
            "error",
            r#"{"type":"error","code":"server_error","message":"boom"}"#,
        );
        assert!(v.error);
        let v = ev(
            &mut s,
            "response.failed",
            r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error"}}}"#,
        );
        assert!(v.error && v.end);
        assert_eq!(v.finish, Some(FinishReason::Error));
    }

    #[test]
    fn type_from_the_payload_when_the_name_is_missing() {
        let mut s = Responses::default();
        let v = ev(
            &mut s,
            "",
            r#"{"type":"response.output_text.delta","delta":"Hi"}"#,
        );
        assert!(v.output && v.content);
        let v = ev(
            &mut s,
            "",
            r#"{"type":"response.completed","response":{"status":"completed","usage":{"output_tokens":2}}}"#,
        );
        assert!(v.end);
        assert_eq!(v.usage_output_tokens, Some(2));
        let v = ev(&mut s, "", r#"{"type":"response.created","response":{}}"#);
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn tool_call_stream_finishes_with_tool_calls() {
        let mut s = Responses::default();
        ev(
            &mut s,
            "response.function_call_arguments.delta",
            r#"{"delta":"{}"}"#,
        );
        let v = ev(
            &mut s,
            "response.completed",
            r#"{"response":{"status":"completed"}}"#,
        );
        assert_eq!(v.finish, Some(FinishReason::ToolCalls));
    }

    #[test]
    fn whole_bodies() {
        let v = body(
            br#"{"id":"resp_1","object":"response","status":"completed","output":[{"type":"reasoning","summary":[]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]}],"usage":{"input_tokens":12,"output_tokens":30}}"#,
        );
        assert!(v.output && v.content && v.end && !v.error);
        assert_eq!(v.finish, Some(FinishReason::Stop));
        assert_eq!(v.usage_output_tokens, Some(30));

        let v = body(
            br#"{"object":"response","status":"completed","output":[{"type":"function_call","name":"f","arguments":"{}","call_id":"c"}],"usage":{"output_tokens":9}}"#,
        );
        assert!(v.output && !v.content);
        assert_eq!(v.finish, Some(FinishReason::ToolCalls));

        let v = body(
            br#"{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[],"usage":{"output_tokens":16}}"#,
        );
        assert!(!v.output);
        assert_eq!(v.finish, Some(FinishReason::Length));

        let v = body(
            br#"{"error":{"message":"Invalid model","type":"invalid_request_error","code":null}}"#,
        );
        assert!(v.error && !v.output);
    }
}
