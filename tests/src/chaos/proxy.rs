//! A TCP proxy between the workers and a lock server that can add latency, blackhole traffic
//! (stop forwarding without closing, like a partition; data flows again when healed) and drop
//! every open connection. It runs on its own thread and tokio runtime in the coordinator.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does to traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Every chunk is delivered this much later.
    Latency(Duration),
    /// Nothing is forwarded (connections stay open) until the mode changes.
    Blackhole,
}

/// A running proxy; stops with the coordinator.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    mode: watch::Sender<Mode>,
    /// Bumped to drop every open connection.
    generation: watch::Sender<u64>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port forwarding to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Result<Proxy, String> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| format!("binding the proxy: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("proxy address: {e}"))?
            .port();
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("proxy socket: {e}"))?;
        let (mode, mode_rx) = watch::channel(Mode::Normal);
        let (generation, generation_rx) = watch::channel(0_u64);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("proxy runtime: {e}"))?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else {
                    return;
                };
                let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, upstream));
                while let Ok((client, _)) = listener.accept().await {
                    let _ = client.set_nodelay(true);
                    tokio::spawn(serve(
                        client,
                        upstream,
                        mode_rx.clone(),
                        generation_rx.clone(),
                    ));
                }
            });
        });
        Ok(Proxy {
            port,
            mode,
            generation,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Closes every connection open now (new ones are accepted as usual).
    pub fn drop_connections(&self) {
        self.generation.send_modify(|g| *g += 1);
    }
}

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    mut generation: watch::Receiver<u64>,
) {
    generation.mark_unchanged();
    // A blackholed network does not let a new connection through either.
    if mode.wait_for(|m| *m != Mode::Blackhole).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = pump(client_read, server_write, mode.clone()) => {}
        () = pump(server_read, client_write, mode.clone()) => {}
        _ = generation.changed() => {}
    }
}

/// Forwards one direction until either side closes: reads unless blackholed, and delivers each
/// chunk once its latency has passed (in order).
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0_u8; 16 * 1024];
        loop {
            let Ok(current) = mode.wait_for(|m| *m != Mode::Blackhole).await.map(|m| *m) else {
                return;
            };
            let n = tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                // Re-check the mode (e.g. blackholed while waiting for data).
                _ = mode.changed() => continue,
            };
            let delay = match current {
                Mode::Latency(d) => d,
                _ => Duration::ZERO,
            };
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    tokio::select! {
        () = writer => {}
        () = reader => {}
    }
}
