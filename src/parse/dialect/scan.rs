//! A strict JSON cursor for the dialects' fast paths: the common event read without serde.
//!
//! serde_json reading a typed shape spends most of an event's cost on what the reading keeps no
//! trace of: every key is validated as UTF-8 and matched as a string, every kept raw value is
//! validated again, and the skipped fields (`id`, `model`, `created`, ...) are walked by a general
//! parser. Most events of a stream have one shape (a token chunk), so a dialect may read that
//! shape with this cursor first and hand anything else to serde_json.
//!
//! The contract that keeps the two readings one: the cursor is never more lenient than
//! serde_json. It accepts only well-formed JSON (RFC 8259: strict numbers, escapes and literals,
//! no trailing commas, only whitespace after the document), all of it valid UTF-8, keys without
//! escapes, nesting at most [`MAX_DEPTH`] deep in skipped values; on anything else a method
//! answers `None` and the dialect falls back to serde_json, which then decides. So for every
//! event the cursor reads, serde_json would read the same fields from the same bytes
//! (`dialect::tests` checks this on every captured stream and on mutations of them).

/// The deepest nesting a skipped value may have; deeper is serde_json's to judge.
const MAX_DEPTH: usize = 32;

/// A position in one JSON text.
pub(super) struct Cursor<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `text`, or `None` when `text` is not UTF-8 (checked once here,
    /// so that strings need no check of their own).
    pub(super) fn new(text: &'a [u8]) -> Option<Cursor<'a>> {
        utf8(text)?;
        Some(Cursor { text, at: 0 })
    }

    /// Consumes exactly `bytes`, which must come next (no whitespace is skipped): the bytes
    /// between values of a chunk read before, which put the cursor in the same state.
    pub(super) fn literal_bytes(&mut self, bytes: &[u8]) -> Option<()> {
        let end = self.at + bytes.len();
        (self.text.get(self.at..end)? == bytes).then(|| self.at = end)
    }

    /// Where the cursor is.
    pub(super) fn position(&self) -> usize {
        self.at
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    pub(super) fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.text.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// The end of the document: nothing but whitespace is left.
    pub(super) fn end(mut self) -> Option<()> {
        self.skip_whitespace();
        (self.at == self.text.len()).then_some(())
    }

    /// Enters an object (`{`); read its members with [`Cursor::key`].
    pub(super) fn object(&mut self) -> Option<Members> {
        self.eat(b'{')?;
        Some(Members { first: true })
    }

    /// The next member's key, its `:` consumed: `Some(Some(key))`, or `Some(None)` once the
    /// object has closed. A key with an escape is not compared here: `None`.
    pub(super) fn key(&mut self, members: &mut Members) -> Option<Option<&'a [u8]>> {
        match self.peek()? {
            b'}' => {
                self.at += 1;
                return Some(None);
            }
            b',' if !members.first => self.at += 1,
            _ if members.first => {}
            _ => return None,
        }
        // A `,` just consumed must be followed by a key: `{"a":1,}` is not JSON.
        members.first = false;
        let start = self.open_string()?;
        let (end, escaped) = self.close_string()?;
        if escaped {
            return None;
        }
        let key = &self.text[start..end - 1];
        self.eat(b':')?;
        Some(Some(key))
    }

    /// Enters an array (`[`); read its elements with [`Cursor::element`].
    pub(super) fn array(&mut self) -> Option<Members> {
        self.eat(b'[')?;
        Some(Members { first: true })
    }

    /// Whether another element follows (its `,` consumed), or the array has closed (`false`).
    pub(super) fn element(&mut self, members: &mut Members) -> Option<bool> {
        match self.peek()? {
            b']' => {
                self.at += 1;
                Some(false)
            }
            // After a `,` a value must follow: `[1,]` is refused where the `]` is read as one.
            b',' if !members.first => {
                self.at += 1;
                Some(true)
            }
            _ if members.first => {
                members.first = false;
                Some(true)
            }
            _ => None,
        }
    }

    /// `null`, consumed.
    pub(super) fn null(&mut self) -> Option<()> {
        self.literal(b"null")
    }

    /// A non-negative integer without fraction or exponent that fits in a `u64`.
    pub(super) fn unsigned(&mut self) -> Option<u64> {
        self.skip_whitespace();
        let digits = self.text[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let text = &self.text[self.at..self.at + digits];
        // No leading zero, at most 19 digits (always fits), no fraction or exponent after.
        if digits == 0 || digits > 19 || (digits > 1 && text[0] == b'0') {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = self.text.get(self.at + digits) {
            return None;
        }
        self.at += digits;
        Some(text.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
    }

    /// The raw text of the next value (what serde_json's `RawValue` holds), checked and consumed.
    pub(super) fn raw(&mut self) -> Option<&'a [u8]> {
        self.skip_whitespace();
        let start = self.at;
        self.skip(0)?;
        Some(&self.text[start..self.at])
    }

    /// Checks and consumes the next value, whatever it is.
    pub(super) fn skip_value(&mut self) -> Option<()> {
        self.skip(0)
    }

    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.open_string()?;
                self.close_string().map(drop)
            }
            b'{' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                let mut members = self.object()?;
                while self.key(&mut members)?.is_some() {
                    self.skip(depth + 1)?;
                }
                Some(())
            }
            b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                let mut members = self.array()?;
                while self.element(&mut members)? {
                    self.skip(depth + 1)?;
                }
                Some(())
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.skip_whitespace();
        self.text[self.at..]
            .starts_with(word)
            .then(|| self.at += word.len())
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.text.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match self.text.get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.text.get(self.at) == Some(&b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.text.get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.text.get(self.at) {
                self.at += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        // Counted on a slice, not stepped through `self.at` (which the loop would store each time).
        let rest = self.text.get(self.at..).unwrap_or(&[]);
        self.at += rest.iter().take_while(|b| b.is_ascii_digit()).count();
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }

    /// Consumes the opening quote of a string; the position after it.
    fn open_string(&mut self) -> Option<usize> {
        self.eat(b'"')?;
        Some(self.at)
    }

    /// Consumes a string's contents and closing quote; the position after it, and whether the
    /// string held an escape. Escapes are checked as serde_json checks them (any four hex digits
    /// after `\u`); a control character is not allowed.
    fn close_string(&mut self) -> Option<(usize, bool)> {
        let mut escaped = false;
        loop {
            let rest = &self.text[self.at..];
            let stop = plain_run(rest)?;
            let byte = rest[stop];
            self.at += stop + 1;
            match byte {
                b'"' => return Some((self.at, escaped)),
                b'\\' => escaped = true,
                _ => return None,
            }
            match self.text.get(self.at)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 1,
                b'u' => {
                    let hex = self.text.get(self.at + 1..self.at + 5)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return None;
                    }
                    self.at += 5;
                }
                _ => return None,
            }
        }
    }
}

