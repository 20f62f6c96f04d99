//! Byte-level walks over JSON text that serde_json has already validated: how deep it
//! nests, and where the elements of a top-level array start and end.
//!
//! Why not serde_json for these: its value parser recurses once per level (a row
//! nested 100,000 deep would overflow the stack; serde_json stops at 128, which is not
//! the limit we want), and collecting an array's elements as `Vec<&RawValue>` costs 16
//! bytes per element before the first row is published (80 MB for a 10 MB body of
//! `[1,1,…]`). serde_json's `IgnoredAny` validates without recursing; these walks rely
//! on that validation and only track strings and brackets.

/// Whether a valid JSON text nests arrays and objects more than `limit` levels deep
/// (a top-level object is level 1). Stops at the first level over the limit.
pub fn deeper_than(text: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    let mut walk = Walk::default();
    for &b in text {
        match walk.step(b) {
            Token::Open => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            Token::Close => depth = depth.saturating_sub(1),
            Token::Comma | Token::Other => {}
        }
    }
    false
}

/// The elements of a valid JSON array text, as slices of it (whitespace around each
/// trimmed), one at a time.
pub struct Elements<'t> {
    text: &'t [u8],
    /// Where the next element starts looking; `None` once the array closed.
    pos: Option<usize>,
}

impl<'t> Elements<'t> {
    /// `text` must be a valid JSON array (leading whitespace allowed).
    pub fn new(text: &'t [u8]) -> Self {
        let pos = text.iter().position(|b| *b == b'[').map(|p| p + 1);
        Elements { text, pos }
    }
}

impl<'t> Iterator for Elements<'t> {
    type Item = &'t [u8];

    fn next(&mut self) -> Option<&'t [u8]> {
        let start = self.pos?;
        let mut depth = 0usize;
        let mut walk = Walk::default();
        for (offset, &b) in self.text[start..].iter().enumerate() {
            let at = start + offset;
            match walk.step(b) {
                Token::Open => depth += 1,
                Token::Close if depth == 0 => {
                    // The array's own `]`: the last element ends here, if there was one.
                    self.pos = None;
                    let element = self.text[start..at].trim_ascii();
                    return (!element.is_empty()).then_some(element);
                }
                Token::Close => depth -= 1,
                Token::Comma if depth == 0 => {
                    self.pos = Some(at + 1);
                    return Some(self.text[start..at].trim_ascii());
                }
                Token::Comma | Token::Other => {}
            }
        }
        self.pos = None;
        None
    }
}

/// What one byte is, outside strings.
#[derive(Debug, PartialEq, Eq)]
enum Token {
    Open,
    Close,
    Comma,
    /// Inside a string, a string's quotes, or anything else.
    Other,
}

/// Whether the walk is inside a string, and just after a backslash in one.
#[derive(Default)]
struct Walk {
    in_string: bool,
    escaped: bool,
}

impl Walk {
    fn step(&mut self, b: u8) -> Token {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
            }
            return Token::Other;
        }
        match b {
            b'"' => {
                self.in_string = true;
                Token::Other
            }
            b'[' | b'{' => Token::Open,
            b']' | b'}' => Token::Close,
            b',' => Token::Comma,
            _ => Token::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        (0..100)
            .find(|l| !deeper_than(text.as_bytes(), *l))
            .unwrap_or(100)
    }

    #[test]
    fn depth_counts_arrays_and_objects_not_strings() {
        assert_eq!(depth("1"), 0);
        assert_eq!(depth("{}"), 1);
        assert_eq!(depth(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(depth(r#"{"a":"[[[{{{"}"#), 1);
        assert_eq!(depth(r#"{"a":"\"[[[","b":["\\",[2]]}"#), 3);
        assert_eq!(depth(r#"[{}, {}, [{}]]"#), 3);
        let bomb = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(deeper_than(bomb.as_bytes(), 64));
        assert!(!deeper_than(bomb.as_bytes(), 100_000));
    }

    fn elements(text: &str) -> Vec<&str> {
        Elements::new(text.as_bytes())
            .map(|e| std::str::from_utf8(e).expect("utf-8"))
            .collect()
    }

    #[test]
    fn elements_of_an_array() {
        assert_eq!(elements("[]"), Vec::<&str>::new());
        assert_eq!(elements(" [ ] "), Vec::<&str>::new());
        assert_eq!(elements("[1]"), vec!["1"]);
        assert_eq!(
            elements(r#" [ {"a": [1, 2]}, "x,]", 3 ,{"b":{"c":"}"}} ] "#),
            vec![r#"{"a": [1, 2]}"#, r#""x,]""#, "3", r#"{"b":{"c":"}"}}"#]
        );
        assert_eq!(elements("[\"\\\"\", [[]]]"), vec!["\"\\\"\"", "[[]]"]);
    }
}
