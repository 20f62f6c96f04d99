//! The `Idempotency-Key` header, the scope a key belongs to (its deployment, tenant and
//! table), and the body's fingerprint: what the record's key and the messages' ids are
//! made of.

use axum::http::HeaderMap;
use ring::digest::{Context, SHA256};

use super::super::parse::Framing;
use crate::http::headers;

/// The longest key taken, in characters.
pub const MAX_KEY_LEN: usize = 128;

/// Hex digits of SHA-256 kept in a record key and in a message id: 128 bits, so two
/// keys (or two bodies) share one only by a collision nobody will meet. The consumer
/// knows a keyed chunk's id by this length (`nats::chunk_id`).
const HASH_HEX: usize = crate::nats::STEM_HEX;

/// The longest message id of a chunk: the stem, `-`, and the chunk's index.
pub const MAX_MESSAGE_ID_LEN: usize = HASH_HEX + 1 + 20;

/// An `Idempotency-Key` as the client meant it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyKey(String);

/// The request's `Idempotency-Key`, if it sent one; a key sent twice or not usable is
/// refused (400) with the reason.
///
/// The IETF draft makes the value a structured-field string (`"8e03978e-..."`): such a
/// value is taken without its quotes, so `"abc"` and `abc` are one key. Unquoted, the
/// key is 1 to 128 visible ASCII characters; quoted, spaces may appear inside.
pub fn from_headers(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, String> {
    let Some(value) = headers::single(headers, "idempotency-key", "Idempotency-Key")
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| "Idempotency-Key must be visible ASCII".to_string())?
        .trim();
    let key = match text.strip_prefix('"') {
        Some(quoted) => structured_string(quoted),
        None => text
            .chars()
            .all(|c| c.is_ascii_graphic())
            .then(|| text.to_string()),
    };
    match key {
        Some(key) if !key.is_empty() && key.chars().count() <= MAX_KEY_LEN => {
            Ok(Some(IdempotencyKey(key)))
        }
        _ => Err(format!(
            "Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters, or a quoted string of them (spaces allowed)"
        )),
    }
}

/// The rest of an RFC 8941 string after its opening quote: its content, or `None`
/// when it is not one (no closing quote, a bad escape, a character it cannot hold).
fn structured_string(rest: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                escaped @ ('"' | '\\') => out.push(escaped),
                _ => return None,
            },
            '"' => return chars.next().is_none().then_some(out),
            ' '..='~' => out.push(c),
            _ => return None,
        }
    }
    None
}

/// A key within the deployment, tenant and table it was sent to: the same key from
/// another tenant, to another table, or to another deployment sharing the bucket (a
/// staging stack beside production on one NATS) is another request.
#[derive(Clone, Debug)]
pub struct ScopedKey {
    /// The deployment: its ingest stream, which no other deployment on the same NATS
    /// can have.
    stream: String,
    tenant: String,
    table: String,
    key: IdempotencyKey,
}

impl ScopedKey {
    pub fn new(stream: &str, tenant: &str, table: &str, key: IdempotencyKey) -> Self {
        Self {
            stream: stream.to_string(),
            tenant: tenant.to_string(),
            table: table.to_string(),
            key,
        }
    }

    /// The bucket key of its record: `<stream>.<tenant>.<table>.<32 hex digits of
    /// SHA-256 of the key>` (a key may hold characters a bucket key cannot; stream,
    /// tenant and table names never do, and keep the bucket readable).
    pub fn record_key(&self) -> String {
        let digest = sha256(&[self.key.0.as_bytes()]);
        format!(
            "{}.{}.{}.{}",
            self.stream,
            self.tenant,
            self.table,
            &digest[..HASH_HEX]
        )
    }

    /// The stem of the message ids of `body` sent under this key: 32 hex digits of
    /// SHA-256 over stream, tenant, table, key and the body's fingerprint. A chunk's id
    /// is `<stem>-<index>`, so neither JetStream's duplicate window nor a chunk's landed
    /// mark (`landed.<id>`, in the bucket another deployment may share) ever takes one
    /// deployment's, tenant's, table's or body's message for another's.
    pub fn message_stem(&self, body: &Fingerprint) -> String {
        let digest = sha256(&[
            self.stream.as_bytes(),
            self.tenant.as_bytes(),
            self.table.as_bytes(),
            self.key.0.as_bytes(),
            body.0.as_bytes(),
        ]);
        digest[..HASH_HEX].to_string()
    }
}

