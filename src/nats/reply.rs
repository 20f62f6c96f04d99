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
    pub fn parse(reply: &'a str) -> Option<Self> {
        let rest = reply.strip_prefix(PREFIX)?;
        let count = rest.split('.').count();
        let skip = match count {
            V1_TOKENS => 0,
            n if n >= V2_MIN_TOKENS => 2,
            _ => return None,
        };
        let mut tokens = rest.split('.').skip(skip);
        let stream = tokens.next()?;
        let _consumer = tokens.next()?;
        let deliveries = tokens.next()?.parse().ok()?;
        let stream_sequence = tokens.next()?.parse().ok()?;
        let _consumer_sequence = tokens.next()?;
        let published = tokens.next()?.parse().ok()?;
        let _pending: u64 = tokens.next()?.parse().ok()?;
        Some(Self {
            stream,
            deliveries,
            stream_sequence,
            published,
        })
    }
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
