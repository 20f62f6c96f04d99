//! Every key `config.toml` accepts, read off the file's serde types (`file.rs`) rather
//! than listed by hand beside them: the environment overrides (`env.rs`) and the test
//! that config.toml documents every key follow the types, so a key added to `file.rs`
//! is overridable at once and undocumented until config.toml says what it does.
//!
//! How: a deserializer that walks one path into `FileConfig` and reports what it meets
//! at the end (a struct and its fields, a map of names, or a value and its kind), the
//! serde derive handing over each struct's field names and each enum's variants.

use std::fmt;
use std::sync::OnceLock;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize as _;

use super::file::FileConfig;

/// One step of a key's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    /// A fixed key: `nats`, `url`.
    Key(&'static str),
    /// A name the operator chooses: `main` in `[clickhouse.targets.main]`, `acme` in
    /// `[tenants.acme]`, `"acme.events"` in `[tables."acme.events"]`.
    Name,
}

/// What a key's value is written as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    Text,
    Integer,
    Float,
    Bool,
    /// A string with a unit: a size (`"8MiB"`) or a duration (`"30s"`).
    WithUnit,
    /// One of a fixed set of words.
    Choice(&'static [&'static str]),
    /// A list of strings (`shards = ["...", "..."]`).
    List,
}

/// One key the configuration accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpec {
    pub path: Vec<Segment>,
    pub kind: ValueKind,
}

#[cfg(test)]
impl KeySpec {
    /// The fixed keys of the path, `*` standing for a chosen name: `clickhouse.targets.*.url`.
    pub fn dotted(&self) -> String {
        self.path
            .iter()
            .map(|s| match s {
                Segment::Key(k) => *k,
                Segment::Name => "*",
            })
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// Every key of `config.toml`, in the order of the types' fields.
pub fn keys() -> &'static [KeySpec] {
    static KEYS: OnceLock<Vec<KeySpec>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut out = Vec::new();
        walk(&mut Vec::new(), &mut out);
        out
    })
}

/// The fields, the map or the value at the end of `path`, recursively.
fn walk(path: &mut Vec<Segment>, out: &mut Vec<KeySpec>) {
    match probe(path) {
        Shape::Struct(fields) => {
            for field in fields {
                path.push(Segment::Key(field));
                walk(path, out);
                path.pop();
            }
        }
        Shape::Map => {
            path.push(Segment::Name);
            walk(path, out);
            path.pop();
        }
        Shape::Value(kind) => out.push(KeySpec {
            path: path.clone(),
            kind,
        }),
    }
}

/// What `FileConfig` holds at `path`.
fn probe(path: &[Segment]) -> Shape {
    match FileConfig::deserialize(Probe { rest: path }) {
        Err(Found::Shape(shape)) => shape,
        // Every path walked comes from the types, and every probe ends in a shape; a
        // type serde cannot describe this way is taken for text.
        Ok(_) | Err(Found::Other(_)) => Shape::Value(ValueKind::Text),
    }
}

/// What a probe met at the end of its path.
#[derive(Debug)]
enum Shape {
    Struct(&'static [&'static str]),
    Map,
    Value(ValueKind),
}

/// The probe's "error": how it stops the derive once it has seen what it came for.
#[derive(Debug)]
enum Found {
    Shape(Shape),
    Other(String),
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Shape(shape) => write!(f, "found {shape:?}"),
            Found::Other(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Found {}

impl de::Error for Found {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Found::Other(msg.to_string())
    }
}

/// Follows `rest` into the type being deserialized.
struct Probe<'p> {
    rest: &'p [Segment],
}

