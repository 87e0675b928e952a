//! How deeply a YAML or JSON text nests its flow collections (`[..]`, `{..}`), measured on the raw bytes before
//! any parser sees them. libyaml's scanner spends time proportional to the flow depth on every token, so a small
//! body of 100,000 `[` costs it minutes; a text deeper than the limit is refused here in one linear pass. JSON is
//! all flow collections, so the same pass bounds a JSON document's depth too.
//!
//! The scan never reports less depth than libyaml would see: brackets inside quoted scalars, block scalars and
//! comments are skipped only where YAML itself would read them as such; anywhere it is unsure, it counts.

/// The text nests deeper than allowed; `line` is 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep {
    pub line: usize,
    pub limit: usize,
}

impl std::fmt::Display for TooDeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nested more than {} levels deep (at line {})", self.limit, self.line)
    }
}

/// Checks that no point of `text` lies inside more than `limit` flow collections.
pub fn check_flow_depth(text: &[u8], limit: usize) -> Result<(), TooDeep> {
    let mut scan = Scan { text, at: 0, line: 1, depth: 0, limit };
    scan.run()
}

struct Scan<'a> {
    text: &'a [u8],
    at: usize,
    line: usize,
    depth: usize,
    limit: usize,
}

impl Scan<'_> {
    fn peek(&self, offset: usize) -> Option<u8> {
        self.text.get(self.at + offset).copied()
    }

    fn run(&mut self) -> Result<(), TooDeep> {
        // Where a node may begin: a quote or a block scalar indicator there starts a scalar.
        let mut node_start = true;
        // The previous token was a quoted scalar or a closed collection: a `:` right after it is an indicator
        // even without a following space (`{"a":"b"}`).
        let mut after_json_node = false;
        // Column of the line's first token that is not a `-`/`?` indicator: a block scalar's content is the
        // lines indented deeper than it.
        let mut line_start = true;
        let mut column = 0usize;
        let mut owner_column: Option<usize> = None;
        // Column of the line's last `-`/`?` indicator: the parent of a block scalar that is itself the entry.
        let mut indicator_column: Option<usize> = None;
        let mut indent = 0usize;
        while let Some(byte) = self.peek(0) {
            if line_start {
                indent = self.text[self.at..].iter().take_while(|b| **b == b' ').count();
                self.at += indent;
                column = indent;
                line_start = false;
                node_start = true;
                owner_column = None;
                indicator_column = None;
                continue;
            }
            let next = self.peek(1);
            let blank_after = next.is_none_or(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'));
            match byte {
                b'\n' => {
                    self.line += 1;
                    line_start = true;
                    self.at += 1;
                    continue;
                }
                b' ' | b'\t' | b'\r' => {}
                b'#' if self.at == 0 || matches!(self.text[self.at - 1], b' ' | b'\t' | b'\n' | b'\r') => {
                    self.skip_to_line_end();
                    continue;
                }
                b'"' | b'\'' if node_start => {
                    owner_column.get_or_insert(column);
                    self.skip_quoted(byte);
                    node_start = false;
                    after_json_node = true;
                    column += 1;
                    continue;
                }
                b'|' | b'>' if node_start && self.depth == 0 => {
                    let parent = owner_column.or(indicator_column).unwrap_or(indent);
                    self.skip_to_line_end();
                    self.skip_block_scalar(parent);
                    continue;
                }
                b'[' | b'{' => {
                    self.depth += 1;
                    if self.depth > self.limit {
                        return Err(TooDeep { line: self.line, limit: self.limit });
                    }
                    node_start = true;
                    after_json_node = false;
                }
                b']' | b'}' => {
                    self.depth = self.depth.saturating_sub(1);
                    node_start = false;
                    after_json_node = true;
                }
                b',' if self.depth > 0 => {
                    node_start = true;
                    after_json_node = false;
                }
                b'-' | b'?' if node_start && blank_after => {
                    // A sequence entry or an explicit key: what follows starts a node.
                    if owner_column.is_none() {
                        indicator_column = Some(column);
                    }
                }
                b':' if blank_after || (self.depth > 0 && after_json_node) => {
                    node_start = true;
                    after_json_node = false;
                }
                b'&' | b'!' if node_start => {
                    // An anchor or a tag: the node itself comes after it.
                    owner_column.get_or_insert(column);
                    while self
                        .peek(0)
                        .is_some_and(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b',' | b'[' | b']' | b'{' | b'}'))
                    {
                        self.at += 1;
                        column += 1;
                    }
                    continue;
                }
                _ => {
                    owner_column.get_or_insert(column);
                    node_start = false;
                    after_json_node = false;
                }
            }
            self.at += 1;
            column += 1;
        }
        Ok(())
    }

    fn skip_to_line_end(&mut self) {
        while self.peek(0).is_some_and(|b| b != b'\n') {
            self.at += 1;
        }
    }

    /// From an opening quote to past its closing one; `\` escapes in double quotes, `''` in single quotes
    /// reads as two quoted scalars, which changes nothing here.
    fn skip_quoted(&mut self, quote: u8) {
        self.at += 1;
        while let Some(byte) = self.peek(0) {
            self.at += 1;
            match byte {
                b'\\' if quote == b'"' => {
                    if self.peek(0) == Some(b'\n') {
                        self.line += 1;
                    }
                    self.at += 1;
                }
                b'\n' => self.line += 1,
                b if b == quote => return,
                _ => {}
            }
        }
    }

    /// The content lines of a `|` or `>` scalar: blank lines and lines indented deeper than `parent`. Leaves the
    /// scan at the start of the first line that is not content.
    fn skip_block_scalar(&mut self, parent: usize) {
        while self.peek(0) == Some(b'\n') {
            let rest = &self.text[self.at + 1..];
            let indent = rest.iter().take_while(|b| **b == b' ').count();
            let blank = rest.get(indent).is_none_or(|b| matches!(b, b'\n' | b'\r'));
            if !blank && indent <= parent {
                return;
            }
            self.at += 1;
            self.line += 1;
            self.skip_to_line_end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(text: &str, limit: usize) -> bool {
        check_flow_depth(text.as_bytes(), limit).is_ok()
    }

    #[test]
    fn counts_flow_collections_in_yaml_and_json() {
        assert!(depth_ok("a: [[1, 2], {b: [3]}]\n", 3));
        assert!(!depth_ok("a: [[1, 2], {b: [3]}]\n", 2));
        assert!(depth_ok(r#"{"a":{"b":["[[[[", "]]]]"]}}"#, 3));
        assert!(!depth_ok(&"[".repeat(100_000), 128));
        assert_eq!(check_flow_depth(b"a: 1\nb: [[[\n", 2), Err(TooDeep { line: 2, limit: 2 }));
    }

    #[test]
    fn skips_brackets_only_where_yaml_does() {
        // Quoted scalars, comments and block scalars hold text, not structure.
        assert!(depth_ok("a: \"[[[[\"\nb: '{{{{'\n# [[[[\nc: |\n  [[[[\n  {{{{\nd: [x]\n", 1));
        assert!(depth_ok("- >\n  [[[[\n- k: |\n    [[[[\n", 0));
        // A quote inside a plain scalar does not start a quoted one, so what follows it is still counted.
        assert!(!depth_ok("a: x 'y\n[[[[]]]]: 1\nz: '\n", 2));
        assert!(!depth_ok("[a:'b, [[[[]]]]']\n", 3));
        // Content of a block scalar ends at a line not indented deeper than its key.
        assert!(!depth_ok("  - k: |\n      text\n    [[[[]]]]: 1\n", 2));
        // A `#` right after a plain scalar's text is not a comment: what follows is counted.
        assert!(!depth_ok("a: b#[[[[\n", 2));
    }
}
