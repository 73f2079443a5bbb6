//! What an error message may show of the file it is about: short excerpts on one line.
//!
//! A message about a configuration goes to a terminal or a log collector, and the file may not
//! be a configuration at all (`check --config /etc/shadow`) or may hold a 100 MB string. So a
//! value is quoted as an [`excerpt`] (at most [`MAX_EXCERPT_CHARS`] characters, control
//! characters escaped), and [`one_line`] makes any finished message safe the same way, including
//! the parser's own, which quote keys and values in full.

/// The most characters of a value that a message quotes.
pub const MAX_EXCERPT_CHARS: usize = 40;
/// The longest message, after its excerpts are cut: the head and the tail are kept, because
/// the parser puts the line and column last.
const MAX_MESSAGE_CHARS: usize = 400;

/// `text` as a message may quote it: control characters escaped, cut to
/// [`MAX_EXCERPT_CHARS`] characters with `…` where it was cut.
pub fn excerpt(text: &str) -> String {
    cut(&escape(text), MAX_EXCERPT_CHARS)
}

/// A finished message made safe to print as one short line: control characters escaped,
/// every span quoted in backticks or double quotes cut to an excerpt, an unknown key that does
/// not look like a setting's name not shown at all, and the whole at most a few hundred
/// characters.
pub fn one_line(message: &str) -> String {
    let message = hide_unknown_keys(&escape(message));
    let mut out = String::with_capacity(message.len().min(2 * MAX_MESSAGE_CHARS));
    let mut rest = message.as_str();
    while let Some(open) = rest.find(['`', '"']) {
        let quote = rest[open..].chars().next().unwrap_or('`');
        out.push_str(&rest[..=open]);
        let inside = &rest[open + 1..];
        match inside.find(quote) {
            Some(close) => {
                out.push_str(&cut(&inside[..close], MAX_EXCERPT_CHARS));
                out.push(quote);
                rest = &inside[close + 1..];
            }
            None => {
                out.push_str(&cut(inside, MAX_EXCERPT_CHARS));
                rest = "";
            }
        }
    }
    out.push_str(rest);
    let chars = out.chars().count();
    if chars <= MAX_MESSAGE_CHARS {
        return out;
    }
    let head: String = out.chars().take(MAX_MESSAGE_CHARS * 2 / 3).collect();
    let tail: String = out.chars().skip(chars - MAX_MESSAGE_CHARS / 4).collect();
    format!("{head} … {tail}")
}

/// serde's "unknown field `…`" quotes the key whole; a key that is not a plausible setting
/// name (a line of `/etc/shadow`, say) is left out, since the file is then most likely not a
/// configuration at all.
fn hide_unknown_keys(message: &str) -> String {
    const LEAD: &str = "unknown field `";
    let Some(start) = message.find(LEAD) else {
        return message.to_string();
    };
    let key_start = start + LEAD.len();
    let after = &message[key_start..];
    let key_end = ["`, expected", "`, there are no fields"]
        .iter()
        .filter_map(|end| after.find(end))
        .min()
        .unwrap_or(after.len());
    let key = &after[..key_end];
    let plausible = (1..=MAX_EXCERPT_CHARS).contains(&key.chars().count())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if plausible {
        return message.to_string();
    }
    let rest = after[key_end..]
        .strip_prefix('`')
        .unwrap_or(&after[key_end..]);
    format!(
        "{}unknown field (not shown: it does not look like a setting name){rest}",
        &message[..start]
    )
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // Line and paragraph separators and bidirectional overrides change how a line reads.
            c if c.is_control()
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}') =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_short_and_one_line() {
        assert_eq!(excerpt("chat"), "chat");
        assert_eq!(excerpt(&"a".repeat(100)), format!("{}…", "a".repeat(40)));
        assert_eq!(excerpt("a\nb\u{7}\u{202e}"), "a\\nb\\u{7}\\u{202e}");
    }

    #[test]
    fn a_parser_message_keeps_its_shape_and_loses_its_bulk() {
        let long = "x".repeat(100_000);
        let m = one_line(&format!(
            "routes[0]: invalid type: string \"{long}\", expected struct Route at line 3 column 5"
        ));
        assert!(m.len() < 200, "{m}");
        assert!(
            m.ends_with("expected struct Route at line 3 column 5"),
            "{m}"
        );
        let m = one_line(&format!(
            "invalid upstream URL `{long}\n`: bad at line 1 column 11"
        ));
        assert!(
            m.ends_with("`: bad at line 1 column 11") && !m.contains('\n'),
            "{m}"
        );
        // An unclosed quote and a long unquoted path are cut too.
        assert!(one_line(&format!("a `{long}")).len() < 100);
        let m = one_line(&format!(
            "routes[0].match.headers.{long}: bad at line 9 column 1"
        ));
        assert!(
            m.chars().count() < 420 && m.ends_with("line 9 column 1"),
            "{m}"
        );
    }

    #[test]
    fn unknown_keys_are_shown_only_when_they_look_like_settings() {
        let m = one_line("unknown field `lisen`, expected one of `listen`, `admin` at line 1");
        assert_eq!(
            m,
            "unknown field `lisen`, expected one of `listen`, `admin` at line 1"
        );
        let secret = "root:$6$abc$0123456789:19000:0:99999:7::";
        let m = one_line(&format!(
            "unknown field `{secret}`, expected one of `listen` at line 1 column 1"
        ));
        assert_eq!(
            m,
            "unknown field (not shown: it does not look like a setting name), expected one of `listen` at line 1 column 1"
        );
        let m = one_line("routes[0]: unknown field `a b`, there are no fields");
        assert!(!m.contains("a b"), "{m}");
    }
}