/// Whether `text` is UTF-8. Events are nearly always ASCII, which is checked a word at a time
/// for less than the general check costs on short texts.
fn utf8(text: &[u8]) -> Option<()> {
    if text.is_ascii() {
        return Some(());
    }
    std::str::from_utf8(text).ok().map(drop)
}

/// Where the first byte that ends a run of plain string contents is: a closing quote, an escape,
/// or a control character (not allowed in a JSON string). Eight bytes at a time while eight are
/// left: an event's strings are short (keys, one token), too short for a vectorised search to
/// pay for its set-up, long enough that a byte at a time costs.
fn plain_run(text: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // The high bit of each byte of `word` that is zero (the lowest one set is exact).
    let zeros = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS;
    let mut at = 0;
    while let Some(chunk) = text.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().ok()?);
        let found = zeros(word ^ (ONES * u64::from(b'"')))
            | zeros(word ^ (ONES * u64::from(b'\\')))
            // Bytes below 0x20.
            | (word.wrapping_sub(ONES * 0x20) & !word & HIGHS);
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = text[at..].iter().position(|&b| STOPS[usize::from(b)])?;
    Some(at + tail)
}

/// The bytes that end a run of plain string contents: the closing quote, an escape, and the
/// control characters JSON does not allow in a string.
const STOPS: [bool; 256] = {
    let mut stops = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        stops[b] = true;
        b += 1;
    }
    stops[b'"' as usize] = true;
    stops[b'\\' as usize] = true;
    stops
};

/// Where a cursor is among an object's members or an array's elements.
#[derive(Debug, Clone, Copy)]
pub(super) struct Members {
    first: bool,
}

/// The fields of one object a reading has taken, by the reading's own numbering (below 32):
/// serde_json refuses a field named twice, so the cursor's reading gives such an object up.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Fields(u32);

