//! The floor of any proxy built on hyper, as a contender of the proxy benchmark.
//!
//! labforge's proxy is hyper's HTTP/1 server in front of hyper's HTTP/1 client with routing,
//! authorization and header rewriting between them. This contender keeps only the two hyper
//! halves and forwards the request as it came: the same serving threads as labforge (one
//! current-thread runtime and `SO_REUSEPORT` listener per CPU), and one upstream connection per
//! client connection, opened with it and used for each of its requests in turn, so that there is
//! not even a pool to look in. What it costs per request is what hyper and tokio cost; whatever
//! labforge costs beyond it is labforge's own.
//!
//! It runs in its own process (the bench binary started again with `--hyper-floor`), so that its
//! CPU time is read apart from the upstream's, as every contender's is.

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::Mutex;

/// `--hyper-floor <listen> <upstream>`: serves until killed.
pub fn run(listen: SocketAddr, upstream: SocketAddr) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let serving: Vec<_> = (0..threads)
        .map(|_| {
            let listener = reuse_port_listener(listen);
            std::thread::spawn(move || serve(listener, upstream))
        })
        .collect();
    for thread in serving {
        let _ = thread.join();
    }
}

fn reuse_port_listener(addr: SocketAddr) -> std::net::TcpListener {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("hyper floor: socket");
    socket.set_reuse_port(true).expect("SO_REUSEPORT");
    socket.bind(&addr.into()).expect("hyper floor: bind");
    socket.listen(4096).expect("hyper floor: listen");
    socket.into()
}

fn serve(listener: std::net::TcpListener, upstream: SocketAddr) {
    crate::serve_each_connection(listener, move |stream| async move {
        let Some(sender) = connect(upstream).await else {
            return;
        };
        let sender = Arc::new(Mutex::new(sender));
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let sender = sender.clone();
            async move {
                let mut sender = sender.lock().await;
                sender.ready().await?;
                let response = sender.send_request(request).await?;
                Ok::<_, hyper::Error>(response)
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
}

async fn connect(upstream: SocketAddr) -> Option<SendRequest<Incoming>> {
    let stream = tokio::net::TcpStream::connect(upstream).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(sender)
}
