//! A TCP relay in front of a real service that can cut connections part-way, or go silent, for
//! fault tests ("the registry went away, or hung, in the middle of an upload").

use crate::tools::SupportError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct FaultyRelay {
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct State {
    /// While set, client bytes beyond `budget` kill the connection and new ones are closed.
    failing: AtomicBool,
    budget: AtomicU64,
    forwarded: AtomicU64,
    /// Heal after the first cut.
    once: AtomicBool,
    /// Once broken, hold connections open in silence instead of cutting them.
    silent: AtomicBool,
    cuts: AtomicU64,
}

impl FaultyRelay {
    /// Relays 127.0.0.1:<free port> to `upstream`, healthy until [`FaultyRelay::fail_after`].
    pub async fn start(upstream: SocketAddr) -> Result<Self, SupportError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| SupportError::Start {
                service: "faulty relay",
                detail: e.to_string(),
            })?;
        let addr = listener.local_addr().map_err(|e| SupportError::Start {
            service: "faulty relay",
            detail: e.to_string(),
        })?;
        let state = Arc::new(State::default());
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let state = Arc::clone(&shared);
                tokio::spawn(relay(client, upstream, state));
            }
        });
        Ok(Self { addr, state, task })
    }

    /// `127.0.0.1:PORT` of the relay.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// From now on, once `bytes` more bytes went upstream, every connection is cut and new ones
    /// are dropped, until [`FaultyRelay::heal`].
    pub fn fail_after(&self, bytes: u64) {
        self.state.forwarded.store(0, Ordering::SeqCst);
        self.state.budget.store(bytes, Ordering::SeqCst);
        self.state.failing.store(true, Ordering::SeqCst);
    }

    /// Cuts the connection that carries the next `bytes` bytes upstream, and only that one: the
    /// relay is healthy again at once, as after a dropped connection the next attempt succeeds.
    pub fn cut_once_after(&self, bytes: u64) {
        self.state.once.store(true, Ordering::SeqCst);
        self.fail_after(bytes);
    }

    /// From now on, once `bytes` more bytes went upstream, the relay goes silent as a hung
    /// service does: nothing more is forwarded either way, nothing is closed, and new connections
    /// are accepted and never answered, until [`FaultyRelay::heal`].
    pub fn stall_after(&self, bytes: u64) {
        self.state.silent.store(true, Ordering::SeqCst);
        self.fail_after(bytes);
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> u64 {
        self.state.cuts.load(Ordering::SeqCst)
    }

    pub fn heal(&self) {
        self.state.failing.store(false, Ordering::SeqCst);
        self.state.silent.store(false, Ordering::SeqCst);
    }
}

impl Drop for FaultyRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl State {
    fn broken(&self) -> bool {
        self.failing.load(Ordering::SeqCst)
            && self.forwarded.load(Ordering::SeqCst) >= self.budget.load(Ordering::SeqCst)
    }

    fn silent(&self) -> bool {
        self.silent.load(Ordering::SeqCst) && self.broken()
    }
}

/// Keeps a connection open and says nothing, for as long as the test runs.
async fn hang(_connection: impl Send) {
    std::future::pending::<()>().await
}

async fn relay(client: TcpStream, upstream: SocketAddr, state: Arc<State>) {
    if state.silent() {
        return hang(client).await;
    }
    if state.broken() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up_state = Arc::clone(&state);
    let upload = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            up_state.forwarded.fetch_add(n as u64, Ordering::SeqCst);
            if up_state.silent() {
                return hang(client_read).await;
            }
            if up_state.broken() {
                up_state.cuts.fetch_add(1, Ordering::SeqCst);
                if up_state.once.swap(false, Ordering::SeqCst) {
                    up_state.failing.store(false, Ordering::SeqCst);
                }
                return;
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down_state = Arc::clone(&state);
    let download = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let read = server_read.read(&mut buf).await;
            // Silent means silent: not even the service's own close gets through.
            if down_state.silent() {
                return hang(client_write).await;
            }
            let n = match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever side ends (or is cut) ends the connection.
    tokio::select! {
        () = upload => {}
        () = download => {}
    }
}
