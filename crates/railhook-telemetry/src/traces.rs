//! OpenTelemetry traces (issue 33, docs/TRACING.md): one trace per Event, from the
//! producer's request to the receiver's response.
//!
//! Spans are `tracing` spans with the target [`TARGET`]; the `tracing-opentelemetry` layer
//! turns them into OpenTelemetry spans and a batch processor exports them over OTLP/HTTP
//! (protobuf). Export is off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set ([`Export::from_env`]); then the standard
//! `OTEL_*` variables apply (`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER(_ARG)`,
//! `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`/`TIMEOUT`/`COMPRESSION`).
//!
//! Contracts:
//! - **Off costs nothing measurable.** With export off no layer enables [`TARGET`], so each
//!   span macro is one cached callsite check and returns a disabled span; the helpers here
//!   return at `is_disabled()`. What is left on the request path is parsing the header.
//! - **Never blocks a request path.** Finished spans go to the SDK's batch processor: a
//!   bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2,048 by default) that drops when full and a
//!   thread of its own that exports; the exporter's HTTP client runs on a small runtime of
//!   its own ([`ExportClient`]), never on the process's.
//! - **Propagation is a pass-through when export is off**: a caller's valid `traceparent`
//!   still reaches the receiver unchanged ([`context_of`]), as the W3C specification asks of
//!   a component that does not trace.

use std::fmt;
use std::str::FromStr;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use railhook_core::{TraceContext, TraceParent};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of every span that becomes an OpenTelemetry span. The log output
/// never shows it (the log filter turns it off), and with export off nothing enables it.
pub const TARGET: &str = "railhook_trace";

/// The span names (docs/TRACING.md lists them with their parents).
pub mod span {
    /// `POST /v1/events` (server span), or an ingress request's.
    pub const INGEST: &str = "ingest";
    /// The relay hands one announcement to Kafka or to the inline worker (producer span).
    pub const RELAY_PUBLISH: &str = "relay publish";
    /// The worker's claim of one Delivery (consumer span; one per Delivery of a claim batch).
    pub const CLAIM: &str = "claim";
    /// One Attempt: the HTTP request to the Endpoint (client span).
    pub const ATTEMPT: &str = "Attempt";
    /// The outcome written (one per Delivery of a finalise batch).
    pub const FINALISE: &str = "finalise";
}

/// Installed OpenTelemetry export: shut it down before the process exits so the spans still
/// queued are sent (bounded by the exporter's timeout).
pub struct Export {
    provider: SdkTracerProvider,
}

/// Why export could not be set up (a bad `OTEL_*` value): the process refuses to start.
#[derive(Debug)]
pub struct ExportError(String);

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpenTelemetry export: {}", self.0)
    }
}

impl std::error::Error for ExportError {}

/// Whether the environment asks for export: an OTLP endpoint is set and neither
/// `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` says otherwise.
pub fn export_requested() -> bool {
    let set = |name: &str| std::env::var(name).map(|v| !v.trim().is_empty()).unwrap_or(false);
    let disabled = std::env::var("OTEL_SDK_DISABLED").map(|v| v.trim().eq_ignore_ascii_case("true")).unwrap_or(false);
    let exporter_none = std::env::var("OTEL_TRACES_EXPORTER").map(|v| v.trim().eq_ignore_ascii_case("none")).unwrap_or(false);
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) && !disabled && !exporter_none
}

impl Export {
    /// The exporter the environment asks for, or `None` when it asks for none.
    pub fn from_env() -> Result<Option<Export>, ExportError> {
        if !export_requested() {
            return Ok(None);
        }
        for var in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
            if let Ok(p) = std::env::var(var) {
                if !p.trim().is_empty() && p.trim() != "http/protobuf" {
                    return Err(ExportError(format!("{var}={p}: this build exports over http/protobuf only (unset it, or set http/protobuf)")));
                }
            }
        }
        use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
        let client = ExportClient::new().map_err(|e| ExportError(format!("starting the exporter's HTTP client: {e}")))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_http_client(client)
            .build()
            .map_err(|e| ExportError(e.to_string()))?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        let named_in_env = std::env::var("OTEL_SERVICE_NAME").is_ok()
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").map(|a| a.contains("service.name=")).unwrap_or(false);
        if !named_in_env {
            resource = resource.with_service_name("railhook");
        }
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
        Ok(Some(Export { provider }))
    }

    /// The `tracing` layer that records [`TARGET`]'s spans into this export.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("railhook"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_target(false)
            .with_level(false)
    }

    /// Flushes what is queued and stops the export thread. Blocking: call it off the async
    /// threads (after the runtime stopped, or in `spawn_blocking`).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("OpenTelemetry export shutdown: {e}");
        }
    }
}

