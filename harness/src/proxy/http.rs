//! Just enough HTTP/1.1 to find where a message ends.
//!
//! The proxy forwards bytes as they came and answers with bytes it chose, so it only
//! parses heads (with `httparse`) and follows body framing: `Content-Length`,
//! `Transfer-Encoding: chunked`, or (responses only) until the connection closes.
//! Nothing is rewritten, so headers reach each side exactly as sent.

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest head accepted (request line or status line plus headers).
const MAX_HEAD: usize = 64 * 1024;

/// Largest chunk-size or trailer line.
const MAX_LINE: usize = 8 * 1024;

/// Most headers parsed in one head.
const MAX_HEADERS: usize = 128;

/// Largest request body the proxy buffers (Sluice's batches are a few MiB).
pub(crate) const MAX_REQUEST_BODY: u64 = 512 * 1024 * 1024;

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Until the peer closes (a response with neither length nor chunking).
    UntilClose,
}

/// A parsed request head, with its raw bytes for forwarding.
#[derive(Debug)]
pub(crate) struct RequestHead {
    pub raw: Vec<u8>,
    pub method: String,
    pub uri: String,
    pub headers: Vec<(String, String)>,
    pub framing: Framing,
    pub keep_alive: bool,
    pub expect_continue: bool,
}

/// A parsed response head, with its raw bytes for copying back.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub raw: Vec<u8>,
    pub status: u16,
    pub framing: Framing,
    pub keep_alive: bool,
}

/// A request body as read: the bytes as they came (still chunked, if they were), and
/// decoded for matching and logging.
#[derive(Debug, Default)]
pub(crate) struct Body {
    pub raw: Vec<u8>,
    pub decoded: Vec<u8>,
}

/// Reads one head (through the blank line). `None` if the peer closed before sending a
/// byte: the normal end of a keep-alive connection.
pub(crate) async fn read_head<R>(reader: &mut R) -> Result<Option<Vec<u8>>>
where
    R: AsyncBufRead + Unpin,
{
    let mut head = Vec::new();
    loop {
        let line_start = head.len();
        let read = read_line(reader, &mut head, MAX_HEAD).await?;
        if read == 0 {
            if head.is_empty() {
                return Ok(None);
            }
            bail!("connection closed in the middle of a head");
        }
        let line = &head[line_start..];
        // Tolerate blank lines before a request line (RFC 9112 §2.2).
        if line_start == 0 && (line == b"\r\n" || line == b"\n") {
            head.clear();
            continue;
        }
        if line == b"\r\n" || line == b"\n" {
            return Ok(Some(head));
        }
    }
}

/// Appends one line (through `\n`) to `buf`; `limit` bounds `buf`'s total length.
async fn read_line<R>(reader: &mut R, buf: &mut Vec<u8>, limit: usize) -> Result<usize>
where
    R: AsyncBufRead + Unpin,
{
    let mut read = 0;
    loop {
        let available = reader.fill_buf().await.context("reading")?;
        if available.is_empty() {
            return Ok(read);
        }
        let (taken, done) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        if buf.len() + taken > limit {
            bail!("line or head longer than {limit} bytes");
        }
        buf.extend_from_slice(&available[..taken]);
        reader.consume(taken);
        read += taken;
        if done {
            return Ok(read);
        }
    }
}

pub(crate) fn parse_request(raw: Vec<u8>) -> Result<RequestHead> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut slots);
    match request.parse(&raw).context("parsing a request head")? {
        httparse::Status::Complete(_) => {}
        httparse::Status::Partial => bail!("incomplete request head"),
    }
    let method = request.method.unwrap_or_default().to_owned();
    let uri = request.path.unwrap_or_default().to_owned();
    let http10 = request.version == Some(0);
    let headers = owned_headers(request.headers);
    let framing = if is_chunked(&headers)? {
        Framing::Chunked
    } else {
        match content_length(&headers)? {
            Some(0) | None => Framing::Empty,
            Some(length) => Framing::Length(length),
        }
    };
    let keep_alive = keeps_alive(&headers, http10);
    let expect_continue =
        header(&headers, "expect").is_some_and(|value| value.eq_ignore_ascii_case("100-continue"));
    Ok(RequestHead {
        raw,
        method,
        uri,
        headers,
        framing,
        keep_alive,
        expect_continue,
    })
}

