//! The outgoing HTTP request of an Attempt (DESIGN.md 6.2, 6.3, 7): one [`Sender`] per worker
//! process sends a signed POST, reads what came back in bounded time and space, and says what
//! happened ([`AttemptOutcome`]); [`classify`] turns that into a [`Verdict`].
//!
//! # Invariants (DESIGN.md 6.2)
//!
//! - **No database or Kafka work in here.** [`Sender::send`] only talks HTTP and returns a
//!   value; the Attempt Runner records it afterwards, so a slow write can never turn a
//!   delivered webhook into a failed one.
//! - **A 2xx status line is a delivery.** Once the status line and headers of a 2xx have
//!   arrived the result is [`AttemptResult::Success`], whatever happens to the body after:
//!   a body that stalls, breaks off or is too long only sets
//!   [`AttemptOutcome::response_truncated`] and a note in [`AttemptOutcome::error_message`].
//! - **Bounded reads.** At most [`BODY_CAP`] bytes of a body are kept, reading it may take at
//!   most [`BODY_READ_TIMEOUT`] (and never past the request's timeout), at most
//!   [`MAX_CAPTURED_HEADERS`] headers are kept with values cut to [`MAX_HEADER_VALUE_BYTES`].
//! - **Redirects are not followed** (`redirect::Policy::none()`): a 3xx is recorded as an
//!   [`AttemptResult::HttpStatus`] and is a non-retryable failure.
//! - **SSRF guard at connect time, pinned by construction.** Names are resolved by
//!   `GuardedResolver`, which hands reqwest only the answers that
//!   [`AllowList::check`] permits; reqwest connects to exactly those addresses, so a name that
//!   re-binds to a private address between checks cannot reach it. IP-literal hosts never reach
//!   a resolver, so [`Sender::send`] checks them with [`AllowList::check_url`] first. Proxies
//!   (`HTTP_PROXY` and friends) are disabled, since a proxy would connect on our behalf to
//!   whatever it resolved.
//! - [`Sender::send`] returns within the request's timeout (plus scheduling slack), whatever
//!   the receiver does.

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use railhook_core::address::{parse_endpoint_url, system_resolver, AllowList, DeniedReason, Resolver};
use railhook_core::signing::{signature_header, EndpointSecret};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, LOCATION, RETRY_AFTER};
use tokio::time::Instant;

use crate::error::WorkerError;

/// `User-Agent` of every outgoing request.
pub const USER_AGENT: &str = concat!("Railhook/", env!("CARGO_PKG_VERSION"));
/// Most bytes of a response body that are kept (and stored in `attempts.response_body`).
pub const BODY_CAP: usize = 64 * 1024;
/// Longest time spent reading a response body once its headers arrived (capped further by
/// what is left of the request's timeout).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Most response headers kept in [`AttemptOutcome::response_headers`]; the rest are dropped.
pub const MAX_CAPTURED_HEADERS: usize = 50;
/// Longest kept response header value, in bytes (repeated headers are joined first).
pub const MAX_HEADER_VALUE_BYTES: usize = 1024;
/// Timeout of an Attempt when the Subscription sets none (DESIGN.md 6.3).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest [`AttemptOutcome::error_message`], in bytes.
const MAX_ERROR_MESSAGE_BYTES: usize = 2048;
/// Longest `Retry-After` honoured when parsing; larger values saturate to it. The scheduler
/// clamps far lower (`worker.retry_after_max_seconds`); this only keeps arithmetic safe.
const RETRY_AFTER_CEILING: Duration = Duration::from_secs(u32::MAX as u64);

pub use railhook_core::signing::{is_reserved_header, RESERVED_HEADERS};

