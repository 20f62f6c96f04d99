//! Which tenant a request on the public API belongs to.
//!
//! With `[api] auth = "token"` the tenant is whoever owns the bearer token: the token
//! is the credential and the tenant follows from it, so a client cannot claim another
//! tenant's name. With `auth = "none"` (a trusted network or a proxy that
//! authenticates) the tenant is named by the `X-Tenant` header. Either way the result
//! is a tenant defined in the configuration, never a string taken from the request:
//! a name that is not a valid identifier is refused before it is looked up.

use std::fmt;
use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::headers::{self, RepeatedHeader};
use crate::config::{is_tenant_name, AuthMode, Config, TENANT_NAME_RULE};

/// The header naming the tenant when `auth = "none"`.
pub const TENANT_HEADER: &str = "x-tenant";

/// A tenant defined in the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    /// The ClickHouse target its rows go to, if any.
    pub target: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantError {
    /// 401: no `Authorization` header.
    MissingToken,
    /// 401: an `Authorization` header that is not `Bearer <token>`.
    MalformedAuthorization,
    /// 403: a token no tenant owns.
    UnknownToken,
    /// 400: `auth = "none"` and no `X-Tenant` header.
    MissingTenantHeader,
    /// 400: an `X-Tenant` value that is not a tenant name (shown escaped, shortened).
    InvalidTenantName(String),
    /// 404: a well-formed name no tenant has.
    UnknownTenant(String),
    /// 400: `Authorization` or `X-Tenant` sent more than once (`api::headers`).
    RepeatedHeader(RepeatedHeader),
}

impl TenantError {
    pub fn status(&self) -> StatusCode {
        match self {
            TenantError::MissingToken | TenantError::MalformedAuthorization => {
                StatusCode::UNAUTHORIZED
            }
            TenantError::UnknownToken => StatusCode::FORBIDDEN,
            TenantError::MissingTenantHeader
            | TenantError::InvalidTenantName(_)
            | TenantError::RepeatedHeader(_) => StatusCode::BAD_REQUEST,
            TenantError::UnknownTenant(_) => StatusCode::NOT_FOUND,
        }
    }

    /// The error class a surface reports: credentials are `denied`, names `rejected`.
    pub fn class_label(&self) -> &'static str {
        match self {
            TenantError::MissingToken
            | TenantError::MalformedAuthorization
            | TenantError::UnknownToken => "denied",
            _ => "rejected",
        }
    }

    /// The `WWW-Authenticate` challenge a 401 carries.
    pub fn www_authenticate(&self) -> Option<&'static str> {
        (self.status() == StatusCode::UNAUTHORIZED).then_some("Bearer")
    }
}

impl fmt::Display for TenantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantError::MissingToken => {
                write!(f, "missing credentials: send Authorization: Bearer <token>")
            }
            TenantError::MalformedAuthorization => {
                write!(f, "the Authorization header must be \"Bearer <token>\"")
            }
            TenantError::UnknownToken => write!(f, "the bearer token belongs to no tenant"),
            TenantError::MissingTenantHeader => {
                write!(
                    f,
                    "missing X-Tenant header: name the tenant the request is for"
                )
            }
            TenantError::InvalidTenantName(shown) => {
                write!(
                    f,
                    "X-Tenant {shown} is not a tenant name ({TENANT_NAME_RULE})"
                )
            }
            TenantError::UnknownTenant(name) => write!(f, "no tenant named {name:?}"),
            TenantError::RepeatedHeader(repeated) => write!(f, "{repeated}"),
        }
    }
}

impl std::error::Error for TenantError {}

/// A plain JSON answer for surfaces without a richer error body of their own.
impl IntoResponse for TenantError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": self.to_string(),
            "code": null,
            "class": self.class_label(),
            "retryable": false,
        });
        let mut response = (self.status(), axum::Json(body)).into_response();
        if let Some(challenge) = self.www_authenticate() {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}

/// Resolves the tenant of a request; cheap to clone, shared by the API's surfaces.
#[derive(Clone, Debug)]
pub struct TenantResolver {
    config: Arc<Config>,
}

impl TenantResolver {
    pub fn new(config: Arc<Config>) -> Self {
        TenantResolver { config }
    }

    pub fn auth(&self) -> AuthMode {
        self.config.api.auth
    }

    pub fn resolve(&self, headers: &HeaderMap) -> Result<Tenant, TenantError> {
        match self.config.api.auth {
            AuthMode::Token => self.by_token(headers),
            AuthMode::None => self.by_header(headers),
        }
    }

    fn by_token(&self, headers: &HeaderMap) -> Result<Tenant, TenantError> {
        let value = once(headers, header::AUTHORIZATION.as_str(), "Authorization")?
            .ok_or(TenantError::MissingToken)?;
        let value = value
            .to_str()
            .map_err(|_| TenantError::MalformedAuthorization)?;
        let (scheme, token) = value
            .trim()
            .split_once(' ')
            .ok_or(TenantError::MalformedAuthorization)?;
        let token = token.trim();
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Err(TenantError::MalformedAuthorization);
        }
        let tenant = self
            .config
            .tenant_for_token(token)
            .ok_or(TenantError::UnknownToken)?;
        Ok(Tenant {
            name: tenant.name.clone(),
            target: tenant.target.clone(),
        })
    }

    fn by_header(&self, headers: &HeaderMap) -> Result<Tenant, TenantError> {
        let value =
            once(headers, TENANT_HEADER, "X-Tenant")?.ok_or(TenantError::MissingTenantHeader)?;
        let name = match value.to_str() {
            Ok(s) if is_tenant_name(s) => s,
            Ok(s) => return Err(TenantError::InvalidTenantName(shown(s))),
            Err(_) => return Err(TenantError::InvalidTenantName("(not visible ASCII)".into())),
        };
        let tenant = self
            .config
            .tenants
            .get(name)
            .ok_or_else(|| TenantError::UnknownTenant(name.to_string()))?;
        Ok(Tenant {
            name: tenant.name.clone(),
            target: tenant.target.clone(),
        })
    }
}

