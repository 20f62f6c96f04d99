//! The error classifier: what a failed ClickHouse request says about the rows.
//!
//! The contract (docs/architecture.md, "Contracts") in one place, shared by the insert path
//! and the query gateway. Order of evidence: the `X-ClickHouse-Exception-Code` header,
//! then the body's leading `Code: NNN`, then the HTTP status alone. A transport
//! failure never reached ClickHouse's judgement, so it is an outage.

use sluice_actors::{Class, ClickHouseError, NoAnswer};

/// Error bodies are read up to this many bytes; the rest is never collected.
pub const MAX_ERROR_BODY: usize = 4096;

/// ClickHouse cannot take the request now (overload, restart, timeouts, lost replicas,
/// read-only table, too many parts...). Kept sorted: `binary_search` relies on it.
pub const UNAVAILABLE_CODES: &[u32] = &[
    95, 96, 159, 160, 164, 173, 201, 202, 203, 209, 210, 225, 236, 241, 242, 243, 244, 252, 254,
    265, 279, 285, 286, 289, 297, 319, 364, 369, 394, 415, 425, 439, 499, 574, 692, 700, 735, 745,
    749, 762, 774, 776, 777, 778, 904, 999, 1000,
];

/// The connection's configuration: unknown user, wrong password, missing grant...
pub const DENIED_CODES: &[u32] = &[192, 193, 194, 195, 291, 497, 516, 720];

/// Failures of one table, not of the server: back off that table alone.
pub const TABLE_SCOPED_CODES: &[u32] = &[242, 252, 497, 692, 774];

/// A multi-row batch refused for its size: split it before anything else.
pub const SPLITTABLE_CODES: &[u32] = &[241, 252];

/// The table or its database does not exist (UNKNOWN_TABLE, UNKNOWN_DATABASE): Rejected,
/// but the same for the whole batch, so ingest waits for the table (a deploy race is the
/// usual cause) and never bisects.
pub const MISSING_TABLE_CODES: &[u32] = &[60, 81];

/// UNKNOWN_SETTING: a setting the server does not know. A verdict on a tenant's query
/// (the gateway), never on an insert's rows: an insert carries only the settings
/// Sluice pins where the server said it knows them, so on an insert it means the server
/// changed behind the URL ([`setting_refused_on_insert`]).
pub const UNKNOWN_SETTING: u32 = 115;

/// An insert refused for a setting the server does not know (code 115): the server
/// behind the URL is not the one Sluice asked (downgraded, replaced). Not a verdict
/// on the rows: Unavailable (the pool backs off, nothing is split or parked), and the
/// insert client asks the server again which settings it knows before the retry.
pub fn setting_refused_on_insert(mut error: ClickHouseError) -> ClickHouseError {
    error.class = Class::Unavailable;
    error.table_scoped = false;
    error.splittable = false;
    error.missing_table = false;
    error.message = format!(
        "the server does not know a setting Sluice sent with the insert (it changed behind \
         the URL?): asking it again which it knows, then retrying: {}",
        error.message
    );
    error
}

/// What a code alone says.
pub fn class_of_code(code: u32) -> Class {
    if UNAVAILABLE_CODES.binary_search(&code).is_ok() {
        Class::Unavailable
    } else if DENIED_CODES.contains(&code) {
        Class::Denied
    } else {
        Class::Rejected
    }
}

/// What an HTTP status with no exception code says (an answer from a proxy, say).
pub fn class_of_status(status: u16) -> Class {
    match status {
        408 | 429 | 502 | 503 | 504 => Class::Unavailable,
        401 | 403 | 407 => Class::Denied,
        413 => Class::Rejected,
        _ => Class::Unknown,
    }
}

/// The code in a body that starts with `Code: NNN` (old servers write
/// `Code: 60, e.displayText() = ...`, current ones `Code: 60. DB::Exception: ...`).
/// Leading whitespace is tolerated; a code anywhere else in the text is not taken.
pub fn code_in_body(body: &str) -> Option<u32> {
    let rest = body.trim_start().strip_prefix("Code:")?.trim_start();
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 || digits > 9 {
        return None;
    }
    rest[..digits].parse().ok()
}