/// The headers of one Attempt's request (DESIGN.md 7), in this order: `webhook-id` (the
/// Delivery id, stable across retries), `webhook-timestamp` (unix seconds; pass a fresh one per
/// Attempt), `webhook-signature` (one `v1,<base64>` entry per secret, space separated: pass the
/// current secret and every unexpired rotated one), `X-Event-Id`, `X-Sequence-Number` when
/// ordered, `Content-Type: application/json`, `User-Agent: Railhook/<version>`, then the
/// Endpoint's custom headers.
///
/// A custom header whose name is reserved ([`is_reserved_header`]) is left out: it can neither
/// replace nor duplicate a header Railhook sets. The API already refuses such names when an
/// Endpoint is created or updated, so this only matters for rows written some other way.
/// Other custom headers are passed as given; one that is not a valid HTTP header makes
/// [`Sender::send`] fail with [`AttemptResult::Request`].
///
/// `body` must be the exact bytes that will be sent. `secrets` should not be empty (an
/// Endpoint always has a current secret); if it is, `webhook-signature` is empty.
pub fn webhook_headers(
    delivery_id: &str,
    event_id: &str,
    timestamp: i64,
    body: &[u8],
    secrets: &[EndpointSecret],
    sequence_number: Option<i64>,
    extra: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    debug_assert!(!secrets.is_empty(), "an Endpoint always has a current secret");
    let mut headers = vec![
        ("webhook-id".to_owned(), delivery_id.to_owned()),
        ("webhook-timestamp".to_owned(), timestamp.to_string()),
        ("webhook-signature".to_owned(), signature_header(secrets, delivery_id, timestamp, body)),
        ("X-Event-Id".to_owned(), event_id.to_owned()),
    ];
    if let Some(n) = sequence_number {
        headers.push(("X-Sequence-Number".to_owned(), n.to_string()));
    }
    headers.push(("Content-Type".to_owned(), "application/json".to_owned()));
    headers.push(("User-Agent".to_owned(), USER_AGENT.to_owned()));
    for (name, value) in extra {
        if !is_reserved_header(name) {
            headers.push((name.clone(), value.clone()));
        }
    }
    headers
}

/// What an Attempt's record shows in place of a credential's value.
pub const REDACTED: &str = "<redacted>";

/// Whether a request header's value is a credential that the attempt log must not keep:
/// `Authorization`, `Proxy-Authorization`, `Cookie`, and any name that speaks of a token, a
/// secret, a password, a key or auth (`X-Api-Key`, `X-Auth-Token`, `X-Gitlab-Token`, ...).
/// Signatures are not credentials (they prove one request, and the receiver needs to see what
/// was checked), so `webhook-signature` and the providers' signature headers are kept.
pub fn is_credential_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    if matches!(name.as_str(), "authorization" | "proxy-authorization" | "cookie") {
        return true;
    }
    // Railhook's own Forward header: the Forward id, not a credential.
    name != "idempotency-key" && ["token", "secret", "password", "passwd", "key", "auth", "session", "credential"].iter().any(|w| name.contains(w))
}

/// Sets the W3C trace context headers (issue 33) on an Attempt's request: `traceparent`
/// and, when there is one, `tracestate`, in place of any an Endpoint's custom headers named.
pub fn set_trace_headers(headers: &mut Vec<(String, String)>, trace: &railhook_core::TraceContext) {
    headers.retain(|(name, _)| !name.eq_ignore_ascii_case("traceparent") && !name.eq_ignore_ascii_case("tracestate"));
    headers.push(("traceparent".to_owned(), trace.traceparent()));
    if let Some(state) = &trace.state {
        headers.push(("tracestate".to_owned(), state.clone()));
    }
}

/// The request headers as the attempt log keeps them: a JSON object of lower-case name to
/// value (a repeated name's values joined with ", "), with the value of every credential
/// ([`is_credential_header`], and each name in `also_secret`, compared case-insensitively)
/// replaced by [`REDACTED`].
pub fn recorded_headers(headers: &[(String, String)], also_secret: &[&str]) -> serde_json::Value {
    let mut recorded = serde_json::Map::new();
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        let secret = is_credential_header(&name) || also_secret.iter().any(|s| s.eq_ignore_ascii_case(&name));
        let value = if secret { REDACTED.to_owned() } else { bounded(value.replace('\0', "\u{FFFD}"), MAX_HEADER_VALUE_BYTES) };
        match recorded.get_mut(&name) {
            Some(serde_json::Value::String(joined)) => {
                joined.push_str(", ");
                joined.push_str(&value);
            }
            _ => {
                recorded.insert(name, value.into());
            }
        }
    }
    serde_json::Value::Object(recorded)
}

