//! Learning which model a request asks for, from its body as it streams past to the server.
//!
//! The proxy forwards a request body frame by frame without holding any of it back, and shows
//! each frame by reference to a [`ModelScanner`], which finds the value of the top-level `model`
//! key of the JSON object, for the request's metric labels. A frame may end at any byte (inside a
//! key, an escape or a UTF-8 character), so the scanner keeps a small fixed state across frames
//! and never buffers the body: only the model name itself is copied, and only up to
//! [`MAX_MODEL_LEN`] bytes. Clients put `model` anywhere (the Python SDK writes it after
//! megabytes of `messages`), so strings are skipped by jumping from quote to quote with
//! `memchr`, and nested values eight bytes at a time, never byte by byte; the model's own string
//! is taken the same way, from its opening quote to the next quote or escape. The scanner is not a
//! validator: it follows the top-level object member by member, skips nested values by matching
//! brackets and quotes only, and leaves judging the body to the server.

use std::sync::Arc;

use memchr::{memchr2, memchr_iter};

/// The longest model name the scanner takes, in bytes after unescaping. A longer one is no name
/// anyone wants as a metric label, and the bound keeps the scanner's memory fixed.
pub(crate) const MAX_MODEL_LEN: usize = 256;

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];
const KEY: &[u8] = b"model";

/// What the scanner knows so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// Nothing is decided yet: show it more of the body.
    Pending,
    /// The string value of the top-level `model` key (possibly empty; a label layer that wants
    /// something else should map it), shared: the request's labels and record keep it as it is.
    Found(Arc<str>),
    /// The body has no usable top-level `model`, or the scanner cannot tell: not an object, a
    /// non-string or too long or undecodable value, the byte limit, or the end of the body.
    GaveUp,
}

/// The answer for a complete model name: found if it is UTF-8.
fn found_name(bytes: &[u8]) -> Scan {
    std::str::from_utf8(bytes).map_or(Scan::GaveUp, |name| Scan::Found(name.into()))
}

/// Finds the top-level `model` of a JSON request body shown to it one frame at a time.
///
/// What it accepts, beyond the plain case:
/// - A leading UTF-8 byte order mark is skipped (some Windows clients send one); whitespace
///   (space, tab, CR, LF) is allowed wherever JSON allows it.
/// - Keys are compared as raw bytes, without unescaping: a key written with escapes, such as
///   `"mod\u0065l"`, is not `model`. No client writes its keys that way.
/// - The value's escapes `\" \\ \/ \b \f \n \r \t` and `\uXXXX` are decoded. A `\u` surrogate
///   (a character outside the Basic Multilingual Plane written as an escape pair) makes it give
///   up, as does any other escape; such characters written as plain UTF-8 are fine. The decoded
///   value must be valid UTF-8 of at most `MAX_MODEL_LEN` (256) bytes.
/// - If the top-level object repeats `model`, the first one wins. (JSON leaves duplicates
///   undefined; serde_json keeps the last.)
/// - Nested values more than 256 levels deep make it give up: it keeps one bit per open level to
///   match brackets, and serde_json itself refuses more than 128.
///
/// It never reports a `model` key nested inside another value, nor the text `model` inside a
/// string. On bytes that are not JSON it gives up, or stays [`Scan::Pending`] until
/// [`finish`](Self::finish); it never panics.
#[derive(Debug, Clone)]
pub struct ModelScanner {
    limit: usize,
    seen: usize,
    state: State,
    /// One bit per open nested level, 1 for an object and 0 for an array, so that a `]` cannot
    /// close a `{` and let a nested key pass for a top-level one.
    levels: [u64; 4],
    value: Vec<u8>,
    result: Scan,
}

/// Where the scanner stands in the document: everything it remembers besides the bracket bits
/// and the model name being copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the opening `{`; `bom` counts the bytes of a byte order mark seen, and is 3 once
    /// one can no longer start.
    Start { bom: u8 },
    /// After `{` or `,` at the top level: a key must start.
    ExpectKey,
    /// Inside a top-level key whose first `matched` bytes spell the start of `model`.
    Key { matched: u8 },
    /// Inside a top-level key that is not `model`.
    OtherKey { escaped: bool },
    /// After a top-level key.
    Colon { model: bool },
    /// After the colon of a key that is not `model`.
    Value,
    /// After the colon of `model`.
    ModelValue,
    /// Inside the model's string, copying it.
    Capture(Escape),
    /// Inside a top-level string value of another key.
    Text { escaped: bool },
    /// Inside a top-level number, `true`, `false` or `null`.
    Literal,
    /// Inside a top-level object or array value, `depth` levels down.
    Nested {
        depth: u16,
        in_string: bool,
        escaped: bool,
    },
    /// After a top-level value: a `,` or the closing `}` must follow.
    AfterValue,
}

/// How far into an escape sequence the model's string is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    None,
    Backslash,
    Unicode { digits: u8, code: u32 },
}