impl Probe<'_> {
    fn value(self, kind: ValueKind) -> Found {
        match self.rest {
            [] => Found::Shape(Shape::Value(kind)),
            _ => Found::Other("a value has no keys".into()),
        }
    }
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = Found;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Found> {
        match self.rest {
            [] => Err(Found::Shape(Shape::Struct(fields))),
            [Segment::Key(key), rest @ ..] => visitor.visit_map(OneEntry {
                key: Some(key),
                rest,
            }),
            [Segment::Name, ..] => Err(Found::Other("a struct has no chosen names".into())),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Found> {
        match self.rest {
            [] => Err(Found::Shape(Shape::Map)),
            [Segment::Name, rest @ ..] => visitor.visit_map(OneEntry {
                key: Some("name"),
                rest,
            }),
            [Segment::Key(_), ..] => Err(Found::Other("a map's keys are names".into())),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Found> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Found> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Found> {
        Err(self.value(ValueKind::Choice(variants)))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Found> {
        Err(self.value(ValueKind::Bool))
    }

    fn deserialize_i64<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Found> {
        Err(self.value(ValueKind::Integer))
    }

    fn deserialize_u64<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Found> {
        Err(self.value(ValueKind::Integer))
    }

    fn deserialize_f64<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Found> {
        Err(self.value(ValueKind::Float))
    }

    fn deserialize_str<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Found> {
        Err(self.value(ValueKind::Text))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Found> {
        Err(self.value(ValueKind::List))
    }

    /// Only the unit types (`units::UnitText`) take any value: text with a unit, or a
    /// bare number so that the "needs a unit" error can be given.
    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Found> {
        Err(self.value(ValueKind::WithUnit))
    }

    serde::forward_to_deserialize_any! {
        i128 u128 char bytes byte_buf unit unit_struct tuple tuple_struct identifier
        ignored_any
    }

    fn deserialize_i8<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.deserialize_i64(v)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.deserialize_i64(v)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.deserialize_i64(v)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.deserialize_u64(v)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.deserialize_u64(v)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.deserialize_u64(v)
    }
    fn deserialize_f32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.deserialize_f64(v)
    }
    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Found> {
        self.deserialize_str(v)
    }
}

/// A table of one entry: the next key of the path, whose value is probed further.
struct OneEntry<'p> {
    key: Option<&'static str>,
    rest: &'p [Segment],
}

impl<'de> MapAccess<'de> for OneEntry<'_> {
    type Error = Found;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Found> {
        match self.key.take() {
            Some(key) => seed
                .deserialize(BorrowedStrDeserializer::new(key))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Found> {
        seed.deserialize(Probe { rest: self.rest })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(dotted: &str) -> Option<ValueKind> {
        keys().iter().find(|k| k.dotted() == dotted).map(|k| k.kind)
    }

    #[test]
    fn every_section_and_kind_is_read_off_the_types() {
        assert_eq!(find("nats.url"), Some(ValueKind::Text));
        assert_eq!(find("nats.max_ack_pending"), Some(ValueKind::Integer));
        assert_eq!(find("nats.ack_wait"), Some(ValueKind::WithUnit));
        assert_eq!(
            find("nats.user"),
            Some(ValueKind::Text),
            "an Option<String>"
        );
        assert_eq!(
            find("clickhouse.targets.*.insert_concurrency"),
            Some(ValueKind::Integer)
        );
        assert_eq!(find("tenants.*.token_env"), Some(ValueKind::Text));
        assert_eq!(find("tables.*.dlq"), Some(ValueKind::Bool));
        assert_eq!(find("clickhouse.targets.*.shards"), Some(ValueKind::List));
        assert_eq!(find("tables.*.exactly_once"), None, "[ingest] only");
        assert_eq!(find("ingest.exactly_once"), Some(ValueKind::Bool));
        assert_eq!(find("pipeline.max_held_rows"), Some(ValueKind::Integer));
        assert_eq!(find("query.retry_budget"), Some(ValueKind::Float));
        assert_eq!(
            find("api.auth"),
            Some(ValueKind::Choice(&["token", "none"]))
        );
        assert_eq!(
            find("log.format"),
            Some(ValueKind::Choice(&["text", "json"]))
        );
        // Every key is a value: no section is taken for a key.
        assert!(find("nats").is_none() && find("clickhouse.targets").is_none());
        assert!(keys().len() > 80, "{}", keys().len());
    }
}
