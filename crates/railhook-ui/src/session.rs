//! Sign-in, sign-out, and who is looking: a [`Viewer`] (`crate::viewer`) from the session
//! cookie, and the CSRF check of its forms.
//!
//! The session cookie holds the credential itself (base64url, so any operator token fits a
//! cookie): a project API key, checked on every request like the API checks it (one indexed
//! lookup, so a revoked key signs the browser out at its next click), or the operator token.
//! It is `HttpOnly; SameSite=Strict; Path=/ui`, plus `Secure` when the request came through
//! TLS (`X-Forwarded-Proto: https` or `Forwarded: proto=https` from the proxy that ends TLS).
//!
//! CSRF: every form carries [`Viewer::csrf`], an HMAC of a fixed label keyed with the
//! credential, so only a page rendered for this session knows it; every POST checks it and
//! refuses a request a browser marks as cross-site (`Sec-Fetch-Site`). The sign-in form,
//! which has no session yet, uses a random value that must equal its own cookie
//! (double submit), so another site cannot sign a browser in under its own key.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use maud::html;
use railhook_core::ProjectId;
use railhook_store::tenancy;
use sha2::Sha256;

use crate::error::{UiError, UiResult};
use crate::form::Form;
use crate::viewer::{Role, Viewer};
use crate::{page, UiState};

pub const SESSION_COOKIE: &str = "rh_session";
/// The operator's chosen project (not a secret: the operator may see every project).
pub const PROJECT_COOKIE: &str = "rh_project";
const SIGN_IN_COOKIE: &str = "rh_signin";

impl Viewer {
    /// Refuses a form that does not carry this session's token, or that a browser marks
    /// as sent from another site.
    pub fn check(&self, headers: &HeaderMap, form: &Form) -> UiResult<()> {
        same_site(headers)?;
        match form.get("csrf") {
            Some(given) if equal(given.as_bytes(), self.csrf.as_bytes()) => Ok(()),
            _ => Err(UiError::forbidden("The form has expired or did not come from this dashboard. Reload the page and try again.")),
        }
    }
}

impl FromRequestParts<UiState> for Viewer {
    type Rejection = UiError;

    async fn from_request_parts(parts: &mut Parts, state: &UiState) -> UiResult<Viewer> {
        let credential = cookie(&parts.headers, SESSION_COOKIE).and_then(decode).ok_or(UiError::Redirect("/ui/sign-in"))?;
        let role_and_project = authenticate(state, &credential).await?.ok_or(UiError::Redirect("/ui/sign-in"))?;
        let (role, project) = match role_and_project {
            (Role::Operator, _) => (Role::Operator, cookie(&parts.headers, PROJECT_COOKIE).and_then(|v| v.parse().ok())),
            (role, project) => (role, project),
        };
        Ok(Viewer { role, project, csrf: csrf_token(&credential) })
    }
}

/// Checks a credential: a project API key (`rhk_...`) against the store, anything else
/// against the operator token. `None`: not valid.
async fn authenticate(state: &UiState, credential: &str) -> UiResult<Option<(Role, Option<ProjectId>)>> {
    if credential.starts_with(tenancy::API_KEY_PREFIX) {
        let client = state.pool.get().await?;
        let principal = tenancy::authenticate(&client, credential).await?;
        return Ok(principal.map(|p| (Role::Project, Some(p.project_id))));
    }
    let expected = state.config.api.admin_token.as_bytes();
    Ok((!expected.is_empty() && equal(credential.as_bytes(), expected)).then_some((Role::Operator, None)))
}

/// Compares MACs of both values, so the time taken says nothing about where they differ.
fn equal(a: &[u8], b: &[u8]) -> bool {
    mac(b"railhook-ui-compare", a) == mac(b"railhook-ui-compare", b)
}

fn mac(key: &[u8], message: &[u8]) -> Vec<u8> {
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(key) else {
        // HMAC accepts keys of any length; this branch cannot be taken.
        return Vec::new();
    };
    m.update(message);
    m.finalize().into_bytes().to_vec()
}

fn csrf_token(credential: &str) -> String {
    URL_SAFE_NO_PAD.encode(mac(credential.as_bytes(), b"railhook-ui csrf v1"))
}

fn decode(value: &str) -> Option<String> {
    URL_SAFE_NO_PAD.decode(value).ok().and_then(|b| String::from_utf8(b).ok()).filter(|s| !s.is_empty())
}

/// The value of cookie `name`, from every `Cookie` header of the request.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// Whether the browser reached us through TLS, as the proxy that ended it says.
fn behind_tls(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    let proto = header("x-forwarded-proto");
    proto.split(',').next().is_some_and(|p| p.trim() == "https") || header("forwarded").contains("proto=https")
}

/// A `Set-Cookie` value for the dashboard; `None` clears the cookie.
pub fn set_cookie(headers: &HeaderMap, name: &str, value: Option<&str>) -> HeaderValue {
    let secure = if behind_tls(headers) { "; Secure" } else { "" };
    let text = match value {
        Some(v) => format!("{name}={v}; Path=/ui; HttpOnly; SameSite=Strict{secure}"),
        None => format!("{name}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    };
    // Names are constants and values base64url or typed ids: always a valid header value.
    HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static(""))
}

/// A browser that sends `Sec-Fetch-Site` tells us whether another site started the request.
fn same_site(headers: &HeaderMap) -> UiResult<()> {
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        None | Some("same-origin") | Some("none") => Ok(()),
        Some(_) => Err(UiError::forbidden("Forms of this dashboard can only be sent from its own pages.")),
    }
}

