//! ClickHouse's answers built by class, as a test states them.

use crate::ports::*;

/// An answer with ClickHouse exception code `code`, of the class the test says.
///
/// Built by class, never from a copy of the classifier's code lists (those live in one
/// place, the `sluice` crate's classifier): a test states what the classifier would
/// say of the code it scripts. Add `.table_scoped()` / `.splittable()` for the flags.
pub fn answer(class: Class, code: u32) -> ClickHouseError {
    ClickHouseError {
        class,
        code: Some(code),
        table_scoped: false,
        splittable: false,
        missing_table: false,
        status: Some(500),
        no_answer: None,
        message: format!("Code: {code}. DB::Exception: scripted"),
    }
}

/// ClickHouse judged the rows (CANNOT_PARSE_INPUT and the like).
pub fn rejected(code: u32) -> ClickHouseError {
    answer(Class::Rejected, code)
}

/// ClickHouse could not take them now.
pub fn unavailable(code: u32) -> ClickHouseError {
    answer(Class::Unavailable, code)
}

/// The connection's configuration (user, password, grants).
pub fn denied(code: u32) -> ClickHouseError {
    answer(Class::Denied, code)
}

/// A codeless HTTP answer, of the class the test says.
pub fn status(status: u16, class: Class) -> ClickHouseError {
    ClickHouseError {
        class,
        code: None,
        table_scoped: false,
        splittable: false,
        missing_table: false,
        status: Some(status),
        no_answer: None,
        message: format!("HTTP {status}"),
    }
}

impl ClickHouseError {
    /// The failure backs off its table alone.
    pub fn table_scoped(mut self) -> Self {
        self.table_scoped = true;
        self
    }

    /// A multi-row batch may succeed when split.
    pub fn splittable(mut self) -> Self {
        self.splittable = true;
        self
    }

    /// The table or its database does not exist (the whole batch, no row named).
    pub fn table_missing(mut self) -> Self {
        self.missing_table = true;
        self
    }
}

/// No connection made (the server was not there): the rows were never sent.
pub fn refused(what: &str) -> ClickHouseError {
    no_answer(crate::NoAnswer::Refused, what)
}

/// The connection lost with no answer (reset, closed mid-answer): what a ClickHouse
/// that crashes on the rows looks like.
pub fn lost(what: &str) -> ClickHouseError {
    no_answer(crate::NoAnswer::Lost, what)
}

/// No answer within the request's timeout (a frozen or slow server).
pub fn timed_out(what: &str) -> ClickHouseError {
    no_answer(crate::NoAnswer::TimedOut, what)
}

/// A transport failure (no HTTP answer), for `why`.
fn no_answer(why: crate::NoAnswer, what: &str) -> ClickHouseError {
    ClickHouseError {
        class: Class::Unavailable,
        code: None,
        table_scoped: false,
        splittable: false,
        missing_table: false,
        status: None,
        no_answer: Some(why),
        message: what.to_owned(),
    }
}