/// SHA-256 of the body and its framing, in hex: a retry is the same request only if it
/// sends these bytes again, framed the same way.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of(framing: Framing, body: &[u8]) -> Self {
        let tag: &[u8] = match framing {
            Framing::Json => b"json",
            Framing::Ndjson => b"ndjson",
            Framing::JsonSeq => b"json-seq",
        };
        Fingerprint(sha256(&[tag, body]))
    }
}

/// SHA-256 of the parts, each preceded by its length (so no two lists of parts give one
/// input), in lower-case hex.
fn sha256(parts: &[&[u8]]) -> String {
    let mut context = Context::new(&SHA256);
    for part in parts {
        context.update(&(part.len() as u64).to_be_bytes());
        context.update(part);
    }
    context
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn key_of(values: &[&str]) -> Result<Option<IdempotencyKey>, String> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append("idempotency-key", HeaderValue::from_str(v).expect("value"));
        }
        from_headers(&headers)
    }

    #[test]
    fn a_key_is_visible_ascii_or_a_quoted_string_and_sent_once() {
        assert_eq!(key_of(&[]), Ok(None));
        assert_eq!(
            key_of(&["batch-0001"]),
            Ok(Some(IdempotencyKey("batch-0001".into())))
        );
        // The draft's form: a structured-field string, the same key without quotes.
        assert_eq!(key_of(&["\"batch-0001\""]), key_of(&["batch-0001"]));
        assert_eq!(
            key_of(&[r#""a b \"c\" \\""#]),
            Ok(Some(IdempotencyKey(r#"a b "c" \"#.into())))
        );
        for bad in ["\"unclosed", "\"a\"b", r#""bad \n escape""#, "\"\"", "a b"] {
            let e = key_of(&[bad]).expect_err(bad);
            assert!(e.contains("Idempotency-Key must be"), "{bad}: {e}");
        }
        assert!(key_of(&[&"k".repeat(MAX_KEY_LEN)]).is_ok());
        assert!(key_of(&[&"k".repeat(MAX_KEY_LEN + 1)]).is_err());
        let e = key_of(&["one", "two"]).expect_err("twice");
        assert!(
            e.contains("Idempotency-Key header is sent more than once"),
            "{e}"
        );
        assert!(key_of(&["same", "same"]).is_err());
    }

    #[test]
    fn a_key_is_scoped_to_its_deployment_tenant_and_table_and_a_message_id_to_the_body_too() {
        let key = || IdempotencyKey("batch-0001".into());
        let acme = ScopedKey::new("INGEST", "acme", "events", key());
        let globex = ScopedKey::new("INGEST", "globex", "events", key());
        let events2 = ScopedKey::new("INGEST", "acme", "events2", key());
        let staging = ScopedKey::new("STAGING", "acme", "events", key());
        assert!(acme.record_key().starts_with("INGEST.acme.events."));
        assert_eq!(
            acme.record_key().len(),
            "INGEST.acme.events.".len() + HASH_HEX
        );
        assert_ne!(acme.record_key(), globex.record_key());
        assert_ne!(acme.record_key(), events2.record_key());
        assert_ne!(acme.record_key(), staging.record_key());

        let body = Fingerprint::of(Framing::Ndjson, b"{\"id\":1}");
        let stems = [&acme, &globex, &events2, &staging].map(|k| k.message_stem(&body));
        assert!(stems.iter().all(|s| s.len() == HASH_HEX));
        let distinct: std::collections::BTreeSet<&String> = stems.iter().collect();
        assert_eq!(distinct.len(), stems.len(), "{stems:?}");
        let other = Fingerprint::of(Framing::Ndjson, b"{\"id\":2}");
        assert_ne!(acme.message_stem(&body), acme.message_stem(&other));
        assert_eq!(acme.message_stem(&body), acme.message_stem(&body.clone()));
        // The same bytes framed otherwise are another body.
        assert_ne!(body, Fingerprint::of(Framing::Json, b"{\"id\":1}"));
        // Parts are length-prefixed: moving a byte between parts changes the hash.
        assert_ne!(sha256(&[b"ab", b"c"]), sha256(&[b"a", b"bc"]));
    }
}