/// The exporter's HTTP client: the workspace's reqwest on a current-thread runtime of its
/// own. The SDK's batch processor exports from a plain thread (`block_on`), where the
/// process's runtime is not reachable, and export must never compete with request paths for
/// it anyway.
struct ExportClient {
    /// Runs the requests: the batch thread blocks on it (it is not a runtime thread).
    runtime: tokio::runtime::Runtime,
    /// Keeps its connection to the collector open between exports.
    client: reqwest::Client,
}

impl fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ExportClient")
    }
}

impl ExportClient {
    fn new() -> Result<ExportClient, Box<dyn std::error::Error + Send + Sync>> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        // A collector that does not answer must not hold spans for ever (OTLP's default
        // export timeout is 10 s; the SDK's own timeout applies as well).
        let client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).build()?;
        Ok(ExportClient { runtime, client })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for ExportClient {
    async fn send_bytes(&self, request: http::Request<bytes::Bytes>) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let request = reqwest::Request::try_from(request.map(reqwest::Body::from))?;
        let client = self.client.clone();
        // The batch thread is not a runtime thread: block on our own runtime.
        self.runtime.block_on(async move {
            let response = client.execute(request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            // Cap what a collector's answer may cost (OTLP answers are small).
            let mut body = Vec::new();
            let mut response = response;
            while let Some(chunk) = response.chunk().await? {
                if body.len() + chunk.len() > 1 << 20 {
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            let mut out = http::Response::builder().status(status);
            if let Some(h) = out.headers_mut() {
                *h = headers;
            }
            Ok(out.body(bytes::Bytes::from(body))?)
        })
    }
}

/// Makes `remote` (a caller's header, an announcement's) the parent of `span`, which must
/// not have been entered yet. Nothing when either is absent or export is off.
pub fn continue_from(span: &Span, remote: Option<&TraceContext>) {
    let Some(remote) = remote else { return };
    if span.is_disabled() {
        return;
    }
    let p = remote.parent;
    let state = remote.state.as_deref().and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
    let context = SpanContext::new(TraceId::from_bytes(p.trace_id), SpanId::from_bytes(p.parent_id), TraceFlags::new(p.flags), true, state);
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(context));
}

/// The trace context to send on from `span`: its own when export records it, else
/// `remote` unchanged (the pass-through). `remote`'s `tracestate` is kept either way.
pub fn context_of(span: &Span, remote: Option<&TraceContext>) -> Option<TraceContext> {
    if span.is_disabled() {
        return remote.cloned();
    }
    let context = span.context();
    let own = context.span();
    let own = own.span_context();
    if !own.is_valid() {
        return remote.cloned();
    }
    let parent = TraceParent { trace_id: own.trace_id().to_bytes(), parent_id: own.span_id().to_bytes(), flags: own.trace_flags().to_u8() };
    Some(TraceContext { parent, state: remote.and_then(|r| r.state.clone()) })
}

/// Marks `span` failed with `message` (OpenTelemetry's error status).
pub fn fail(span: &Span, message: impl Into<String>) {
    if !span.is_disabled() {
        span.set_status(opentelemetry::trace::Status::error(message.into()));
    }
}

/// A request's W3C trace context (`traceparent`, every `tracestate` header), or `None` when
/// it has no valid `traceparent`: a malformed one is ignored, never refused.
pub fn incoming(headers: &http::HeaderMap) -> Option<TraceContext> {
    let parent = headers.get("traceparent")?;
    TraceContext::from_headers(Some(parent.as_bytes()), headers.get_all("tracestate").iter().map(|v| v.as_bytes()))
}
