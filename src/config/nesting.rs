//! A linear pass over configuration text that refuses nesting deeper than [`MAX_NESTING`]
//! before the YAML parser sees it.
//!
//! Why it exists: libyaml's scanner keeps one "possible simple key" per open flow collection
//! (`[` or `{`) and looks at all of them at every token, so its time grows with the square of
//! the nesting: 100,000 `[` took 21 s to refuse. Counting brackets is not enough, because a
//! bracket inside a quoted, plain or block scalar or a comment opens nothing, and a quote inside
//! a plain scalar starts nothing; a count that is wrong either way is either a false refusal or
//! a way around the limit. So this pass follows libyaml's own tokenizer rules (unsafe-libyaml
//! 0.2, `scanner.rs`, which serde_yaml 0.9 runs) closely enough to open and close exactly the
//! levels libyaml does: flow levels, and block indentation levels (`roll_indent`), which is
//! also how `- - - x` nests. It produces no tokens and keeps only the innermost simple key per
//! level. Where libyaml would stop with a syntax error this pass goes on: libyaml reads nothing
//! after its first error, so going on can only count more, never less.

/// How deep a configuration may nest, flow collections and block indentation levels together.
/// The deepest place in the schema (`routes[].match.headers.<name>`) is 5 levels down; 16
/// leaves room for any layout while keeping libyaml's cost linear.
pub const MAX_NESTING: usize = 16;

/// Text nested deeper than the limit: where the limit was passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep {
    /// 1-based, like the YAML parser's messages.
    pub line: usize,
    pub column: usize,
}

/// Refuses `text` if it nests deeper than `limit` levels anywhere; stops at the first place.
pub fn check(text: &str, limit: usize) -> Result<(), TooDeep> {
    Scanner::new(text.as_bytes(), Some(limit)).run().map(|_| ())
}

/// The deepest nesting in `text`, as the pass counts it (for tests).
#[cfg(test)]
pub(crate) fn deepest(text: &str) -> usize {
    Scanner::new(text.as_bytes(), None)
        .run()
        .unwrap_or_default()
}

/// libyaml's `yaml_simple_key_t` without what only matters for its errors and token queue.
#[derive(Debug, Clone, Copy, Default)]
struct SimpleKey {
    possible: bool,
    line: usize,
    index: usize,
    column: usize,
}

struct Scanner<'a> {
    text: &'a [u8],
    /// Byte offset: libyaml's `mark.index`, which also counts bytes.
    pos: usize,
    line: usize,
    /// In characters, as libyaml counts columns.
    column: usize,
    flow_level: usize,
    /// The current block indentation column; -1 outside any block collection.
    indent: i64,
    indents: Vec<i64>,
    simple_key_allowed: bool,
    /// One per flow level, plus the block level's.
    simple_keys: Vec<SimpleKey>,
    limit: Option<usize>,
    deepest: usize,
}

impl<'a> Scanner<'a> {
    fn new(text: &'a [u8], limit: Option<usize>) -> Self {
        Scanner {
            text,
            pos: 0,
            line: 0,
            column: 0,
            flow_level: 0,
            indent: -1,
            indents: Vec::new(),
            simple_key_allowed: true,
            simple_keys: vec![SimpleKey::default()],
            limit,
            deepest: 0,
        }
    }

    // ---- Characters, as libyaml's macros see them. The input ends at a NUL too: libyaml's
    // ---- reader refuses control characters, so it never reads past one.

    fn at(&self, k: usize) -> u8 {
        self.text.get(self.pos + k).copied().unwrap_or(0)
    }

    fn is_end(&self) -> bool {
        self.at(0) == 0
    }

    fn is_blank(&self, k: usize) -> bool {
        matches!(self.at(k), b' ' | b'\t')
    }

    fn is_break(&self, k: usize) -> bool {
        match self.at(k) {
            b'\r' | b'\n' => true,
            0xC2 => self.at(k + 1) == 0x85,
            0xE2 => self.at(k + 1) == 0x80 && matches!(self.at(k + 2), 0xA8 | 0xA9),
            _ => false,
        }
    }

    fn is_breakz(&self, k: usize) -> bool {
        self.is_break(k) || self.at(k) == 0
    }

