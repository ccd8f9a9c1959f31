//! The lingering close: how a connection ends after a response that left its request's body
//! unread (413 by the declared length, 401 or 415 before the body, any early refusal).
//!
//! Closing a socket while unread bytes sit in its receive buffer makes the kernel answer with
//! a reset instead of a FIN, and a client still sending its body loses the response in that
//! reset: Python's `urllib` writes the whole body before it reads anything and gets
//! `BrokenPipeError`, Node's `fetch` gets `EPIPE`. So, as nginx's `lingering_close` does, the
//! server sends the response and its FIN, then reads and throws away what the client still
//! sends until the client closes, or [`Lingering::max_bytes`] have been thrown away, or
//! [`Lingering::timeout`] has passed, whichever comes first; only then does it close.
//!
//! Nothing lingers after a body that was read to its end, nor after one that failed
//! (the body read timeout, a reset): a client too slow to send its body in time gets no
//! more time here.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The bounds of one lingering close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lingering {
    /// How long after the response the server keeps reading.
    pub timeout: Duration,
    /// How many bytes it reads and throws away at most.
    pub max_bytes: u64,
}

impl Lingering {
    fn enabled(&self) -> bool {
        !self.timeout.is_zero() && self.max_bytes > 0
    }
}

/// How far the service got with one request's body. The body sets it as it is read; the
/// service looks at it when the response is ready.
#[derive(Debug, Default)]
pub(crate) struct BodyRead(AtomicU8);

const UNREAD: u8 = 0;
const ENDED: u8 = 1;
const FAILED: u8 = 2;

impl BodyRead {
    pub(crate) fn ended(&self) {
        let _ = self.0.compare_exchange(UNREAD, ENDED, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The body cannot be read further (its deadline passed, the client reset): lingering
    /// would not help the client, and a slow one has had its time.
    pub(crate) fn failed(&self) {
        self.0.store(FAILED, Ordering::Relaxed);
    }

    /// Whether bytes of the body may still be on their way.
    pub(crate) fn left_unread(&self) -> bool {
        self.0.load(Ordering::Relaxed) == UNREAD
    }
}

/// Why a lingering close ended, for the debug log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The client closed its side (or reset): nothing was left to protect.
    ClientClosed,
    MaxBytes,
    Timeout,
}

enum State {
    Open,
    Draining { deadline: Pin<Box<tokio::time::Sleep>>, started: Instant, thrown_away: u64 },
    Closed,
}

/// A connection's socket as hyper sees it: reads and writes pass through; its shutdown,
/// which hyper asks for once the last response is flushed, is a lingering close when
/// [`LingeringStream::unread_body`] was set for that response.
pub(crate) struct LingeringStream {
    stream: TcpStream,
    /// Set by the service when a response goes out with its request's body unread (that
    /// response also says `Connection: close`, so it is the connection's last).
    unread_body: Arc<AtomicBool>,
    lingering: Lingering,
    state: State,
}

impl LingeringStream {
    pub(crate) fn new(stream: TcpStream, lingering: Lingering) -> LingeringStream {
        LingeringStream { stream, unread_body: Arc::new(AtomicBool::new(false)), lingering, state: State::Open }
    }

    pub(crate) fn unread_body(&self) -> Arc<AtomicBool> {
        self.unread_body.clone()
    }

    /// Reads and throws away until the client closes or a bound is reached.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<Ended> {
        let State::Draining { deadline, thrown_away, .. } = &mut self.state else { return Poll::Ready(Ended::ClientClosed) };
        let mut scratch = [0u8; 16 * 1024];
        loop {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ended::Timeout);
            }
            let room = (self.lingering.max_bytes - *thrown_away).min(scratch.len() as u64) as usize;
            let mut buf = ReadBuf::new(&mut scratch[..room]);
            match ready!(Pin::new(&mut self.stream).poll_read(cx, &mut buf)) {
                Err(_) => return Poll::Ready(Ended::ClientClosed),
                Ok(()) if buf.filled().is_empty() => return Poll::Ready(Ended::ClientClosed),
                Ok(()) => {
                    *thrown_away += buf.filled().len() as u64;
                    if *thrown_away >= self.lingering.max_bytes {
                        return Poll::Ready(Ended::MaxBytes);
                    }
                }
            }
        }
    }
}

