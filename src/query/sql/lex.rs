//! The lexer: SQL text to tokens, the way ClickHouse splits it.
//!
//! It follows ClickHouse's own lexer (`src/Parsers/Lexer.cpp`) where that matters to the
//! check, and where servers differ it lexes once per way of reading ([`Reading`]): a
//! comment one server skips is code to another, and the check must hold for both.
//! Where it cannot tell what a server sees it errs towards seeing more: a character
//! ClickHouse might skip as whitespace separates tokens, and a character ClickHouse
//! would refuse is never allowed to join two tokens into one.

/// One way a ClickHouse server reads comments. 18.16 knows `--` and flat `/* */`;
/// current servers nest block comments (`/* /* */ */` is one comment) and also take
/// `//`, `# ` and `#!` to the end of the line as comments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub nested_block_comments: bool,
    pub slash_comments: bool,
    pub hash_comments: bool,
}

impl Reading {
    /// Every combination, 18.16's first: which one a server uses is not known here,
    /// and the features came in separately.
    pub fn all() -> impl Iterator<Item = Reading> {
        (0..8u8).map(|bits| Reading {
            nested_block_comments: bits & 1 != 0,
            slash_comments: bits & 2 != 0,
            hash_comments: bits & 4 != 0,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    /// A bare word as written: a keyword (matched whatever its case) or a name.
    Word(String),
    /// A quoted identifier (`"name"` or `` `name` ``) without its quotes: always a
    /// name, never a keyword. `None` when it holds a backslash escape: servers decode
    /// those differently (`\x73`, `\N`, a backslash kept or dropped), so what it names
    /// cannot be known here.
    Quoted(Option<String>),
    /// A string literal or a number: opaque.
    Literal,
    Punct(char),
}

impl Token {
    pub fn is_keyword(&self, keyword: &str) -> bool {
        matches!(self, Token::Word(w) if w.eq_ignore_ascii_case(keyword))
    }

    pub fn is_punct(&self, c: char) -> bool {
        *self == Token::Punct(c)
    }

    /// The name this token is, bare or quoted.
    pub fn name(&self) -> Option<&str> {
        match self {
            Token::Word(w) => Some(w),
            Token::Quoted(Some(name)) => Some(name),
            _ => None,
        }
    }
}

/// Text ClickHouse cannot read either: a string, quoted identifier or block comment
/// that never ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unterminated(pub &'static str);

pub fn lex(sql: &str, reading: Reading) -> Result<Vec<Token>, Unterminated> {
    let bytes = sql.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        match c {
            // Every control character counts as whitespace: ClickHouse skips `\v` and
            // `\f` too, and refuses the rest.
            _ if c.is_ascii_control() || c == b' ' => i += 1,
            b'-' if next == Some(b'-') => i = line_end(bytes, i),
            b'/' if next == Some(b'/') && reading.slash_comments => i = line_end(bytes, i),
            b'#' if matches!(next, Some(b' ' | b'!')) && reading.hash_comments => {
                i = line_end(bytes, i)
            }
            b'/' if next == Some(b'*') => {
                i = block_comment_end(bytes, i, reading.nested_block_comments)
                    .ok_or(Unterminated("comment"))?
            }
            b'\'' => {
                i = quoted_end(bytes, i).ok_or(Unterminated("string"))?;
                tokens.push(Token::Literal);
            }
            b'"' | b'`' => {
                let end = quoted_end(bytes, i).ok_or(Unterminated("quoted identifier"))?;
                tokens.push(Token::Quoted(unquote(&sql[i + 1..end - 1], c)));
                i = end;
            }
            _ if c.is_ascii_digit() => {
                let after_dot = tokens.last() == Some(&Token::Punct('.'));
                let end = number_end(bytes, i, after_dot);
                if bytes.get(end).copied().is_some_and(is_word_char) {
                    // `1abc`: ClickHouse makes one word of it (or refuses it), never
                    // a number and a word.
                    let end = word_end(bytes, end);
                    tokens.push(Token::Word(sql[i..end].to_string()));
                    i = end;
                } else {
                    tokens.push(Token::Literal);
                    i = end;
                }
            }
            _ if is_word_char(c) => {
                let end = word_end(bytes, i);
                tokens.push(Token::Word(sql[i..end].to_string()));
                i = end;
            }
            _ if c.is_ascii() => {
                tokens.push(Token::Punct(c as char));
                i += 1;
            }
            // Outside quotes ClickHouse skips Unicode whitespace or refuses the
            // character: either way it separates, so it is skipped here.
            _ => i += sql[i..].chars().next().map_or(1, char::len_utf8),
        }
    }
    Ok(tokens)
}

/// Letters, digits, `_` and `$` continue a bare word in ClickHouse.
fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

fn word_end(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && is_word_char(bytes[i]) {
        i += 1;
    }
    i
}

/// A line comment runs to the newline (which cannot be escaped).
fn line_end(bytes: &[u8], i: usize) -> usize {
    bytes[i..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |n| i + n)
}

/// Just past the block comment opened at `i`; `None` when it never closes.
fn block_comment_end(bytes: &[u8], i: usize, nested: bool) -> Option<usize> {
    let mut depth = 1usize;
    let mut j = i + 2;
    while j + 1 < bytes.len() {
        match (bytes[j], bytes[j + 1]) {
            (b'/', b'*') if nested => {
                depth += 1;
                j += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => j += 1,
        }
    }
    None
}

/// Just past the quoted token opened at `start`. A backslash escapes the next byte
/// and a doubled quote stays inside, as ClickHouse reads them.
fn quoted_end(bytes: &[u8], start: usize) -> Option<usize> {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            q if q == quote => {
                if bytes.get(i + 1) == Some(&quote) {
                    i += 2;
                } else {
                    return Some(i + 1);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// A quoted identifier's name: doubled quotes undone; `None` with a backslash in it.
fn unquote(inner: &str, quote: u8) -> Option<String> {
    if inner.contains('\\') {
        return None;
    }
    let q = char::from(quote);
    Some(inner.replace(&format!("{q}{q}"), &q.to_string()))
}

/// Just past the number starting at `i`: ClickHouse's digits, `0x`/`0b` prefix,
/// fraction and exponent. Right after a `.` only whole digits (`t.1.2` is two
/// element accesses).
fn number_end(bytes: &[u8], mut i: usize, after_dot: bool) -> usize {
    let at = |i: usize| bytes.get(i).copied();
    if after_dot {
        while at(i).is_some_and(|b| b.is_ascii_digit()) {
            i += 1;
        }
        return i;
    }
    let hex = at(i) == Some(b'0')
        && matches!(at(i + 1), Some(b'x' | b'X'))
        && at(i + 2).is_some_and(|b| b.is_ascii_hexdigit());
    let bin = at(i) == Some(b'0')
        && matches!(at(i + 1), Some(b'b' | b'B'))
        && matches!(at(i + 2), Some(b'0' | b'1'));
    if hex || bin {
        i += 2;
    }
    let digit = |b: u8| {
        if hex {
            b.is_ascii_hexdigit()
        } else {
            b.is_ascii_digit()
        }
    };
    while at(i).is_some_and(digit) {
        i += 1;
    }
    if at(i) == Some(b'.') {
        i += 1;
        while at(i).is_some_and(digit) {
            i += 1;
        }
    }
    let exponent = if hex { [b'p', b'P'] } else { [b'e', b'E'] };
    if at(i).is_some_and(|b| exponent.contains(&b)) && i + 1 < bytes.len() {
        i += 1;
        if matches!(at(i), Some(b'+' | b'-')) && i + 1 < bytes.len() {
            i += 1;
        }
        while at(i).is_some_and(|b| b.is_ascii_digit()) {
            i += 1;
        }
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: Reading = Reading {
        nested_block_comments: false,
        slash_comments: false,
        hash_comments: false,
    };
    const NEW: Reading = Reading {
        nested_block_comments: true,
        slash_comments: true,
        hash_comments: true,
    };

    fn words(sql: &str, reading: Reading) -> Vec<String> {
        lex(sql, reading)
            .expect(sql)
            .into_iter()
            .map(|t| match t {
                Token::Word(w) => w,
                Token::Quoted(Some(n)) => format!("<{n}>"),
                Token::Quoted(None) => "<?>".into(),
                Token::Literal => "#".into(),
                Token::Punct(c) => c.to_string(),
            })
            .collect()
    }

    #[test]
    fn every_reading_once_old_first() {
        let all: Vec<_> = Reading::all().collect();
        assert_eq!(all.len(), 8);
        assert_eq!(all[0], OLD);
        assert!(all.contains(&NEW));
    }

    #[test]
    fn comments_by_reading() {
        let sql = "a /* /* */ b */ c // d\n e # f\n g #!h\n i #j";
        assert_eq!(
            words(sql, OLD),
            [
                "a", "b", "*", "/", "c", "/", "/", "d", "e", "#", "f", "g", "#", "!", "h", "i",
                "#", "j"
            ]
        );
        assert_eq!(words(sql, NEW), ["a", "c", "e", "g", "i", "#", "j"]);
        assert_eq!(lex("a /* /* */", NEW), Err(Unterminated("comment")));
        assert_eq!(words("a /* /* */", OLD), ["a"]);
    }

    #[test]
    fn quoted_identifiers_are_names_strings_are_not() {
        assert_eq!(
            words(r#"`a``b` "c""d" 'e' `x\`y` "sys\x74em""#, OLD),
            ["<a`b>", "<c\"d>", "#", "<?>", "<?>"]
        );
    }

    #[test]
    fn numbers_as_clickhouse_splits_them() {
        assert_eq!(words("1e10 0x1F 1.5e-3 .5", OLD), ["#", "#", "#", ".", "#"]);
        // A word glued to a number is one word, never a number and a keyword.
        assert_eq!(words("1settings 1.5e3x", OLD), ["1settings", "1.5e3x"]);
        assert_eq!(words("t.1.2", OLD), ["t", ".", "#", ".", "#"]);
    }

    #[test]
    fn control_and_unicode_characters_separate() {
        assert_eq!(words("a\u{b}b\u{c}c\u{0}d", OLD), ["a", "b", "c", "d"]);
        assert_eq!(
            words("a\u{a0}b\u{200b}c\u{3000}d é", OLD),
            ["a", "b", "c", "d"]
        );
        assert_eq!(words("url$ $x", OLD), ["url$", "$x"]);
    }
}
