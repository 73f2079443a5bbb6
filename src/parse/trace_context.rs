//! The W3C Trace Context `traceparent` header (version 00), read so that a request's span can
//! be the child of its caller's. The header itself is forwarded untouched; this only reads it.
//!
//! A header that does not parse is ignored, as the W3C specification asks of a receiver: the
//! span then starts a trace of its own.

/// The caller's span, from a valid `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The caller sampled its span (flag 01).
    pub sampled: bool,
}

/// Reads `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`. Other versions are read by
/// their first four fields, as the specification asks; all-zero ids, version `ff` and any
/// other shape are refused.
pub fn traceparent(value: &[u8]) -> Option<TraceParent> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let mut parts = text.split('-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let parent = parts.next()?;
    let flags = parts.next()?;
    if version.len() != 2 || version.eq_ignore_ascii_case("ff") {
        return None;
    }
    let version = hex::<1>(version)?[0];
    // Version 00 has exactly four fields; a later version may add more.
    if version == 0 && parts.next().is_some() {
        return None;
    }
    let trace_id = hex::<16>(trace)?;
    let span_id = hex::<8>(parent)?;
    let flags = hex::<1>(flags)?[0];
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(TraceParent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// Exactly `2 * N` lower-case hex digits (the specification refuses upper case).
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let bytes = text.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_specifications_example_is_read() {
        let p = traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(p.trace_id[0], 0x4b);
        assert_eq!(p.trace_id[15], 0x36);
        assert_eq!(p.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(p.sampled);
        let p = traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!p.sampled);
        // A later version with more fields is read by its first four.
        assert!(
            traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz").is_some()
        );
    }

    #[test]
    fn malformed_headers_are_ignored() {
        for bad in [
            &b""[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"\xff\xfe",
        ] {
            assert_eq!(traceparent(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