impl ModelScanner {
    /// A scanner that gives up after `limit` body bytes without finding the key: the model's
    /// closing quote must come within the first `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            seen: 0,
            state: State::Start { bom: 0 },
            levels: [0; 4],
            value: Vec::new(),
            result: Scan::Pending,
        }
    }

    /// Shows the next frame of the body. Once it returns [`Scan::Found`] or [`Scan::GaveUp`] it
    /// keeps returning that, and ignores further input.
    pub fn feed(&mut self, data: &[u8]) -> &Scan {
        if self.result != Scan::Pending {
            return &self.result;
        }
        let room = self.limit.saturating_sub(self.seen);
        let frame = data.get(..room).unwrap_or(data);
        // Never more than `limit`, so this cannot overflow.
        self.seen += frame.len();
        self.result = match self.run(frame) {
            Err(answer) => answer,
            // The limit is reached and nothing more will be scanned, so waiting would only
            // delay the same answer.
            Ok(()) if self.seen >= self.limit => Scan::GaveUp,
            Ok(()) => Scan::Pending,
        };
        if self.result != Scan::Pending {
            self.value = Vec::new();
        }
        &self.result
    }

    /// The body ended: [`Scan::Pending`] becomes [`Scan::GaveUp`].
    pub fn finish(&mut self) -> &Scan {
        if self.result == Scan::Pending {
            self.result = Scan::GaveUp;
            self.value = Vec::new();
        }
        &self.result
    }

    /// What the scanner knows so far, without showing it anything.
    pub fn result(&self) -> &Scan {
        &self.result
    }

    /// Scans one frame. `Err` carries the final answer: it stops the scan, found or not.
    fn run(&mut self, data: &[u8]) -> Result<(), Scan> {
        let mut rest = data;
        while let Some((&byte, tail)) = rest.split_first() {
            match self.state {
                // Strings and nested values are where megabytes of prompt live: jump through
                // them instead of stepping byte by byte.
                State::OtherKey { escaped } => match skip_string(rest, escaped) {
                    Ok(after) => {
                        rest = after;
                        self.state = State::Colon { model: false };
                    }
                    Err(escaped) => {
                        self.state = State::OtherKey { escaped };
                        return Ok(());
                    }
                },
                State::Text { escaped } => match skip_string(rest, escaped) {
                    Ok(after) => {
                        rest = after;
                        self.state = State::AfterValue;
                    }
                    Err(escaped) => {
                        self.state = State::Text { escaped };
                        return Ok(());
                    }
                },
                State::Nested {
                    depth,
                    in_string: true,
                    escaped,
                } => match skip_string(rest, escaped) {
                    Ok(after) => {
                        rest = after;
                        self.state = State::Nested {
                            depth,
                            in_string: false,
                            escaped: false,
                        };
                    }
                    Err(escaped) => {
                        self.state = State::Nested {
                            depth,
                            in_string: true,
                            escaped,
                        };
                        return Ok(());
                    }
                },
                State::Nested {
                    depth,
                    in_string: false,
                    ..
                } => {
                    let Some(at) = find_structural(rest) else {
                        return Ok(());
                    };
                    let Some((&found, after)) = rest.get(at..).and_then(<[u8]>::split_first) else {
                        return Ok(());
                    };
                    rest = after;
                    self.state = self.nested(depth, found)?;
                }
                State::Capture(Escape::None) => {
                    let end = memchr2(b'"', b'\\', rest);
                    let plain = &rest[..end.unwrap_or(rest.len())];
                    // JSON forbids raw control characters in strings.
                    if plain.iter().any(|&b| b < 0x20) {
                        return Err(Scan::GaveUp);
                    }
                    let Some(at) = end else {
                        return self.keep(plain);
                    };
                    if rest[at] == b'\\' {
                        self.keep(plain)?;
                        rest = &rest[at + 1..];
                        self.state = State::Capture(Escape::Backslash);
                        continue;
                    }
                    // The whole name in this frame, as it usually is: taken at once, not copied
                    // byte by byte into the buffer first.
                    if self.value.is_empty() {
                        return Err(if plain.len() > MAX_MODEL_LEN {
                            Scan::GaveUp
                        } else {
                            found_name(plain)
                        });
                    }
                    self.keep(plain)?;
                    return Err(found_name(&self.value));
                }
                _ => {
                    rest = tail;
                    self.step(byte)?;
                }
            }
        }
        Ok(())
    }

    /// Moves through the states that take one byte at a time: the top-level punctuation, keys
    /// (compared as they pass) and the model's value.
    fn step(&mut self, byte: u8) -> Result<(), Scan> {
        self.state = match self.state {
            State::Start { bom } => match BOM.get(usize::from(bom)) {
                Some(&expected) if byte == expected => State::Start { bom: bom + 1 },
                // A byte order mark begun but not finished is not JSON.
                _ if bom != 0 && usize::from(bom) != BOM.len() => return Err(Scan::GaveUp),
                _ if is_space(byte) => State::Start {
                    bom: BOM.len() as u8,
                },
                _ if byte == b'{' => State::ExpectKey,
                _ => return Err(Scan::GaveUp),
            },
            // A `}` here is either an empty object or a trailing comma; either way, no model.
            State::ExpectKey => match byte {
                b'"' => State::Key { matched: 0 },
                _ if is_space(byte) => State::ExpectKey,
                _ => return Err(Scan::GaveUp),
            },
            State::Key { matched } => match byte {
                b'"' => State::Colon {
                    model: usize::from(matched) == KEY.len(),
                },
                b'\\' => State::OtherKey { escaped: true },
                _ if KEY.get(usize::from(matched)) == Some(&byte) => State::Key {
                    matched: matched + 1,
                },
                _ => State::OtherKey { escaped: false },
            },
            State::Colon { model } => match byte {
                b':' if model => State::ModelValue,
                b':' => State::Value,
                _ if is_space(byte) => State::Colon { model },
                _ => return Err(Scan::GaveUp),
            },
            State::Value => match byte {
                b'"' => State::Text { escaped: false },
                b'{' | b'[' => State::Nested {
                    depth: self.open(0, byte == b'{')?,
                    in_string: false,
                    escaped: false,
                },
                b'-' | b'0'..=b'9' | b'a'..=b'z' => State::Literal,
                _ if is_space(byte) => State::Value,
                _ => return Err(Scan::GaveUp),
            },
            // Numbers and literals are not checked: the server judges the body, and neither can
            // hide a key.
            State::Literal => match byte {
                b',' => State::ExpectKey,
                b'+' | b'-' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' => State::Literal,
                _ if is_space(byte) => State::AfterValue,
                _ => return Err(Scan::GaveUp),
            },
            // The closing `}` lands in the give-up arm: the object ended without a model.
            State::AfterValue => match byte {
                b',' => State::ExpectKey,
                _ if is_space(byte) => State::AfterValue,
                _ => return Err(Scan::GaveUp),
            },
            State::ModelValue => match byte {
                b'"' => {
                    self.value.clear();
                    State::Capture(Escape::None)
                }
                _ if is_space(byte) => State::ModelValue,
                _ => return Err(Scan::GaveUp),
            },
            State::Capture(escape) => State::Capture(self.capture(escape, byte)?),
            // `run` handles the rest without coming here; taking a byte for them would lose it.
            State::OtherKey { .. } | State::Text { .. } | State::Nested { .. } => {
                return Err(Scan::GaveUp)
            }
        };
        Ok(())
    }

    /// Decodes one byte of an escape in the model's string.
    fn capture(&mut self, escape: Escape, byte: u8) -> Result<Escape, Scan> {
        match escape {
            // `run` takes the plain text between escapes itself, up to the closing quote.
            Escape::None => Err(Scan::GaveUp),
            Escape::Backslash => {
                let plain = match byte {
                    b'"' | b'\\' | b'/' => byte,
                    b'b' => 0x08,
                    b'f' => 0x0C,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => return Ok(Escape::Unicode { digits: 0, code: 0 }),
                    _ => return Err(Scan::GaveUp),
                };
                self.keep(&[plain]).map(|()| Escape::None)
            }
            Escape::Unicode { digits, code } => {
                let digit = char::from(byte).to_digit(16).ok_or(Scan::GaveUp)?;
                // Four hex digits at most, so the code stays below 0x10000.
                let code = (code << 4) | digit;
                if digits < 3 {
                    return Ok(Escape::Unicode {
                        digits: digits + 1,
                        code,
                    });
                }
                // `from_u32` refuses surrogates: a model name needs no escaped astral characters,
                // and pairing them would mean remembering half a character across escapes.
                let decoded = char::from_u32(code).ok_or(Scan::GaveUp)?;
                self.keep(decoded.encode_utf8(&mut [0; 4]).as_bytes())
                    .map(|()| Escape::None)
            }
        }
    }

    fn keep(&mut self, bytes: &[u8]) -> Result<(), Scan> {
        if self.value.len().saturating_add(bytes.len()) > MAX_MODEL_LEN {
            return Err(Scan::GaveUp);
        }
        self.value.extend_from_slice(bytes);
        Ok(())
    }

    /// Follows one quote or bracket inside a nested value.
    fn nested(&mut self, depth: u16, byte: u8) -> Result<State, Scan> {
        let depth = match byte {
            b'"' => {
                return Ok(State::Nested {
                    depth,
                    in_string: true,
                    escaped: false,
                })
            }
            b'{' | b'[' => self.open(depth, byte == b'{')?,
            b'}' | b']' => self.close(depth, byte == b'}')?,
            _ => return Err(Scan::GaveUp),
        };
        Ok(if depth == 0 {
            State::AfterValue
        } else {
            State::Nested {
                depth,
                in_string: false,
                escaped: false,
            }
        })
    }

    /// Opens a nested level below `depth` levels; past the bits there are, gives up.
    fn open(&mut self, depth: u16, object: bool) -> Result<u16, Scan> {
        let word = self
            .levels
            .get_mut(usize::from(depth / 64))
            .ok_or(Scan::GaveUp)?;
        let mask = 1u64 << (depth % 64);
        if object {
            *word |= mask;
        } else {
            *word &= !mask;
        }
        Ok(depth + 1)
    }

    /// Closes the innermost of `depth` open levels, which must be of the same kind.
    fn close(&self, depth: u16, object: bool) -> Result<u16, Scan> {
        let top = depth.checked_sub(1).ok_or(Scan::GaveUp)?;
        let word = self.levels.get(usize::from(top / 64)).ok_or(Scan::GaveUp)?;
        if ((word >> (top % 64)) & 1 == 1) == object {
            Ok(top)
        } else {
            Err(Scan::GaveUp)
        }
    }
}

