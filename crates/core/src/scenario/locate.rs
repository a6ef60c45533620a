//! Finds where a dotted field is written in a scenario file, as line:column.
//!
//! serde reports positions only for errors it raises itself, and only where its reader happened
//! to stop (after a key, after a value). Validation runs on the deserialised scenario, which has
//! no positions at all. This minimal JSON scanner records where every key and value starts, so
//! an error can point at `"workers"` or at the `60` of `"hidden": 60`.
//!
//! It is a best-effort helper: on text it cannot scan it finds nothing, and callers then fall back
//! to serde's position or none. It never decides whether a file is valid; serde does.

use super::path::Segment;

/// A 1-based line and column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub line: usize,
    pub column: usize,
}

impl Position {
    /// Where the first byte that is not UTF-8 sits in `bytes` (the text before it is valid):
    /// 1-based line, and column in characters as serde_json counts them.
    pub(crate) fn of_invalid_utf8(err: &std::string::FromUtf8Error) -> Position {
        let valid = &err.as_bytes()[..err.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&valid[line_start..]).chars().count() + 1;
        Position { line, column }
    }
}

/// Where a field is written: its key (absent for list items and the root) and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Located {
    pub key: Option<Position>,
    pub value: Position,
}

/// Deeper nesting than this is not scanned (serde_json stops at 128 too).
const MAX_DEPTH: usize = 128;

/// Where the value at `path` (and its key) is written in `source`; `None` if it is not written
/// there or the text cannot be scanned.
pub(crate) fn locate(source: &str, path: &[Segment]) -> Option<Located> {
    let mut scanner = Scanner { bytes: source.as_bytes(), at: 0, line: 1, column: 1 };
    let root = scanner.value(0)?;
    let mut located = Located { key: None, value: root.position };
    let mut node = &root;
    for segment in path {
        let (key, child) = match (segment, &node.kind) {
            (Segment::Key(wanted), Kind::Object(entries)) => {
                let entry = entries.iter().find(|e| &e.key == wanted)?;
                (Some(entry.key_position), &entry.value)
            }
            (Segment::Index(index), Kind::Array(items)) => (None, items.get(*index)?),
            _ => return None,
        };
        located = Located { key, value: child.position };
        node = child;
    }
    Some(located)
}

struct Node {
    position: Position,
    kind: Kind,
}

enum Kind {
    Object(Vec<Entry>),
    Array(Vec<Node>),
    Scalar,
}

struct Entry {
    key: String,
    key_position: Position,
    value: Node,
}

struct Scanner<'s> {
    bytes: &'s [u8],
    at: usize,
    line: usize,
    column: usize,
}

