//! The little HTTP/1.1 the server needs, on std's sockets: requests with a `Content-Length` body, keep-alive,
//! whole responses and server-sent-event streams. No async runtime: every connection has a thread, and the
//! work is the model's anyway.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Request line plus headers.
const MAX_HEAD: usize = 32 * 1024;

pub struct Request {
    pub method: String,
    /// Without the query string.
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// HTTP/1.1 keeps the connection unless the client says `Connection: close`.
    pub fn keep_alive(&self) -> bool {
        !self.header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close"))
    }
}

pub enum ReadError {
    /// The client closed the connection (or went idle) between requests.
    Closed,
    /// Answer 400 with this message, then close.
    Bad(String),
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> Self {
        ReadError::Closed
    }
}

/// Reads one request. Bodies over `max_body` bytes are refused before they are read.
pub fn read_request(reader: &mut BufReader<TcpStream>, max_body: usize) -> Result<Request, ReadError> {
    let mut head = Vec::new();
    loop {
        let n = reader.by_ref().take((MAX_HEAD - head.len()) as u64 + 1).read_until(b'\n', &mut head)?;
        if n == 0 {
            return Err(if head.is_empty() { ReadError::Closed } else { ReadError::Bad("truncated request".into()) });
        }
        if head.len() > MAX_HEAD {
            return Err(ReadError::Bad(format!("request headers exceed {MAX_HEAD} bytes")));
        }
        if head == b"\r\n" || head == b"\n" {
            head.clear(); // tolerated blank lines before a request
            continue;
        }
        if head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n") {
            break;
        }
    }
    let head = String::from_utf8(head).map_err(|_| ReadError::Bad("request headers are not UTF-8".into()))?;
    let mut lines = head.lines();
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(ReadError::Bad(format!("malformed request line `{line}`")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(ReadError::Bad(format!("unsupported protocol `{version}`")));
    }
    let mut headers = Vec::new();
    for l in lines.filter(|l| !l.is_empty()) {
        let Some((k, v)) = l.split_once(':') else {
            return Err(ReadError::Bad(format!("malformed header line `{l}`")));
        };
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let mut req = Request {
        method: method.to_string(),
        path: target.split('?').next().unwrap_or_default().to_string(),
        headers,
        body: Vec::new(),
    };
    if req.header("transfer-encoding").is_some_and(|t| !t.eq_ignore_ascii_case("identity")) {
        return Err(ReadError::Bad("chunked request bodies are not supported; send a Content-Length".into()));
    }
    let len = match req.header("content-length") {
        None => 0,
        Some(v) => v.parse::<usize>().map_err(|_| ReadError::Bad(format!("invalid Content-Length `{v}`")))?,
    };
    if len > max_body {
        return Err(ReadError::Bad(format!("the request body has {len} bytes; the limit is {max_body}")));
    }
    if len > 0 && req.header("expect").is_some_and(|e| e.eq_ignore_ascii_case("100-continue")) {
        reader.get_mut().write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }
    req.body = vec![0; len];
    reader
        .read_exact(&mut req.body)
        .map_err(|_| ReadError::Bad("the request body is shorter than its Content-Length".into()))?;
    Ok(req)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Writes a whole response.
pub fn respond(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        reason(status),
        body.len(),
        if keep_alive { "keep-alive" } else { "close" }
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    stream.write_all(&out)?;
    stream.flush()
}

/// Starts a server-sent-event stream; the connection closes at its end.
pub fn start_events(stream: &mut TcpStream) -> io::Result<()> {
    stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )?;
    stream.flush()
}

pub fn event(stream: &mut TcpStream, data: &str) -> io::Result<()> {
    stream.write_all(format!("data: {data}\n\n").as_bytes())?;
    stream.flush()
}

/// Whether the client is still there: a closed socket reads as end-of-file (or an error) without blocking.
pub fn peer_alive(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut byte = [0u8; 1];
    let alive = match stream.peek(&mut byte) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    };
    alive && stream.set_nonblocking(false).is_ok()
}

/// Reads and drops what the client still sends (up to `limit` bytes, for a moment) after an error answer, so
/// that closing the socket does not reset the connection before the client has read the answer.
pub fn drain(stream: &mut TcpStream, limit: usize) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 16 * 1024];
    let mut total = 0;
    while total < limit {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
}

/// Idle keep-alive connections are closed after this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