/// One Attempt's request: always a POST.
#[derive(Debug, Clone)]
pub struct OutgoingRequest {
    /// The Endpoint URL (validated again here: http(s), a host, no credentials or fragment).
    pub url: String,
    /// Usually [`webhook_headers`]. Names and values must be valid HTTP.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// Bounds connecting, sending, and receiving the status line and headers; the body is then
    /// read within what is left of it, at most [`BODY_READ_TIMEOUT`]. [`DEFAULT_TIMEOUT`] when
    /// the Subscription sets none.
    pub timeout: Duration,
}

/// What went wrong, or that nothing did; [`AttemptResult::as_str`] is the `attempts.result`
/// column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptResult {
    /// A 2xx status line and headers arrived.
    Success,
    /// A status other than 2xx arrived (3xx included: redirects are not followed; the
    /// status code tells them apart, the message names the `Location`).
    HttpStatus,
    /// No complete status line and headers within the timeout (DNS and connecting included).
    Timeout,
    /// The TCP connection could not be made (refused, unreachable, reset while connecting).
    Connect,
    /// The host name did not resolve, or resolved to no address at all.
    Dns,
    /// The TLS handshake failed, certificate verification included.
    Tls,
    /// Every address of the host is refused by the SSRF guard (`network.allow_cidrs`), or the
    /// host is an IP literal that is. Nothing was sent.
    RefusedAddress,
    /// Connected, but the connection closed or was reset, or the reply was not valid HTTP,
    /// before a complete status line and headers arrived.
    Protocol,
    /// The request could not be built: an invalid URL or header. A retry would fail the same.
    Request,
}

impl AttemptResult {
    pub const ALL: [AttemptResult; 9] = [
        AttemptResult::Success,
        AttemptResult::HttpStatus,
        AttemptResult::Timeout,
        AttemptResult::Connect,
        AttemptResult::Dns,
        AttemptResult::Tls,
        AttemptResult::RefusedAddress,
        AttemptResult::Protocol,
        AttemptResult::Request,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptResult::Success => "success",
            AttemptResult::HttpStatus => "http_status",
            AttemptResult::Timeout => "timeout",
            AttemptResult::Connect => "connect",
            AttemptResult::Dns => "dns",
            AttemptResult::Tls => "tls",
            AttemptResult::RefusedAddress => "refused_address",
            AttemptResult::Protocol => "protocol",
            AttemptResult::Request => "request",
        }
    }

    /// The inverse of [`AttemptResult::as_str`].
    pub fn parse(text: &str) -> Option<AttemptResult> {
        AttemptResult::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl fmt::Display for AttemptResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one Attempt's request came to; the columns of an `attempts` row.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptOutcome {
    pub started_at: DateTime<Utc>,
    /// From the start until the body was read (or the failure).
    pub duration: Duration,
    pub status_code: Option<u16>,
    pub result: AttemptResult,
    /// Why it failed; for a response, the status and any trouble reading the body (also on a
    /// success, e.g. "response body: nothing more arrived within 5000 ms ...").
    pub error_message: Option<String>,
    /// A JSON object: lower-case header name to value (repeated headers joined with ", "),
    /// at most [`MAX_CAPTURED_HEADERS`], values cut to [`MAX_HEADER_VALUE_BYTES`]. `{}` when no
    /// response arrived.
    pub response_headers: serde_json::Value,
    /// At most [`BODY_CAP`] bytes of the body, as UTF-8 (invalid sequences and NUL, which
    /// Postgres text refuses, become U+FFFD).
    pub response_body: String,
    /// Whether `response_body` is not the whole body: it was longer than the cap, or reading
    /// it stalled or failed.
    pub response_truncated: bool,
    /// The response's `Retry-After` (delta-seconds or HTTP-date; a past date is zero),
    /// whatever the status. [`classify`] honours it only for 429 and 503.
    pub retry_after: Option<Duration>,
}

/// What to do with the Delivery after an Attempt (DESIGN.md 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Delivered,
    /// Schedule another Attempt per the ladder; `retry_after` (from a 429 or 503) may only
    /// push it later, and the scheduler clamps it.
    Retry { retry_after: Option<Duration> },
    /// Straight to Failed Messages: retrying would not help.
    Fail,
}