/// Skips the rest of a JSON string, from just after its opening quote or wherever the last
/// frame left it. Returns what follows the closing quote, or `Err(escaped)` if the frame ended
/// first, `escaped` when its last byte was a backslash whose escaped byte is still to come.
fn skip_string(rest: &[u8], escaped: bool) -> Result<&[u8], bool> {
    let rest = if escaped {
        match rest.split_first() {
            Some((_, after)) => after,
            None => return Err(true),
        }
    } else {
        rest
    };
    // Only quotes can end a string, so search for them alone and judge each by the backslashes
    // just before it: an odd run escapes it. Prompts are full of `\n`, and stopping at every
    // backslash (as `memchr2` would) costs several times more on such text. No run reaches back
    // past the start of `rest`, where no escape is pending, and each backslash is counted once.
    for quote in memchr_iter(b'"', rest) {
        let before = rest.get(..quote).unwrap_or_default();
        if trailing_backslashes(before) % 2 == 0 {
            return Ok(rest.get(quote + 1..).unwrap_or_default());
        }
    }
    Err(trailing_backslashes(rest) % 2 == 1)
}

fn trailing_backslashes(bytes: &[u8]) -> usize {
    bytes.iter().rev().take_while(|&&b| b == b'\\').count()
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

fn is_structural(byte: u8) -> bool {
    matches!(byte, b'"' | b'{' | b'[' | b'}' | b']')
}

/// Where the next quote or bracket is. Nested values can be long runs of numbers (a prompt
/// given as token ids), so it tests eight bytes at a time before looking for the byte itself.
fn find_structural(bytes: &[u8]) -> Option<usize> {
    let mut offset = 0;
    for word in bytes.chunks_exact(8) {
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            break;
        };
        if has_structural(u64::from_le_bytes(word)) {
            break;
        }
        offset += 8;
    }
    bytes
        .get(offset..)?
        .iter()
        .position(|&b| is_structural(b))
        .map(|at| offset + at)
}

