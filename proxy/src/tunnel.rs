//! A websocket tunnel: bytes both ways as they come, never buffered or re-framed. The one thing
//! it adds: when the notebook's server goes away without closing (killed, crashed, its container
//! removed), the client gets a close frame (1001, going away) rather than a reset, so that
//! JupyterLab and code-server tell their user and reconnect instead of hanging on a dead socket.
//! To add it without cutting into a frame, the server's side is followed frame by frame
//! (RFC 6455 §5.2: only the headers are read, payloads are counted past).

use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// How long the client's side may keep sending once the server's side has ended.
const CLIENT_GRACE: Duration = Duration::from_secs(5);

/// The longest frame header: two bytes, an 8-byte length, a 4-byte mask.
const MAX_HEADER: usize = 14;

/// Where the server-to-client byte stream is among its frames.
#[derive(Debug)]
pub(crate) struct ServerFrames {
    header: [u8; MAX_HEADER],
    /// Header bytes of the next frame seen so far.
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    payload_left: u64,
    /// The server sent a close frame (its own goodbye: nothing is added).
    closed: bool,
}

impl Default for ServerFrames {
    fn default() -> Self {
        Self {
            header: [0; MAX_HEADER],
            header_len: 0,
            payload_left: 0,
            closed: false,
        }
    }
}

impl ServerFrames {
    /// Follows `bytes`, the next the server sent.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let take = usize::try_from(self.payload_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.payload_left -= take as u64;
                bytes = &bytes[take..];
                continue;
            }
            self.header[self.header_len] = bytes[0];
            self.header_len += 1;
            bytes = &bytes[1..];
            if let Some((opcode, payload)) = complete_header(&self.header[..self.header_len]) {
                self.closed |= opcode == CLOSE_OPCODE;
                self.payload_left = payload;
                self.header_len = 0;
            }
        }
    }

    /// Between two frames: a frame may be added here.
    pub(crate) fn at_boundary(&self) -> bool {
        self.header_len == 0 && self.payload_left == 0
    }

    pub(crate) fn closed(&self) -> bool {
        self.closed
    }
}

const CLOSE_OPCODE: u8 = 0x8;

/// The opcode and payload length of a frame whose header is `bytes`, once it is whole.
fn complete_header(bytes: &[u8]) -> Option<(u8, u64)> {
    let [first, second, rest @ ..] = bytes else {
        return None;
    };
    let length_bytes = match second & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask_bytes = if second & 0x80 != 0 { 4 } else { 0 };
    if rest.len() < length_bytes + mask_bytes {
        return None;
    }
    let payload = match length_bytes {
        0 => u64::from(second & 0x7f),
        _ => rest[..length_bytes]
            .iter()
            .fold(0u64, |n, b| (n << 8) | u64::from(*b)),
    };
    Some((first & 0x0f, payload))
}

/// A close frame with code 1001 (going away) and the reason the client is shown.
fn going_away_frame() -> Vec<u8> {
    use tungstenite::protocol::frame::coding::CloseCode;
    use tungstenite::protocol::frame::{CloseFrame, Frame};
    let frame = Frame::close(Some(CloseFrame {
        code: CloseCode::Away,
        reason: "the notebook's server went away".into(),
    }));
    let mut bytes = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = frame.format(&mut bytes);
    bytes
}

