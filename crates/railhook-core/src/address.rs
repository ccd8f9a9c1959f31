//! The SSRF guard for Endpoint URLs: which URLs are acceptable, which IP addresses they may
//! reach, and the operator's allow-list (`network.allow_cidrs`) that overrides the refusal.
//!
//! Used twice (DESIGN.md section 8): when an Endpoint is created, on the URL's IP literal, and
//! at connect time, on every address DNS returned (the connection is then pinned to the
//! addresses checked). Nothing here resolves names.
//!
//! IP literals are normalised by the WHATWG URL parser, so `http://2130706433/`,
//! `http://0177.0.0.1/`, `http://0x7f.1/` and `http://127.1/` all become `127.0.0.1` before
//! they are classified. IPv6 addresses that embed an IPv4 address (`::ffff:a.b.c.d`,
//! `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::`) are classified by it.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::pin::Pin;
use std::sync::Arc;

/// Resolves a host name to its addresses: what the API (at creation) and the worker (at
/// connect time) call before checking the answers. Production uses the system resolver
/// (getaddrinfo, through `tokio::net::lookup_host`); tests pass a function with fixed answers,
/// since the system resolver cannot be pointed at a test nameserver. Only
/// [`system_resolver`] resolves.
pub type Resolver = Arc<dyn Fn(&str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>> + Send + Sync>;

/// The system resolver (getaddrinfo, through `tokio::net::lookup_host`) as a [`Resolver`]:
/// what the API and the worker use outside tests.
pub fn system_resolver() -> Resolver {
    Arc::new(|host: &str| {
        let host = host.to_owned();
        Box::pin(async move { Ok(tokio::net::lookup_host((host.as_str(), 0)).await?.map(|a| a.ip()).collect()) })
    })
}

/// A [`Resolver`] with fixed answers, for tests: `name -> addresses`; other names do not
/// resolve (`NotFound`).
pub fn fixed_resolver(answers: Vec<(String, Vec<IpAddr>)>) -> Resolver {
    let answers = Arc::new(answers);
    Arc::new(move |host: &str| {
        let found = answers.iter().find(|(name, _)| name.eq_ignore_ascii_case(host.trim_end_matches('.'))).map(|(_, a)| a.clone());
        Box::pin(async move { found.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such host (fixed resolver)")) })
    })
}

/// The config key named in messages, so an operator knows what to change.
pub const ALLOW_SETTING: &str = "network.allow_cidrs";
/// Longest accepted Endpoint URL, in bytes, as given and as normalised.
pub const MAX_URL_LEN: usize = 2048;

/// Why an address is refused. Carries the address as it was checked (for an IPv4-mapped
/// address, the IPv6 form), and its message is fit for an API client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeniedReason {
    /// 10/8, 172.16/12, 192.168/16, 100.64/10 (CGNAT), fc00::/7, fec0::/10, 64:ff9b:1::/48.
    #[error("url resolves to a private address ({0}), which is refused; add it to {ALLOW_SETTING} to permit it")]
    Private(IpAddr),
    /// 127/8, ::1.
    #[error("url resolves to a loopback address ({0}), which is refused; add it to {ALLOW_SETTING} to permit it")]
    Loopback(IpAddr),
    /// 169.254/16, fe80::/10.
    #[error("url resolves to a link-local address ({0}), which is refused; add it to {ALLOW_SETTING} to permit it")]
    LinkLocal(IpAddr),
    /// Cloud instance metadata services; see [`METADATA`].
    #[error("url resolves to a cloud metadata address ({0}), which is refused; only a {ALLOW_SETTING} entry for exactly this address (/32 or /128) permits it")]
    Metadata(IpAddr),
    /// 224/4, ff00::/8.
    #[error("url resolves to a multicast address ({0}), which is refused; add it to {ALLOW_SETTING} to permit it")]
    Multicast(IpAddr),
    /// 0/8, ::.
    #[error("url resolves to an unspecified address ({0}), which is refused; add it to {ALLOW_SETTING} to permit it")]
    Unspecified(IpAddr),
    /// 255.255.255.255.
    #[error("url resolves to the broadcast address ({0}), which is refused; add it to {ALLOW_SETTING} to permit it")]
    Broadcast(IpAddr),
    /// 240/4, documentation (192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32,
    /// 3fff::/20), 192.0.0/24, benchmarking 198.18/15, discard-only 100::/64.
    #[error("url resolves to a reserved address ({0}), which is refused; add it to {ALLOW_SETTING} to permit it")]
    Reserved(IpAddr),
}

impl DeniedReason {
    /// The address that was refused.
    pub fn ip(&self) -> IpAddr {
        match *self {
            DeniedReason::Private(ip)
            | DeniedReason::Loopback(ip)
            | DeniedReason::LinkLocal(ip)
            | DeniedReason::Metadata(ip)
            | DeniedReason::Multicast(ip)
            | DeniedReason::Unspecified(ip)
            | DeniedReason::Broadcast(ip)
            | DeniedReason::Reserved(ip) => ip,
        }
    }

    /// A short, low-cardinality name for metric labels and logs: `private`, `loopback`, ...
    pub fn label(&self) -> &'static str {
        match self {
            DeniedReason::Private(_) => "private",
            DeniedReason::Loopback(_) => "loopback",
            DeniedReason::LinkLocal(_) => "link_local",
            DeniedReason::Metadata(_) => "metadata",
            DeniedReason::Multicast(_) => "multicast",
            DeniedReason::Unspecified(_) => "unspecified",
            DeniedReason::Broadcast(_) => "broadcast",
            DeniedReason::Reserved(_) => "reserved",
        }
    }
}

/// Instance metadata endpoints: AWS/GCP/Azure/OCI (169.254.169.254), AWS ECS task metadata
/// (169.254.170.2), AWS over IPv6 (fd00:ec2::254), Alibaba Cloud (100.100.100.200), Azure
/// WireServer (168.63.129.16, a public address only meaningful inside Azure).
pub const METADATA: [IpAddr; 5] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V4(Ipv4Addr::new(169, 254, 170, 2)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
];

/// The IPv4 address an IPv6 address stands for, if it embeds one: IPv4-mapped
/// `::ffff:0:0/96`, IPv4-translated `::ffff:0:0:0/96` (SIIT, RFC 2765), IPv4-compatible
/// `::/96` (except `::` and `::1`), NAT64 `64:ff9b::/96` and 6to4 `2002::/16`. Connecting to
/// these reaches (or is translated to) the IPv4 address.
pub fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(low),
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some(low),
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, a, b, ..] => Some(Ipv4Addr::new((a >> 8) as u8, a as u8, (b >> 8) as u8, b as u8)),
        _ => None,
    }
}