impl Fields {
    /// `None` when field `index` was taken before.
    pub(super) fn first(&mut self, index: u32) -> Option<()> {
        let bit = 1 << index;
        (self.0 & bit == 0).then(|| self.0 |= bit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Skips one whole document with the cursor; `Some` only when it is all well-formed.
    fn whole(text: &str) -> Option<()> {
        let mut cursor = Cursor::new(text.as_bytes())?;
        cursor.skip_value()?;
        cursor.end()
    }

    #[test]
    fn well_formed_json_is_read() {
        for text in [
            r#"{}"#,
            r#" { "a" : [ 1 , -2.5e+3 , 0 , 0.1 , 1E9 ] , "b" : { "c" : null } } "#,
            r#"{"s":"esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D","t":true,"f":false}"#,
            r#"[]"#,
            r#"[[],{},"",0]"#,
            "\"caf\u{e9} \u{1f600}\"",
        ] {
            assert!(whole(text).is_some(), "{text}");
            assert!(serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok());
        }
    }

    #[test]
    fn anything_serde_json_refuses_is_refused() {
        for text in [
            "",
            "{",
            r#"{"a":1,}"#,
            r#"[1,]"#,
            r#"{,"a":1}"#,
            r#"{"a" 1}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":1e}"#,
            r#"{"a":-}"#,
            r#"{"a":+1}"#,
            r#"{"a":tru}"#,
            r#"{"a":nul}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12G4"}"#,
            "{\"a\":\"tab\there\"}",
            r#"{"a":1} x"#,
            r#"{"a":1}{}"#,
            r#"{'a':1}"#,
            r#"{a:1}"#,
            r#"{"a":[1 2]}"#,
            r#"{"a":"unterminated}"#,
        ] {
            assert!(whole(text).is_none(), "{text}");
            assert!(
                serde_json::from_str::<serde::de::IgnoredAny>(text).is_err(),
                "serde_json takes {text}"
            );
        }
    }

    #[test]
    fn what_the_cursor_leaves_to_serde_json() {
        // Not UTF-8, a key with an escape, nesting deeper than MAX_DEPTH: serde_json decides.
        assert!(Cursor::new(b"{\"a\":\"\xff\"}").is_none());
        let mut cursor = Cursor::new(br#"{"ch\u006fices":1}"#).unwrap();
        let mut members = cursor.object().unwrap();
        assert!(cursor.key(&mut members).is_none());
        for (open, close) in [("[", "]"), (r#"{"a":"#, "}")] {
            let nested = |depth| format!("{}0{}", open.repeat(depth), close.repeat(depth));
            assert!(whole(&nested(MAX_DEPTH)).is_some());
            assert!(whole(&nested(MAX_DEPTH + 1)).is_none());
            // Far deeper than any stack would take if the cursor recursed without a bound.
            assert!(whole(&nested(1_000_000)).is_none());
        }
    }

    #[test]
    fn a_run_of_plain_contents_ends_at_the_first_stop() {
        for len in 0..24 {
            for stop in [b'"', b'\\', 0x00, 0x1f] {
                for filler in [b'a', 0x20, 0x7f, 0x80, 0xff, b'!', b'#', b'[', b']'] {
                    let mut text = vec![filler; len];
                    text.push(stop);
                    text.extend_from_slice(b"\"\\\x01tail");
                    assert_eq!(plain_run(&text), Some(len), "{text:?}");
                }
            }
            assert_eq!(plain_run(&vec![b'a'; len]), None);
        }
    }

    #[test]
    fn keys_raw_values_and_counts() {
        let text = br#"{"index": 12, "delta": {"content": "a\"b"}, "n": null, "big": 18446744073709551615}"#;
        let mut cursor = Cursor::new(text).unwrap();
        let mut members = cursor.object().unwrap();
        assert_eq!(cursor.key(&mut members), Some(Some(&b"index"[..])));
        assert_eq!(cursor.unsigned(), Some(12));
        assert_eq!(cursor.key(&mut members), Some(Some(&b"delta"[..])));
        assert_eq!(cursor.raw(), Some(&br#"{"content": "a\"b"}"#[..]));
        assert_eq!(cursor.key(&mut members), Some(Some(&b"n"[..])));
        assert_eq!(cursor.null(), Some(()));
        assert_eq!(cursor.key(&mut members), Some(Some(&b"big"[..])));
        // Twenty digits: past what the cursor reads as a count.
        assert_eq!(cursor.unsigned(), None);
        for bad in ["1.5", "1e3", "-1", "01", "x"] {
            assert_eq!(
                Cursor::new(bad.as_bytes()).unwrap().unsigned(),
                None,
                "{bad}"
            );
        }
    }
}