/// Relays `client` and `upstream` both ways until both are done, or one side fails. For a
/// `websocket` upgrade, when the server's side ends without a close frame of its own, the
/// client gets one; the client may then send its goodbye for [`CLIENT_GRACE`]. Other upgrades'
/// bytes are relayed and nothing is added.
pub(crate) async fn tunnel<C, U>(client: C, upstream: U, websocket: bool) -> std::io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut upstream_read, mut upstream_write) = tokio::io::split(upstream);
    let to_upstream = async {
        let copied = tokio::io::copy(&mut client_read, &mut upstream_write).await;
        let _ = upstream_write.shutdown().await;
        copied.map(drop)
    };
    let to_client = async {
        let mut frames = ServerFrames::default();
        let mut buffer = vec![0u8; 16 * 1024];
        let ended = loop {
            match upstream_read.read(&mut buffer).await {
                Ok(0) => break Ok(()),
                Ok(read) => {
                    if websocket {
                        frames.feed(&buffer[..read]);
                    }
                    // Flushed at once: a TLS stream may hold written bytes back otherwise.
                    client_write.write_all(&buffer[..read]).await?;
                    client_write.flush().await?;
                }
                Err(error) => break Err(error),
            }
        };
        if websocket && !frames.closed() && frames.at_boundary() {
            let _ = client_write.write_all(&going_away_frame()).await;
        }
        let _ = client_write.shutdown().await;
        ended
    };
    tokio::pin!(to_upstream, to_client);
    tokio::select! {
        ended = &mut to_client => {
            let _ = tokio::time::timeout(CLIENT_GRACE, to_upstream).await;
            ended
        }
        sent = &mut to_upstream => match sent {
            // The client is done sending; what the server still has goes on to it.
            Ok(()) => to_client.await,
            // The server stopped taking bytes (it went away): its side ends soon, and the
            // client still gets its close frame.
            Err(error) => {
                let _ = tokio::time::timeout(CLIENT_GRACE, to_client).await;
                Err(error)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's frame (unmasked) with `opcode` and `payload`.
    fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => bytes.push(n as u8),
            n if n <= 0xffff => {
                bytes.push(126);
                bytes.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                bytes.push(127);
                bytes.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn frames_are_followed_across_any_split_of_the_stream() {
        let stream: Vec<u8> = [
            frame(0x1, b"hello"),
            frame(0x2, &[7; 300]),
            frame(0x2, &vec![1; 70_000]),
            frame(0x9, b""),
        ]
        .concat();
        for chunk in [1, 2, 3, 7, 126, 4096, stream.len()] {
            let mut frames = ServerFrames::default();
            for (i, piece) in stream.chunks(chunk).enumerate() {
                frames.feed(piece);
                let end = (i + 1) * chunk >= stream.len();
                assert!(!end || frames.at_boundary(), "chunks of {chunk}");
            }
            assert!(!frames.closed());
        }
        // Inside a frame, or inside a header: no boundary.
        let mut frames = ServerFrames::default();
        frames.feed(&stream[..3]);
        assert!(!frames.at_boundary());
        let mut frames = ServerFrames::default();
        frames.feed(&frame(0x2, &[0; 200])[..2]);
        assert!(!frames.at_boundary());
    }

    #[test]
    fn a_close_from_the_server_is_seen() {
        let mut frames = ServerFrames::default();
        frames.feed(&frame(0x1, b"bye"));
        frames.feed(&frame(CLOSE_OPCODE, &[0x03, 0xe8]));
        assert!(frames.closed() && frames.at_boundary());
    }

    #[tokio::test]
    async fn a_server_that_vanishes_leaves_its_client_a_close_frame() {
        let (client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (upstream, mut server) = tokio::io::duplex(64 * 1024);
        let relaying = tokio::spawn(tunnel(client, upstream, true));
        server.write_all(&frame(0x1, b"first")).await.unwrap();
        // Then the server is gone without a close frame.
        drop(server);
        let mut got = Vec::new();
        client_peer.read_to_end(&mut got).await.unwrap();
        let mut expected = frame(0x1, b"first");
        expected.extend(going_away_frame());
        assert_eq!(got, expected);
        drop(client_peer);
        relaying.await.unwrap().unwrap();

        // A server cut off inside a frame: the client gets what came, and no frame after it.
        let (client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (upstream, mut server) = tokio::io::duplex(64 * 1024);
        let relaying = tokio::spawn(tunnel(client, upstream, true));
        let partial = &frame(0x2, &[9; 100])[..50];
        server.write_all(partial).await.unwrap();
        drop(server);
        let mut got = Vec::new();
        client_peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, partial);
        drop(client_peer);
        relaying.await.unwrap().unwrap();
    }
}
