//! Ollama's native API: `/api/generate` and `/api/chat`, NDJSON lines or one JSON object
//! (`"stream": false`).
//!
//! A line carries output when its `response` (generate), `message.content` (chat), `thinking` or
//! `message.thinking` is non-empty, or its `message.tool_calls` holds a call; visible content is
//! `response` and `message.content`, never thinking or tool calls. The end marker is
//! `done: true`; that line carries `eval_count` (the output count), `prompt_eval_count` (the
//! prompt count) and `done_reason` (`stop`, `length`; `load`/`unload` are `other`). A line
//! `{"error": ...}` under the 200 is an error. The count arrives only at the end, so events carry
//! no per-event token counts.
//!
//! The `done` line also carries Ollama's own timing, in nanoseconds: `load_duration` (loading
//! the model; large when it was cold), `prompt_eval_duration` (the prompt), `eval_duration`
//! (generation) and `total_duration`. Ollama reports no cache or reasoning counts.

use serde::Deserialize;

use super::{
    update, Alarm, Count, Engine, EngineReport, Finish, Flag, Nanos, Shape, ToolCalls, Verdict,
};

#[derive(Deserialize)]
struct Line {
    #[serde(default)]
    response: Shape,
    #[serde(default)]
    thinking: Shape,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    done: Flag,
    #[serde(default)]
    done_reason: Finish,
    #[serde(default)]
    eval_count: Count,
    #[serde(default)]
    prompt_eval_count: Count,
    #[serde(default)]
    load_duration: Nanos,
    #[serde(default)]
    prompt_eval_duration: Nanos,
    #[serde(default)]
    eval_duration: Nanos,
    #[serde(default)]
    total_duration: Nanos,
    #[serde(default, deserialize_with = "Alarm::error_field")]
    error: Alarm,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Shape,
    #[serde(default)]
    thinking: Shape,
    #[serde(default)]
    tool_calls: ToolCalls,
}

fn read(json: &[u8], report: &mut EngineReport) -> Verdict {
    let Ok(line) = serde_json::from_slice::<Line>(json) else {
        return Verdict::default();
    };
    let timing = [
        line.load_duration.0,
        line.prompt_eval_duration.0,
        line.eval_duration.0,
        line.total_duration.0,
    ];
    if timing.iter().any(Option::is_some) {
        update(&mut report.load, line.load_duration.0);
        update(&mut report.prefill, line.prompt_eval_duration.0);
        update(&mut report.decode, line.eval_duration.0);
        update(&mut report.total, line.total_duration.0);
        report.source = Some(Engine::Ollama);
    }
    let (message_content, message_output) = match &line.message {
        Some(m) => (
            m.content.filled(),
            m.content.filled() || m.thinking.filled() || m.tool_calls.0,
        ),
        None => (false, false),
    };
    let content = line.response.filled() || message_content;
    let done = line.done.0;
    Verdict {
        output: content || message_output || line.thinking.filled(),
        content,
        end: done,
        error: line.error.0,
        finish: line.done_reason.0,
        // Counts on a line that is not the last are not the stream's (none are sent there).
        usage_output_tokens: line.eval_count.0.filter(|_| done),
        usage_prompt_tokens: line.prompt_eval_count.0.filter(|_| done),
        tokens: None,
    }
}

pub(super) fn event(_event_type: &[u8], data: &[u8], report: &mut EngineReport) -> Verdict {
    read(data, report)
}