/// The code in an `X-ClickHouse-Exception-Code` header value.
pub fn code_in_header(value: &str) -> Option<u32> {
    value.trim().parse().ok()
}

/// Classify a ClickHouse exception code with its flags.
pub fn from_code(code: u32, status: Option<u16>, message: String) -> ClickHouseError {
    ClickHouseError {
        class: class_of_code(code),
        code: Some(code),
        table_scoped: TABLE_SCOPED_CODES.contains(&code),
        splittable: SPLITTABLE_CODES.contains(&code),
        missing_table: MISSING_TABLE_CODES.contains(&code),
        status,
        no_answer: None,
        message,
    }
}

/// Classify an HTTP answer that is not a success.
///
/// `header` is the raw `X-ClickHouse-Exception-Code` value, `body` the first
/// [`MAX_ERROR_BODY`] bytes of the body (lossily decoded).
pub fn from_response(status: u16, header: Option<&str>, body: &str) -> ClickHouseError {
    let message = body.trim().to_string();
    let code = header
        .and_then(code_in_header)
        .or_else(|| code_in_body(body));
    match code {
        Some(code) => from_code(code, Some(status), message),
        None => ClickHouseError {
            class: class_of_status(status),
            code: None,
            table_scoped: false,
            splittable: false,
            missing_table: false,
            status: Some(status),
            no_answer: None,
            message: if message.is_empty() {
                format!("HTTP {status} with no body")
            } else {
                message
            },
        },
    }
}

/// Classify a failure to get any answer: refused, reset, broken pipe, unreachable,
/// DNS, timeouts, EOF. None of them means a row was judged; `why` tells which of them
/// it was (the adapter knows it from its client's error).
pub fn transport(why: NoAnswer, message: impl Into<String>) -> ClickHouseError {
    ClickHouseError {
        class: Class::Unavailable,
        code: None,
        table_scoped: false,
        splittable: false,
        missing_table: false,
        status: None,
        no_answer: Some(why),
        message: message.into(),
    }
}

/// An answer that came but could not be read as what was asked (a line of
/// `system.tables` that is not its JSON): nothing was judged, nothing was lost.
pub fn unreadable_answer(message: impl Into<String>) -> ClickHouseError {
    ClickHouseError {
        no_answer: None,
        ..transport(NoAnswer::Refused, message)
    }
}

/// Classify free text the way `sluice classify` reads its argument: a bare code, a
/// `status:NNN`, or an error message (with `Code: NNN` at its start or after
/// `Exception-Code:`). Returns `None` when the text carries nothing to go on.
pub fn from_text(text: &str) -> Option<ClickHouseError> {
    let text = text.trim();
    if let Ok(code) = text.parse::<u32>() {
        return Some(from_code(code, None, String::new()));
    }
    if let Some(status) = text
        .strip_prefix("status:")
        .and_then(|s| s.trim().parse::<u16>().ok())
    {
        return Some(from_response(status, None, ""));
    }
    if let Some(code) = code_in_body(text) {
        return Some(from_code(code, None, text.to_string()));
    }
    let lower = text.to_ascii_lowercase();
    if let Some(pos) = lower.find("x-clickhouse-exception-code:") {
        let value = &text[pos + "x-clickhouse-exception-code:".len()..];
        let value = value.trim_start();
        let digits = value.len() - value.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if let Ok(code) = value[..digits].parse() {
            return Some(from_code(code, None, text.to_string()));
        }
    }
    looks_like_transport(&lower).map(|why| transport(why, text))
}

/// Words a transport failure is described with, by the OS, hyper, or a proxy, and
/// which failure each names. Only text pasted into `sluice classify` is read this way:
/// the adapter knows the failure from its client's error.
fn looks_like_transport(lower: &str) -> Option<NoAnswer> {
    const WORDS: &[(&str, NoAnswer)] = &[
        ("connection refused", NoAnswer::Refused),
        ("unreachable", NoAnswer::Refused),
        ("dns", NoAnswer::Refused),
        ("failed to lookup", NoAnswer::Refused),
        ("timed out", NoAnswer::TimedOut),
        ("timeout", NoAnswer::TimedOut),
        ("connection reset", NoAnswer::Lost),
        ("broken pipe", NoAnswer::Lost),
        ("unexpected eof", NoAnswer::Lost),
        ("end of file", NoAnswer::Lost),
        ("connection closed", NoAnswer::Lost),
    ];
    WORDS
        .iter()
        .find(|(word, _)| lower.contains(word))
        .map(|(_, why)| *why)
}