/// Whether `ip` is refused by default, and why. `None` means a public address.
///
/// Metadata is checked before the ranges that contain it (169.254.169.254 is Metadata, not
/// LinkLocal), so the allow-list's stricter rule for it applies.
pub fn classify(ip: IpAddr) -> Option<DeniedReason> {
    if METADATA.contains(&ip) {
        return Some(DeniedReason::Metadata(ip));
    }
    match ip {
        IpAddr::V4(v4) => classify_v4(v4).map(|make| make(ip)),
        IpAddr::V6(v6) => match embedded_ipv4(v6) {
            Some(v4) if METADATA.contains(&IpAddr::V4(v4)) => Some(DeniedReason::Metadata(ip)),
            Some(v4) => classify_v4(v4).map(|make| make(ip)),
            None => classify_v6(v6).map(|make| make(ip)),
        },
    }
}

type Make = fn(IpAddr) -> DeniedReason;

fn classify_v4(ip: Ipv4Addr) -> Option<Make> {
    let within = |net: [u8; 4], len: u8| Cidr::v4_contains(net, len, ip);
    let reason: Make = if within([0, 0, 0, 0], 8) {
        DeniedReason::Unspecified
    } else if within([127, 0, 0, 0], 8) {
        DeniedReason::Loopback
    } else if within([169, 254, 0, 0], 16) {
        DeniedReason::LinkLocal
    } else if within([10, 0, 0, 0], 8)
        || within([172, 16, 0, 0], 12)
        || within([192, 168, 0, 0], 16)
        || within([100, 64, 0, 0], 10)
    {
        DeniedReason::Private
    } else if within([224, 0, 0, 0], 4) {
        DeniedReason::Multicast
    } else if ip == Ipv4Addr::BROADCAST {
        DeniedReason::Broadcast
    } else if within([240, 0, 0, 0], 4)
        || within([192, 0, 2, 0], 24)
        || within([198, 51, 100, 0], 24)
        || within([203, 0, 113, 0], 24)
        || within([192, 0, 0, 0], 24)
        || within([198, 18, 0, 0], 15)
    {
        DeniedReason::Reserved
    } else {
        return None;
    };
    Some(reason)
}