/// Whether any of the eight bytes in `word` is a quote or bracket, without a branch per byte.
fn has_structural(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Nonzero exactly when some byte of `x` is zero (the classic test; the subtraction is
    // meant to wrap).
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS != 0;
    // Setting bit 5 turns `[` into `{` and `]` into `}`, and no other byte into either.
    let folded = word | (ONES * 0x20);
    has_zero(word ^ (ONES * u64::from(b'"')))
        || has_zero(folded ^ (ONES * u64::from(b'{')))
        || has_zero(folded ^ (ONES * u64::from(b'}')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;
    use serde_json::Value;

    const NO_LIMIT: usize = usize::MAX;

    fn found(name: &str) -> Scan {
        Scan::Found(name.into())
    }

    /// Feeds the frames in order, then ends the body.
    fn scan_frames<'a>(frames: impl IntoIterator<Item = &'a [u8]>, limit: usize) -> Scan {
        let mut scanner = ModelScanner::new(limit);
        for frame in frames {
            let before = scanner.result().clone();
            let now = scanner.feed(frame).clone();
            if before != Scan::Pending {
                assert_eq!(now, before, "a decided scanner changed its answer");
            }
        }
        scanner.finish().clone()
    }

    fn scan_whole(body: &[u8], limit: usize) -> Scan {
        scan_frames([body], limit)
    }

    /// Cuts the body at the given points (any order, repeats allowed) and feeds the pieces.
    fn scan_cut(body: &[u8], cuts: &[usize], limit: usize) -> Scan {
        let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(body.len())).collect();
        cuts.sort_unstable();
        let mut frames = Vec::new();
        let mut from = 0;
        for cut in cuts {
            frames.push(&body[from..cut]);
            from = cut;
        }
        frames.push(&body[from..]);
        scan_frames(frames, limit)
    }

    fn table() -> Vec<(&'static str, Vec<u8>, usize, Scan)> {
        let long = |n: usize| format!(r#"{{"model":"{}"}}"#, "a".repeat(n));
        let deep = |n: usize| format!(r#"{{"a":{}{},"model":"m"}}"#, "[".repeat(n), "]".repeat(n));
        let cases: Vec<(&'static str, String, usize, Scan)> = vec![
            (
                "model first",
                r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"stream":true}"#.into(),
                NO_LIMIT,
                found("llama-3-8b"),
            ),
            (
                "model last, as the Python SDK writes it",
                r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"model":"gpt-4o"}"#.into(),
                NO_LIMIT,
                found("gpt-4o"),
            ),
            (
                "model in the middle",
                r#"{"stream":true,"model":"m","max_tokens":10}"#.into(),
                NO_LIMIT,
                found("m"),
            ),
            (
                "nested model keys in objects come first",
                r#"{"messages":[{"role":"user","model":"inner","content":"x"}],"tools":[{"function":{"model":"deep"}}],"model":"outer"}"#.into(),
                NO_LIMIT,
                found("outer"),
            ),
            (
                "nested model keys in arrays and objects",
                r#"{"a":[["model"],{"model":[1,{"model":"x"}]}],"b":{"model":"y"},"model":"outer"}"#.into(),
                NO_LIMIT,
                found("outer"),
            ),
            (
                "only nested model keys",
                r#"{"messages":[{"model":"inner"}],"extra":{"model":"x"}}"#.into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            (
                "model as a value, then as a key",
                r#"{"name":"model","model":"real"}"#.into(),
                NO_LIMIT,
                found("real"),
            ),
            (
                "model only as a value",
                r#"{"x":"model","y":["model"]}"#.into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            (
                "quoted key text and brackets inside a nested string",
                r#"{"messages":[{"content":"say \"model\": \"fake\" {}[] } ] {"}],"model":"real"}"#.into(),
                NO_LIMIT,
                found("real"),
            ),
            (
                "quoted key text inside a top-level string",
                r#"{"prompt":"\"model\":\"fake\"","model":"real"}"#.into(),
                NO_LIMIT,
                found("real"),
            ),
            (
                "a whole fake member inside a string",
                r#"{"prompt":"{\"model\":\"fake\"}","p2":"\",\"model\":\"fake2"}"#.into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            (
                "escaped backslashes before a closing quote",
                r#"{"a":"a\\\\","b":["x\\",{"c":"\\"}],"model":"m"}"#.into(),
                NO_LIMIT,
                found("m"),
            ),
            (
                "escaped backslash then escaped quote",
                r#"{"a":"\\\"model\\\":1","model":"m"}"#.into(),
                NO_LIMIT,
                found("m"),
            ),
            (
                "escapes in a key that is not model",
                r#"{"k\"model":1,"\\":2,"\u0041":3,"model":"m"}"#.into(),
                NO_LIMIT,
                found("m"),
            ),
            (
                "whitespace everywhere",
                " \r\n\t{ \n\"messages\" :\t[ { \"a\" : 1 } , 2 ] ,\r\n \"n\"\t: -1.5e+10 , \"t\" : true\n,\n\"model\" \t:\r\n \"m\" \n}\n".into(),
                NO_LIMIT,
                found("m"),
            ),
            (
                "literals before the model",
                r#"{"a":null,"b":false,"c":true,"d":-0.5E-3,"e":0,"model":"m"}"#.into(),
                NO_LIMIT,
                found("m"),
            ),
            ("model is null", r#"{"model":null}"#.into(), NO_LIMIT, Scan::GaveUp),
            ("model is a number", r#"{"model": 42}"#.into(), NO_LIMIT, Scan::GaveUp),
            (
                "model is an object",
                r#"{"model":{"name":"x"}}"#.into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            ("model is an array", r#"{"model":["x"]}"#.into(), NO_LIMIT, Scan::GaveUp),
            ("model is empty", r#"{"model":""}"#.into(), NO_LIMIT, found("")),
            ("no model", r#"{"messages":[]}"#.into(), NO_LIMIT, Scan::GaveUp),
            ("empty object", "{}".into(), NO_LIMIT, Scan::GaveUp),
            ("empty body", String::new(), NO_LIMIT, Scan::GaveUp),
            ("only whitespace", " \n ".into(), NO_LIMIT, Scan::GaveUp),
            ("not an object: array", r#"["model","x"]"#.into(), NO_LIMIT, Scan::GaveUp),
            (
                "not an object: array of objects",
                r#"  [{"model":"x"}]"#.into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            ("not an object: string", r#""model""#.into(), NO_LIMIT, Scan::GaveUp),
            ("not an object: number", "42".into(), NO_LIMIT, Scan::GaveUp),
            ("not JSON", "model=x&stream=true".into(), NO_LIMIT, Scan::GaveUp),
            ("unterminated value", r#"{"model":"abc"#.into(), NO_LIMIT, Scan::GaveUp),
            (
                "limit ends just after the closing quote",
                r#"{"model":"m"}"#.into(),
                12,
                found("m"),
            ),
            (
                "limit ends just before the closing quote",
                r#"{"model":"m"}"#.into(),
                11,
                Scan::GaveUp,
            ),
            ("limit of zero", r#"{"model":"m"}"#.into(), 0, Scan::GaveUp),
            (
                "limit before a late model",
                format!(r#"{{"prompt":"{}","model":"m"}}"#, "x".repeat(1000)),
                1000,
                Scan::GaveUp,
            ),
            ("value at the length bound", long(256), NO_LIMIT, found(&"a".repeat(256))),
            ("value past the length bound", long(257), NO_LIMIT, Scan::GaveUp),
            (
                "multi-byte character past the length bound",
                format!(r#"{{"model":"{}é"}}"#, "a".repeat(255)),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            (
                "bound counts decoded bytes",
                format!(r#"{{"model":"{}"}}"#, r"\u0041".repeat(256)),
                NO_LIMIT,
                found(&"A".repeat(256)),
            ),
            (
                "escapes in the value",
                r#"{"model":"a\"b\\c\/d\n\t\r\b\f\u00e9\u20AC"}"#.into(),
                NO_LIMIT,
                found("a\"b\\c/d\n\t\r\u{8}\u{c}é€"),
            ),
            ("plain UTF-8 in the value", r#"{"model":"modèle-😀"}"#.into(), NO_LIMIT, found("modèle-😀")),
            (
                "surrogate pair in the value",
                r#"{"model":"\ud83d\ude00"}"#.into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            ("unknown escape in the value", r#"{"model":"\x41"}"#.into(), NO_LIMIT, Scan::GaveUp),
            ("bad hex in the value", r#"{"model":"\u00zz"}"#.into(), NO_LIMIT, Scan::GaveUp),
            (
                "raw control character in the value",
                "{\"model\":\"a\nb\"}".into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            (
                "escaped key is not matched (documented)",
                r#"{"mod\u0065l":"x"}"#.into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            (
                "keys that start or end like model",
                r#"{"models":"x","mode":"y","Model":"z","":1,"amodel":2,"model":"m"}"#.into(),
                NO_LIMIT,
                found("m"),
            ),
            (
                "first of two models wins",
                r#"{"model":"a","model":"b"}"#.into(),
                NO_LIMIT,
                found("a"),
            ),
            (
                "byte order mark",
                "\u{FEFF}{\"model\":\"m\"}".into(),
                NO_LIMIT,
                found("m"),
            ),
            (
                "byte order mark after whitespace",
                " \u{FEFF}{\"model\":\"m\"}".into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            (
                "mismatched brackets",
                r#"{"a":{"b":[}],"model":"x"}"#.into(),
                NO_LIMIT,
                Scan::GaveUp,
            ),
            ("missing colon", r#"{"a" "model":"x"}"#.into(), NO_LIMIT, Scan::GaveUp),
            ("two values", r#"{"a":1 2,"model":"x"}"#.into(), NO_LIMIT, Scan::GaveUp),
            ("leading comma", r#"{,"model":"x"}"#.into(), NO_LIMIT, Scan::GaveUp),
            ("trailing comma", r#"{"a":1,}"#.into(), NO_LIMIT, Scan::GaveUp),
            ("nesting at the bound", deep(256), NO_LIMIT, found("m")),
            ("nesting past the bound", deep(257), NO_LIMIT, Scan::GaveUp),
            (
                "garbage after the answer is ignored",
                "{\"model\":\"m\"\u{0}]]]\"".into(),
                NO_LIMIT,
                found("m"),
            ),
        ];
        let mut cases: Vec<_> = cases
            .into_iter()
            .map(|(name, body, limit, want)| (name, body.into_bytes(), limit, want))
            .collect();
        cases.push((
            "invalid UTF-8 in the value",
            b"{\"model\":\"a\xffb\"}".to_vec(),
            NO_LIMIT,
            Scan::GaveUp,
        ));
        cases.push((
            "invalid UTF-8 elsewhere is skipped",
            b"{\"x\":\"\xff\xfe\",\"model\":\"m\"}".to_vec(),
            NO_LIMIT,
            found("m"),
        ));
        cases.push((
            "half a byte order mark",
            b"\xef\xbb{\"model\":\"m\"}".to_vec(),
            NO_LIMIT,
            Scan::GaveUp,
        ));
        cases
    }

    #[test]
    fn table_cases() {
        for (name, body, limit, want) in table() {
            assert_eq!(scan_whole(&body, limit), want, "{name}");
        }
    }

    #[test]
    fn table_cases_do_not_depend_on_frame_boundaries() {
        for (name, body, limit, want) in table() {
            for cut in 0..=body.len() {
                assert_eq!(scan_cut(&body, &[cut], limit), want, "{name}, cut at {cut}");
            }
            let bytes = body.chunks(1);
            assert_eq!(scan_frames(bytes, limit), want, "{name}, one byte a frame");
        }
    }

    #[test]
    fn answer_is_kept_and_input_ignored_once_decided() {
        let mut scanner = ModelScanner::new(NO_LIMIT);
        assert_eq!(scanner.feed(br#"{"model":"m"#), &Scan::Pending);
        assert_eq!(scanner.feed(br#"", "model": "#), &found("m"));
        assert_eq!(scanner.feed(b"\xff garbage"), &found("m"));
        assert_eq!(scanner.finish(), &found("m"));
        assert_eq!(scanner.result(), &found("m"));

        let mut scanner = ModelScanner::new(NO_LIMIT);
        assert_eq!(scanner.feed(b"["), &Scan::GaveUp);
        assert_eq!(scanner.feed(br#"{"model":"m"}"#), &Scan::GaveUp);
    }

    // ---- Property tests: random JSON written many ways, checked against serde_json. ----

    fn fragment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("model".to_string()),
            Just("\"model\":".to_string()),
            Just("\"model\":\"fake\"".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("\\\"".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(",".to_string()),
            Just(":".to_string()),
            Just("/".to_string()),
            Just("\n".to_string()),
            Just("\u{1}".to_string()),
            Just("é".to_string()),
            Just("€".to_string()),
            Just("😀".to_string()),
            Just("\u{FEFF}".to_string()),
            "[a-z ]{1,8}",
            any::<char>().prop_map(String::from),
        ]
    }

    fn text(max: usize) -> impl Strategy<Value = String> {
        prop::collection::vec(fragment(), 0..max).prop_map(|parts| parts.concat())
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => text(4),
            2 => Just("model".to_string()),
            1 => Just("mode".to_string()),
            1 => Just("models".to_string()),
            1 => Just("Model".to_string()),
            1 => Just("messages".to_string()),
        ]
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e12..1e12f64).prop_map(Value::from),
            text(6).prop_map(Value::String),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..5)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    fn model_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => text(8).prop_map(Value::String),
            2 => "[a-zA-Z0-9./:-]{1,40}".prop_map(Value::String),
            1 => "[a-z0-9]{250,260}".prop_map(Value::String),
            1 => "[é]{126,130}".prop_map(Value::String),
            1 => leaf(),
            1 => value(),
        ]
    }

    /// Top-level members in the order they are written, keys unique (the first kept), since
    /// serde_json and the scanner disagree, on purpose, about repeated keys.
    fn members() -> impl Strategy<Value = Vec<(String, Value)>> {
        (
            prop::collection::vec((key(), value()), 0..6),
            prop::option::of((any::<Index>(), model_value())),
        )
            .prop_map(|(mut members, model)| {
                if let Some((at, value)) = model {
                    let at = at.index(members.len() + 1);
                    members.insert(at, ("model".to_string(), value));
                }
                let mut seen = std::collections::HashSet::new();
                members.retain(|(key, _)| seen.insert(key.clone()));
                members
            })
    }

    /// A JSON writer that keeps member order and, unlike serde_json, puts random whitespace
    /// between tokens and writes characters with every escape JSON allows.
    struct Wild {
        out: Vec<u8>,
        rng: u64,
    }

    impl Wild {
        fn roll(&mut self, sides: u64) -> u64 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            self.rng % sides
        }

        fn space(&mut self) {
            if self.roll(3) == 0 {
                for _ in 0..=self.roll(3) {
                    let pick = self.roll(4) as usize;
                    self.out.push(b" \t\n\r"[pick]);
                }
            }
        }

        /// `pairs`: whether astral characters may be written as surrogate escape pairs, which
        /// the scanner refuses in the model's value. `optional`: whether characters that need
        /// no escape may get one anyway, which would hide the top-level key `model`.
        fn string(&mut self, s: &str, pairs: bool, optional: bool) {
            self.out.push(b'"');
            for c in s.chars() {
                let must = c == '"' || c == '\\' || c < ' ';
                if !must && (!optional || self.roll(4) != 0) {
                    self.out
                        .extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    continue;
                }
                let short = match c {
                    '"' | '\\' | '/' => Some(c),
                    '\n' => Some('n'),
                    '\t' => Some('t'),
                    '\r' => Some('r'),
                    '\u{8}' => Some('b'),
                    '\u{c}' => Some('f'),
                    _ => None,
                };
                let mut units = [0u16; 2];
                let units = c.encode_utf16(&mut units);
                let unicode = units.len() == 1 || pairs;
                match short {
                    Some(short) if !unicode || self.roll(2) == 0 => {
                        self.out.extend_from_slice(format!("\\{short}").as_bytes());
                    }
                    _ if unicode => {
                        for unit in units.iter() {
                            let hex = if self.roll(2) == 0 {
                                format!("\\u{unit:04x}")
                            } else {
                                format!("\\u{unit:04X}")
                            };
                            self.out.extend_from_slice(hex.as_bytes());
                        }
                    }
                    _ => self
                        .out
                        .extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
            self.out.push(b'"');
        }

        fn value(&mut self, value: &Value, pairs: bool) {
            match value {
                Value::String(s) => self.string(s, pairs, true),
                Value::Array(items) => {
                    self.out.push(b'[');
                    for (n, item) in items.iter().enumerate() {
                        self.space();
                        if n > 0 {
                            self.out.push(b',');
                            self.space();
                        }
                        self.value(item, true);
                    }
                    self.space();
                    self.out.push(b']');
                }
                Value::Object(members) => self.object(members.iter(), true),
                _ => self
                    .out
                    .extend_from_slice(serde_json::to_string(value).unwrap().as_bytes()),
            }
        }

        fn object<'a>(
            &mut self,
            members: impl Iterator<Item = (&'a String, &'a Value)>,
            top: bool,
        ) {
            self.out.push(b'{');
            for (n, (key, value)) in members.enumerate() {
                self.space();
                if n > 0 {
                    self.out.push(b',');
                    self.space();
                }
                let model = top && key == "model";
                self.string(key, true, !model);
                self.space();
                self.out.push(b':');
                self.space();
                self.value(value, !model);
            }
            self.space();
            self.out.push(b'}');
        }
    }

    #[derive(Debug, Clone)]
    enum Layout {
        Compact,
        Pretty,
        Wild(u64),
    }

    fn layout() -> impl Strategy<Value = Layout> {
        prop_oneof![
            Just(Layout::Compact),
            Just(Layout::Pretty),
            (1..u64::MAX).prop_map(Layout::Wild),
        ]
    }

    fn write(members: &[(String, Value)], layout: &Layout) -> Vec<u8> {
        let object = || Value::Object(members.iter().cloned().collect());
        match layout {
            Layout::Compact => serde_json::to_vec(&object()).unwrap(),
            Layout::Pretty => serde_json::to_vec_pretty(&object()).unwrap(),
            Layout::Wild(seed) => {
                let mut wild = Wild {
                    out: Vec::new(),
                    rng: *seed,
                };
                wild.space();
                wild.object(members.iter().map(|(k, v)| (k, v)), true);
                wild.space();
                wild.out
            }
        }
    }

    /// What serde_json, reading the whole body, says the scanner should answer.
    fn oracle(body: &[u8]) -> Scan {
        let parsed: Value = serde_json::from_slice(body).expect("the writers write valid JSON");
        match parsed.get("model").and_then(Value::as_str) {
            Some(name) if name.len() <= MAX_MODEL_LEN => found(name),
            _ => Scan::GaveUp,
        }
    }

    /// Bytes that look enough like JSON to reach every state, and enough unlike it to break it.
    fn jsonish() -> impl Strategy<Value = Vec<u8>> {
        let token = prop_oneof![
            Just(b"{".to_vec()),
            Just(b"}".to_vec()),
            Just(b"[".to_vec()),
            Just(b"]".to_vec()),
            Just(b"\"".to_vec()),
            Just(b"\\".to_vec()),
            Just(b"\\u".to_vec()),
            Just(b":".to_vec()),
            Just(b",".to_vec()),
            Just(b" ".to_vec()),
            Just(b"\"model\"".to_vec()),
            Just(b"\"model\":\"".to_vec()),
            Just(b"model".to_vec()),
            Just(b"1".to_vec()),
            Just(b"d834".to_vec()),
            Just(b"null".to_vec()),
            Just(vec![0xEF]),
            Just(vec![0xFF]),
            prop::collection::vec(any::<u8>(), 1..4),
        ];
        (prop::bool::ANY, prop::collection::vec(token, 0..40)).prop_map(|(open, tokens)| {
            let mut body = if open { b"{".to_vec() } else { Vec::new() };
            body.extend(tokens.concat());
            body
        })
    }

    fn check_sane(answer: &Scan) {
        if let Scan::Found(name) = answer {
            assert!(name.len() <= MAX_MODEL_LEN);
        }
        assert_ne!(answer, &Scan::Pending, "finish left the scanner pending");
    }

    /// The byte-at-a-time definition of a string's end that `skip_string` must match: it
    /// returns how many bytes the string took, or whether an escape is pending at the end.
    fn string_end_slowly(bytes: &[u8], mut escaped: bool) -> Result<usize, bool> {
        for (at, &byte) in bytes.iter().enumerate() {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                return Ok(at + 1);
            }
        }
        Err(escaped)
    }

    fn string_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop_oneof![Just(b'"'), Just(b'\\'), Just(b'a'), Just(b'{'), any::<u8>()],
            0..80,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn skip_string_finds_the_same_end_as_stepping(
            bytes in string_bytes(),
            escaped in any::<bool>(),
        ) {
            let fast = skip_string(&bytes, escaped).map(|after| bytes.len() - after.len());
            prop_assert_eq!(fast, string_end_slowly(&bytes, escaped));
        }

        #[test]
        fn find_structural_finds_the_first_quote_or_bracket(bytes in string_bytes()) {
            let slow = bytes.iter().position(|&b| is_structural(b));
            prop_assert_eq!(find_structural(&bytes), slow);
        }

        #[test]
        fn agrees_with_serde_json_however_split(
            members in members(),
            layout in layout(),
            cuts in prop::collection::vec(any::<Index>(), 0..8),
        ) {
            let body = write(&members, &layout);
            let want = oracle(&body);
            let cuts: Vec<usize> = cuts.iter().map(|c| c.index(body.len() + 1)).collect();
            prop_assert_eq!(scan_whole(&body, NO_LIMIT), want.clone());
            prop_assert_eq!(scan_cut(&body, &cuts, NO_LIMIT), want);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_split_the_same(
            body in prop::collection::vec(any::<u8>(), 0..300),
            cuts in prop::collection::vec(any::<Index>(), 0..8),
            limit in prop_oneof![Just(NO_LIMIT), 0..400usize],
        ) {
            let cuts: Vec<usize> = cuts.iter().map(|c| c.index(body.len() + 1)).collect();
            let whole = scan_whole(&body, limit);
            check_sane(&whole);
            prop_assert_eq!(scan_cut(&body, &cuts, limit), whole);
        }

        #[test]
        fn broken_json_never_panics_and_splits_the_same(
            body in jsonish(),
            cuts in prop::collection::vec(any::<Index>(), 0..8),
        ) {
            let cuts: Vec<usize> = cuts.iter().map(|c| c.index(body.len() + 1)).collect();
            let whole = scan_whole(&body, NO_LIMIT);
            check_sane(&whole);
            prop_assert_eq!(scan_cut(&body, &cuts, NO_LIMIT), whole);
        }

        #[test]
        fn damaged_documents_never_panic_and_split_the_same(
            members in members(),
            layout in layout(),
            at in any::<Index>(),
            byte in any::<u8>(),
            cuts in prop::collection::vec(any::<Index>(), 0..8),
        ) {
            let mut body = write(&members, &layout);
            if !body.is_empty() {
                let at = at.index(body.len());
                body[at] = byte;
            }
            let cuts: Vec<usize> = cuts.iter().map(|c| c.index(body.len() + 1)).collect();
            let whole = scan_whole(&body, NO_LIMIT);
            check_sane(&whole);
            prop_assert_eq!(scan_cut(&body, &cuts, NO_LIMIT), whole);
        }
    }
}