impl Scanner<'_> {
    fn position(&self) -> Position {
        Position { line: self.line, column: self.column }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        if byte == b'\n' {
            self.line += 1;
            self.column = 1;
        } else if byte & 0xC0 != 0x80 {
            // Count characters, not bytes: UTF-8 continuation bytes do not start a column.
            self.column += 1;
        }
        Some(byte)
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.bump();
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.skip_whitespace();
        (self.bump()? == byte).then_some(())
    }

    fn value(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.skip_whitespace();
        let position = self.position();
        let kind = match self.peek()? {
            b'{' => self.object(depth)?,
            b'[' => self.array(depth)?,
            b'"' => {
                self.string()?;
                Kind::Scalar
            }
            _ => {
                let start = self.at;
                let literal = |b: u8| b.is_ascii_alphanumeric() || b"+-.".contains(&b);
                while self.peek().is_some_and(literal) {
                    self.bump();
                }
                if self.at == start {
                    return None;
                }
                Kind::Scalar
            }
        };
        Some(Node { position, kind })
    }

    fn object(&mut self, depth: usize) -> Option<Kind> {
        self.bump();
        let mut entries = Vec::new();
        self.skip_whitespace();
        if self.peek()? == b'}' {
            self.bump();
            return Some(Kind::Object(entries));
        }
        loop {
            self.skip_whitespace();
            let key_position = self.position();
            let key = self.string()?;
            self.expect(b':')?;
            let value = self.value(depth + 1)?;
            entries.push(Entry { key, key_position, value });
            self.skip_whitespace();
            match self.bump()? {
                b',' => continue,
                b'}' => return Some(Kind::Object(entries)),
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<Kind> {
        self.bump();
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek()? == b']' {
            self.bump();
            return Some(Kind::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.skip_whitespace();
            match self.bump()? {
                b',' => continue,
                b']' => return Some(Kind::Array(items)),
                _ => return None,
            }
        }
    }

    /// A string literal, unescaped (keys must compare equal to the names serde saw).
    fn string(&mut self) -> Option<String> {
        if self.bump()? != b'"' {
            return None;
        }
        let mut out = Vec::new();
        loop {
            match self.bump()? {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let c = match self.bump()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return None,
                    };
                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
                byte => out.push(byte),
            }
        }
    }

    /// The character of a `\u` escape with its four hex digits (after the `u`), joining surrogate pairs.
    fn unicode_escape(&mut self) -> Option<char> {
        let high = self.hex4()?;
        if !(0xD800..0xDC00).contains(&high) {
            return Some(char::from_u32(high).unwrap_or(char::REPLACEMENT_CHARACTER));
        }
        if self.bump()? != b'\\' || self.bump()? != b'u' {
            return None;
        }
        let low = self.hex4()?;
        let code = 0x10000 + ((high - 0xD800) << 10) + low.checked_sub(0xDC00)?;
        Some(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER))
    }

    fn hex4(&mut self) -> Option<u32> {
        (0..4).try_fold(0, |acc, _| Some(acc * 16 + char::from(self.bump()?).to_digit(16)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::path;

    const SOURCE: &str = r#"{
  "name": "x",
  "model": {"depths": [1, 2], "hidden": 60},
  "inject": [
    {"fault": "segv", "phase": "forward"},
    {"fault": "hang", "step": 3, "when": {"launch.mode": "ddp"}}
  ],
  "d\u00e9j\u00e0": {"vu": true},
  "ünï": 1, "after": 2
}"#;

    fn at(path: &str) -> Option<Located> {
        locate(SOURCE, &path::parse(path).unwrap())
    }

    fn pos(line: usize, column: usize) -> Position {
        Position { line, column }
    }

    #[test]
    fn finds_keys_and_values_of_nested_fields() {
        assert_eq!(at("name"), Some(Located { key: Some(pos(2, 3)), value: pos(2, 11) }));
        assert_eq!(at("model.hidden"), Some(Located { key: Some(pos(3, 31)), value: pos(3, 41) }));
        assert_eq!(at("model.depths[1]"), Some(Located { key: None, value: pos(3, 27) }));
    }

    #[test]
    fn finds_list_items_and_when_keys() {
        assert_eq!(at("inject[1]").map(|l| l.value), Some(pos(6, 5)));
        assert_eq!(at("inject[1].step").map(|l| l.value), Some(pos(6, 31)));
        assert_eq!(at("inject[1].when.launch.mode").and_then(|l| l.key), Some(pos(6, 43)));
    }

    #[test]
    fn unescapes_keys_and_counts_columns_in_characters() {
        assert_eq!(at("déjà.vu").map(|l| l.value), Some(pos(8, 28)));
        assert_eq!(at("after").and_then(|l| l.key), Some(pos(9, 13)));
    }

    #[test]
    fn finds_nothing_for_absent_fields_or_unscannable_text() {
        assert_eq!(at("model.heads"), None);
        assert_eq!(at("inject[2]"), None);
        assert_eq!(at("name.x"), None);
        assert_eq!(locate("{\"a\": 1,", &path::parse("a").unwrap()), None);
        assert_eq!(locate("", &[]), None);
    }
}