/// Parses a response head; `method` is the request's (a HEAD answer has no body).
pub(crate) fn parse_response(raw: Vec<u8>, method: &str) -> Result<ResponseHead> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    match response.parse(&raw).context("parsing a response head")? {
        httparse::Status::Complete(_) => {}
        httparse::Status::Partial => bail!("incomplete response head"),
    }
    let status = response.code.unwrap_or_default();
    let http10 = response.version == Some(0);
    let headers = owned_headers(response.headers);
    let framing = if method.eq_ignore_ascii_case("HEAD")
        || (100..200).contains(&status)
        || status == 204
        || status == 304
    {
        Framing::Empty
    } else if is_chunked(&headers)? {
        Framing::Chunked
    } else {
        match content_length(&headers)? {
            Some(0) => Framing::Empty,
            Some(length) => Framing::Length(length),
            None => Framing::UntilClose,
        }
    };
    let keep_alive = framing != Framing::UntilClose && keeps_alive(&headers, http10);
    Ok(ResponseHead {
        raw,
        status,
        framing,
        keep_alive,
    })
}

fn owned_headers(headers: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).trim().to_owned(),
            )
        })
        .collect()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

fn is_chunked(headers: &[(String, String)]) -> Result<bool> {
    let Some(encoding) = header(headers, "transfer-encoding") else {
        return Ok(false);
    };
    let last = encoding.rsplit(',').next().unwrap_or_default().trim();
    if last.eq_ignore_ascii_case("chunked") {
        Ok(true)
    } else {
        bail!("unsupported Transfer-Encoding: {encoding}")
    }
}

fn content_length(headers: &[(String, String)]) -> Result<Option<u64>> {
    header(headers, "content-length")
        .map(|value| {
            value
                .parse()
                .with_context(|| format!("bad Content-Length: {value:?}"))
        })
        .transpose()
}

fn keeps_alive(headers: &[(String, String)], http10: bool) -> bool {
    let connection = header(headers, "connection").unwrap_or_default();
    let says = |word: &str| {
        connection
            .split(',')
            .any(|token| token.trim().eq_ignore_ascii_case(word))
    };
    if http10 {
        says("keep-alive")
    } else {
        !says("close")
    }
}

/// Reads a whole request body.
pub(crate) async fn read_body<R>(reader: &mut R, framing: Framing) -> Result<Body>
where
    R: AsyncBufRead + Unpin,
{
    let mut body = Body::default();
    match framing {
        Framing::Empty => {}
        Framing::Length(length) => {
            if length > MAX_REQUEST_BODY {
                bail!("request body of {length} bytes is over the proxy's limit");
            }
            let mut data = Vec::new();
            (&mut *reader)
                .take(length)
                .read_to_end(&mut data)
                .await
                .context("reading a request body")?;
            if data.len() as u64 != length {
                bail!(
                    "connection closed after {} of {length} body bytes",
                    data.len()
                );
            }
            body.decoded.clone_from(&data);
            body.raw = data;
        }
        Framing::Chunked => {
            copy_chunked(reader, &mut body.raw, Some(&mut body.decoded)).await?;
        }
        Framing::UntilClose => bail!("a request body cannot be delimited by close"),
    }
    Ok(body)
}

/// Reads at most `limit` body bytes (for a reset in the middle of a request).
pub(crate) async fn read_some_body<R>(reader: &mut R, limit: u64) -> Vec<u8>
where
    R: AsyncBufRead + Unpin,
{
    let mut data = Vec::new();
    // Whatever arrives is fine, including nothing: the connection is reset next.
    let _ = (&mut *reader).take(limit).read_to_end(&mut data).await;
    data
}

/// Copies a response body from `reader` to `writer` as it arrives.
pub(crate) async fn copy_body<R, W>(reader: &mut R, writer: &mut W, framing: Framing) -> Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match framing {
        Framing::Empty => {}
        Framing::Length(length) => {
            let copied = tokio::io::copy(&mut (&mut *reader).take(length), writer)
                .await
                .context("copying a response body")?;
            if copied != length {
                bail!("upstream closed after {copied} of {length} body bytes");
            }
        }
        Framing::Chunked => copy_chunked(reader, writer, None).await?,
        Framing::UntilClose => {
            tokio::io::copy(reader, writer)
                .await
                .context("copying a response body")?;
        }
    }
    writer.flush().await.context("flushing a response body")?;
    Ok(())
}