/// What Sluice does with a failure of this kind on the ingest path, in one sentence.
pub fn ingest_action(error: &ClickHouseError) -> &'static str {
    if error.code == Some(UNKNOWN_SETTING) {
        return "an insert carries only settings the server said it knows: the server changed behind the URL; ask it again which settings it knows, back off the pool and retry with those; never park (a tenant's query with it is answered 400)";
    }
    if error.missing_table {
        return "the table or database does not exist (yet): wait for it, table-scoped, for missing_table_grace (its neighbours keep inserting, its rows are nakked with the delay); when the grace runs out park its rows batch by batch without bisection (the failure names no row)";
    }
    match (error.class, error.table_scoped, error.splittable) {
        (Class::Rejected, _, _) => {
            "the rows are at fault: bisect the batch, park each row rejected alone on the DLQ (or leave it unacked when the table's DLQ is off), ack the rest"
        }
        (_, true, true) => {
            "split a multi-row batch first (a lone row is not split again); if it still fails, back off this table alone and nak its rows with the delay; never park"
        }
        (_, false, true) => {
            "split a multi-row batch first (a lone row is not split again); if it still fails, back off the whole pool and nak the rows with the delay; never park"
        }
        (_, true, false) => {
            "back off this table alone (its neighbours keep inserting) and nak its rows with the delay; never park"
        }
        (_, false, false) => {
            "back off the whole pool (1 s doubling to 30 s, jittered), nak the rows with the delay, probe once when the window ends; never park"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_lists_are_sorted_disjoint_and_consistent() {
        assert!(UNAVAILABLE_CODES.windows(2).all(|w| w[0] < w[1]));
        for code in DENIED_CODES {
            assert!(!UNAVAILABLE_CODES.contains(code), "{code} in both lists");
        }
        for code in SPLITTABLE_CODES {
            assert_eq!(
                class_of_code(*code),
                Class::Unavailable,
                "splittable {code}"
            );
        }
        for code in TABLE_SCOPED_CODES {
            assert!(class_of_code(*code).is_outage(), "table-scoped {code}");
        }
    }

    #[test]
    fn every_unavailable_code() {
        let expected = [
            95, 96, 159, 160, 164, 173, 201, 202, 203, 209, 210, 225, 236, 241, 242, 243, 244, 252,
            254, 265, 279, 285, 286, 289, 297, 319, 364, 369, 394, 415, 425, 439, 499, 574, 692,
            700, 735, 745, 749, 762, 774, 776, 777, 778, 904, 999, 1000,
        ];
        assert_eq!(expected.len(), 47);
        for code in expected {
            let e = from_code(code, None, String::new());
            assert_eq!(e.class, Class::Unavailable, "code {code}");
            assert_eq!(
                e.table_scoped,
                [242, 252, 692, 774].contains(&code),
                "table_scoped {code}"
            );
            assert_eq!(
                e.splittable,
                [241, 252].contains(&code),
                "splittable {code}"
            );
        }
    }

    #[test]
    fn every_denied_code() {
        for code in [192, 193, 194, 195, 291, 497, 516, 720] {
            let e = from_code(code, None, String::new());
            assert_eq!(e.class, Class::Denied, "code {code}");
            assert_eq!(e.table_scoped, code == 497, "table_scoped {code}");
            assert!(!e.splittable);
        }
    }

    #[test]
    fn any_other_code_is_rejected() {
        for code in [
            0, 1, 6, 26, 27, 60, 62, 81, 115, 117, 12345, 1001, 4294967295,
        ] {
            let e = from_code(code, None, String::new());
            assert_eq!(e.class, Class::Rejected, "code {code}");
            assert!(!e.table_scoped && !e.splittable, "flags {code}");
        }
    }

    #[test]
    fn status_without_code() {
        let cases = [
            (408, Class::Unavailable),
            (429, Class::Unavailable),
            (502, Class::Unavailable),
            (503, Class::Unavailable),
            (504, Class::Unavailable),
            (401, Class::Denied),
            (403, Class::Denied),
            (407, Class::Denied),
            (413, Class::Rejected),
            (400, Class::Unknown),
            (404, Class::Unknown),
            (500, Class::Unknown),
            (501, Class::Unknown),
            (302, Class::Unknown),
        ];
        for (status, class) in cases {
            let e = from_response(status, None, "<html>proxy error</html>");
            assert_eq!(e.class, class, "status {status}");
            assert_eq!(e.code, None);
            assert_eq!(e.status, Some(status));
        }
    }

    #[test]
    fn header_wins_over_body_and_status() {
        let e = from_response(500, Some("745"), "Code: 60. DB::Exception: x");
        assert_eq!((e.class, e.code), (Class::Unavailable, Some(745)));
        let e = from_response(503, Some(" 60 "), "");
        assert_eq!((e.class, e.code), (Class::Rejected, Some(60)));
    }

    #[test]
    fn unparsable_header_falls_back_to_body() {
        let e = from_response(500, Some("n/a"), "Code: 252. DB::Exception: Too many parts");
        assert_eq!(e.code, Some(252));
        assert!(e.table_scoped && e.splittable);
    }

    #[test]
    fn both_body_formats() {
        let old = "Code: 60, e.displayText() = DB::Exception: Table default.nope doesn't exist., e.what() = DB::Exception\n";
        let new = "Code: 60. DB::Exception: Table default.nope does not exist. (UNKNOWN_TABLE) (version 24.3.1.1)\n";
        for body in [old, new] {
            let e = from_response(404, None, body);
            assert_eq!((e.class, e.code), (Class::Rejected, Some(60)), "{body}");
        }
        let e = from_response(
            500,
            None,
            "Code: 27, e.displayText() = DB::Exception: Cannot parse input",
        );
        assert_eq!((e.class, e.code), (Class::Rejected, Some(27)));
        let e = from_response(401, None, "Code: 193, e.displayText() = DB::Exception: Wrong password for user writer, e.what() = DB::Exception");
        assert_eq!((e.class, e.code), (Class::Denied, Some(193)));
    }

    #[test]
    fn code_must_lead_the_body() {
        assert_eq!(
            code_in_body("  \nCode: 159. DB::Exception: Timeout"),
            Some(159)
        );
        assert_eq!(code_in_body("error: Code: 159"), None);
        assert_eq!(code_in_body("Code: x"), None);
        assert_eq!(code_in_body("Code:"), None);
        assert_eq!(code_in_body("Code: 99999999999999"), None);
        let e = from_response(500, None, "Internal error. Code: 60");
        assert_eq!((e.class, e.code), (Class::Unknown, None));
    }

    #[test]
    fn transport_failures_are_unavailable() {
        let e = transport(NoAnswer::Refused, "connection refused");
        assert_eq!(
            (e.class, e.code, e.status),
            (Class::Unavailable, None, None)
        );
        assert!(!e.lost_connection());
        assert!(transport(NoAnswer::Lost, "connection reset by peer").lost_connection());
        assert!(!transport(NoAnswer::TimedOut, "operation timed out").lost_connection());
    }

    #[test]
    fn text_as_the_cli_reads_it() {
        let e = from_text("252").expect("code");
        assert_eq!(e.class, Class::Unavailable);
        assert!(e.table_scoped && e.splittable);
        assert_eq!(from_text("60").map(|e| e.class), Some(Class::Rejected));
        assert_eq!(from_text("12345").map(|e| e.class), Some(Class::Rejected));
        assert_eq!(
            from_text("Code: 516. DB::Exception: x").map(|e| e.class),
            Some(Class::Denied)
        );
        assert_eq!(
            from_text("status:503").map(|e| e.class),
            Some(Class::Unavailable)
        );
        assert_eq!(
            from_text("status:500").map(|e| e.class),
            Some(Class::Unknown)
        );
        assert_eq!(
            from_text("X-ClickHouse-Exception-Code: 745").map(|e| e.code),
            Some(Some(745))
        );
        assert_eq!(
            from_text("error sending request: Connection refused (os error 111)").map(|e| e.class),
            Some(Class::Unavailable)
        );
        assert_eq!(from_text("something odd"), None);
    }
}