impl AsyncRead for LingeringStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for LingeringStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    /// Sends the FIN (the response is complete), then lingers if a body was left unread.
    /// Returns once the connection may be closed without resetting the client.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &this.state {
                State::Open => {
                    ready!(Pin::new(&mut this.stream).poll_shutdown(cx))?;
                    if !(this.lingering.enabled() && this.unread_body.load(Ordering::Relaxed)) {
                        this.state = State::Closed;
                        return Poll::Ready(Ok(()));
                    }
                    this.state = State::Draining {
                        deadline: Box::pin(tokio::time::sleep(this.lingering.timeout)),
                        started: Instant::now(),
                        thrown_away: 0,
                    };
                }
                State::Draining { .. } => {
                    let ended = ready!(this.poll_drain(cx));
                    if let State::Draining { started, thrown_away, .. } = &this.state {
                        tracing::debug!(?ended, thrown_away, lingered_ms = started.elapsed().as_millis() as u64, "lingering close done");
                    }
                    this.state = State::Closed;
                    return Poll::Ready(Ok(()));
                }
                State::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The server of this crate with a router that refuses before reading, against a raw
    //! client that sends its whole body after the refusal has arrived. The API's own tests
    //! run real clients against the real API.

    use std::net::SocketAddr;

    use axum::http::StatusCode;
    use axum::routing::post;
    use axum::Router;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use crate::ServerLimits;

    use super::*;

    const GUARD: Duration = Duration::from_secs(20);

    async fn start(limits: ServerLimits) -> (SocketAddr, CancellationToken) {
        // Refuses without reading the body, as an auth check or a length check does.
        let router = Router::new().route("/refuse", post(|| async { (StatusCode::PAYLOAD_TOO_LARGE, "too large") })).route(
            "/read",
            post(|body: axum::body::Bytes| async move { body.len().to_string() }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(crate::serve_with(listener, router, limits, shutdown.clone()));
        (addr, shutdown)
    }

    /// Sends the headers, waits for the response to start (the server has refused early),
    /// then sends the whole body before reading on, as a client does that writes its body
    /// before it looks at the response (Python's urllib). Without lingering the server has
    /// closed by then, and the body's bytes are answered with a reset.
    async fn body_after_the_answer(addr: SocketAddr, path: &str, body_len: usize) -> io::Result<String> {
        let mut stream = TcpStream::connect(addr).await?;
        let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {body_len}\r\n\r\n");
        stream.write_all(head.as_bytes()).await?;
        let mut got = vec![0u8; 12];
        stream.read_exact(&mut got).await?;
        for chunk in vec![b'x'; body_len].chunks(64 * 1024) {
            stream.write_all(chunk).await?;
        }
        stream.read_to_end(&mut got).await?;
        Ok(String::from_utf8_lossy(&got).into_owned())
    }

    #[tokio::test]
    async fn a_refused_body_is_read_away_and_the_response_arrives() {
        let (addr, _shutdown) = start(ServerLimits::default()).await;
        for _ in 0..20 {
            let got = tokio::time::timeout(GUARD, body_after_the_answer(addr, "/refuse", 2 << 20)).await.expect("hung");
            let got = got.expect("the client lost the response");
            assert!(got.starts_with("HTTP/1.1 413"), "{got}");
            assert!(got.to_ascii_lowercase().contains("connection: close"), "{got}");
            assert!(got.ends_with("too large"), "{got}");
        }
        // A body read to its end leaves the connection alone (kept alive, no lingering).
        let mut stream = TcpStream::connect(addr).await.unwrap();
        for _ in 0..2 {
            stream.write_all(b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc").await.unwrap();
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(GUARD, stream.read(&mut buf)).await.expect("hung").unwrap();
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(text.starts_with("HTTP/1.1 200") && !text.contains("close"), "{text}");
        }
    }

    #[test]
    fn body_read_states() {
        let read = BodyRead::default();
        assert!(read.left_unread());
        read.ended();
        assert!(!read.left_unread());
        let failed = BodyRead::default();
        failed.failed();
        failed.ended();
        assert!(!failed.left_unread());
    }
}