/// Copies a chunked body through its last chunk and trailers, byte for byte, to `raw`;
/// also collects the chunk data into `decoded` when given.
async fn copy_chunked<R, W>(
    reader: &mut R,
    raw: &mut W,
    mut decoded: Option<&mut Vec<u8>>,
) -> Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut total: u64 = 0;
    loop {
        let mut line = Vec::new();
        if read_line(reader, &mut line, MAX_LINE).await? == 0 {
            bail!("connection closed before the last chunk");
        }
        raw.write_all(&line).await.context("writing a chunk size")?;
        let text = String::from_utf8_lossy(&line);
        let size_text = text.split(';').next().unwrap_or_default().trim();
        let size = u64::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size line: {text:?}"))?;
        if size == 0 {
            break;
        }
        total += size;
        if decoded.is_some() && total > MAX_REQUEST_BODY {
            bail!("chunked request body is over the proxy's limit");
        }
        let mut remaining = size;
        let mut buf = vec![0u8; 16 * 1024];
        while remaining > 0 {
            let want = usize::try_from(remaining.min(buf.len() as u64)).unwrap_or(buf.len());
            let n = reader
                .read(&mut buf[..want])
                .await
                .context("reading a chunk")?;
            if n == 0 {
                bail!("connection closed inside a chunk");
            }
            raw.write_all(&buf[..n]).await.context("writing a chunk")?;
            if let Some(decoded) = decoded.as_deref_mut() {
                decoded.extend_from_slice(&buf[..n]);
            }
            remaining -= n as u64;
        }
        let mut crlf = Vec::new();
        read_line(reader, &mut crlf, MAX_LINE).await?;
        if crlf != b"\r\n" && crlf != b"\n" {
            bail!("chunk not followed by CRLF");
        }
        raw.write_all(&crlf).await.context("writing a chunk end")?;
    }
    // Trailers, then the blank line that ends the body.
    loop {
        let mut line = Vec::new();
        if read_line(reader, &mut line, MAX_LINE).await? == 0 {
            bail!("connection closed inside chunked trailers");
        }
        raw.write_all(&line).await.context("writing trailers")?;
        if line == b"\r\n" || line == b"\n" {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_a_chunked_request_and_keeps_the_raw_bytes() -> Result<()> {
        let wire: &[u8] =
            b"POST /?query=INSERT HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
                            5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: t\r\n\r\nNEXT";
        let mut reader = tokio::io::BufReader::new(wire);
        let head = read_head(&mut reader).await?.context("a head")?;
        let head = parse_request(head)?;
        assert_eq!(head.method, "POST");
        assert_eq!(head.framing, Framing::Chunked);
        assert!(head.keep_alive);
        let body = read_body(&mut reader, head.framing).await?;
        assert_eq!(body.decoded, b"hello world");
        assert!(body.raw.starts_with(b"5\r\nhello"));
        assert!(body.raw.ends_with(b"Trailer: t\r\n\r\n"));
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await?;
        assert_eq!(rest, b"NEXT");
        Ok(())
    }

    #[tokio::test]
    async fn frames_responses() -> Result<()> {
        let head = parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n".to_vec(),
            "GET",
        )?;
        assert_eq!(head.framing, Framing::Length(3));
        assert!(head.keep_alive);
        let head = parse_response(b"HTTP/1.1 200 OK\r\n\r\n".to_vec(), "GET")?;
        assert_eq!(head.framing, Framing::UntilClose);
        assert!(!head.keep_alive);
        let head = parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n".to_vec(),
            "HEAD",
        )?;
        assert_eq!(head.framing, Framing::Empty);
        let head = parse_request(b"GET / HTTP/1.0\r\n\r\n".to_vec())?;
        assert!(!head.keep_alive);
        assert_eq!(
            read_head(&mut tokio::io::BufReader::new(&b""[..])).await?,
            None
        );
        Ok(())
    }
}