    fn is_blankz(&self, k: usize) -> bool {
        self.is_blank(k) || self.is_breakz(k)
    }

    fn is_alpha(&self) -> bool {
        matches!(self.at(0), b'0'..=b'9' | b'A'..=b'Z' | b'a'..=b'z' | b'_' | b'-')
    }

    fn document_indicator(&self) -> bool {
        self.column == 0
            && (self.text[self.pos..].starts_with(b"---")
                || self.text[self.pos..].starts_with(b"..."))
            && self.is_blankz(3)
    }

    fn skip(&mut self) {
        let width = match self.at(0) {
            0x00..=0x7F => 1,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        self.pos = (self.pos + width).min(self.text.len());
        self.column += 1;
    }

    fn skip_line(&mut self) {
        if self.at(0) == b'\r' && self.at(1) == b'\n' {
            self.pos += 2;
        } else {
            self.skip();
        }
        self.column = 0;
        self.line += 1;
    }

    // ---- Levels.

    fn opened(&mut self) -> Result<(), TooDeep> {
        let depth = self.flow_level + self.indents.len();
        self.deepest = self.deepest.max(depth);
        match self.limit {
            Some(limit) if depth > limit => Err(TooDeep {
                line: self.line + 1,
                column: self.column + 1,
            }),
            _ => Ok(()),
        }
    }

    fn roll_indent(&mut self, column: usize) -> Result<(), TooDeep> {
        if self.flow_level == 0 && self.indent < column as i64 {
            self.indents.push(self.indent);
            self.indent = column as i64;
            self.opened()?;
        }
        Ok(())
    }

    fn unroll_indent(&mut self, column: i64) {
        if self.flow_level != 0 {
            return;
        }
        while self.indent > column {
            self.indent = self.indents.pop().unwrap_or(-1);
        }
    }

    fn increase_flow_level(&mut self) -> Result<(), TooDeep> {
        self.simple_keys.push(SimpleKey::default());
        self.flow_level += 1;
        self.opened()
    }

    fn decrease_flow_level(&mut self) {
        if self.flow_level != 0 {
            self.flow_level -= 1;
            self.simple_keys.pop();
        }
    }

    fn top_key(&mut self) -> &mut SimpleKey {
        if self.simple_keys.is_empty() {
            self.simple_keys.push(SimpleKey::default());
        }
        let last = self.simple_keys.len() - 1;
        &mut self.simple_keys[last]
    }

    fn save_simple_key(&mut self) {
        if self.simple_key_allowed {
            let key = SimpleKey {
                possible: true,
                line: self.line,
                index: self.pos,
                column: self.column,
            };
            *self.top_key() = key;
        }
    }

    fn remove_simple_key(&mut self) {
        self.top_key().possible = false;
    }

    // ---- Tokens: `yaml_parser_fetch_next_token`.

    fn run(mut self) -> Result<usize, TooDeep> {
        loop {
            self.scan_to_next_token();
            self.unroll_indent(self.column as i64);
            if self.is_end() {
                return Ok(self.deepest);
            }
            let c = self.at(0);
            if self.column == 0 && c == b'%' {
                // A directive: libyaml reads it to the end of the line or fails.
                self.unroll_indent(-1);
                self.remove_simple_key();
                self.simple_key_allowed = false;
                while !self.is_breakz(0) {
                    self.skip();
                }
                continue;
            }
            if self.document_indicator() {
                self.unroll_indent(-1);
                self.remove_simple_key();
                self.simple_key_allowed = false;
                for _ in 0..3 {
                    self.skip();
                }
                continue;
            }
            let flow = self.flow_level != 0;
            match c {
                b'[' | b'{' => {
                    self.save_simple_key();
                    self.increase_flow_level()?;
                    self.simple_key_allowed = true;
                    self.skip();
                }
                b']' | b'}' => {
                    self.remove_simple_key();
                    self.decrease_flow_level();
                    self.simple_key_allowed = false;
                    self.skip();
                }
                b',' => {
                    self.remove_simple_key();
                    self.simple_key_allowed = true;
                    self.skip();
                }
                b'-' if self.is_blankz(1) => {
                    self.roll_indent(self.column)?;
                    self.remove_simple_key();
                    self.simple_key_allowed = true;
                    self.skip();
                }
                b'?' if flow || self.is_blankz(1) => {
                    self.roll_indent(self.column)?;
                    self.remove_simple_key();
                    self.simple_key_allowed = !flow;
                    self.skip();
                }
                b':' if flow || self.is_blankz(1) => self.fetch_value()?,
                b'*' | b'&' => {
                    self.save_simple_key();
                    self.simple_key_allowed = false;
                    self.skip();
                    while self.is_alpha() {
                        self.skip();
                    }
                }
                b'!' => {
                    self.save_simple_key();
                    self.simple_key_allowed = false;
                    self.scan_tag();
                }
                b'|' | b'>' if !flow => {
                    self.remove_simple_key();
                    self.simple_key_allowed = true;
                    self.scan_block_scalar();
                }
                b'\'' | b'"' => {
                    self.save_simple_key();
                    self.simple_key_allowed = false;
                    self.scan_flow_scalar(c == b'\'');
                }
                _ if self.starts_plain_scalar(c) => {
                    self.save_simple_key();
                    self.simple_key_allowed = false;
                    self.scan_plain_scalar();
                }
                // libyaml stops here ("found character that cannot start any token").
                _ => self.skip(),
            }
        }
    }

    fn starts_plain_scalar(&self, c: u8) -> bool {
        let indicator = b"-?:,[]{}#&*!|>'\"%@`".contains(&c);
        !(self.is_blankz(0) || indicator)
            || (c == b'-' && !self.is_blank(1))
            || (self.flow_level == 0 && (c == b'?' || c == b':') && !self.is_blankz(1))
    }

    fn scan_to_next_token(&mut self) {
        loop {
            if self.column == 0 && self.text[self.pos..].starts_with(&[0xEF, 0xBB, 0xBF]) {
                self.skip();
            }
            while self.at(0) == b' '
                || ((self.flow_level != 0 || !self.simple_key_allowed) && self.at(0) == b'\t')
            {
                self.skip();
            }
            if self.at(0) == b'#' {
                while !self.is_breakz(0) {
                    self.skip();
                }
            }
            if !self.is_break(0) {
                return;
            }
            self.skip_line();
            if self.flow_level == 0 {
                self.simple_key_allowed = true;
            }
        }
    }

    fn fetch_value(&mut self) -> Result<(), TooDeep> {
        let (line, pos) = (self.line, self.pos);
        let key = *self.top_key();
        // libyaml drops a simple key once the line ends or 1024 bytes have passed.
        if key.possible && key.line == line && key.index + 1024 >= pos {
            self.roll_indent(key.column)?;
            self.top_key().possible = false;
            self.simple_key_allowed = false;
        } else {
            self.roll_indent(self.column)?;
            self.simple_key_allowed = self.flow_level == 0;
        }
        self.skip();
        Ok(())
    }

    /// `yaml_parser_scan_tag`: `!<uri>`, or `!` and a run of URI characters (which takes in the
    /// handle, `!name!`, as well).
    fn scan_tag(&mut self) {
        let verbatim = self.at(1) == b'<';
        self.skip();
        if verbatim {
            self.skip();
        }
        while self.is_alpha()
            || b";/?:@&=+$.%!~*'()".contains(&self.at(0))
            || (verbatim && b",[]".contains(&self.at(0)))
        {
            self.skip();
        }
        if verbatim && self.at(0) == b'>' {
            self.skip();
        }
    }

    /// `yaml_parser_scan_block_scalar`: the header, then every line indented at least as much
    /// as the scalar's indentation (explicit, or that of its first non-empty line).
    fn scan_block_scalar(&mut self) {
        self.skip();
        let mut increment = 0i64;
        let digit = |c: u8| c.is_ascii_digit().then(|| i64::from(c - b'0'));
        if matches!(self.at(0), b'+' | b'-') {
            self.skip();
            if let Some(d) = digit(self.at(0)) {
                if d == 0 {
                    return; // libyaml stops: an indentation indicator of 0.
                }
                increment = d;
                self.skip();
            }
        } else if let Some(d) = digit(self.at(0)) {
            if d == 0 {
                return;
            }
            increment = d;
            self.skip();
            if matches!(self.at(0), b'+' | b'-') {
                self.skip();
            }
        }
        while self.is_blank(0) {
            self.skip();
        }
        if self.at(0) == b'#' {
            while !self.is_breakz(0) {
                self.skip();
            }
        }
        if !self.is_breakz(0) {
            return; // libyaml stops: no comment or line break after the header.
        }
        if self.is_break(0) {
            self.skip_line();
        }
        let mut indent = if increment != 0 {
            if self.indent >= 0 {
                self.indent + increment
            } else {
                increment
            }
        } else {
            0
        };
        if !self.block_scalar_breaks(&mut indent) {
            return;
        }
        while self.column as i64 == indent && !self.is_end() {
            while !self.is_breakz(0) {
                self.skip();
            }
            if self.is_end() {
                return;
            }
            self.skip_line();
            if !self.block_scalar_breaks(&mut indent) {
                return;
            }
        }
    }

    /// `yaml_parser_scan_block_scalar_breaks`; `false` where libyaml stops (a tab indenting).
    fn block_scalar_breaks(&mut self, indent: &mut i64) -> bool {
        let mut max_indent = 0i64;
        loop {
            while (*indent == 0 || (self.column as i64) < *indent) && self.at(0) == b' ' {
                self.skip();
            }
            max_indent = max_indent.max(self.column as i64);
            if (*indent == 0 || (self.column as i64) < *indent) && self.at(0) == b'\t' {
                return false;
            }
            if !self.is_break(0) {
                break;
            }
            self.skip_line();
        }
        if *indent == 0 {
            *indent = max_indent.max(self.indent + 1).max(1);
        }
        true
    }

    /// `yaml_parser_scan_flow_scalar`: a single- or double-quoted scalar, over lines.
    fn scan_flow_scalar(&mut self, single: bool) {
        let quote = if single { b'\'' } else { b'"' };
        self.skip();
        loop {
            if self.document_indicator() || self.is_end() {
                return; // libyaml stops: a quoted scalar is never left open.
            }
            while !self.is_blankz(0) {
                if single && self.at(0) == b'\'' && self.at(1) == b'\'' {
                    self.skip();
                    self.skip();
                } else if self.at(0) == quote {
                    break;
                } else if !single && self.at(0) == b'\\' && self.is_break(1) {
                    self.skip();
                    self.skip_line();
                    break;
                } else if !single && self.at(0) == b'\\' {
                    let hex_digits = match self.at(1) {
                        b'x' => 2,
                        b'u' => 4,
                        b'U' => 8,
                        b'0' | b'a' | b'b' | b't' | b'\t' | b'n' | b'v' | b'f' | b'r' | b'e'
                        | b' ' | b'"' | b'/' | b'\'' | b'\\' | b'N' | b'_' | b'L' | b'P' => 0,
                        _ => return, // libyaml stops: an unknown escape.
                    };
                    self.skip();
                    self.skip();
                    for _ in 0..hex_digits {
                        if !self.at(0).is_ascii_hexdigit() {
                            return; // libyaml stops: not a hexadecimal escape.
                        }
                        self.skip();
                    }
                } else {
                    self.skip();
                }
            }
            if self.at(0) == quote {
                self.skip();
                return;
            }
            while self.is_blank(0) || self.is_break(0) {
                if self.is_blank(0) {
                    self.skip();
                } else {
                    self.skip_line();
                }
            }
        }
    }

    /// `yaml_parser_scan_plain_scalar`: words up to `: `, ` #`, a flow indicator in flow
    /// context, or, over lines, a line indented no deeper than the enclosing block.
    fn scan_plain_scalar(&mut self) {
        let indent = self.indent + 1;
        let mut leading_blanks = false;
        loop {
            if self.document_indicator() || self.at(0) == b'#' {
                break;
            }
            while !self.is_blankz(0) {
                let c = self.at(0);
                if self.flow_level != 0 && c == b':' && b",?[]{}".contains(&self.at(1)) {
                    // libyaml stops ("found unexpected ':'"); the caller reads on from here.
                    return;
                }
                if (c == b':' && self.is_blankz(1))
                    || (self.flow_level != 0 && b",[]{}".contains(&c))
                {
                    break;
                }
                self.skip();
            }
            if !(self.is_blank(0) || self.is_break(0)) {
                break;
            }
            while self.is_blank(0) || self.is_break(0) {
                if self.is_blank(0) {
                    if leading_blanks && (self.column as i64) < indent && self.at(0) == b'\t' {
                        return; // libyaml stops: a tab that violates indentation.
                    }
                    self.skip();
                } else {
                    self.skip_line();
                    leading_blanks = true;
                }
            }
            if self.flow_level == 0 && (self.column as i64) < indent {
                break;
            }
        }
        if leading_blanks {
            self.simple_key_allowed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Nesting of a parsed value: collections along the deepest path.
    fn value_depth(v: &serde_yaml::Value) -> usize {
        match v {
            serde_yaml::Value::Sequence(s) => 1 + s.iter().map(value_depth).max().unwrap_or(0),
            serde_yaml::Value::Mapping(m) => {
                1 + m
                    .iter()
                    .map(|(k, v)| value_depth(k).max(value_depth(v)))
                    .max()
                    .unwrap_or(0)
            }
            serde_yaml::Value::Tagged(t) => value_depth(&t.value),
            _ => 0,
        }
    }

    #[test]
    fn deep_flow_and_block_nesting_is_refused_at_the_limit() {
        let deep = format!("routes: {}", "[".repeat(100_000));
        assert_eq!(
            check(&deep, 16),
            Err(TooDeep {
                line: 1,
                column: 24
            })
        );
        let dashes = format!("routes:\n  {}x\n", "- ".repeat(50_000));
        assert_eq!(check(&dashes, 16).map_err(|e| e.line), Err(2));
        let mut indented = String::from("a:\n");
        for i in 1..40 {
            indented.push_str(&format!("{}b{i}:\n", " ".repeat(i)));
        }
        assert_eq!(check(&indented, 16).map_err(|e| e.line), Err(17));
        // Exactly at the limit is fine.
        assert_eq!(check(&format!("a: {}", "[".repeat(15)), 16), Ok(()));
        assert!(check(&format!("a: {}", "[".repeat(16)), 16).is_err());
    }

    #[test]
    fn the_example_config_is_shallow() {
        let text = include_str!("../../config/tokenmeter.yaml");
        assert!(deepest(text) <= 5, "{}", deepest(text));
    }

    /// Brackets that libyaml reads as text must not count, or a valid file would be refused.
    #[test]
    fn brackets_inside_scalars_and_comments_open_nothing() {
        let many = "[".repeat(100);
        for text in [
            format!("a: '{many}'\n"),
            format!("a: \"{many}\\\"{many}\"\n"),
            format!("a: x{many}\n"),
            format!("a: x\n  {many}\n"), // a plain scalar's continuation line
            format!("# {many}\na: 1\n"),
            format!("a: 1 # {many}\n"),
            format!("a: |\n  {many}\n  {many}\nb: 2\n"),
            format!("a: >-\n\n   {many}\nb: 2\n"),
            format!("a: [\"{many}\", '{many}']\n"),
            format!("a: !tag x{many}\n"),
            format!("a: 'it''s {many}'\n"),
            format!("a: \"multi\n  line {many}\"\n"),
        ] {
            assert!(deepest(&text) <= 2, "{text:?}: {}", deepest(&text));
        }
    }

    /// The ways a careless count would miss real levels: a quote that is not one, a `#` that
    /// is not a comment, a block scalar that ends earlier than its indentation suggests.
    #[test]
    fn real_levels_hidden_behind_lookalikes_are_counted() {
        let deep = "[".repeat(40);
        for text in [
            // `'` inside a plain scalar is not a quote.
            format!("a: it's\nb: {deep}"),
            format!("a: b\n  'c\nd: {deep}"),
            // `#` not after a blank is not a comment.
            format!("a: [x#y, {deep}"),
            // The quote ends; what follows is structure.
            format!("a: ['x #', {deep}"),
            format!("a: [\"\\\"\", {deep}"),
            // A block scalar with an explicit indentation ends at a shallower line.
            format!("a: |4\n      text\n  {deep}"),
            // A directive-looking line inside a flow collection is still read to its end.
            format!("a: [x,\n {deep}"),
            // An anchor and a tag before the collection.
            format!("a: &x !t {deep}"),
        ] {
            assert!(deepest(&text) >= 40, "{text:?}: {}", deepest(&text));
        }
    }

    fn scalar() -> impl Strategy<Value = serde_yaml::Value> {
        prop_oneof![
            "[a-z]{1,3}".prop_map(serde_yaml::Value::from),
            // Characters that mean something to YAML, inside strings.
            "[\\[\\]{}'\"#:,&*!|>%@` \\\\\n-]{1,6}".prop_map(serde_yaml::Value::from),
            any::<i32>().prop_map(serde_yaml::Value::from),
        ]
    }

    fn value() -> impl Strategy<Value = serde_yaml::Value> {
        scalar().prop_recursive(6, 40, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_yaml::Value::Sequence),
                prop::collection::vec((scalar(), inner), 0..4).prop_map(|entries| {
                    serde_yaml::Value::Mapping(entries.into_iter().collect())
                }),
            ]
        })
    }