/// DESIGN.md 6.3: 2xx is delivered; 408, 429, 5xx, timeouts and connect, DNS, TLS and
/// protocol errors are retried; other 4xx, 3xx (redirects are not followed) and 1xx fail at
/// once. `Retry-After` is passed on only for 429 and 503.
///
/// A refused address fails at once: the operator's allow-list, not the receiver, decides it,
/// and the Endpoint URL was checked when it was created, so a name that now resolves only to
/// refused addresses is a misconfiguration (or an attack) that a retry would repeat. A
/// [`AttemptResult::Request`] error fails too, as it would recur identically.
pub fn classify(outcome: &AttemptOutcome) -> Verdict {
    match outcome.result {
        AttemptResult::Success => Verdict::Delivered,
        AttemptResult::HttpStatus => match outcome.status_code {
            Some(200..=299) => Verdict::Delivered,
            Some(429 | 503) => Verdict::Retry { retry_after: outcome.retry_after },
            Some(408 | 500..=599) => Verdict::Retry { retry_after: None },
            _ => Verdict::Fail,
        },
        AttemptResult::Timeout
        | AttemptResult::Connect
        | AttemptResult::Dns
        | AttemptResult::Tls
        | AttemptResult::Protocol => Verdict::Retry { retry_after: None },
        AttemptResult::RefusedAddress | AttemptResult::Request => Verdict::Fail,
    }
}

/// Parses a `Retry-After` value: delta-seconds (digits only; huge values saturate) or an
/// HTTP-date (IMF-fixdate, RFC 850 or asctime), as a wait from `now` (zero if in the past).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(RETRY_AFTER_CEILING));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO).min(RETRY_AFTER_CEILING))
}


/// The worker's HTTP client: pooled connections, no redirects, verified TLS (rustls, webpki
/// roots), no proxies, and the SSRF guard. Cheap to clone; make one per process.
#[derive(Clone)]
pub struct Sender {
    client: reqwest::Client,
    allow: Arc<AllowList>,
}

impl fmt::Debug for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").field("allow", &self.allow.to_string()).finish_non_exhaustive()
    }
}

impl Sender {
    /// A Sender that may reach public addresses and those `allow` permits, resolving names
    /// with the system resolver.
    pub fn new(allow: AllowList) -> Result<Sender, WorkerError> {
        Sender::with_resolver(allow, system_resolver())
    }

