//! `railhook verify`: checks a captured request's Standard Webhooks signature by hand, with
//! the receiver kit's verifier (`railhook-receiver`, what a customer's receiver runs).
//!
//! Input is either a raw HTTP request as captured (`--request FILE`: request line, headers,
//! blank line, body; `Content-Length` or chunked framing honoured) or the headers and body
//! apart (`--headers FILE --body FILE`; headers as `Name: value` lines or as a JSON object,
//! the shape of an Attempt's `request_headers` in the API). Exit status: 0 valid, 1 not
//! valid (the message says why), 2 the input could not be read or parsed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use railhook_receiver::{Secret, Verifier, VerifyError, TIMESTAMP_HEADER};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A secret of the Endpoint (whsec_...). Repeat it for each secret of a rotation: the
    /// request is valid if it verifies with any. Also from RAILHOOK_VERIFY_SECRET
    /// (space separated), which keeps secrets out of the shell history.
    #[arg(long = "secret", value_name = "WHSEC", required = true, env = "RAILHOOK_VERIFY_SECRET", value_delimiter = ' ', hide_env_values = true)]
    secrets: Vec<String>,
    /// The captured raw HTTP request; `-` reads standard input.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["headers", "body"], required_unless_present = "headers")]
    request: Option<PathBuf>,
    /// The request's headers: `Name: value` lines, or a JSON object of strings.
    #[arg(long, value_name = "FILE", requires = "body")]
    headers: Option<PathBuf>,
    /// The request's body, byte for byte.
    #[arg(long, value_name = "FILE", requires = "headers")]
    body: Option<PathBuf>,
    /// Largest distance allowed between webhook-timestamp and now, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    tolerance: u64,
    /// Check the signature only, not the timestamp's age (a request captured long ago).
    #[arg(long)]
    ignore_age: bool,
}

/// Input that could not be read or understood: exit 2.
struct InputError(String);

pub fn run(args: &VerifyArgs) -> ExitCode {
    match check(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(InputError(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Prints the verdict; `Ok(true)` when the request verifies.
fn check(args: &VerifyArgs) -> Result<bool, InputError> {
    let mut secrets = Vec::new();
    for (i, text) in args.secrets.iter().filter(|s| !s.is_empty()).enumerate() {
        secrets.push(text.parse::<Secret>().map_err(|e| InputError(format!("--secret #{}: {e}", i + 1)))?);
    }
    if secrets.is_empty() {
        return Err(InputError("give at least one --secret".into()));
    }
    let (headers, body) = match (&args.request, &args.headers, &args.body) {
        (Some(request), _, _) => parse_request(&read(request)?)?,
        (None, Some(headers), Some(body)) => (parse_headers(&read(headers)?)?, read(body)?),
        _ => return Err(InputError("give --request FILE, or --headers FILE and --body FILE".into())),
    };

    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let signed_at = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(TIMESTAMP_HEADER)).and_then(|(_, v)| v.trim().parse::<i64>().ok());
    // --ignore-age: verify as of the moment it was signed.
    let at = match (args.ignore_age, signed_at) {
        (true, Some(ts)) => ts,
        _ => now,
    };
    let tolerance = Duration::from_secs(args.tolerance);
    let verdicts: Vec<Result<_, VerifyError>> =
        secrets.iter().map(|s| Verifier::new([s.clone()]).with_tolerance(tolerance).verify_at(&headers, &body, at)).collect();

    if let Some((i, verified)) = verdicts.iter().enumerate().find_map(|(i, v)| v.as_ref().ok().map(|v| (i, v))) {
        let age = now - verified.timestamp;
        println!(
            "valid: webhook-id {} signed at {} ({}), matches --secret #{}{}",
            verified.id,
            verified.timestamp,
            describe_age(age),
            i + 1,
            if args.ignore_age { " (age not checked: --ignore-age)" } else { "" }
        );
        return Ok(true);
    }
    // Every secret gave the same verdict unless it is a signature mismatch; report the first.
    let error = verdicts.into_iter().find_map(Result::err).expect("at least one secret");
    eprintln!("invalid: {error} [{}]", error.code());
    match error {
        VerifyError::TooOld { .. } | VerifyError::TooNew { .. } if !args.ignore_age => {
            eprintln!("hint: for a request captured earlier, --ignore-age checks the signature alone");
        }
        VerifyError::NoMatchingSignature => {
            if let Some(trimmed) = body.strip_suffix(b"\r\n").or_else(|| body.strip_suffix(b"\n")) {
                let without = secrets.iter().any(|s| Verifier::new([s.clone()]).with_tolerance(tolerance).verify_at(&headers, trimmed, at).is_ok());
                if without {
                    eprintln!("hint: the signature matches the body without its final newline: the file has one the request did not");
                }
            }
            eprintln!("hint: the body must be byte for byte what was sent, and the secret the Endpoint's (GET /v1/endpoints/{{id}}/secret)");
        }
        _ => {}
    }
    Ok(false)
}

fn describe_age(age: i64) -> String {
    if age >= 0 {
        format!("{age} s ago")
    } else {
        format!("{} s in the future", -age)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, InputError> {
    if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).map_err(|e| InputError(format!("reading standard input: {e}")))?;
        return Ok(buf);
    }
    std::fs::read(path).map_err(|e| InputError(format!("reading {}: {e}", path.display())))
}

type Headers = Vec<(String, String)>;

/// A raw HTTP/1 request: an optional request line, header lines, a blank line, the body
/// (cut to `Content-Length`, or de-chunked for `Transfer-Encoding: chunked`). LF line
/// endings are accepted as well as CRLF (a capture pasted into an editor).
fn parse_request(raw: &[u8]) -> Result<(Headers, Vec<u8>), InputError> {
    let crlf = find(raw, b"\r\n\r\n").map(|i| (i, 4));
    let lf = find(raw, b"\n\n").map(|i| (i, 2));
    let (end, sep) = match (crlf, lf) {
        (Some(a), Some(b)) => if a.0 <= b.0 { a } else { b },
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return Err(InputError("the request has no blank line between its headers and its body".into())),
    };
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| InputError("the request's headers are not UTF-8".into()))?;
    let headers = parse_header_lines(head)?;
    let mut body = raw[end + sep..].to_vec();
    let get = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_string());
    if get("transfer-encoding").is_some_and(|te| te.eq_ignore_ascii_case("chunked")) {
        body = dechunk(&body)?;
    } else if let Some(length) = get("content-length") {
        let length: usize = length.parse().map_err(|_| InputError(format!("Content-Length {length:?} is not a number")))?;
        if body.len() < length {
            return Err(InputError(format!("the body has {} bytes, fewer than its Content-Length {length}: the capture is cut short", body.len())));
        }
        body.truncate(length);
    }
    Ok((headers, body))
}

/// `Name: value` lines, or a JSON object of strings; a request or status line is skipped.
fn parse_headers(raw: &[u8]) -> Result<Headers, InputError> {
    let text = std::str::from_utf8(raw).map_err(|_| InputError("the headers file is not UTF-8".into()))?;
    if text.trim_start().starts_with('{') {
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).map_err(|e| InputError(format!("the headers file is not a JSON object: {e}")))?;
        return Ok(map.into_iter().filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_string()))).collect());
    }
    parse_header_lines(text)
}

