//! One client connection: read each request, ask the script what to do, do it.
//!
//! Requests on one keep-alive connection are handled in turn, each with its own mode,
//! so "answer 503 twice, then pass through" works on a client that reuses its
//! connection. A passed-through request goes to the upstream on a fresh connection and
//! its answer is copied back byte for byte; the client's connection stays open.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::control::Shared;
use super::http::{self, Body, Framing, RequestHead};
use super::mode::{reason_phrase, Mode, Respond};
use super::record::{RequestRecord, BODY_PREFIX_BYTES};
use super::socket;

/// How long connecting to the upstream may take before the client is reset.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a reset waits for part of the body to arrive.
const PARTIAL_READ_TIMEOUT: Duration = Duration::from_millis(200);

/// The most body bytes a reset reads before resetting.
const PARTIAL_READ_LIMIT: u64 = 64 * 1024;

type Client = BufReader<TcpStream>;

/// How a connection ends.
enum End {
    /// Close cleanly (FIN).
    Close,
    /// Reset (RST).
    Reset,
    /// Keep the socket open without answering until the client leaves.
    Stall,
}

/// After one request: go on, or end the connection.
enum Next {
    KeepAlive,
    End(End),
}

/// Serves one accepted connection until it ends or the proxy resets every connection.
pub(crate) async fn serve(stream: TcpStream, shared: Arc<Shared>, upstream: SocketAddr, id: u64) {
    let _ = stream.set_nodelay(true);
    let mut reset_signal = shared.reset_all.subscribe();
    let mut client = BufReader::new(stream);
    let end = tokio::select! {
        end = serve_requests(&mut client, &shared, upstream, id) => end,
        _ = reset_signal.changed() => End::Reset,
    };
    match end {
        End::Close => {
            let _ = client.get_mut().shutdown().await;
        }
        End::Reset => socket::reset(client.into_inner()),
        End::Stall => {
            tokio::select! {
                () = drain_until_closed(&mut client) => {}
                _ = reset_signal.changed() => socket::reset(client.into_inner()),
            }
        }
    }
}

async fn serve_requests(
    client: &mut Client,
    shared: &Shared,
    upstream: SocketAddr,
    id: u64,
) -> End {
    loop {
        match serve_one(client, shared, upstream, id).await {
            Ok(Next::KeepAlive) => {}
            Ok(Next::End(end)) => return end,
            Err(error) => {
                tracing::debug!(connection = id, error = %format!("{error:#}"), "proxy connection failed");
                return End::Reset;
            }
        }
    }
}

async fn serve_one(
    client: &mut Client,
    shared: &Shared,
    upstream: SocketAddr,
    id: u64,
) -> Result<Next> {
    let Some(raw) = http::read_head(client).await? else {
        return Ok(Next::End(End::Close));
    };
    let head = http::parse_request(raw)?;
    let query = head.uri.split_once('?').map(|(_, query)| query.to_owned());

    let mut body = if shared.needs_body() {
        Some(read_full_body(client, &head).await?)
    } else {
        None
    };
    let decision = shared.decide(
        query.as_deref(),
        body.as_ref().map(|b| b.decoded.as_slice()),
    );
    let action = match decision.rule {
        Some(index) => format!("rule {index}: {}", decision.mode.describe()),
        None => decision.mode.describe(),
    };
    let record = |body: &[u8]| RequestRecord {
        seq: 0, // numbered by Shared::record
        connection: id,
        method: head.method.clone(),
        uri: head.uri.clone(),
        headers: head.headers.clone(),
        body_prefix: String::from_utf8_lossy(&body[..body.len().min(BODY_PREFIX_BYTES)])
            .into_owned(),
        body_len: body.len(),
        action: action.clone(),
        answered: false,
    };

    match decision.mode {
        Mode::Reset | Mode::Refuse => {
            let partial = match &body {
                Some(body) => body.decoded.clone(),
                None => read_partial_body(client, &head).await,
            };
            shared.record(record(&partial));
            Ok(Next::End(End::Reset))
        }
        Mode::Stall => {
            let body = ensure_body(client, &head, &mut body).await?;
            shared.record(record(&body.decoded));
            Ok(Next::End(End::Stall))
        }
        Mode::Respond(respond) => {
            let body = ensure_body(client, &head, &mut body).await?;
            shared.record(record(&body.decoded));
            write_response(client.get_mut(), &respond, head.keep_alive).await?;
            Ok(if head.keep_alive {
                Next::KeepAlive
            } else {
                Next::End(End::Close)
            })
        }
        mode @ (Mode::PassThrough | Mode::Delay(_)) => {
            let body = ensure_body(client, &head, &mut body).await?;
            let seq = shared.record(record(&body.decoded));
            if let Mode::Delay(by) = mode {
                tokio::time::sleep(by).await;
            }
            forward(
                client,
                &head,
                body,
                (shared, seq),
                upstream,
                Answer::CopyBack,
            )
            .await
        }
        Mode::AnswerLost => {
            let body = ensure_body(client, &head, &mut body).await?;
            let seq = shared.record(record(&body.decoded));
            forward(client, &head, body, (shared, seq), upstream, Answer::Lose).await
        }
    }
}

