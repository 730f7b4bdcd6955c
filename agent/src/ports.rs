//! A web server the user runs in the notebook, reached from labforge's proxy through this agent
//! (started by exec, as for SSH): `ports` lists what listens, `connect` carries one connection.
//! No port is published and the notebook's network is not opened: the bytes ride the exec.

use std::collections::BTreeSet;
use std::io::Write as _;

/// What `connect` writes before the connection's bytes: the reader knows then whether it got a
/// connection or why not.
pub const CONNECTED: &str = "ok";

/// TCP ports something listens on, from `/proc/net/tcp` and `/proc/net/tcp6` (the container's
/// own network namespace).
pub fn listening() -> BTreeSet<u16> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|table| listening_in(&table))
        .collect()
}

/// The local ports of the sockets in state LISTEN (`0A`) of one `/proc/net/tcp*` table.
pub fn listening_in(table: &str) -> BTreeSet<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            let port = local.rsplit(':').next()?;
            (state == "0A")
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// Prints [`listening`] as a JSON array.
pub fn print_listening() -> Result<(), String> {
    let ports: Vec<u16> = listening().into_iter().collect();
    let json = serde_json::to_string(&ports).map_err(|e| e.to_string())?;
    println!("{json}");
    Ok(())
}

/// Connects to `port` on this container's loopback (IPv4, then IPv6), says [`CONNECTED`] and
/// carries bytes between the connection and stdin/stdout until either side ends.
pub fn connect(port: &str) -> Result<(), String> {
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{port:?} is not a TCP port"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting: {e}"))?;
    runtime.block_on(async move {
        let stream = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(stream) => stream,
            Err(v4) => tokio::net::TcpStream::connect(("::1", port))
                .await
                .map_err(|_| format!("nothing listens on port {port} in the notebook ({v4})"))?,
        };
        let _ = stream.set_nodelay(true);
        let mut stdout = tokio::io::stdout();
        {
            let mut said = Vec::new();
            let _ = writeln!(said, "{CONNECTED}");
            tokio::io::AsyncWriteExt::write_all(&mut stdout, &said)
                .await
                .map_err(|e| e.to_string())?;
            tokio::io::AsyncWriteExt::flush(&mut stdout)
                .await
                .map_err(|e| e.to_string())?;
        }
        let mut local = tokio::io::join(tokio::io::stdin(), stdout);
        let mut stream = stream;
        // Either side closing ends it: the proxy drops the exec when its client goes.
        let _ = tokio::io::copy_bidirectional(&mut local, &mut stream).await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listening_sockets_are_listed() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:22B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000  1000        0 3 1 0000000000000000 20 4 30 10 -1
";
        assert_eq!(listening_in(table), BTreeSet::from([8888, 8080]));
        let v6 = "  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:1F92 00000000000000000000000000000000:0000 0A 00000000:00000000";
        assert_eq!(listening_in(v6), BTreeSet::from([8082]));
        assert!(listening_in("garbage\nnot a table").is_empty());
    }
}