fn random_token() -> String {
    let bytes: [u8; 24] = rand::random();
    URL_SAFE_NO_PAD.encode(bytes)
}

/// `GET /ui/sign-in`: the form, with a fresh double-submit token.
pub async fn sign_in_page(headers: HeaderMap) -> Response {
    sign_in_form(&headers, StatusCode::OK, None)
}

fn sign_in_form(headers: &HeaderMap, status: StatusCode, problem: Option<&str>) -> Response {
    let token = random_token();
    let body = html! {
        h1 { "Sign in to Railhook" }
        @if let Some(problem) = problem { p.notice.error role="alert" id="sign-in-error" { (problem) } }
        form method="post" action="/ui/sign-in" .stack {
            input type="hidden" name="csrf" value=(token);
            label for="credential" { "Project API key or operator token" }
            input #credential type="password" name="credential" autocomplete="current-password" required
                aria-describedby=(if problem.is_some() { "sign-in-error credential-help" } else { "credential-help" })
                aria-invalid=[problem.map(|_| "true")];
            p #credential-help .hint { "A project API key (rhk_...) shows that project; the operator token (RAILHOOK_ADMIN_TOKEN) shows every project." }
            button type="submit" { "Sign in" }
        }
    };
    let cookie = set_cookie(headers, SIGN_IN_COOKIE, Some(&token));
    (status, [(header::SET_COOKIE, cookie)], page::bare("Sign in", body)).into_response()
}

/// `POST /ui/sign-in`: checks the credential and starts the session.
pub async fn sign_in(State(state): State<UiState>, headers: HeaderMap, form: Form) -> UiResult<Response> {
    same_site(&headers)?;
    let expected = cookie(&headers, SIGN_IN_COOKIE).unwrap_or("");
    let given = form.get("csrf").unwrap_or("");
    if expected.is_empty() || !equal(given.as_bytes(), expected.as_bytes()) {
        return Ok(sign_in_form(&headers, StatusCode::FORBIDDEN, Some("The sign-in form expired. Try again.")));
    }
    let credential = form.get("credential").map(str::trim).unwrap_or("");
    if credential.is_empty() {
        return Ok(sign_in_form(&headers, StatusCode::BAD_REQUEST, Some("Enter a project API key or the operator token.")));
    }
    let Some((role, _)) = authenticate(&state, credential).await? else {
        return Ok(sign_in_form(&headers, StatusCode::UNAUTHORIZED, Some("That key or token is not valid (or has been revoked).")));
    };
    let to = if role == Role::Operator { "/ui/projects" } else { "/ui/" };
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response();
    let cookies = response.headers_mut();
    cookies.append(header::SET_COOKIE, set_cookie(&headers, SESSION_COOKIE, Some(&URL_SAFE_NO_PAD.encode(credential))));
    cookies.append(header::SET_COOKIE, set_cookie(&headers, SIGN_IN_COOKIE, None));
    cookies.append(header::SET_COOKIE, set_cookie(&headers, PROJECT_COOKIE, None));
    Ok(response)
}

/// `POST /ui/sign-out`: forgets the session in this browser.
pub async fn sign_out(viewer: Viewer, headers: HeaderMap, form: Form) -> UiResult<Response> {
    viewer.check(&headers, &form)?;
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/ui/sign-in")]).into_response();
    let cookies = response.headers_mut();
    cookies.append(header::SET_COOKIE, set_cookie(&headers, SESSION_COOKIE, None));
    cookies.append(header::SET_COOKIE, set_cookie(&headers, PROJECT_COOKIE, None));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_among_many() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1; rh_session=abc"));
        h.append(header::COOKIE, HeaderValue::from_static("rh_project=prj_x"));
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, PROJECT_COOKIE), Some("prj_x"));
        assert_eq!(cookie(&h, "missing"), None);
    }

    #[test]
    fn cookie_flags() {
        let mut h = HeaderMap::new();
        let plain = set_cookie(&h, SESSION_COOKIE, Some("v"));
        assert_eq!(plain.to_str().unwrap(), "rh_session=v; Path=/ui; HttpOnly; SameSite=Strict");
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert!(set_cookie(&h, SESSION_COOKIE, Some("v")).to_str().unwrap().ends_with("; Secure"));
        assert!(set_cookie(&h, SESSION_COOKIE, None).to_str().unwrap().contains("Max-Age=0"));
    }

    #[test]
    fn csrf_depends_on_the_credential() {
        assert_ne!(csrf_token("rhk_a"), csrf_token("rhk_b"));
        assert_eq!(csrf_token("rhk_a"), csrf_token("rhk_a"));
        assert!(equal(b"x", b"x") && !equal(b"x", b"y"));
    }

    #[test]
    fn cross_site_forms_are_refused() {
        let mut h = HeaderMap::new();
        assert!(same_site(&h).is_ok());
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(same_site(&h).is_err());
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(same_site(&h).is_ok());
    }

    #[test]
    fn undecodable_session_cookies_are_no_session() {
        assert_eq!(decode("!!!"), None);
        assert_eq!(decode(""), None);
        assert_eq!(decode(&URL_SAFE_NO_PAD.encode("rhk_x")), Some("rhk_x".into()));
    }
}
