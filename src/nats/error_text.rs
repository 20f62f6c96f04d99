//! ClickHouse's error as Sluice carries it in a NATS header or a batch's record: one
//! line (a header cannot hold CR or LF) and capped (a message can run to kilobytes).

/// The most of ClickHouse's message a DLQ header (or a record) carries.
pub(crate) const MAX_ERROR_HEADER: usize = 1024;

/// NATS header values cannot hold CR or LF: a multi-line ClickHouse message is folded.
pub(crate) fn header_value(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// At most `max` bytes, cut at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_single_lines_and_capped() {
        assert_eq!(
            header_value("Code: 27\r\n, e.what()"),
            "Code: 27  , e.what()"
        );
        let long = "é".repeat(1000);
        let cut = truncate(&long, MAX_ERROR_HEADER);
        assert!(cut.len() <= MAX_ERROR_HEADER && cut.len() >= MAX_ERROR_HEADER - 1);
    }
}