fn classify_v6(ip: Ipv6Addr) -> Option<Make> {
    let within = |net: [u16; 8], len: u8| Cidr::v6_contains(net, len, ip);
    let reason: Make = if ip.is_unspecified() {
        DeniedReason::Unspecified
    } else if ip.is_loopback() {
        DeniedReason::Loopback
    } else if within([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10) {
        DeniedReason::LinkLocal
    } else if within([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7)
        || within([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10)
        || within([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48)
    {
        DeniedReason::Private
    } else if within([0xff00, 0, 0, 0, 0, 0, 0, 0], 8) {
        DeniedReason::Multicast
    } else if within([0x2001, 0x0db8, 0, 0, 0, 0, 0, 0], 32)
        || within([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20)
        || within([0x0100, 0, 0, 0, 0, 0, 0, 0], 64)
    {
        DeniedReason::Reserved
    } else {
        return None;
    };
    Some(reason)
}

/// One allow-list entry: an address and a prefix length within its family's width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    fn parse(text: &str) -> Option<Cidr> {
        let (addr, len) = text.split_once('/')?;
        let addr: IpAddr = addr.parse().ok()?;
        let len: u8 = len.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (len <= max).then_some(Cidr { addr, len })
    }

    fn v4_contains(net: [u8; 4], len: u8, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        u32::from_be_bytes(net) & mask == u32::from(ip) & mask
    }

    fn v6_contains(net: [u16; 8], len: u8, ip: Ipv6Addr) -> bool {
        let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
        u128::from(Ipv6Addr::from(net)) & mask == u128::from(ip) & mask
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => Cidr::v4_contains(net.octets(), self.len, ip),
            (IpAddr::V6(net), IpAddr::V6(ip)) => Cidr::v6_contains(net.segments(), self.len, ip),
            _ => false,
        }
    }

    /// A single-address entry for exactly `ip`.
    fn is_exactly(&self, ip: IpAddr) -> bool {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        self.len == full && self.addr == ip
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ALLOW_SETTING} entry '{0}' is not a CIDR such as 127.0.0.0/8 or ::1/128")]
pub struct AllowListError(pub String);

/// CIDRs the operator permits although [`classify`] refuses them, e.g. `127.0.0.0/8` for
/// local development and tests. Empty by default: everything [`classify`] denies is refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Cidr>,
}

impl AllowList {
    /// Parses `address/prefix-length` entries (IPv4 or IPv6; host bits may be set, only the
    /// prefix counts). A bare address without `/len` is refused, as config validation does.
    pub fn parse(cidrs: &[String]) -> Result<AllowList, AllowListError> {
        let entries = cidrs
            .iter()
            .map(|c| Cidr::parse(c).ok_or_else(|| AllowListError(c.chars().take(100).collect())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AllowList { entries })
    }

    /// Whether a connection to `ip` is permitted.
    ///
    /// A public address passes. A denied one passes if an entry contains it, or contains the
    /// IPv4 address it embeds (so `127.0.0.0/8` also permits `::ffff:127.0.0.1`). Metadata
    /// addresses are stricter: only an entry for exactly that address (`/32` or `/128`, or
    /// the embedded IPv4 as `/32`) permits them; `169.254.0.0/16` does not.
    pub fn check(&self, ip: IpAddr) -> Result<(), DeniedReason> {
        let Some(reason) = classify(ip) else { return Ok(()) };
        let embedded = match ip {
            IpAddr::V6(v6) => embedded_ipv4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let forms = [Some(ip), embedded];
        let forms = forms.iter().flatten();
        let permitted = match reason {
            DeniedReason::Metadata(_) => forms.clone().any(|f| self.entries.iter().any(|e| e.is_exactly(*f))),
            _ => forms.clone().any(|f| self.entries.iter().any(|e| e.contains(*f))),
        };
        if permitted {
            Ok(())
        } else {
            Err(reason)
        }
    }

    /// The creation-time check: an IP-literal host is checked now; a domain passes here and
    /// is checked on its DNS answers at connect time.
    pub fn check_url(&self, url: &EndpointUrl) -> Result<(), DeniedReason> {
        match url.ip() {
            Some(ip) => self.check(ip),
            None => Ok(()),
        }
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries: Vec<String> = self.entries.iter().map(Cidr::to_string).collect();
        write!(f, "[{}]", entries.join(", "))
    }
}

/// Why an Endpoint URL was refused; the message is fit for an API client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("url is {len} characters long; at most {MAX_URL_LEN} are allowed")]
    TooLong { len: usize },
    #[error("url must not contain spaces or control characters")]
    Whitespace,
    #[error("url is not a valid absolute URL: {0}")]
    Invalid(String),
    #[error("url scheme must be http or https, not '{0}'")]
    Scheme(String),
    #[error("url must not contain credentials (user:password@); receivers verify the webhook-signature instead")]
    Credentials,
    #[error("url must have a host")]
    MissingHost,
    #[error("url must not contain a fragment ('#...'); it is never sent to the receiver")]
    Fragment,
    #[error("url port must be between 1 and 65535")]
    PortZero,
}

/// A validated Endpoint URL: http or https, a host, no credentials, no fragment, at most
/// [`MAX_URL_LEN`] bytes. Holds the WHATWG-normalised form, which is what to store and send
/// to (`HTTP://Example.COM:80/a` becomes `http://example.com/a`, `http://0x7f.1/` becomes
/// `http://127.0.0.1/`, an IDN becomes punycode).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointUrl {
    url: url::Url,
}

/// Parses and validates an Endpoint URL. Address classes are not checked here; use
/// [`AllowList::check_url`] at creation time and [`AllowList::check`] on DNS answers.
pub fn parse_endpoint_url(text: &str) -> Result<EndpointUrl, UrlError> {
    if text.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong { len: text.len() });
    }
    // The WHATWG parser silently strips surrounding spaces and removes tabs and newlines
    // anywhere; refuse them so what is stored is what the customer meant.
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(UrlError::Whitespace);
    }
    let url = url::Url::parse(text).map_err(|e| UrlError::Invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlError::Scheme(url.scheme().chars().take(40).collect()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::Credentials);
    }
    if url.host().is_none() {
        return Err(UrlError::MissingHost);
    }
    if url.fragment().is_some() {
        return Err(UrlError::Fragment);
    }
    if url.port() == Some(0) {
        return Err(UrlError::PortZero);
    }
    // Normalising percent-encodes non-ASCII, which can make the URL longer than what was given.
    if url.as_str().len() > MAX_URL_LEN {
        return Err(UrlError::TooLong { len: url.as_str().len() });
    }
    Ok(EndpointUrl { url })
}