    /// Writes `v` in flow style with the quoting chosen by `style` and line breaks in between,
    /// so that every level is a flow level.
    fn flow(v: &serde_yaml::Value, style: &mut impl Iterator<Item = u8>, out: &mut String) {
        fn next(style: &mut impl Iterator<Item = u8>) -> u8 {
            style.next().unwrap_or(0)
        }
        match v {
            serde_yaml::Value::Sequence(s) => {
                out.push('[');
                for (i, item) in s.iter().enumerate() {
                    if i > 0 {
                        out.push_str(if next(style) % 2 == 0 { ", " } else { ",\n  " });
                    }
                    flow(item, style, out);
                }
                out.push(']');
            }
            serde_yaml::Value::Mapping(m) => {
                out.push('{');
                for (i, (k, item)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    // A key stays on one line, as an implicit key must.
                    let key = serde_yaml::to_string(k).unwrap();
                    out.push_str(&serde_json::to_string(key.trim_end()).unwrap());
                    out.push_str(": ");
                    flow(item, style, out);
                }
                out.push('}');
            }
            other => {
                let text = match other {
                    serde_yaml::Value::String(s) => s.clone(),
                    _ => serde_yaml::to_string(other).unwrap().trim().to_string(),
                };
                if next(style) % 2 == 0 {
                    out.push('\'');
                    // A blank line is a line break inside a quoted scalar; the indentation
                    // keeps a continuation line from reading as `---`.
                    out.push_str(&text.replace('\'', "''").replace('\n', "\n\n  "));
                    out.push('\'');
                } else {
                    out.push_str(&serde_json::to_string(&text).unwrap());
                }
            }
        }
    }