fn parse_header_lines(text: &str) -> Result<Headers, InputError> {
    let mut headers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        // A request line (POST /hook HTTP/1.1) or a status line (HTTP/1.1 200 OK).
        if n == 0 && (line.contains(" HTTP/") || line.starts_with("HTTP/")) {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(InputError(format!("header line {} has no ':': {:?}", n + 1, line.chars().take(60).collect::<String>())));
        };
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(headers)
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, InputError> {
    let bad = || InputError("the chunked body is malformed".into());
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\n").ok_or_else(bad)?;
        let size_text = std::str::from_utf8(&rest[..line_end]).map_err(|_| bad())?.trim();
        let size_text = size_text.split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| bad())?;
        rest = &rest[line_end + 1..];
        if size == 0 {
            return Ok(body);
        }
        if rest.len() < size {
            return Err(bad());
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size..];
        rest = rest.strip_prefix(b"\r\n").or_else(|| rest.strip_prefix(b"\n")).ok_or_else(bad)?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_requests_with_crlf_lf_length_and_chunks() {
        let (h, b) = parse_request(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}trailing").ok().unwrap();
        assert_eq!(h, vec![("Host".into(), "x".into()), ("Content-Length".into(), "2".into())]);
        assert_eq!(b, b"{}");
        let (h, b) = parse_request(b"webhook-id: a\nwebhook-timestamp: 1\n\nbody\n").ok().unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(b, b"body\n");
        let (_, b) = parse_request(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").ok().unwrap();
        assert_eq!(b, b"abcde");
        assert!(parse_request(b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nshort").is_err());
        assert!(parse_request(b"no blank line").is_err());
        assert!(parse_request(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err());
    }

    #[test]
    fn header_files_as_lines_or_json() {
        let h = parse_headers(br#"{"webhook-id": "a", "x-n": 5}"#).ok().unwrap();
        assert_eq!(h, vec![("webhook-id".into(), "a".into())]);
        let h = parse_headers(b"HTTP/1.1 200 OK\nwebhook-id: a:b\n").ok().unwrap();
        assert_eq!(h, vec![("webhook-id".into(), "a:b".into())]);
        assert!(parse_headers(b"webhook-id a").is_err());
    }
}