/// Reads the body unless a rule already made us read it.
async fn ensure_body<'a>(
    client: &mut Client,
    head: &RequestHead,
    body: &'a mut Option<Body>,
) -> Result<&'a Body> {
    if body.is_none() {
        *body = Some(read_full_body(client, head).await?);
    }
    body.as_ref().context("request body missing")
}

/// Reads the whole body, first telling a client that waits for it to go on.
async fn read_full_body(client: &mut Client, head: &RequestHead) -> Result<Body> {
    if head.expect_continue && head.framing != Framing::Empty {
        client
            .get_mut()
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .context("writing 100 Continue")?;
    }
    http::read_body(client, head.framing).await
}

/// Reads up to half of the body (whatever arrives quickly), for a reset mid-request.
async fn read_partial_body(client: &mut Client, head: &RequestHead) -> Vec<u8> {
    let limit = match head.framing {
        Framing::Empty | Framing::UntilClose => return Vec::new(),
        Framing::Length(length) => (length / 2).min(PARTIAL_READ_LIMIT),
        Framing::Chunked => PARTIAL_READ_LIMIT,
    };
    tokio::time::timeout(PARTIAL_READ_TIMEOUT, http::read_some_body(client, limit))
        .await
        .unwrap_or_default()
}

async fn write_response(client: &mut TcpStream, respond: &Respond, keep_alive: bool) -> Result<()> {
    let has = |name: &str| {
        respond
            .headers
            .iter()
            .any(|(key, _)| key.eq_ignore_ascii_case(name))
    };
    let mut head = format!(
        "HTTP/1.1 {} {}\r\n",
        respond.status,
        reason_phrase(respond.status)
    );
    for (name, value) in &respond.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !has("content-length") && !has("transfer-encoding") {
        head.push_str(&format!("Content-Length: {}\r\n", respond.body.len()));
    }
    if !keep_alive && !has("connection") {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    client
        .write_all(head.as_bytes())
        .await
        .context("writing a canned response head")?;
    client
        .write_all(&respond.body)
        .await
        .context("writing a canned response body")?;
    client.flush().await.context("flushing a canned response")?;
    Ok(())
}

/// Sends the request to the upstream on a fresh connection and copies the answer back.
/// Any failure on the way resets the client, as a dying server would.
/// What becomes of the upstream's answer to a forwarded request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    CopyBack,
    /// Read to its end (the upstream finished the request), then the client is reset.
    Lose,
}

async fn forward(
    client: &mut Client,
    head: &RequestHead,
    body: &Body,
    (shared, seq): (&Shared, u64),
    upstream: SocketAddr,
    answer: Answer,
) -> Result<Next> {
    let connected =
        tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream)).await;
    let server = match connected {
        Ok(Ok(server)) => server,
        Ok(Err(error)) => {
            tracing::debug!(%upstream, %error, "upstream unreachable; resetting the client");
            return Ok(Next::End(End::Reset));
        }
        Err(_) => {
            tracing::debug!(%upstream, "upstream connect timed out; resetting the client");
            return Ok(Next::End(End::Reset));
        }
    };
    let _ = server.set_nodelay(true);
    let mut server = BufReader::new(server);
    let writer = server.get_mut();
    writer
        .write_all(&head.raw)
        .await
        .context("forwarding a request head")?;
    writer
        .write_all(&body.raw)
        .await
        .context("forwarding a request body")?;
    writer
        .flush()
        .await
        .context("flushing a forwarded request")?;
    Shared::bump(&shared.forwarded);

    let response = loop {
        let raw = http::read_head(&mut server)
            .await?
            .context("the upstream closed without answering")?;
        let response = http::parse_response(raw, &head.method)?;
        // The proxy already told the client to continue; interim answers stop here.
        if (100..200).contains(&response.status) && response.status != 101 {
            continue;
        }
        break response;
    };
    shared.answered(seq);
    if answer == Answer::Lose {
        http::copy_body(&mut server, &mut tokio::io::sink(), response.framing).await?;
        return Ok(Next::End(End::Reset));
    }
    client
        .get_mut()
        .write_all(&response.raw)
        .await
        .context("copying a response head")?;
    http::copy_body(&mut server, client.get_mut(), response.framing).await?;
    Ok(if head.keep_alive && response.keep_alive {
        Next::KeepAlive
    } else {
        Next::End(End::Close)
    })
}

/// Reads and discards until the client closes (or fails).
async fn drain_until_closed(client: &mut Client) {
    let mut sink = [0u8; 4096];
    while let Ok(read) = client.read(&mut sink).await {
        if read == 0 {
            break;
        }
    }
}
