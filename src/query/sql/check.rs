//! The check proper, over one reading's tokens: one read statement, no clause that
//! changes what the gateway pins, no table function or server table outside the
//! allow-lists.

use super::lex::Token;
use super::names::{
    contains, ALLOWED_SYSTEM_TABLES, ALLOWED_TABLE_FUNCTIONS, FROM_IN_ARGUMENTS, FROM_LIST_ENDS,
    SERVER_DATABASES, SHOW_ALLOWED, SHOW_CREATE_ALLOWED, SHOW_MODIFIERS, TABLE_FUNCTIONS,
};
use super::{SqlError, READ_KEYWORDS, WRITE_KEYWORDS};

pub fn check(tokens: &[Token]) -> Result<(), SqlError> {
    let body = one_statement(tokens)?;
    let leading = leading_keyword(body)?;
    if leading.eq_ignore_ascii_case("SHOW") {
        check_show(body)?;
    }
    // `DESCRIBE f(...)`, `EXISTS TABLE f(...)`, `SHOW CREATE TABLE f(...)`: outside a
    // query, a call at the top level names a table.
    let calls_are_tables = !["SELECT", "WITH", "EXPLAIN"]
        .iter()
        .any(|k| leading.eq_ignore_ascii_case(k));
    Scan::new(body, calls_are_tables).run()
}

/// The statement without its one optional trailing `;`.
fn one_statement(tokens: &[Token]) -> Result<&[Token], SqlError> {
    if tokens.is_empty() {
        return Err(SqlError::Empty);
    }
    match tokens.iter().position(|t| t.is_punct(';')) {
        Some(0) => Err(SqlError::Empty),
        Some(pos) if pos + 1 != tokens.len() => Err(SqlError::MultiStatement),
        Some(pos) => Ok(&tokens[..pos]),
        None => Ok(tokens),
    }
}

/// The first word, past any opening parentheses: a read statement's keyword.
fn leading_keyword(body: &[Token]) -> Result<&str, SqlError> {
    match body.iter().find(|t| !t.is_punct('(')) {
        Some(Token::Word(word)) => {
            let upper = word.to_ascii_uppercase();
            if READ_KEYWORDS.contains(&upper.as_str()) {
                Ok(word)
            } else if WRITE_KEYWORDS.contains(&upper.as_str()) {
                Err(SqlError::Write(upper))
            } else {
                Err(SqlError::NotRead(upper))
            }
        }
        _ => Err(SqlError::NoKeyword),
    }
}

/// `SHOW TABLES` and its kin list what a query could read anyway; the other forms
/// show the server's state and users.
fn check_show(body: &[Token]) -> Result<(), SqlError> {
    let mut words = body
        .iter()
        .skip_while(|t| !t.is_keyword("SHOW"))
        .skip(1)
        .skip_while(|t| SHOW_MODIFIERS.iter().any(|m| t.is_keyword(m)));
    let refused = |shown: &str| SqlError::Show(shown.to_ascii_uppercase());
    let what = match words.next() {
        Some(Token::Word(w)) => w,
        _ => return Err(refused("")),
    };
    if !contains(SHOW_ALLOWED, what) {
        return Err(refused(what));
    }
    if what.eq_ignore_ascii_case("CREATE") {
        match words.find(|t| !t.is_keyword("TEMPORARY")) {
            Some(Token::Word(w)) if contains(SHOW_CREATE_ALLOWED, w) => {}
            Some(Token::Word(w)) => return Err(refused(&format!("CREATE {w}"))),
            _ => return Err(refused("CREATE")),
        }
    }
    Ok(())
}

/// One pass over a statement's tokens, keeping track of the parentheses it is in.
struct Scan<'t> {
    tokens: &'t [Token],
    /// One frame per open parenthesis, the statement itself at the bottom.
    frames: Vec<Frame>,
}

/// What a parenthesis (or the statement) says about the words inside it.
#[derive(Clone, Copy)]
struct Frame {
    /// `FROM` here starts a table list: false in the arguments of `EXTRACT` and kin.
    from_starts_tables: bool,
    /// Inside a table list (after `FROM` or `JOIN`, before the clause that ends it):
    /// a `,` here is followed by a table.
    in_table_list: bool,
    /// Every `name(` here is a table function (a statement other than a query).
    calls_are_tables: bool,
}

impl Frame {
    fn new(from_starts_tables: bool) -> Self {
        Frame {
            from_starts_tables,
            in_table_list: false,
            calls_are_tables: false,
        }
    }
}

// === impl Scan ===

impl<'t> Scan<'t> {
    fn new(tokens: &'t [Token], calls_are_tables: bool) -> Self {
        let top = Frame {
            calls_are_tables,
            ..Frame::new(true)
        };
        Scan {
            tokens,
            frames: vec![top],
        }
    }

