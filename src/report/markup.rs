//! Markdown and HTML escaping for GitHub-flavoured markdown. Every table cell goes through
//! [`cell`]; every literal value goes through [`text`], [`code`], [`fence`] or [`html`].

/// The one escape for a markdown table cell: `|` would end the cell and a newline the row.
/// `content` is inline markdown already (escaped text or code spans).
pub(crate) fn cell(content: &str) -> String {
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

/// Plain text as inline markdown: characters that would start emphasis, links, code or HTML are
/// backslash-escaped. `|` and newlines are left to [`cell`].
pub(crate) fn text(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
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
    }

    #[test]
    fn text_escapes_markdown_syntax() {
        assert_eq!(text("__init__ *x* <br>"), r"\_\_init\_\_ \*x\* \<br\>");
        assert_eq!(text("x86_64 _a"), r"x86_64 \_a");
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