/// The one value of a header that names the tenant; sent twice, it is refused.
fn once<'h>(
    headers: &'h HeaderMap,
    name: &str,
    shown: &'static str,
) -> Result<Option<&'h HeaderValue>, TenantError> {
    headers::single(headers, name, shown).map_err(TenantError::RepeatedHeader)
}

/// A refused value as it may appear in an error message: escaped and shortened.
fn shown(s: &str) -> String {
    const MAX: usize = 64;
    let mut out: String = s.chars().take(MAX).collect();
    if s.chars().count() > MAX {
        out.push('…');
    }
    format!("{out:?}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn resolver(text: &str, vars: &[(&str, &str)]) -> TenantResolver {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let config = Config::from_parts("t", text, &vars).expect("config");
        TenantResolver::new(Arc::new(config))
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    /// How a request with these headers is refused, and its status.
    fn refusal(r: &TenantResolver, pairs: &[(&str, &str)]) -> (TenantError, StatusCode) {
        let e = r.resolve(&headers(pairs)).expect_err("refused");
        let status = e.status();
        (e, status)
    }

    const TOKEN_CONFIG: &str = r#"
[clickhouse.targets.main]
url = "http://127.0.0.1:8123"
[tenants.acme]
target = "main"
token_env = "ACME_TOKEN"
[tenants.globex]
target = "main"
token_env = "GLOBEX_TOKEN"
"#;

    #[test]
    fn token_mode() {
        let r = resolver(
            TOKEN_CONFIG,
            &[("ACME_TOKEN", "t-acme"), ("GLOBEX_TOKEN", "t-globex")],
        );
        assert_eq!(r.auth(), AuthMode::Token);
        let t = r
            .resolve(&headers(&[("authorization", "Bearer t-acme")]))
            .expect("acme");
        assert_eq!(
            (t.name.as_str(), t.target.as_deref()),
            ("acme", Some("main"))
        );
        let t = r
            .resolve(&headers(&[("authorization", "bearer  t-globex ")]))
            .expect("globex");
        assert_eq!(t.name, "globex");

        let e = r.resolve(&headers(&[])).expect_err("missing");
        assert_eq!(
            (e.clone(), e.status()),
            (TenantError::MissingToken, StatusCode::UNAUTHORIZED)
        );
        assert_eq!(e.www_authenticate(), Some("Bearer"));
        for bad in ["Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "t-acme"] {
            let e = r
                .resolve(&headers(&[("authorization", bad)]))
                .expect_err(bad);
            assert_eq!(e, TenantError::MalformedAuthorization, "{bad}");
            assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        }
        let e = r
            .resolve(&headers(&[("authorization", "Bearer t-acmE")]))
            .expect_err("unknown");
        assert_eq!(
            (e.clone(), e.status()),
            (TenantError::UnknownToken, StatusCode::FORBIDDEN)
        );
        assert_eq!(e.www_authenticate(), None);
        let mut twice = headers(&[("authorization", "Bearer t-acme")]);
        twice.append(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer t-globex"),
        );
        assert_eq!(
            r.resolve(&twice).expect_err("twice"),
            TenantError::RepeatedHeader(RepeatedHeader("Authorization"))
        );
        // X-Tenant is not a credential in token mode.
        let e = r
            .resolve(&headers(&[("x-tenant", "acme")]))
            .expect_err("no token");
        assert_eq!(e, TenantError::MissingToken);
    }

    #[test]
    fn header_mode() {
        let r = resolver(
            "[api]\nauth = \"none\"\n[clickhouse.targets.main]\nurl = \"http://127.0.0.1:8123\"\n[tenants.acme-eu]\ntarget = \"main\"\n",
            &[],
        );
        let t = r
            .resolve(&headers(&[("x-tenant", "acme-eu")]))
            .expect("tenant");
        assert_eq!(t.name, "acme-eu");
        assert_eq!(
            refusal(&r, &[]),
            (TenantError::MissingTenantHeader, StatusCode::BAD_REQUEST)
        );
        let e = r
            .resolve(&headers(&[("x-tenant", "acme'; DROP TABLE x")]))
            .expect_err("invalid");
        assert!(matches!(e, TenantError::InvalidTenantName(_)));
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            refusal(&r, &[("x-tenant", "globex")]),
            (
                TenantError::UnknownTenant("globex".into()),
                StatusCode::NOT_FOUND
            )
        );
        let mut twice = headers(&[("x-tenant", "acme-eu")]);
        twice.append(TENANT_HEADER, HeaderValue::from_static("acme-eu"));
        let e = r.resolve(&twice).expect_err("twice");
        assert_eq!(
            (e.clone(), e.status()),
            (
                TenantError::RepeatedHeader(RepeatedHeader("X-Tenant")),
                StatusCode::BAD_REQUEST
            )
        );
        let long = "a".repeat(300);
        let e = r
            .resolve(&headers(&[("x-tenant", &long)]))
            .expect_err("too long");
        assert!(e.to_string().len() < 200, "{e}");
    }

    #[test]
    fn errors_render_as_json() {
        let response = TenantError::MissingToken.into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response
                .headers()
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok()),
            Some("Bearer")
        );
    }
}
