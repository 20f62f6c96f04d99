//! What a status message on a pull request's inbox means, as NATS ADR-37 (JetStream
//! pull consumers) has a client take it.
//!
//! Only two are terminal, a 400 (the request itself is wrong) and a 409 "Consumer
//! Deleted": no pull on this consumer can go on, and the source fails (the consumer
//! actor connects again, which makes the durable consumer again). A 409 "Consumer is
//! push based" is taken as terminal too: no request can change it, and connecting
//! again names the consumer's problem. Everything else is waited out: a request that
//! expired (408) or ended (409 "Leadership Change", "Exceeded MaxWaiting"...) is
//! replaced, after a pause when the server refused it; a 503 (no responders: the
//! consumer has no leader, an election) makes the source wait and ask again.

/// One status message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullStatus {
    /// 100: the request still waits on the server (an idle heartbeat).
    Heartbeat,
    /// 408 or 409: the request ended; `left` of the messages it asked for are not
    /// coming (`None`: the server did not say, so the whole request).
    Ended { left: Option<usize>, by: EndedBy },
    /// 503: nothing took the request.
    NoResponders,
    /// No pull on this consumer can go on: why.
    Terminal(String),
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndedBy {
    /// It expired (or had nothing to wait for): ask again.
    Expired,
    /// The consumer's leader changed: every request waiting on the old one is gone.
    LeadershipChange,
    /// The server turned it down for a limit (too many waiting, too large): ask again
    /// after a pause.
    Refused,
}

/// `code` and `description` of a status message; `pending`: its
/// `Nats-Pending-Messages` header.
pub fn classify(code: u16, description: &str, pending: Option<usize>) -> PullStatus {
    let why = description.trim();
    match code {
        100 => PullStatus::Heartbeat,
        400 => PullStatus::Terminal(format!("400 {why}")),
        409 if why.eq_ignore_ascii_case("Consumer Deleted") => {
            PullStatus::Terminal(format!("409 {why}"))
        }
        409 if why.eq_ignore_ascii_case("Consumer is push based") => {
            PullStatus::Terminal(format!("409 {why}"))
        }
        409 if why.to_ascii_lowercase().contains("leadership change") => PullStatus::Ended {
            left: pending,
            by: EndedBy::LeadershipChange,
        },
        408 => PullStatus::Ended {
            left: pending,
            by: EndedBy::Expired,
        },
        // No Messages: only a no-wait request gets it; nothing was delivered.
        404 => PullStatus::Ended {
            left: pending,
            by: EndedBy::Expired,
        },
        503 => PullStatus::NoResponders,
        // Exceeded MaxWaiting, MaxRequestBatch, MaxRequestExpires, MaxRequestMaxBytes,
        // Message Size Exceeds MaxBytes, and anything a later server adds: the request
        // is over, the pull is not.
        _ => PullStatus::Ended {
            left: pending,
            by: EndedBy::Refused,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bad_request_and_a_deleted_consumer_end_the_pull() {
        assert!(matches!(
            classify(400, "Bad Request", None),
            PullStatus::Terminal(_)
        ));
        assert!(matches!(
            classify(409, "Consumer Deleted", None),
            PullStatus::Terminal(_)
        ));
        assert!(matches!(
            classify(409, "Consumer is push based", None),
            PullStatus::Terminal(_)
        ));
        assert_eq!(classify(100, "Idle Heartbeat", None), PullStatus::Heartbeat);
        assert_eq!(classify(503, "", None), PullStatus::NoResponders);
    }

    #[test]
    fn a_leadership_change_or_a_limit_ends_the_request_not_the_pull() {
        assert_eq!(
            classify(409, "Leadership Change", Some(7)),
            PullStatus::Ended {
                left: Some(7),
                by: EndedBy::LeadershipChange
            }
        );
        assert_eq!(
            classify(408, "Request Timeout", Some(3)),
            PullStatus::Ended {
                left: Some(3),
                by: EndedBy::Expired
            }
        );
        for why in [
            "Exceeded MaxWaiting",
            "Exceeded MaxRequestBatch of 10",
            "Exceeded MaxRequestExpires of 1s",
            "Message Size Exceeds MaxBytes",
        ] {
            assert_eq!(
                classify(409, why, None),
                PullStatus::Ended {
                    left: None,
                    by: EndedBy::Refused
                },
                "{why}"
            );
        }
        assert!(matches!(
            classify(418, "something new", None),
            PullStatus::Ended {
                by: EndedBy::Refused,
                ..
            }
        ));
    }
}