/// `"stream": false`: one object with `done: true`.
pub(super) fn body(body: &[u8], report: &mut EngineReport) -> Verdict {
    read(body, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::event::FinishReason;

    fn ev(data: &str) -> Verdict {
        event(b"", data.as_bytes(), &mut EngineReport::default())
    }

    fn body(json: &[u8]) -> Verdict {
        super::body(json, &mut EngineReport::default())
    }

    #[test]
    fn generate_lines() {
        let v = ev(
            r#"{"model":"llama3.2","created_at":"2023-08-04T08:52:19.385406455-07:00","response":"The","done":false}"#,
        );
        assert!(v.output && v.content && !v.end);
        let v = ev(
            r#"{"model":"qwen3","created_at":"2025-05-29T09:35:56.836222Z","response":"","thinking":"Let me","done":false}"#,
        );
        assert!(v.output && !v.content);
        let v = ev(
            r#"{"model":"llama3.2","created_at":"2023-08-04T19:22:45.499127Z","response":"","done":true,"done_reason":"stop","context":[1,2,3],"total_duration":10706818083,"load_duration":6338219291,"prompt_eval_count":26,"prompt_eval_duration":130079000,"eval_count":259,"eval_duration":4232710000}"#,
        );
        assert!(!v.output && v.end);
        assert_eq!(v.finish, Some(FinishReason::Stop));
        assert_eq!(
            (v.usage_output_tokens, v.usage_prompt_tokens),
            (Some(259), Some(26))
        );
    }

    #[test]
    fn chat_lines() {
        let v = ev(
            r#"{"model":"qwen3","created_at":"2025-05-29T09:35:56Z","message":{"role":"assistant","content":"","thinking":"Hmm"},"done":false}"#,
        );
        assert!(v.output && !v.content);
        let v = ev(
            r#"{"model":"llama3.2","created_at":"2023-08-04T08:52:19Z","message":{"role":"assistant","content":"Hi","images":null},"done":false}"#,
        );
        assert!(v.output && v.content);
        let v = ev(
            r#"{"model":"llama3.2","created_at":"2024-07-22T20:33:28Z","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Toronto"}}}]},"done":false}"#,
        );
        assert!(v.output && !v.content);
        let v = ev(
            r#"{"model":"llama3.2","created_at":"2023-08-04T19:22:45Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"length","eval_count":16,"prompt_eval_count":9}"#,
        );
        assert!(!v.output && v.end);
        assert_eq!(v.finish, Some(FinishReason::Length));
        assert_eq!(v.usage_output_tokens, Some(16));
    }

    #[test]
    fn load_and_errors() {
        let v = ev(
            r#"{"model":"llama3.2","created_at":"2024-09-12T21:17:29Z","response":"","done":true,"done_reason":"load"}"#,
        );
        assert!(v.end);
        assert_eq!(v.finish, Some(FinishReason::Other));
        let v = ev(r#"{"error":"an error was encountered while running the model"}"#);
        assert!(v.error && !v.output && !v.end);
    }

    /// The `done` line's timing, in nanoseconds; other lines report nothing.
    #[test]
    fn done_line_durations() {
        let mut r = EngineReport::default();
        event(
            b"",
            br#"{"model":"llama3.2","created_at":"2023-08-04T08:52:19.385406455-07:00","response":"The","done":false}"#,
            &mut r,
        );
        assert!(r.is_empty());
        event(
            b"",
            br#"{"model":"llama3.2","created_at":"2023-08-04T19:22:45.499127Z","response":"","done":true,"context":[1,2,3],"total_duration":10706818083,"load_duration":6338219291,"prompt_eval_count":26,"prompt_eval_duration":130079000,"eval_count":259,"eval_duration":4232710000}"#,
            &mut r,
        );
        assert_eq!(r.load, Some(std::time::Duration::from_nanos(6_338_219_291)));
        assert_eq!(
            r.prefill,
            Some(std::time::Duration::from_nanos(130_079_000))
        );
        assert_eq!(
            r.decode,
            Some(std::time::Duration::from_nanos(4_232_710_000))
        );
        assert_eq!(
            r.total,
            Some(std::time::Duration::from_nanos(10_706_818_083))
        );
        assert_eq!(r.source, Some(crate::parse::report::Engine::Ollama));
        assert_eq!((r.cached_tokens, r.prompt_processed), (None, None));
        // A whole body with only some of them.
        let mut r = EngineReport::default();
        super::body(
            br#"{"model":"m","message":{"role":"assistant","content":"Hi"},"done":true,"total_duration":5191566416,"eval_count":298}"#,
            &mut r,
        );
        assert_eq!(
            r.total,
            Some(std::time::Duration::from_nanos(5_191_566_416))
        );
        assert_eq!(r.load, None);
    }

    #[test]
    fn whole_body() {
        let v = body(
            br#"{"model":"llama3.2","created_at":"2023-08-04T19:22:45Z","message":{"role":"assistant","content":"Hello! How are you today?"},"done":true,"done_reason":"stop","total_duration":5191566416,"prompt_eval_count":26,"eval_count":298}"#,
        );
        assert!(v.output && v.content && v.end);
        assert_eq!(v.usage_output_tokens, Some(298));
    }
}