impl EndpointUrl {
    /// The normalised URL, to store and to send requests to.
    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    pub fn as_url(&self) -> &url::Url {
        &self.url
    }

    pub fn into_url(self) -> url::Url {
        self.url
    }

    /// The host as written in the normalised URL: a lower-case ASCII domain, a dotted IPv4
    /// address, or an IPv6 address in brackets (`[::1]`). For DNS use [`EndpointUrl::domain`].
    pub fn host(&self) -> &str {
        self.url.host_str().unwrap_or_default()
    }

    /// The address, if the host is an IP literal (in any form the parser accepts).
    pub fn ip(&self) -> Option<IpAddr> {
        match self.url.host()? {
            url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
            url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
            url::Host::Domain(_) => None,
        }
    }

    /// The domain name to resolve, if the host is not an IP literal.
    pub fn domain(&self) -> Option<&str> {
        self.url.domain()
    }

    /// The explicit port, else 443 for https and 80 for http.
    pub fn port_or_default(&self) -> u16 {
        self.url.port_or_known_default().unwrap_or(if self.is_https() { 443 } else { 80 })
    }

    pub fn is_https(&self) -> bool {
        self.url.scheme() == "https"
    }
}

impl fmt::Display for EndpointUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.url.as_str())
    }
}

impl std::str::FromStr for EndpointUrl {
    type Err = UrlError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_endpoint_url(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn allow(entries: &[&str]) -> AllowList {
        AllowList::parse(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn label(s: &str) -> Option<&'static str> {
        classify(ip(s)).map(|r| r.label())
    }

    #[test]
    fn ipv4_classes() {
        let cases = [
            ("10.0.0.1", Some("private")),
            ("10.255.255.255", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.15.255.255", None),
            ("172.32.0.0", None),
            ("192.168.1.1", Some("private")),
            ("192.169.0.1", None),
            ("100.64.0.1", Some("private")),
            ("100.127.255.255", Some("private")),
            ("100.63.255.255", None),
            ("100.128.0.0", None),
            ("127.0.0.1", Some("loopback")),
            ("127.255.255.254", Some("loopback")),
            ("169.254.1.1", Some("link_local")),
            ("169.254.169.254", Some("metadata")),
            ("169.254.170.2", Some("metadata")),
            ("100.100.100.200", Some("metadata")),
            ("168.63.129.16", Some("metadata")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.255", Some("multicast")),
            ("0.0.0.0", Some("unspecified")),
            ("0.1.2.3", Some("unspecified")),
            ("255.255.255.255", Some("broadcast")),
            ("240.0.0.1", Some("reserved")),
            ("255.255.255.254", Some("reserved")),
            ("192.0.2.1", Some("reserved")),
            ("198.51.100.7", Some("reserved")),
            ("203.0.113.9", Some("reserved")),
            ("192.0.0.8", Some("reserved")),
            ("198.18.0.1", Some("reserved")),
            ("198.19.255.255", Some("reserved")),
            ("198.20.0.0", None),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("93.184.216.34", None),
            ("11.0.0.1", None),
            ("126.255.255.255", None),
            ("128.0.0.1", None),
            ("223.255.255.255", None),
        ];
        for (addr, want) in cases {
            assert_eq!(label(addr), want, "{addr}");
        }
    }

    #[test]
    fn ipv6_classes() {
        let cases = [
            ("::", Some("unspecified")),
            ("::1", Some("loopback")),
            ("fe80::1", Some("link_local")),
            ("febf:ffff::1", Some("link_local")),
            ("fc00::1", Some("private")),
            ("fd12:3456::1", Some("private")),
            ("fec0::1", Some("private")),
            ("fd00:ec2::254", Some("metadata")),
            ("fd00:ec2::253", Some("private")),
            ("ff02::1", Some("multicast")),
            ("2001:db8::1", Some("reserved")),
            ("3fff::1", Some("reserved")),
            ("100::1", Some("reserved")),
            ("64:ff9b:1::1", Some("private")),
            ("2001:4860:4860::8888", None),
            ("2606:4700:4700::1111", None),
            ("2a00:1450:4001::1", None),
        ];
        for (addr, want) in cases {
            assert_eq!(label(addr), want, "{addr}");
        }
    }

    #[test]
    fn embedded_ipv4_is_classified_by_it() {
        let cases = [
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:7f00:1", Some("loopback")),
            ("::ffff:10.1.2.3", Some("private")),
            ("::ffff:169.254.169.254", Some("metadata")),
            ("::ffff:a9fe:a9fe", Some("metadata")),
            ("::ffff:0:127.0.0.1", Some("loopback")),
            ("::ffff:0:a9fe:a9fe", Some("metadata")),
            ("::ffff:0:10.0.0.1", Some("private")),
            ("::ffff:0:8.8.8.8", None),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some("loopback")),
            ("::10.0.0.1", Some("private")),
            ("::8.8.8.8", None),
            ("64:ff9b::127.0.0.1", Some("loopback")),
            ("64:ff9b::a9fe:a9fe", Some("metadata")),
            ("64:ff9b::192.168.0.1", Some("private")),
            ("64:ff9b::8.8.8.8", None),
            ("2002:7f00:1::", Some("loopback")),
            ("2002:a9fe:a9fe::1", Some("metadata")),
            ("2002:0808:0808::1", None),
        ];
        for (addr, want) in cases {
            assert_eq!(label(addr), want, "{addr}");
        }
        // The reason carries the address as checked, not the embedded one.
        assert_eq!(classify(ip("::ffff:127.0.0.1")), Some(DeniedReason::Loopback(ip("::ffff:127.0.0.1"))));
    }

    #[test]
    fn messages_are_fit_for_clients() {
        assert_eq!(
            classify(ip("127.0.0.1")).unwrap().to_string(),
            "url resolves to a loopback address (127.0.0.1), which is refused; add it to network.allow_cidrs to permit it"
        );
        assert_eq!(
            classify(ip("169.254.169.254")).unwrap().to_string(),
            "url resolves to a cloud metadata address (169.254.169.254), which is refused; only a network.allow_cidrs entry for exactly this address (/32 or /128) permits it"
        );
        assert_eq!(
            AllowList::parse(&["10.0.0.0".to_string()]).unwrap_err().to_string(),
            "network.allow_cidrs entry '10.0.0.0' is not a CIDR such as 127.0.0.0/8 or ::1/128"
        );
        assert_eq!(
            parse_endpoint_url("ftp://example.com/").unwrap_err().to_string(),
            "url scheme must be http or https, not 'ftp'"
        );
    }

    #[test]
    fn allow_list_parsing() {
        for ok in ["127.0.0.0/8", "10.1.2.3/8", "::1/128", "fd00::/8", "0.0.0.0/0", "::/0", "1.2.3.4/32"] {
            assert!(AllowList::parse(&[ok.to_string()]).is_ok(), "{ok}");
        }
        for bad in ["", "127.0.0.1", "127.0.0.0/33", "::1/129", "127.0.0.0/-1", "localhost/8", "127.0.0.0/8 ", "/8", "1.2.3/24"] {
            assert_eq!(AllowList::parse(&[bad.to_string()]), Err(AllowListError(bad.to_string())), "{bad}");
        }
        assert_eq!(allow(&["10.1.2.3/8", "::1/128"]).to_string(), "[10.1.2.3/8, ::1/128]");
    }

    #[test]
    fn allow_list_overrides_classes() {
        let empty = AllowList::default();
        assert_eq!(empty.check(ip("8.8.8.8")), Ok(()));
        assert_eq!(empty.check(ip("127.0.0.1")), Err(DeniedReason::Loopback(ip("127.0.0.1"))));

        let dev = allow(&["127.0.0.0/8", "::1/128", "10.20.0.0/16"]);
        assert_eq!(dev.check(ip("127.0.0.1")), Ok(()));
        assert_eq!(dev.check(ip("127.9.9.9")), Ok(()));
        assert_eq!(dev.check(ip("::1")), Ok(()));
        assert_eq!(dev.check(ip("::ffff:127.0.0.1")), Ok(()), "mapped form of an allowed address");
        assert_eq!(dev.check(ip("10.20.3.4")), Ok(()));
        assert_eq!(dev.check(ip("10.21.0.1")), Err(DeniedReason::Private(ip("10.21.0.1"))));
        assert_eq!(dev.check(ip("192.168.0.1")), Err(DeniedReason::Private(ip("192.168.0.1"))));
        assert_eq!(dev.check(ip("8.8.8.8")), Ok(()));
    }

    #[test]
    fn metadata_needs_an_exact_entry() {
        let md = ip("169.254.169.254");
        for broad in [&["169.254.0.0/16"][..], &["0.0.0.0/0", "::/0"], &["169.254.169.254/31"]] {
            assert_eq!(allow(broad).check(md), Err(DeniedReason::Metadata(md)), "{broad:?}");
        }
        assert_eq!(allow(&["169.254.169.254/32"]).check(md), Ok(()));
        assert_eq!(allow(&["169.254.169.254/32"]).check(ip("::ffff:169.254.169.254")), Ok(()));
        assert!(allow(&["169.254.169.254/32"]).check(ip("169.254.170.2")).is_err());
        let v6 = ip("fd00:ec2::254");
        assert!(allow(&["fd00::/8"]).check(v6).is_err());
        assert_eq!(allow(&["fd00:ec2::254/128"]).check(v6), Ok(()));
        // A broad entry still permits the rest of the link-local range.
        assert_eq!(allow(&["169.254.0.0/16"]).check(ip("169.254.1.1")), Ok(()));
    }

    /// `Cidr::contains` agrees with a bit-by-bit prefix comparison for random prefixes.
    #[test]
    fn cidr_containment_random() {
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..20_000 {
            let net: u128 = rng.random();
            let len: u8 = rng.random_range(0..=128);
            // Often share a prefix with the network so both outcomes occur.
            let keep: u32 = rng.random_range(0..=128);
            let noise: u128 = rng.random();
            let mask = u128::MAX.checked_shl(128 - keep).unwrap_or(0);
            let addr = (net & mask) | (noise & !mask);
            let expected = (0..u32::from(len)).all(|i| (net >> (127 - i)) & 1 == (addr >> (127 - i)) & 1);
            let cidr = Cidr { addr: IpAddr::V6(Ipv6Addr::from(net)), len };
            assert_eq!(cidr.contains(IpAddr::V6(Ipv6Addr::from(addr))), expected, "seed {seed}: {cidr} vs {addr:x}");

            let (net4, addr4, len4) = ((net >> 96) as u32, (addr >> 96) as u32, len.min(32));
            let expected4 = (0..u32::from(len4)).all(|i| (net4 >> (31 - i)) & 1 == (addr4 >> (31 - i)) & 1);
            let cidr4 = Cidr { addr: IpAddr::V4(Ipv4Addr::from(net4)), len: len4 };
            assert_eq!(cidr4.contains(IpAddr::V4(Ipv4Addr::from(addr4))), expected4, "seed {seed}: {cidr4}");
            // Families never mix.
            assert!(!cidr4.contains(IpAddr::V6(Ipv6Addr::from(addr))));
        }
    }

    /// Random addresses: an allow-list entry covering an address always permits it unless it
    /// is a metadata address; the empty list permits exactly the unclassified ones.
    #[test]
    fn check_agrees_with_classify_random() {
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let empty = AllowList::default();
        let everything = allow(&["0.0.0.0/0", "::/0"]);
        let interesting: [u32; 8] = [0x7f00_0001, 0x0a00_0001, 0xa9fe_a9fe, 0xc0a8_0101, 0xe000_0001, 0, 0xffff_ffff, 0x0808_0808];
        for _ in 0..20_000 {
            let addr = match rng.random_range(0..4) {
                0 => IpAddr::V4(Ipv4Addr::from(rng.random::<u32>())),
                1 => IpAddr::V6(Ipv6Addr::from(rng.random::<u128>())),
                2 => IpAddr::V6(Ipv4Addr::from(interesting[rng.random_range(0..interesting.len())]).to_ipv6_mapped()),
                _ => IpAddr::V4(Ipv4Addr::from(interesting[rng.random_range(0..interesting.len())] ^ rng.random_range(0..256))),
            };
            let class = classify(addr);
            assert_eq!(empty.check(addr).err(), class, "seed {seed}: {addr}");
            match class {
                Some(DeniedReason::Metadata(_)) => assert!(everything.check(addr).is_err(), "seed {seed}: {addr}"),
                _ => assert_eq!(everything.check(addr), Ok(()), "seed {seed}: {addr}"),
            }
            if let IpAddr::V4(v4) = addr {
                // The mapped form is classified like the IPv4 address.
                let mapped = IpAddr::V6(v4.to_ipv6_mapped());
                assert_eq!(classify(mapped).map(|r| r.label()), class.map(|r| r.label()), "seed {seed}: {addr}");
            }
        }
    }

    #[test]
    fn ipv4_literals_in_every_spelling_are_normalised() {
        let loopback = Some(ip("127.0.0.1"));
        for spelling in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://0177.0.0.1/",
            "http://0x7f.0.0.1/",
            "http://0X7F.0.0.1/",
            "http://0x7f000001/",
            "http://017700000001/",
            "http://127.1/",
            "http://127.0.1/",
            "http://0x7f.1/",
            "http://127.0.0.1./",
            "http://%31%32%37.0.0.1/",
            "http://１２７.０.０.１/",
            "https://0177.00.00.01:8443/x",
        ] {
            let url = parse_endpoint_url(spelling).unwrap_or_else(|e| panic!("{spelling}: {e}"));
            assert_eq!(url.ip(), loopback, "{spelling}");
            assert_eq!(url.host(), "127.0.0.1", "{spelling}");
            assert_eq!(url.domain(), None, "{spelling}");
            assert_eq!(AllowList::default().check_url(&url), Err(DeniedReason::Loopback(ip("127.0.0.1"))), "{spelling}");
            assert_eq!(allow(&["127.0.0.0/8"]).check_url(&url), Ok(()), "{spelling}");
        }
        let md = parse_endpoint_url("http://0xa9fea9fe/latest/meta-data").unwrap();
        assert_eq!(md.ip(), Some(ip("169.254.169.254")));
        assert_eq!(md.as_str(), "http://169.254.169.254/latest/meta-data");
        let mapped = parse_endpoint_url("http://[::ffff:127.0.0.1]:8080/").unwrap();
        assert_eq!(mapped.ip(), Some(ip("::ffff:127.0.0.1")));
        assert_eq!(mapped.host(), "[::ffff:7f00:1]");
        assert!(AllowList::default().check_url(&mapped).is_err());
        // Not IPv4 literals: too many parts or out of range are errors, not domains.
        for bad in ["http://127.0.0.1.1/", "http://256.0.0.1/", "http://4294967296/", "http://0x1ffffffff/", "http://08.0.0.1/"] {
            assert!(matches!(parse_endpoint_url(bad), Err(UrlError::Invalid(_))), "{bad}: {:?}", parse_endpoint_url(bad));
        }
    }

    #[test]
    fn endpoint_urls() {
        let url = parse_endpoint_url("HTTPS://Example.COM:443/hooks/in?x=1").unwrap();
        assert_eq!(url.as_str(), "https://example.com/hooks/in?x=1");
        assert_eq!(url.host(), "example.com");
        assert_eq!(url.domain(), Some("example.com"));
        assert_eq!(url.ip(), None);
        assert_eq!(url.port_or_default(), 443);
        assert!(url.is_https());
        assert_eq!(AllowList::default().check_url(&url), Ok(()), "domains are checked when resolved");

        assert_eq!(parse_endpoint_url("http://example.com").unwrap().port_or_default(), 80);
        assert_eq!(parse_endpoint_url("http://example.com:8080/").unwrap().port_or_default(), 8080);
        assert_eq!(parse_endpoint_url("https://[2001:4860::1]/").unwrap().ip(), Some(ip("2001:4860::1")));
        assert_eq!(parse_endpoint_url("https://bücher.example/").unwrap().host(), "xn--bcher-kva.example");
        assert_eq!("http://a.example/".parse::<EndpointUrl>().unwrap().to_string(), "http://a.example/");

        let err = |s: &str| parse_endpoint_url(s).unwrap_err();
        assert_eq!(err("ftp://example.com/"), UrlError::Scheme("ftp".into()));
        assert_eq!(err("file:///etc/passwd"), UrlError::Scheme("file".into()));
        assert_eq!(err("javascript:alert(1)"), UrlError::Scheme("javascript".into()));
        assert_eq!(err("http://user:pw@example.com/"), UrlError::Credentials);
        assert_eq!(err("http://user@example.com/"), UrlError::Credentials);
        assert_eq!(err("http://:pw@example.com/"), UrlError::Credentials);
        assert_eq!(err("http://example.com/#top"), UrlError::Fragment);
        assert_eq!(err("http://example.com/#"), UrlError::Fragment);
        assert_eq!(err("http://example.com:0/"), UrlError::PortZero);
        assert_eq!(err(" http://example.com/"), UrlError::Whitespace);
        assert_eq!(err("http://exa\tmple.com/"), UrlError::Whitespace);
        assert_eq!(err("http://example.com/\n"), UrlError::Whitespace);
        assert!(matches!(err("example.com/hook"), UrlError::Invalid(_)));
        assert!(matches!(err(""), UrlError::Invalid(_)));
        assert!(matches!(err("http://"), UrlError::Invalid(_)));
        assert!(matches!(err("http://example.com:99999/"), UrlError::Invalid(_)));
        assert!(matches!(err("http://[fe80::1%25eth0]/"), UrlError::Invalid(_)));

        let max = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN - 20));
        assert_eq!(max.len(), MAX_URL_LEN);
        assert!(parse_endpoint_url(&max).is_ok());
        assert_eq!(err(&format!("{max}a")), UrlError::TooLong { len: MAX_URL_LEN + 1 });
        // Short as given, too long once non-ASCII is percent-encoded.
        let grows = format!("https://example.com/{}", "é".repeat(900));
        assert!(grows.len() <= MAX_URL_LEN);
        assert!(matches!(err(&grows), UrlError::TooLong { .. }));
    }