    fn run(mut self) -> Result<(), SqlError> {
        for i in 0..self.tokens.len() {
            self.check_token(i)?;
            self.follow(i);
        }
        Ok(())
    }

    fn at(&self, i: usize) -> Option<&'t Token> {
        self.tokens.get(i)
    }

    fn frame(&mut self) -> &mut Frame {
        // The bottom frame is never popped (see `follow`).
        let last = self.frames.len() - 1;
        &mut self.frames[last]
    }

    /// Refuse token `i` if it starts something the gateway does not run.
    fn check_token(&self, i: usize) -> Result<(), SqlError> {
        let token = &self.tokens[i];
        let after_dot = i > 0 && self.tokens[i - 1].is_punct('.');
        if *token == Token::Quoted(None) {
            return Err(SqlError::EscapedIdentifier);
        }
        if token.is_keyword("SETTINGS") && !after_dot {
            return Err(SqlError::SettingsClause);
        }
        if token.is_keyword("FORMAT") && !after_dot && self.is_format_clause(i) {
            return Err(SqlError::FormatClause);
        }
        if let Some(param) = self.identifier_parameter(i) {
            return Err(SqlError::IdentifierParameter(param.to_string()));
        }
        let Some(name) = token.name() else {
            return Ok(());
        };
        let is_call = self.at(i + 1).is_some_and(|t| t.is_punct('('));
        let table_function = contains(TABLE_FUNCTIONS, name)
            || (self.is_table_position(i) && !contains(ALLOWED_TABLE_FUNCTIONS, name));
        if is_call && table_function {
            return Err(SqlError::TableFunction(name.to_string()));
        }
        if contains(SERVER_DATABASES, name) && self.at(i + 1).is_some_and(|t| t.is_punct('.')) {
            if let Some(table) = self.at(i + 2).and_then(Token::name) {
                if !contains(ALLOWED_SYSTEM_TABLES, table) {
                    return Err(SqlError::SystemTable(format!("{name}.{table}")));
                }
            }
        }
        Ok(())
    }

    /// `FORMAT Name` at the end of the statement (or before `SETTINGS`): the clause,
    /// not a column named `format`.
    fn is_format_clause(&self, i: usize) -> bool {
        self.at(i + 1).and_then(Token::name).is_some()
            && match self.at(i + 2) {
                None => true,
                Some(next) => next.is_keyword("SETTINGS"),
            }
    }

    /// The name of a query parameter of type `Identifier` opening at `i`
    /// (`{t:Identifier}`): ClickHouse splices its value in as a name, where the check
    /// never sees it (`system.processes` passed as a parameter).
    fn identifier_parameter(&self, i: usize) -> Option<&'t str> {
        if !self.tokens[i].is_punct('{') || !self.at(i + 2).is_some_and(|t| t.is_punct(':')) {
            return None;
        }
        let name = self.at(i + 1)?.name()?;
        self.tokens[i + 3..]
            .iter()
            .take_while(|t| !t.is_punct('}'))
            .any(|t| t.is_keyword("Identifier"))
            .then_some(name)
    }

    /// Whether the name at `i` stands where a table goes: right after `FROM`, `JOIN`
    /// (not `ARRAY JOIN`, which takes expressions) or a `,` of a table list, or
    /// anywhere at the top of a statement that is not a query.
    fn is_table_position(&self, i: usize) -> bool {
        let frame = self.frames[self.frames.len() - 1];
        if frame.calls_are_tables {
            return true;
        }
        let Some(prev) = i.checked_sub(1).and_then(|p| self.at(p)) else {
            return false;
        };
        (prev.is_keyword("FROM") && frame.from_starts_tables)
            || (prev.is_keyword("JOIN") && !self.is_array_join(i - 1))
            || (prev.is_punct(',') && frame.in_table_list)
    }

    fn is_array_join(&self, join: usize) -> bool {
        join > 0 && self.tokens[join - 1].is_keyword("ARRAY")
    }

    /// Keep the frames up to date past token `i`.
    fn follow(&mut self, i: usize) {
        let token = &self.tokens[i];
        if token.is_punct('(') {
            let prev_takes_from = i > 0
                && matches!(&self.tokens[i - 1], Token::Word(w) if contains(FROM_IN_ARGUMENTS, w));
            self.frames.push(Frame::new(!prev_takes_from));
        } else if token.is_punct(')') {
            if self.frames.len() > 1 {
                self.frames.pop();
            }
        } else if token.is_keyword("FROM") {
            if self.frame().from_starts_tables {
                self.frame().in_table_list = true;
            }
        } else if token.is_keyword("JOIN") {
            if !self.is_array_join(i) {
                self.frame().in_table_list = true;
            }
        } else if let Token::Word(w) = token {
            if contains(FROM_LIST_ENDS, w) {
                self.frame().in_table_list = false;
            }
        }
    }
}