    /// As [`Sender::new`], with names resolved by `resolve` (tests give fixed DNS answers
    /// this way). Its answers go through the same guard and pinning as the system's.
    pub fn with_resolver(allow: AllowList, resolve: Resolver) -> Result<Sender, WorkerError> {
        let allow = Arc::new(allow);
        let client = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .use_rustls_tls()
            .https_only(false)
            .tls_built_in_root_certs(true)
            .dns_resolver(Arc::new(GuardedResolver { allow: allow.clone(), resolve }))
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| WorkerError::misconfigured("could not build the HTTP client", e))?;
        Ok(Sender { client, allow })
    }

    /// A Sender with the operator's `network.allow_cidrs`.
    pub fn from_config(network: &railhook_config::NetworkConfig) -> Result<Sender, WorkerError> {
        Sender::new(AllowList::parse(&network.allow_cidrs).map_err(|e| WorkerError::misconfigured("network.allow_cidrs", e))?)
    }

    pub fn allow_list(&self) -> &AllowList {
        &self.allow
    }

    /// Sends one Attempt's request and reads the response within `request.timeout`; never
    /// fails, never touches the database or Kafka (see the module's invariants).
    pub async fn send(&self, request: OutgoingRequest) -> AttemptOutcome {
        let started_at = crate::clock::host_now();
        let start = Instant::now();
        // A timeout too large for the clock means "none to speak of": a year.
        let deadline = start.checked_add(request.timeout).unwrap_or(start + Duration::from_secs(365 * 86_400));
        let fail = |result: AttemptResult, message: String| AttemptOutcome {
            started_at,
            duration: start.elapsed(),
            status_code: None,
            result,
            error_message: Some(bounded(message, MAX_ERROR_MESSAGE_BYTES)),
            response_headers: serde_json::Value::Object(serde_json::Map::new()),
            response_body: String::new(),
            response_truncated: false,
            retry_after: None,
        };

        let url = match parse_endpoint_url(&request.url) {
            Ok(url) => url,
            Err(e) => return fail(AttemptResult::Request, e.to_string()),
        };
        // An IP-literal host is connected to without any resolver: check it here.
        if let Err(reason) = self.allow.check_url(&url) {
            return fail(AttemptResult::RefusedAddress, reason.to_string());
        }
        let mut headers = HeaderMap::with_capacity(request.headers.len());
        for (name, value) in &request.headers {
            let Ok(header_name) = HeaderName::from_bytes(name.as_bytes()) else {
                return fail(AttemptResult::Request, format!("invalid request header name {:?}", bounded(name.clone(), 100)));
            };
            let Ok(header_value) = HeaderValue::from_str(value) else {
                return fail(AttemptResult::Request, format!("invalid value for request header {header_name}"));
            };
            headers.append(header_name, header_value);
        }
        let built = self.client.post(url.into_url()).headers(headers).body(request.body).build();
        let built = match built {
            Ok(built) => built,
            Err(e) => return fail(AttemptResult::Request, chain(&e)),
        };

        let mut response = match tokio::time::timeout_at(deadline, self.client.execute(built)).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                let (result, message) = describe_error(&e);
                return fail(result, message);
            }
            Err(_) => {
                return fail(
                    AttemptResult::Timeout,
                    format!("no response status line and headers within {} ms", request.timeout.as_millis()),
                )
            }
        };

        // From here on the outcome is decided by the status line; the body only adds detail.
        let status = response.status();
        let result = if status.is_success() { AttemptResult::Success } else { AttemptResult::HttpStatus };
        let response_headers = capture_headers(response.headers());
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let mut notes = Vec::new();
        if !status.is_success() {
            notes.push(format!("HTTP {status}"));
        }
        if status.is_redirection() {
            let location = response.headers().get(LOCATION).map(|v| lossy(v.as_bytes()));
            notes.push(match location {
                Some(l) => format!("redirect to {} not followed: redirects are refused, update the endpoint URL", bounded(l, 300)),
                None => "redirects are not followed".to_owned(),
            });
        }

        let body_deadline = deadline.min(Instant::now() + BODY_READ_TIMEOUT);
        let body = read_body(&mut response, body_deadline).await;
        drop(response);
        if let Some(note) = body.note {
            notes.push(note);
        }
        let (response_body, cut) = body_text(&body.bytes);
        AttemptOutcome {
            started_at,
            duration: start.elapsed(),
            status_code: Some(status.as_u16()),
            result,
            error_message: (!notes.is_empty()).then(|| bounded(notes.join("; "), MAX_ERROR_MESSAGE_BYTES)),
            response_headers,
            response_body,
            response_truncated: body.truncated || cut,
            retry_after,
        }
    }
}

struct Body {
    bytes: Vec<u8>,
    truncated: bool,
    note: Option<String>,
}

/// Reads at most [`BODY_CAP`] bytes (one more to know whether there is more) until `deadline`.
async fn read_body(response: &mut reqwest::Response, deadline: Instant) -> Body {
    let started = Instant::now();
    let hint = response.content_length().unwrap_or(0).min(BODY_CAP as u64 + 1) as usize;
    let mut bytes = Vec::with_capacity(hint);
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                let room = BODY_CAP + 1 - bytes.len();
                bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if bytes.len() > BODY_CAP {
                    bytes.truncate(BODY_CAP);
                    return Body { bytes, truncated: true, note: None };
                }
            }
            Ok(Ok(None)) => return Body { bytes, truncated: false, note: None },
            Ok(Err(e)) => {
                let note = format!("response body: reading failed after {} bytes: {}", bytes.len(), chain(&e));
                return Body { bytes, truncated: true, note: Some(note) };
            }
            Err(_) => {
                let note = format!(
                    "response body: incomplete after {} ms ({} bytes read); kept what arrived",
                    started.elapsed().as_millis(),
                    bytes.len()
                );
                return Body { bytes, truncated: true, note: Some(note) };
            }
        }
    }
}