    /// Arbitrary input never panics, and whatever is accepted satisfies the contract.
    #[test]
    fn random_urls_never_panic() {
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let pieces = [
            "http", "https", "ftp", "://", ":", "/", "@", "#", "?", "[", "]", "::1", "127", ".", "0x7f", "0", "1",
            "example", "com", "%", "2e", "é", "\u{0}", " ", "user", "8080", "ffff",
        ];
        for _ in 0..20_000 {
            let text: String = (0..rng.random_range(0..12)).map(|_| pieces[rng.random_range(0..pieces.len())]).collect();
            if let Ok(url) = parse_endpoint_url(&text) {
                let u = url.as_url();
                assert!(matches!(u.scheme(), "http" | "https"), "seed {seed}: {text}");
                assert!(u.username().is_empty() && u.password().is_none() && u.fragment().is_none(), "seed {seed}: {text}");
                assert!(!url.host().is_empty(), "seed {seed}: {text}");
                assert!(url.port_or_default() > 0);
                assert_eq!(url.ip().is_some(), url.domain().is_none(), "seed {seed}: {text}");
                // Normalisation is idempotent: the stored form parses to itself.
                assert_eq!(parse_endpoint_url(url.as_str()).as_ref(), Ok(&url), "seed {seed}: {text}");
            }
        }
    }
}
