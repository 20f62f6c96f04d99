//! The name of a setting as an operator reads it (`[nats] url`,
//! `[clickhouse.targets.main] url`, `[tables."acme.events"]`) and as the document knows
//! it (a path of keys): a problem names its keys with this, and finds their line in the
//! file, or the variable that set them, through it.

use std::fmt;

/// A key of the configuration, or a whole table of it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    path: Vec<String>,
    /// A table (`[tables."acme.events"]`) rather than a key in one.
    table: bool,
}

impl Key {
    /// The table at `path`: `Key::table(["clickhouse", "targets", "main"])`.
    pub fn table<S: Into<String>>(path: impl IntoIterator<Item = S>) -> Key {
        Key {
            path: path.into_iter().map(Into::into).collect(),
            table: true,
        }
    }

    /// A key as the document path has it, leaf or table as said.
    pub fn from_path(path: Vec<String>, table: bool) -> Key {
        Key { path, table }
    }

    /// The key `name` of this table.
    pub fn key(&self, name: &str) -> Key {
        let mut path = self.path.clone();
        path.push(name.to_string());
        Key { path, table: false }
    }

    pub fn path(&self) -> &[String] {
        &self.path
    }

    /// Whether `other` is this key or lies within it.
    pub fn contains(&self, other: &Key) -> bool {
        other.path.starts_with(&self.path)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (section, name) = match (self.table, self.path.split_last()) {
            (false, Some((name, section))) if !section.is_empty() => (section, Some(name)),
            _ => (&self.path[..], None),
        };
        if !section.is_empty() {
            let parts: Vec<String> = section.iter().map(|p| bare_or_quoted(p)).collect();
            write!(f, "[{}]", parts.join("."))?;
        }
        match name {
            Some(name) => write!(f, " {}", bare_or_quoted(name)),
            None => Ok(()),
        }
    }
}

/// A key as TOML writes it: bare when it can be, quoted otherwise.
fn bare_or_quoted(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_as_an_operator_writes_them() {
        let nats = Key::table(["nats"]);
        assert_eq!(nats.to_string(), "[nats]");
        assert_eq!(nats.key("url").to_string(), "[nats] url");
        let target = Key::table(["clickhouse", "targets", "main"]);
        assert_eq!(
            target.key("url").to_string(),
            "[clickhouse.targets.main] url"
        );
        let table = Key::table(["tables", "acme.events"]);
        assert_eq!(table.to_string(), "[tables.\"acme.events\"]");
        assert_eq!(
            table.key("batch_rows").to_string(),
            "[tables.\"acme.events\"] batch_rows"
        );
        assert!(table.contains(&table.key("dlq")));
        assert!(!table.key("dlq").contains(&table));
    }
}
