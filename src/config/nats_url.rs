//! `[nats] url`: the seed servers it lists, and credentials in it found, so they can
//! be refused, and hidden, so the refusal does not print them.
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

/// The seed servers of `[nats] url`: one server or a comma-separated list (blanks
/// around each taken away), each a URL the NATS client can connect to. The client
/// takes them in a random order and learns the rest of a cluster from the one it
/// reaches, so listing every node lets it start whichever one is down. `Err` names the
/// first entry that is not a server (by its place and with its user-info hidden).
pub fn seeds(urls: &str) -> Result<Vec<String>, String> {
    let entries: Vec<&str> = urls.split(',').map(str::trim).collect();
    let mut seeds = Vec::with_capacity(entries.len());
    for (n, entry) in entries.iter().enumerate() {
        let place = if entries.len() == 1 {
            String::new()
        } else {
            format!(" (server {} of {})", n + 1, entries.len())
        };
        if entry.is_empty() {
            return Err(format!(
                "an empty server{place}: list servers separated by single commas"
            ));
        }
        if let Err(e) = entry.parse::<async_nats::ServerAddr>() {
            let shown = hide_credentials(entry).unwrap_or_else(|| entry.to_string());
            return Err(format!("\"{shown}\"{place} is not a NATS server URL ({e})"));
        }
        seeds.push(entry.to_string());
    }
    Ok(seeds)
}

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
    fn a_list_gives_every_seed_and_a_bad_one_is_named() {
        assert_eq!(
            seeds("nats://a:4222, nats://b:4222 ,c:4222"),
            Ok(vec![
                "nats://a:4222".to_string(),
                "nats://b:4222".to_string(),
                "c:4222".to_string()
            ])
        );
        assert_eq!(
            seeds("nats://127.0.0.1:4222"),
            Ok(vec!["nats://127.0.0.1:4222".to_string()])
        );
        let bad = seeds("nats://a:4222,nats://b:42x22").expect_err("a bad port");
        assert!(
            bad.contains("\"nats://b:42x22\" (server 2 of 2) is not a NATS server URL"),
            "{bad}"
        );
        let empty = seeds("nats://a:4222,,nats://b:4222").expect_err("an empty entry");
        assert!(empty.contains("an empty server (server 2 of 3)"), "{empty}");
        assert!(seeds("").is_err());
    }

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
