//! Credentials in `[nats] url`: found, so they can be refused, and hidden, so the
//! refusal does not print them.
//!
//! Why refuse rather than use them: a secret in the URL lives in `config.toml` or a
//! plain override variable, and the URL is printed by `check-config` and logged at start
//! and on connection trouble. Credentials come from `user` + `password_env`,
//! `token_env` or `creds_file`, like a ClickHouse target's (whose URL is refused the
//! same way).
//!
//! The value may list several servers (`nats://a:4222,nats://b:4222`, as the client
//! takes it), each with or without a scheme; the user-info of any one of them (`user:pw@`
//! or a token `tok@`) counts.

/// The URL list with every server's user-info replaced by `***`, or `None` when no
/// server carries any.
pub fn hide_credentials(urls: &str) -> Option<String> {
    let mut found = false;
    let hidden: Vec<String> = urls
        .split(',')
        .map(|server| {
            let (scheme, rest) = match server.find("://") {
                Some(at) => server.split_at(at + 3),
                None => ("", server),
            };
            // Any `@` counts, not only one before the first `/`, `?` or `#`: a password
            // written with one of those raw (unencoded) must not show past the check.
            match rest.rfind('@') {
                Some(at) => {
                    found = true;
                    format!("{scheme}***{}", &rest[at..])
                }
                None => server.to_string(),
            }
        })
        .collect();
    found.then(|| hidden.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_urls_carry_nothing() {
        for url in [
            "nats://127.0.0.1:4222",
            "127.0.0.1:4222",
            "tls://nats.example:4222,nats://10.0.0.2:4222",
            "ws://h:80/path",
            "",
        ] {
            assert_eq!(hide_credentials(url), None, "{url}");
        }
    }

    #[test]
    fn user_info_is_found_and_hidden_in_any_server() {
        for (url, hidden) in [
            ("nats://alice:hunter2@h:4222", "nats://***@h:4222"),
            ("nats://s3cr3t-token@h:4222", "nats://***@h:4222"),
            ("alice:hunter2@h:4222", "***@h:4222"),
            ("nats://u:p@ss@h:4222/x", "nats://***@h:4222/x"),
            (
                "nats://a:4222,tls://u:hunter2@b:4222",
                "nats://a:4222,tls://***@b:4222",
            ),
            // A raw `/`, `?` or `#` in the password (it should be percent-encoded).
            ("nats://alice:hun/ter2@h:4222", "nats://***@h:4222"),
            ("nats://alice:hun?ter2@h:4222", "nats://***@h:4222"),
            ("nats://alice:hun#ter2@h:4222", "nats://***@h:4222"),
            // An `@` in a path is taken for credentials too: refused rather than printed.
            ("ws://h:80/path@x", "ws://***@x"),
        ] {
            let got = hide_credentials(url).expect(url);
            assert_eq!(got, hidden, "{url}");
            assert!(
                !got.contains("hunter2") && !got.contains("s3cr3t") && !got.contains("ter2"),
                "{got}"
            );
        }
    }
}
