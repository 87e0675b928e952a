//! Bounding text that one party hands another (a node's hostname and NACK
//! error kept by the control plane, a schema message in a client's
//! rejection): cut on a character boundary, so the result stays valid UTF-8,
//! and marked, so a reader knows it was cut.

/// Cuts `text` to at most `max` bytes on a character boundary, adding `…`
/// when it cut anything.
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncate_cuts_on_char_boundaries() {
        let cases = [("short", 10, "short"), ("exactly", 7, "exactly"), ("abcdef", 3, "abc…"), ("héllo", 2, "h…")];
        for (input, max, expected) in cases {
            assert_eq!(truncate(input.to_owned(), max), expected, "{input} / {max}");
        }
    }
}
