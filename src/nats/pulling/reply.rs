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
    /// When the message was stored, in ns since the epoch, as the address writes it:
    /// read only when asked for ([`AckAddress::published`]), which is rare.
    published: &'a str,
}

impl<'a> AckAddress<'a> {
    /// `None` for anything that is not a JetStream ack address.
    ///
    /// It runs for every message a consumer delivers, so it looks at the bytes as little
    /// as it can: the dots are found by `memchr` (a `split('.')` costs a search per
    /// token), the stream's name is a slice of the address itself (cut at ASCII dots, so
    /// still UTF-8), and of the numbers only the two a delivery keeps are read; the
    /// others are only checked to be digits.
    pub fn parse(reply: &'a str) -> Option<Self> {
        let rest = reply.strip_prefix(PREFIX)?;
        let bytes = rest.as_bytes();
        // Token i spans bounds[i]..bounds[i + 1] - 1; the first V2_MIN_TOKENS tokens are
        // all either form needs; past them only whether there are more matters.
        let mut bounds = [0usize; V2_MIN_TOKENS + 1];
        let mut count = 1;
        for dot in memchr::memchr_iter(b'.', bytes) {
            if let Some(slot) = bounds.get_mut(count) {
                *slot = dot + 1;
            }
            count += 1;
        }
        if let Some(slot) = bounds.get_mut(count) {
            *slot = bytes.len() + 1;
        }
        let first = match count {
            V1_TOKENS => 0,
            n if n >= V2_MIN_TOKENS => 2,
            _ => return None,
        };
        let token = |i: usize| rest.get(bounds[first + i]..bounds[first + i + 1] - 1);
        let published = token(5)?;
        if !all_digits(token(6)?) || !all_digits(published) {
            return None;
        }
        Some(Self {
            stream: token(0)?,
            deliveries: digits(token(2)?)?,
            stream_sequence: digits(token(3)?)?,
            published,
        })
    }

    /// When the message was stored, in ns since the epoch.
    pub fn published(&self) -> Option<i128> {
        digits(self.published).map(i128::from)
    }
}

/// A non-empty token of decimal digits.
fn all_digits(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit())
}

/// A token of decimal digits (what the server writes), or `None`.
fn digits(token: &str) -> Option<u64> {
    if token.is_empty() {
        return None;
    }
    token.bytes().try_fold(0u64, |n, b| {
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
            (a.stream, a.deliveries, a.stream_sequence, a.published()),
            ("INGEST", 3, 1042, Some(1_796_102_912_957_106_342))
        );
    }

    #[test]
    fn the_form_with_domain_and_account_hash() {
        let a = AckAddress::parse(
            "$JS.ACK.hub.ABCDEFGH.INGEST.sluice.1.7.7.1796102912957106342.0.x7Ghq2",
        )
        .expect("parses");
        assert_eq!(
            (a.stream, a.deliveries, a.stream_sequence, a.published()),
            ("INGEST", 1, 7, Some(1_796_102_912_957_106_342))
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
            "$JS.ACK.INGEST.sluice.1.2.3.4x.5",
            "$JS.ACK.INGEST.sluice.1..3.4.5",
            "$JS.ACK.INGEST.sluice.1.2.3.4.",
        ] {
            assert_eq!(AckAddress::parse(reply), None, "{reply}");
        }
    }
}