/// The body as text of at most [`BODY_CAP`] bytes, and whether making it text cut some off.
/// A character split by the cap is dropped rather than replaced.
fn body_text(bytes: &[u8]) -> (String, bool) {
    let bytes = match std::str::from_utf8(bytes) {
        Err(e) if e.error_len().is_none() && bytes.len() == BODY_CAP => &bytes[..e.valid_up_to()],
        _ => bytes,
    };
    let text = String::from_utf8_lossy(bytes).replace('\0', "\u{FFFD}");
    let len = text.len();
    let text = bounded(text, BODY_CAP);
    let cut = text.len() < len;
    (text, cut)
}

fn capture_headers(headers: &HeaderMap) -> serde_json::Value {
    let mut captured = serde_json::Map::new();
    for (name, value) in headers.iter().take(MAX_CAPTURED_HEADERS) {
        let value = lossy(value.as_bytes());
        match captured.get_mut(name.as_str()) {
            Some(serde_json::Value::String(joined)) => {
                joined.push_str(", ");
                joined.push_str(&value);
                let whole = std::mem::take(joined);
                *joined = bounded(whole, MAX_HEADER_VALUE_BYTES);
            }
            _ => {
                captured.insert(name.as_str().to_owned(), bounded(value, MAX_HEADER_VALUE_BYTES).into());
            }
        }
    }
    serde_json::Value::Object(captured)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace('\0', "\u{FFFD}")
}

/// `text` cut to at most `max` bytes at a character boundary.
fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Why a request failed before a response arrived, from reqwest's error chain.
fn describe_error(error: &reqwest::Error) -> (AttemptResult, String) {
    let mut message = chain(error);
    let mut resolve = None;
    let mut tls = false;
    walk(error, &mut |e| {
        if let Some(r) = e.downcast_ref::<ResolveError>() {
            // Our own message says it all; reqwest's and hyper's wrappers add nothing.
            message = bounded(r.to_string(), MAX_ERROR_MESSAGE_BYTES);
            resolve.get_or_insert(match r {
                ResolveError::Refused { .. } => AttemptResult::RefusedAddress,
                ResolveError::Lookup { .. } | ResolveError::NoAddresses { .. } => AttemptResult::Dns,
            });
        }
        if e.is::<rustls::Error>() {
            tls = true;
        }
    });
    let result = if let Some(result) = resolve {
        result
    } else if tls {
        AttemptResult::Tls
    } else if error.is_timeout() {
        AttemptResult::Timeout
    } else if error.is_connect() {
        AttemptResult::Connect
    } else if error.is_builder() {
        AttemptResult::Request
    } else {
        AttemptResult::Protocol
    };
    (result, message)
}

/// Calls `f` on every error in the chain below `error`, looking inside `io::Error`s too:
/// their `source()` skips the error they wrap (e.g. rustls's, often wrapped twice).
fn walk(error: &(dyn StdError + 'static), f: &mut dyn FnMut(&(dyn StdError + 'static))) {
    let mut next = error.source();
    for _ in 0..32 {
        let Some(e) = next else { return };
        f(e);
        next = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
}

/// The messages of the error chain below `error` (reqwest's own top message names the whole
/// URL and says little), joined with ": ", repeats left out.
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut push = |e: &(dyn StdError + 'static)| {
        let text = e.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    };
    walk(error, &mut push);
    if parts.is_empty() {
        parts.push(error.to_string());
    }
    bounded(parts.join(": "), MAX_ERROR_MESSAGE_BYTES)
}

/// Why [`GuardedResolver`] gave reqwest no address.
#[derive(Debug, thiserror::Error)]
enum ResolveError {
    #[error("could not resolve {host}: {source}")]
    Lookup { host: String, source: std::io::Error },
    #[error("{host} resolved to no address")]
    NoAddresses { host: String },
    #[error("{host} resolves only to refused addresses ({count} answers, all refused): {first}")]
    Refused { host: String, count: usize, first: DeniedReason },
}

