//! The optional shared bearer token of a controller and its workers.
//!
//! AgentRL's protocol has no authentication: anyone who can reach a port can start sessions,
//! mark workers stale or cancel others' sessions. A [`Token`] closes that: a controller or
//! worker that has one answers every request without `Authorization: Bearer <token>` with 401
//! (in its own error shape) before any handler runs, so an unauthenticated request changes
//! nothing. Everything of ours that talks to these servers sends the token it was given: the
//! [`ControllerClient`](crate::ControllerClient) and [`RemoteTask`](crate::RemoteTask), a
//! worker's heartbeats and cancel notices, and the controller's calls to its workers; so a
//! controller and workers that share one token work together.
//!
//! The token is compared in constant time: both sides are hashed (SHA-256) and the digests
//! compared with [`subtle::ConstantTimeEq`], so neither the position of the first differing
//! byte nor the length of the token shows in the timing.
//!
//! The token comes from [`TOKEN_ENV`] (`AGENTRY_TOKEN`), or for the servers from `--token` too.
//! The environment variable is the better place: a command line is visible to every user of
//! the machine (`ps`).

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The environment variable holding the shared token: read by `agentry controller`,
/// `agentry worker` and [`RemoteTask::connect`](crate::RemoteTask::connect).
pub const TOKEN_ENV: &str = "AGENTRY_TOKEN";

/// A shared bearer token. Its `Debug` form hides the secret, and `==` compares in constant
/// time.
#[derive(Clone)]
pub struct Token {
    secret: String,
    digest: [u8; 32],
}

impl Token {
    /// A token, if `secret` is one: not empty, and only visible ASCII characters (it travels in
    /// an HTTP header).
    ///
    /// # Errors
    /// An empty secret, or one with a space, a control or a non-ASCII character.
    pub fn new(secret: &str) -> Result<Token, String> {
        if secret.is_empty() {
            return Err("the token is empty (unset it to run without a token)".into());
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the token must be printable ASCII without spaces (it is sent in a header)".into(),
            );
        }
        Ok(Token {
            secret: secret.to_string(),
            digest: Sha256::digest(secret.as_bytes()).into(),
        })
    }

    /// The token in [`TOKEN_ENV`], or `None` when the variable is not set.
    ///
    /// # Errors
    /// The variable is set but is not a valid token (see [`Token::new`]), or not Unicode.
    pub fn from_env() -> Result<Option<Token>, String> {
        match std::env::var(TOKEN_ENV) {
            Ok(secret) => Token::new(&secret)
                .map(Some)
                .map_err(|e| format!("{TOKEN_ENV}: {e}")),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(format!("{TOKEN_ENV}: the token is not valid Unicode"))
            }
        }
    }

    /// The secret, to send.
    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    /// `Bearer <token>`, marked sensitive (never logged by the HTTP libraries).
    pub(crate) fn header_value(&self) -> HeaderValue {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", self.secret))
            .expect("a token is visible ASCII, so a valid header value");
        value.set_sensitive(true);
        value
    }

    /// Whether `presented` is this token, in time independent of where they differ and of
    /// `presented`'s length.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        constant_time_eq(&self.digest, &digest)
    }

    /// Whether `headers` carry `Authorization: Bearer <this token>`.
    fn authorizes(&self, headers: &HeaderMap) -> Verdict {
        let Some(value) = headers.get(AUTHORIZATION) else {
            return Verdict::Missing;
        };
        let value = value.as_bytes();
        // The scheme is case-insensitive (RFC 9110 §11.1); the token is not.
        match value.split_at_checked(7) {
            Some((scheme, presented)) if scheme.eq_ignore_ascii_case(b"bearer ") => {
                if self.matches(presented.trim_ascii()) {
                    Verdict::Valid
                } else {
                    Verdict::Wrong
                }
            }
            _ => Verdict::Missing,
        }
    }
}

