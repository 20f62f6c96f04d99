//! What a JetStream ack address says about the message it acks.
//!
//! The reply subject of every message a consumer delivers encodes where the message
//! stands (ADR-15): `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`,
//! or, from servers that know domains, `$JS.ACK.<domain>.<account hash>.<stream>
//! .<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>.<random>` (tokens after the
//! pending count are ignored, as the form may grow). It is read for every delivered row
//! (the table actor asks each one's position), so the parser borrows and never
//! allocates.

const PREFIX: &str = "$JS.ACK.";

/// The tokens after the prefix in the original form.
const V1_TOKENS: usize = 7;
/// The fewest tokens after the prefix in the form with domain and account hash.
const V2_MIN_TOKENS: usize = 9;

/// One ack address, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckAddress<'a> {
    pub stream: &'a str,
    /// How many times JetStream has delivered the message (1 on the first delivery).
    pub deliveries: u64,
    pub stream_sequence: u64,
    /// When the message was stored, in ns since the epoch.
    pub published: i128,
}

impl<'a> AckAddress<'a> {
    /// `None` for anything that is not a JetStream ack address.
    ///
    /// One pass over the bytes: it runs for every message a consumer delivers.
    pub fn parse(reply: &'a str) -> Option<Self> {
        let rest = reply.strip_prefix(PREFIX)?.as_bytes();
        // The first V2_MIN_TOKENS tokens are all either form needs; past them only
        // whether there are more matters. Split by hand: a `split('.')` costs a memchr
        // call per token, 0.1 µs per message at the scale of these short subjects.
        let mut tokens: [&[u8]; V2_MIN_TOKENS] = [&[]; V2_MIN_TOKENS];
        let mut count = 0;
        let mut start = 0;
        for (i, b) in rest.iter().enumerate() {
            if *b == b'.' {
                if let Some(slot) = tokens.get_mut(count) {
                    *slot = &rest[start..i];
                }
                count += 1;
                start = i + 1;
            }
        }
        if let Some(slot) = tokens.get_mut(count) {
            *slot = &rest[start..];
        }
        count += 1;
        let t = match count {
            V1_TOKENS => &tokens[..V1_TOKENS],
            n if n >= V2_MIN_TOKENS => &tokens[2..],
            _ => return None,
        };
        let [stream, _consumer, deliveries, stream_sequence, _consumer_sequence, published, pending] =
            *t
        else {
            return None;
        };
        digits(pending)?;
        Some(Self {
            // Cut at '.' boundaries of a str: still UTF-8.
            stream: std::str::from_utf8(stream).ok()?,
            deliveries: digits(deliveries)?,
            stream_sequence: digits(stream_sequence)?,
            published: digits(published)?.into(),
        })
    }
}

/// A token of decimal digits (what the server writes), or `None`.
fn digits(token: &[u8]) -> Option<u64> {
    if token.is_empty() {
        return None;
    }
    token.iter().try_fold(0u64, |n, &b| {
        let d = b.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_original_form() {
        let a = AckAddress::parse("$JS.ACK.INGEST.sluice.3.1042.977.1796102912957106342.12")
            .expect("parses");
        assert_eq!(
            a,
            AckAddress {
                stream: "INGEST",
                deliveries: 3,
                stream_sequence: 1042,
                published: 1_796_102_912_957_106_342,
            }
        );
    }

    #[test]
    fn the_form_with_domain_and_account_hash() {
        let a = AckAddress::parse(
            "$JS.ACK.hub.ABCDEFGH.INGEST.sluice.1.7.7.1796102912957106342.0.x7Ghq2",
        )
        .expect("parses");
        assert_eq!(
            (a.stream, a.deliveries, a.stream_sequence, a.published),
            ("INGEST", 1, 7, 1_796_102_912_957_106_342)
        );
        // Without the trailing random token (11 tokens in all), and with more after it.
        let short = AckAddress::parse("$JS.ACK._.ABCDEFGH.INGEST.sluice.2.8.9.5.0");
        assert_eq!(
            short.map(|a| (a.stream_sequence, a.deliveries)),
            Some((8, 2))
        );
        let long = AckAddress::parse("$JS.ACK._.ABCDEFGH.INGEST.sluice.2.8.9.5.0.r.future");
        assert_eq!(long.map(|a| a.stream_sequence), Some(8));
    }

    #[test]
    fn anything_else_is_not_an_ack_address() {
        for reply in [
            "",
            "_INBOX.abc",
            "$JS.ACK.INGEST.sluice.1.2.3.4",
            "$JS.ACK.INGEST.sluice.x.2.3.4.5",
            "$JS.ACK.INGEST.sluice.1.-2.3.4.5",
            "$JS.ACK.a.b.INGEST.sluice.1.2.3.4",
            "$JS.ACK.a.b.INGEST.sluice.1.2.3.4.x",
        ] {
            assert_eq!(AckAddress::parse(reply), None, "{reply}");
        }
    }
}