/// Resolves host names (with the system resolver unless the Sender was given another) and
/// passes on only the addresses the allow-list permits; reqwest connects to exactly these (no
/// re-resolution), which pins each connection to checked addresses. Refused answers are
/// dropped, so a name with one permitted and one refused address connects only to the
/// permitted one; a name with none permitted fails as [`AttemptResult::RefusedAddress`].
struct GuardedResolver {
    allow: Arc<AllowList>,
    resolve: Resolver,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow.clone();
        let host = name.as_str().to_owned();
        let lookup = (self.resolve)(&host);
        Box::pin(async move {
            let lookup = lookup.await.map(|ips| ips.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect::<Vec<_>>());
            let answers = match lookup {
                Ok(answers) => answers,
                Err(source) => return Err(Box::new(ResolveError::Lookup { host, source }) as _),
            };
            let mut permitted: Vec<SocketAddr> = Vec::new();
            let mut refused: Vec<DeniedReason> = Vec::new();
            for addr in answers {
                match allow.check(addr.ip()) {
                    Ok(()) if !permitted.contains(&addr) => permitted.push(addr),
                    Ok(()) => {}
                    Err(reason) => refused.push(reason),
                }
            }
            if permitted.is_empty() {
                let error = match refused.first() {
                    Some(first) => ResolveError::Refused { host, count: refused.len(), first: *first },
                    None => ResolveError::NoAddresses { host },
                };
                return Err(Box::new(error) as _);
            }
            if !refused.is_empty() {
                tracing::debug!(host, refused = refused.len(), "skipped refused DNS answers");
            }
            Ok(Box::new(permitted.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("99999999999999999999999", now), Some(RETRY_AFTER_CEILING));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:51:37 GMT", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("Sunday, 06-Nov-94 08:50:37 GMT", now), Some(Duration::from_secs(60)));
        assert_eq!(parse_retry_after("Sun Nov  6 08:49:47 1994", now), Some(Duration::from_secs(10)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now), Some(Duration::ZERO));
        for bad in ["", "-5", "1.5", "soon", "120 s"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn results_round_trip() {
        for r in AttemptResult::ALL {
            assert_eq!(AttemptResult::parse(r.as_str()), Some(r));
        }
        assert_eq!(AttemptResult::parse("nope"), None);
    }

    #[test]
    fn body_text_is_bounded_and_storable() {
        let mut bytes = vec![b'a'; BODY_CAP - 1];
        bytes.push(0xE2); // first byte of a 3-byte character cut by the cap
        let (text, cut) = body_text(&bytes);
        assert_eq!(text.len(), BODY_CAP - 1);
        assert!(!cut);
        let (text, cut) = body_text(&vec![0xFF; BODY_CAP]);
        assert!(text.len() <= BODY_CAP && cut);
        assert_eq!(body_text(b"a\0b").0, "a\u{FFFD}b");
    }

    #[test]
    fn recorded_headers_keep_signatures_and_redact_credentials() {
        let sent: Vec<(String, String)> = [
            ("webhook-id", "dlv_1"),
            ("webhook-signature", "v1,abc="),
            ("Authorization", "Bearer s3cret"),
            ("X-Api-Key", "k"),
            ("X-Gitlab-Token", "t"),
            ("Idempotency-Key", "fwd_1"),
            ("X-Custom", "a"),
            ("x-custom", "b"),
            ("X-Partner", "visible"),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
        let recorded = recorded_headers(&sent, &["x-partner"]);
        assert_eq!(
            recorded,
            serde_json::json!({
                "webhook-id": "dlv_1", "webhook-signature": "v1,abc=", "authorization": REDACTED, "x-api-key": REDACTED,
                "x-gitlab-token": REDACTED, "idempotency-key": "fwd_1", "x-custom": "a, b", "x-partner": REDACTED,
            })
        );
    }

    #[test]
    fn reserved_headers() {
        for name in ["Webhook-Signature", "CONTENT-TYPE", "user-agent", "Proxy-Authorization", "Host"] {
            assert!(is_reserved_header(name), "{name}");
        }
        assert!(!is_reserved_header("X-Tenant"));
    }
}
