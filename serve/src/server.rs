//! A running HTTP server on its own tokio runtime, for the controller and the workers.
//!
//! Each [`Server`] owns the runtime its routes and background jobs run on, so dropping it stops
//! everything at once: connections close, heartbeats stop, in-flight requests are abandoned.
//! From its peers' point of view that is a crash, which is what the fault tests need; the CLI
//! simply never drops it ([`Server::run_forever`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use axum::Router;
use tokio::runtime::Runtime;

/// A server listening on `addr`, serving until dropped.
pub struct Server {
    addr: SocketAddr,
    runtime: Option<Runtime>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

impl Server {
    /// Binds `bind` (port 0 picks a free port), then serves the router `build` makes from the
    /// bound address, and runs the background jobs `build` returns on the same runtime.
    ///
    /// # Errors
    /// If the runtime cannot start or the address cannot be bound (e.g. the port is in use).
    pub(crate) fn start<F, J>(bind: SocketAddr, threads: usize, build: F) -> io::Result<Server>
    where
        F: FnOnce(SocketAddr) -> (Router, Vec<J>),
        J: Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .enable_all()
            .thread_name("agentry-serve")
            .build()?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(bind))
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {bind}: {e}")))?;
        let addr = listener.local_addr()?;
        let (router, jobs) = build(addr);
        runtime.spawn(async move {
            // An accept error other than a per-connection one ends the server; there is no one
            // to report it to but the log.
            // Small writes (stream chunks, short replies) go out at once: with Nagle's
            // algorithm on, each waited for the client's delayed ACK (about 40 ms a reply).
            let listener = axum::serve::ListenerExt::tap_io(listener, |stream| {
                let _ = stream.set_nodelay(true);
            });
            if let Err(e) = axum::serve(listener, router).await {
                eprintln!("agentry-serve: the server on {addr} stopped: {e}");
            }
        });
        for job in jobs {
            runtime.spawn(job);
        }
        Ok(Server {
            addr,
            runtime: Some(runtime),
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API base URL on loopback, `http://127.0.0.1:PORT/api` (or the bound host when it is
    /// a specific one).
    pub fn url(&self) -> String {
        api_url(self.addr)
    }

    /// The root URL on loopback, `http://127.0.0.1:PORT` (or the bound host when it is a
    /// specific one), for servers whose API is not under `/api` (the OpenAI one is under `/v1`).
    pub fn origin(&self) -> String {
        origin(self.addr)
    }

    /// Serves until the process ends.
    pub fn run_forever(mut self) -> ! {
        match self.runtime.take() {
            Some(runtime) => runtime.block_on(std::future::pending()),
            None => unreachable!("a server always holds its runtime until dropped"),
        }
    }

    /// Stops at once, as a crash would: connections close, in-flight requests are abandoned.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// `http://HOST:PORT/api`, with an unspecified host (`0.0.0.0`, `::`) replaced by loopback.
pub(crate) fn api_url(addr: SocketAddr) -> String {
    format!("{}/api", origin(addr))
}

/// `http://HOST:PORT`, with an unspecified host (`0.0.0.0`, `::`) replaced by loopback.
fn origin(addr: SocketAddr) -> String {
    let host = if addr.ip().is_unspecified() {
        match addr {
            SocketAddr::V4(_) => "127.0.0.1".to_string(),
            SocketAddr::V6(_) => "[::1]".to_string(),
        }
    } else {
        match addr {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        }
    };
    format!("http://{host}:{}", addr.port())
}

/// Joins an API base (`http://h:p/api`, with or without a trailing slash) and an endpoint.
pub(crate) fn join(base: &str, endpoint: &str) -> String {
    format!("{}/{endpoint}", base.trim_end_matches('/'))
}
