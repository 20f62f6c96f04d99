//! Every documented operation is routed and answers what its document says; every
//! method the document does not give a path is refused with 405; a path it does not
//! have is 404. With `admin::openapi`'s and `api::openapi`'s tests (the routed paths are
//! the documented ones), the documents cannot drift from the routers.

use std::collections::BTreeSet;

use anyhow::{bail, Result};
use reqwest::Method;
use serde_json::Value;
use sluice_harness::TENANT;

use crate::*;

const METHODS: [Method; 6] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::OPTIONS,
];

/// A documented path with its parameters filled in.
fn concrete(template: &str) -> Result<String> {
    let mut path = String::new();
    for segment in template.split('/').skip(1) {
        let value = match segment {
            "{tenant}" => TENANT,
            "{table}" => "events",
            "{target}" => "main",
            s if s.starts_with('{') => bail!("no value for the parameter {s} of {template}"),
            s => s,
        };
        path.push('/');
        path.push_str(value);
    }
    Ok(path)
}

/// The media types the document gives `status` of an operation (none: no body).
fn media_types(operation: &Value, status: u16) -> BTreeSet<String> {
    operation["responses"][status.to_string()]["content"]
        .as_object()
        .map(|c| c.keys().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_routed_and_every_other_method_is_refused() -> Result<()> {
    let stack = production_like_stack().await?;
    for (listener, base, token) in listeners(&stack) {
        let doc = document(&stack, &base).await?;
        let paths = doc["paths"].as_object().cloned().unwrap_or_default();
        assert!(!paths.is_empty(), "{listener}: no path documented");
        for (template, item) in &paths {
            let path = concrete(template)?;
            for method in METHODS {
                let name = method.as_str().to_ascii_lowercase();
                let response = stack
                    .http()
                    .request(method.clone(), format!("{base}{path}"))
                    .bearer_auth(token)
                    .send()
                    .await?;
                let status = response.status().as_u16();
                let content_type = response
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.split(';').next())
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                let Some(operation) = item.get(&name) else {
                    assert_eq!(
                        status, 405,
                        "{listener}: {method} {path} is not documented, but answered {status}"
                    );
                    continue;
                };
                let documented = media_types(operation, status);
                assert!(
                    operation["responses"].get(status.to_string()).is_some(),
                    "{listener}: {method} {path} answered {status}, which its document does not list"
                );
                assert!(
                    documented.contains(&content_type)
                        || (documented.is_empty() && content_type.is_empty()),
                    "{listener}: {method} {path} answered {status} as {content_type:?}; documented: {documented:?}"
                );
            }
        }
        let response = stack
            .http()
            .get(format!("{base}/not/a/route"))
            .bearer_auth(token)
            .send()
            .await?;
        assert_eq!(response.status(), 404, "{listener}");
    }
    Ok(())
}
