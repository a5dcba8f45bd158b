//! Marker search with hold-back: the parsers keep the text that could still
//! turn into a marker (`<|tool_c` …) so no marker fragment ever reaches
//! `content` or `reasoning` (serving.md B2 rule 1, MoonshotAI/Kimi-K2#89).

/// What a buffer holds with respect to a set of markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scan {
    /// Marker number `which` (index into the marker list) starts at byte `at`.
    Found { at: usize, which: usize },
    /// No whole marker; the first `safe` bytes cannot belong to one, the rest
    /// is a proper prefix of some marker and must wait for more text.
    Clear { safe: usize },
}

/// Looks for the earliest marker in `buf[from..]` (`from` lets a caller that
/// keeps a growing buffer skip what it already searched; it must be a char
/// boundary). On a tie the longer marker wins.
pub(super) fn scan_from(buf: &str, from: usize, markers: &[&str]) -> Scan {
    let hay = &buf[from..];
    let mut best: Option<(usize, usize)> = None;
    for (i, m) in markers.iter().enumerate() {
        if let Some(p) = hay.find(m) {
            let better = match best {
                None => true,
                Some((bp, bi)) => p < bp || (p == bp && m.len() > markers[bi].len()),
            };
            if better {
                best = Some((p, i));
            }
        }
    }
    match best {
        Some((p, which)) => Scan::Found {
            at: from + p,
            which,
        },
        None => Scan::Clear {
            safe: buf.len() - held_suffix(buf, markers),
        },
    }
}

/// [`scan_from`] over the whole buffer.
pub(super) fn scan(buf: &str, markers: &[&str]) -> Scan {
    scan_from(buf, 0, markers)
}

/// Where a re-scan of a buffer that grew from `old_len` bytes may start: a
/// marker that ends in the new text can begin up to `longest - 1` bytes
/// before it. Rounded down to a char boundary.
pub(super) fn rescan_start(buf: &str, old_len: usize, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(1);
    let mut from = old_len
        .saturating_sub(longest.saturating_sub(1))
        .min(buf.len());
    while !buf.is_char_boundary(from) {
        from -= 1;
    }
    from
}

/// Bytes at the end of `buf` that form a proper prefix of some marker
/// (always a whole number of chars, since a marker prefix cut on a char
/// boundary of the marker starts on a char boundary of `buf`).
pub(super) fn held_suffix(buf: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for m in markers {
        let max = (m.len().saturating_sub(1)).min(buf.len());
        for k in (best + 1..=max).rev() {
            if m.is_char_boundary(k) && buf.ends_with(&m[..k]) {
                best = k;
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_earliest_and_holds_prefixes() {
        let m = ["<|a|>", "<|bb|>"];
        assert_eq!(scan("x<|bb|>y<|a|>", &m), Scan::Found { at: 1, which: 1 });
        assert_eq!(scan("hello <|b", &m), Scan::Clear { safe: 6 });
        assert_eq!(scan("hello <", &m), Scan::Clear { safe: 6 });
        assert_eq!(scan("a < b", &m), Scan::Clear { safe: 5 });
        // Multibyte markers are held on char boundaries.
        let w = ["<｜tool▁sep｜>"];
        let s = "name<｜tool▁";
        assert_eq!(scan(s, &w), Scan::Clear { safe: 4 });
        assert_eq!(held_suffix("ab｜", &w), 0);
        assert_eq!(rescan_start("ab｜cd", 5, &w), 0);
    }
}
