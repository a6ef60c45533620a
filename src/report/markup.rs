//! Markdown and HTML escaping for GitHub-flavoured markdown. Every table cell goes through
//! [`cell`]; every literal value goes through [`text`], [`code`], [`fence`] or [`html`].

/// The one escape for a markdown table cell: `|` would end the cell and a newline the row.
/// `content` is inline markdown already (escaped text or code spans).
pub(crate) fn cell(content: &str) -> String {
    let content = keep_units(content);
    let mut out = String::with_capacity(content.len());
    let mut chars = content.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '|' => out.push_str(r"\|"),
            '\r' if chars.peek() == Some(&'\n') => {}
            '\r' | '\n' => out.push_str("<br>"),
            c => out.push(c),
        }
    }
    if out.trim().is_empty() { super::text::NONE.to_string() } else { out }
}

/// Units that follow a number in the report's cells (`0.32 s`, `1 min 05 s`, `12 MiB`).
const UNITS: [&str; 10] = ["s", "ms", "min", "h", "B", "KiB", "MiB", "GiB", "TiB", "%"];

/// A number and its unit joined by a no-break space, so a narrow column never wraps between
/// them. Code spans are left alone.
fn keep_units(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_code = false;
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c == '`' {
            in_code = !in_code;
        }
        if c == ' ' && !in_code && i > 0 && chars[i - 1].is_ascii_digit() {
            let word: String = chars[i + 1..]
                .iter()
                .take_while(|c| !c.is_whitespace() && !matches!(c, ',' | ')' | ';' | '·'))
                .collect();
            if UNITS.contains(&word.as_str()) {
                out.push('\u{a0}');
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// Plain text as inline markdown: characters that would start emphasis, links, code or HTML are
/// backslash-escaped. `|` and newlines are left to [`cell`].
pub(crate) fn text(s: &str) -> String {
    // Control sequences go before the escaping, which would split `ESC ]` and leave its payload
    // (the rule of `crate::secrets`, which the file sink applies again).
    let chars: Vec<char> = crate::secrets::strip_controls(s, false).chars().collect();
    let mut out = String::with_capacity(s.len());
    for (i, &c) in chars.iter().enumerate() {
        // An underscore between two letters or digits (`x86_64`) can never start emphasis, so it
        // stays readable in the raw text.
        let intraword = c == '_'
            && i > 0
            && chars[i - 1].is_alphanumeric()
            && chars.get(i + 1).is_some_and(|n| n.is_alphanumeric());
        if !intraword && matches!(c, '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '&' | '~') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Harness-written inline text (verdicts, evidence): its code spans are kept as written, every
/// `quotes` entry (program text such as a rank's error message, compared with runs of whitespace
/// folded) found outside them becomes a code span of at most `quote_max` characters, and every
/// other character is escaped with [`text`]. So whatever a verdict quotes, `char const*` cannot
/// start emphasis and `<char>` cannot be taken for an HTML tag.
pub(crate) fn harness(s: &str, quotes: &[&str], quote_max: usize) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut quotes: Vec<String> = quotes
        .iter()
        .map(|q| q.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|q| q.chars().count() >= 8)
        .collect();
    quotes.sort_by_key(|q| std::cmp::Reverse(q.len()));
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    while !rest.is_empty() {
        match code_span_at(rest) {
            Some((before, span, after)) => {
                out.push_str(&plain_with_quotes(before, &quotes, quote_max));
                out.push_str(span);
                rest = after;
            }
            None => {
                out.push_str(&plain_with_quotes(rest, &quotes, quote_max));
                break;
            }
        }
    }
    out
}

/// The first complete code span of `s` (CommonMark: a backtick run closed by the next run of the
/// same length) as (text before, span, text after).
fn code_span_at(s: &str) -> Option<(&str, &str, &str)> {
    let bytes = s.as_bytes();
    // The next backtick run at or after `from`: (start, end).
    let next_run = |from: usize| {
        let start = from + bytes[from..].iter().position(|&b| b == b'`')?;
        let end = start + bytes[start..].iter().take_while(|&&b| b == b'`').count();
        Some((start, end))
    };
    let mut from = 0;
    while let Some((open, open_end)) = next_run(from) {
        let mut at = open_end;
        while let Some((close, close_end)) = next_run(at) {
            if close_end - close == open_end - open {
                return Some((&s[..open], &s[open..close_end], &s[close_end..]));
            }
            at = close_end;
        }
        // No closing run: these backticks are text; look for a later opener.
        from = open_end;
    }
    None
}

fn plain_with_quotes(s: &str, quotes: &[String], quote_max: usize) -> String {
    let found = quotes.iter().filter_map(|q| s.find(q.as_str()).map(|at| (at, q))).min_by_key(|(at, _)| *at);
    match found {
        Some((at, q)) => format!(
            "{}{}{}",
            text(&s[..at]),
            code(&super::text::truncate(q, quote_max)),
            plain_with_quotes(&s[at + q.len()..], quotes, quote_max)
        ),
        None => text(s),
    }
}

/// An inline code span that survives any backticks inside; newlines become ` ⏎ ` (a code span
/// cannot hold them and a table row would end).
pub(crate) fn code(s: &str) -> String {
    let s = s.replace("\r\n", "\n").replace(['\r', '\n'], " ⏎ ");
    let ticks = "`".repeat(longest_run(&s, '`') + 1);
    if s.starts_with('`') || s.ends_with('`') || s.is_empty() {
        format!("{ticks} {s} {ticks}")
    } else {
        format!("{ticks}{s}{ticks}")
    }
}

/// A fenced code block whose fence is longer than any backtick run in `body`.
pub(crate) fn fence(info: &str, body: &str) -> String {
    let ticks = "`".repeat((longest_run(body, '`') + 1).max(3));
    let body = body.trim_end_matches('\n');
    if body.is_empty() {
        format!("{ticks}{info}\n{ticks}")
    } else {
        format!("{ticks}{info}\n{body}\n{ticks}")
    }
}

/// Text for an HTML context such as `<summary>`, where markdown is not rendered.
pub(crate) fn html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// `<code>…</code>` for an HTML context.
pub(crate) fn html_code(s: &str) -> String {
    format!("<code>{}</code>", html(s))
}

/// The opening of a collapsed section; `summary` is HTML (use [`html`] for values). The blank
/// line GitHub needs before markdown content comes from joining blocks with blank lines.
pub(crate) fn details_open(summary: &str) -> String {
    format!("<details><summary>{summary}</summary>")
}

/// Closes [`details_open`].
pub(crate) const DETAILS_CLOSE: &str = "</details>";

/// How a column's cells are aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// A markdown table; `header` and `rows` are inline markdown and pass through [`cell`] here.
pub(crate) fn table(header: &[&str], align: &[Align], rows: &[Vec<String>]) -> String {
    let line = |cells: Vec<String>| format!("| {} |", cells.join(" | "));
    let mut out = vec![
        line(header.iter().map(|h| cell(h)).collect()),
        line(
            (0..header.len())
                .map(|i| match align.get(i) {
                    Some(Align::Right) => "---:".to_string(),
                    _ => "---".to_string(),
                })
                .collect(),
        ),
    ];
    for row in rows {
        out.push(line(row.iter().map(|c| cell(c)).collect()));
    }
    out.join("\n")
}

fn longest_run(s: &str, ch: char) -> usize {
    let (mut best, mut run) = (0, 0);
    for c in s.chars() {
        run = if c == ch { run + 1 } else { 0 };
        best = best.max(run);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_escape_pipes_and_newlines() {
        assert_eq!(cell("a|b"), r"a\|b");
        assert_eq!(cell("one\ntwo\r\nthree"), "one<br>two<br>three");
        assert_eq!(cell(&code("x | y")), r"`x \| y`");
        assert_eq!(cell(""), "—");
        assert_eq!(cell("1 min 05 s, 12 MiB `3 s`"), "1\u{a0}min 05\u{a0}s, 12\u{a0}MiB `3 s`");
    }

    #[test]
    fn text_escapes_markdown_syntax() {
        assert_eq!(text("__init__ *x* <br>"), r"\_\_init\_\_ \*x\* \<br\>");
        assert_eq!(text("x86_64 _a"), r"x86_64 \_a");
    }

    #[test]
    fn harness_text_keeps_code_spans_and_quotes_program_text() {
        let err = "std::basic_string<char, std::char_traits<char>> char const* x";
        let v = format!("Rank 1 failed in `forward` at step 2: {err} (see *log*)");
        assert_eq!(
            harness(&v, &[err], 200),
            format!("Rank 1 failed in `forward` at step 2: `{err}` (see \\*log\\*)")
        );
        assert_eq!(harness("a `b` `unclosed <x>", &[], 10), r"a `b` \`unclosed \<x\>");
        assert_eq!(harness("x: 0123456789abc", &["0123456789abc"], 5), "x: `0123…`");
    }

    #[test]
    fn code_spans_survive_backticks() {
        assert_eq!(code("a"), "`a`");
        assert_eq!(code("a `b` c"), "``a `b` c``");
        assert_eq!(code("`x`"), "`` `x` ``");
        assert_eq!(code("l1\nl2"), "`l1 ⏎ l2`");
    }

    #[test]
    fn fences_are_longer_than_the_backticks_inside() {
        assert_eq!(fence("text", "plain\n"), "```text\nplain\n```");
        assert_eq!(fence("", "has ``` inside"), "````\nhas ``` inside\n````");
    }

    #[test]
    fn html_escapes_tags() {
        assert_eq!(html("Vec<u8> & \"x\""), "Vec&lt;u8&gt; &amp; &quot;x&quot;");
    }

    #[test]
    fn tables_have_a_delimiter_row_and_escaped_cells() {
        let t = table(&["a", "n"], &[Align::Left, Align::Right], &[vec!["x|y".into(), "1".into()]]);
        assert_eq!(t, "| a | n |\n| --- | ---: |\n| x\\|y | 1 |");
    }
}