    proptest! {
        /// Whatever serde_yaml writes (block style, its own quoting and block scalars), this
        /// pass sees at least the levels the parser built: a block sequence under a mapping key
        /// opens no indentation level of its own, so each level it counts can stand for two.
        #[test]
        fn never_fewer_levels_than_the_parser_builds_in_block_style(v in value()) {
            let text = serde_yaml::to_string(&v).unwrap();
            let parsed: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
            prop_assert!(value_depth(&parsed) <= 2 * deepest(&text), "{text}");
        }

        /// In flow style every collection is a flow level: exactly as many are counted.
        #[test]
        fn exactly_the_flow_levels_the_parser_builds(v in value(), style in prop::collection::vec(any::<u8>(), 64)) {
            let mut text = String::from("x: ");
            flow(&v, &mut style.into_iter(), &mut text);
            text.push('\n');
            let parsed: serde_yaml::Value = serde_yaml::from_str(&text)
                .map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            prop_assert_eq!(value_depth(&parsed), deepest(&text), "{}", text);
        }

        /// Any text: no panic, and the limit holds wherever the pass stops.
        #[test]
        fn any_text_is_scanned_without_panic(text in "[\\[\\]{}'\"#:,&*!|>%@` \\\\\n\t\r-a]{0,200}") {
            let _ = check(&text, 3);
            let _ = deepest(&text);
        }
    }
}