/// Two equal-length byte strings compared without an early exit.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    bool::from(a.ct_eq(b))
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        constant_time_eq(&self.digest, &other.digest)
    }
}

impl Eq for Token {}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

enum Verdict {
    Valid,
    Missing,
    Wrong,
}

/// What a refused request is answered: 401 with `WWW-Authenticate: Bearer` and the body
/// `shape` makes from the reason (`{"message"}` from the controller, `{"detail"}` from a
/// worker).
#[derive(Clone, Copy)]
pub(crate) struct Guard {
    pub(crate) shape: fn(&'static str) -> serde_json::Value,
}

/// The middleware: a request without the token is refused before its handler runs (so before
/// its body is read), and changes nothing.
pub(crate) async fn require(
    axum::extract::State((token, guard)): axum::extract::State<(Token, Guard)>,
    request: Request<Body>,
    next: Next,
) -> Response {
    let reason = match token.authorizes(request.headers()) {
        Verdict::Valid => return next.run(request).await,
        Verdict::Missing => "missing bearer token (send Authorization: Bearer <token>)",
        Verdict::Wrong => "wrong bearer token",
    };
    let mut response =
        (StatusCode::UNAUTHORIZED, axum::Json((guard.shape)(reason))).into_response();
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// `router`, with every route behind `token` when there is one.
pub(crate) fn protect(
    router: axum::Router,
    token: Option<&Token>,
    shape: fn(&'static str) -> serde_json::Value,
) -> axum::Router {
    match token {
        Some(token) => router.layer(axum::middleware::from_fn_with_state(
            (token.clone(), Guard { shape }),
            require,
        )),
        None => router,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_digests_match_and_any_difference_does_not() {
        let a = [7u8; 32];
        assert!(constant_time_eq(&a, &a));
        for position in [0, 1, 16, 31] {
            let mut b = a;
            b[position] ^= 1;
            assert!(!constant_time_eq(&a, &b), "difference at byte {position}");
        }
        assert!(!constant_time_eq(&a, &[0u8; 32]));
    }

    #[test]
    fn a_token_matches_itself_only() {
        let token = Token::new("s3cret-Token").unwrap();
        assert!(token.matches(b"s3cret-Token"));
        for wrong in [
            &b""[..],
            b"s3cret-Toke",
            b"s3cret-Token!",
            b"S3cret-Token",
            b"x3cret-Token",
            b"s3cret-Tokem",
        ] {
            assert!(!token.matches(wrong), "{}", String::from_utf8_lossy(wrong));
        }
        assert_eq!(token, Token::new("s3cret-Token").unwrap());
        assert_ne!(token, Token::new("other").unwrap());
    }

    #[test]
    fn the_header_needs_the_bearer_scheme_and_the_exact_token() {
        let token = Token::new("abc").unwrap();
        let verdict = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            token.authorizes(&headers)
        };
        assert!(matches!(verdict("Bearer abc"), Verdict::Valid));
        assert!(matches!(verdict("bearer abc"), Verdict::Valid));
        assert!(matches!(verdict("Bearer abd"), Verdict::Wrong));
        assert!(matches!(verdict("Bearer "), Verdict::Wrong));
        assert!(matches!(verdict("Basic abc"), Verdict::Missing));
        assert!(matches!(verdict("abc"), Verdict::Missing));
        assert!(matches!(
            token.authorizes(&HeaderMap::new()),
            Verdict::Missing
        ));
    }

    #[test]
    fn bad_tokens_are_refused_and_the_secret_is_never_printed() {
        assert!(Token::new("").is_err());
        assert!(Token::new("two words").is_err());
        assert!(Token::new("tab\there").is_err());
        assert!(Token::new("naïve").is_err());
        let token = Token::new("hunter2").unwrap();
        assert!(!format!("{token:?}").contains("hunter2"));
        assert_eq!(token.header_value().to_str().unwrap(), "Bearer hunter2");
        assert!(token.header_value().is_sensitive());
    }
}
