//! The rendezvous store: a small key-value store through which the ranks of a job
//! exchange what they need to find each other (job id and token, the node and address of
//! every rank, endpoint addresses) and on which they hold barriers.
//!
//! One client, [`Rendezvous`], over two backends chosen by URL ([`parse_url`]):
//!
//! - `tcp://HOST:PORT`: a [`KvServer`] served in memory by rank 0 or by the launcher
//!   (`quiver run`), spoken to through the line protocol below;
//! - `file:///DIR`: a directory on a file system shared by all nodes, one file per key.
//!
//! # Guarantees
//!
//! - Keys and values are 1 to [`MAX_ITEM_LEN`] bytes of printable ASCII without
//!   whitespace (`'!'..='~'`). The client rejects anything else with
//!   [`Error::Rendezvous`] before it reaches the store; the server rejects it too.
//! - A value is seen whole or not at all (the file store writes a temporary file and
//!   renames or hard-links it into place).
//! - [`Rendezvous::put_if_absent`] is atomic: among concurrent callers exactly one value
//!   is stored, and every caller gets that value back.
//! - Nothing received from the network or read from the directory is trusted: lines are
//!   length-limited, malformed requests are answered with `ERR`, and malformed replies or
//!   file contents become [`Error::Rendezvous`]. Nothing here panics on bad input.
//!
//! # Line protocol (tcp)
//!
//! One request per line and one reply line per request. Fields are separated by a single
//! space; lines end with `\n` (a `\r` before it is ignored) and hold at most 8448 bytes.
//!
//! | request              | reply                                                        |
//! |----------------------|--------------------------------------------------------------|
//! | `PUT key value`      | `OK` (stores, replacing any earlier value)                   |
//! | `PUTNX key value`    | `VAL stored` (stores if absent; replies with what is stored) |
//! | `GET key timeout_ms` | `VAL value` once the key exists, or `TIMEOUT`                |
//! | `TRYGET key`         | `VAL value` or `NONE`                                        |
//! | anything else        | `ERR reason`; the connection goes on serving                 |
//!
//! A connection answers its requests in order; the server serves connections in parallel
//! (a thread each), so a `GET` blocked on one connection delays no other. The client
//! keeps a small pool of connections for the same reason: threads sharing one
//! [`Rendezvous`] never wait behind each other's blocking [`Rendezvous::get`].
//!
//! # File store
//!
//! Key `k` is the file `DIR/k.E` where `E` is `k` with `%` written `%25` and `/` written
//! `%2F`; files have mode 0600 and `DIR` is created with mode 0700 if missing. Escaped
//! names longer than 240 bytes are refused. The file system must support hard links
//! (used by `put_if_absent`). [`Rendezvous::get`] polls with a backoff from 1 to 10 ms.
//! Nothing is ever removed, so a directory must not be reused by a later job.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The longest key or value, in bytes.
pub const MAX_ITEM_LEN: usize = 4096;

/// The longest request or reply line, without its `\n`.
pub(crate) const MAX_LINE: usize = 2 * MAX_ITEM_LEN + 256;
/// Connections a server serves at once; more are answered `ERR` and closed.
const MAX_CONNECTIONS: usize = 4096;
/// Idle connections a client keeps for reuse.
const MAX_IDLE: usize = 8;
/// How much longer than the server's own wait a client waits for a reply.
const REPLY_SLACK: Duration = Duration::from_secs(30);
/// How long a client tries to open an extra connection to a store already reached.
const REDIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between connection attempts while the store is not up yet.
const DIAL_RETRY: Duration = Duration::from_millis(20);
/// How long a shutdown waits for the clients to hang up.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How often the accept loop checks for shutdown.
const ACCEPT_POLL_MS: i32 = 50;
/// The longest file name the file store creates.
const MAX_FILE_NAME: usize = 240;

const ITEM_RULE: &str =
    "keys and values must be 1 to 4096 printable ASCII characters without whitespace";

/// Locks `m`, ignoring poisoning: the data guarded here stays consistent across a panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why `s` is not a valid key or value, if it is not.
fn check_item(s: &str) -> std::result::Result<(), &'static str> {
    if s.is_empty() {
        Err("is empty")
    } else if s.len() > MAX_ITEM_LEN {
        Err("is longer than 4096 bytes")
    } else if !s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        Err("contains whitespace or a character that is not printable ASCII")
    } else {
        Ok(())
    }
}

/// True if `s` may be used as a key or a value.
pub fn is_valid_item(s: &str) -> bool {
    check_item(s).is_ok()
}

/// `s` quoted and cut to a readable length, for error messages.
pub(crate) fn show(s: &str) -> String {
    const KEEP: usize = 64;
    let mut out: String = s.chars().take(KEEP).collect();
    let cut = out.len() < s.len();
    out = format!("{out:?}");
    if cut {
        out.push_str("...");
    }
    out
}

/// A point in time after which waiting stops; `None` when the timeout is too large to
/// represent (it is then never reached).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    /// The deadline `timeout` from now.
    pub(crate) fn after(timeout: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(timeout))
    }

    /// Time left, zero once passed.
    pub(crate) fn remaining(&self) -> Duration {
        match self.0 {
            Some(t) => t.saturating_duration_since(Instant::now()),
            None => Duration::MAX,
        }
    }
}

// ---------------------------------------------------------------------------------------
// URLs

/// A parsed rendezvous URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousUrl {
    /// `tcp://HOST:PORT`: the `HOST:PORT` part, as given (a name or an address; IPv6
    /// addresses in brackets).
    Tcp(String),
    /// `file:///DIR`: the absolute directory.
    File(PathBuf),
}

impl fmt::Display for RendezvousUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RendezvousUrl::Tcp(host_port) => write!(f, "tcp://{host_port}"),
            RendezvousUrl::File(dir) => write!(f, "file://{}", dir.display()),
        }
    }
}

/// Parses `tcp://HOST:PORT` or `file:///ABS/DIR` (the path is taken literally, without
/// percent-decoding). Anything else is an [`Error::Rendezvous`] saying what is expected.
pub fn parse_url(s: &str) -> Result<RendezvousUrl> {
    parse_url_inner(s).map_err(|reason| Error::Rendezvous {
        url: s.to_string(),
        reason,
    })
}

const URL_FORMS: &str = "expected tcp://HOST:PORT or file:///DIR";

fn parse_url_inner(s: &str) -> std::result::Result<RendezvousUrl, String> {
    if let Some(rest) = s.strip_prefix("tcp://") {
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('@') || rest.chars().any(char::is_whitespace) {
            return Err(format!(
                "{URL_FORMS}: a tcp:// URL has no path, user or spaces"
            ));
        }
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Err(format!("{URL_FORMS}: the port is missing"));
        };
        if host.is_empty() {
            return Err(format!("{URL_FORMS}: the host is missing"));
        }
        if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
            return Err(format!(
                "{URL_FORMS}: write an IPv6 address in brackets, as in tcp://[::1]:7777"
            ));
        }
        match port.parse::<u16>() {
            Ok(p) if p != 0 && port.bytes().all(|b| b.is_ascii_digit()) => {}
            _ => {
                return Err(format!(
                    "{URL_FORMS}: the port must be a number from 1 to 65535"
                ))
            }
        }
        Ok(RendezvousUrl::Tcp(rest.to_string()))
    } else if let Some(rest) = s.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(format!(
                "{URL_FORMS}: a file:// URL names an absolute directory with an empty host, \
                 as in file:///shared/quiver"
            ));
        }
        if rest.contains('\0') {
            return Err(format!("{URL_FORMS}: the path contains a NUL byte"));
        }
        Ok(RendezvousUrl::File(PathBuf::from(rest)))
    } else {
        Err(URL_FORMS.to_string())
    }
}

// ---------------------------------------------------------------------------------------
// Line reading shared by the server and the client

/// What [`read_line_limited`] read.
pub enum LineRead {
    /// A complete line is in the buffer (without `\n` or `\r\n`).
    Line,
    /// The line was longer than allowed; it was consumed and discarded.
    TooLong,
    /// End of stream (a partial last line is dropped).
    Eof,
}

/// Reads one line of at most `max` bytes into `buf`, never buffering more than that.
pub(crate) fn read_line_limited<R: BufRead>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<LineRead> {
    buf.clear();
    let mut too_long = false;
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(LineRead::Eof);
        }
        let newline = avail.iter().position(|&b| b == b'\n');
        let chunk = &avail[..newline.unwrap_or(avail.len())];
        if !too_long {
            if buf.len() + chunk.len() > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = newline.map_or(avail.len(), |i| i + 1);
        r.consume(used);
        if newline.is_some() {
            if too_long {
                return Ok(LineRead::TooLong);
            }
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(LineRead::Line);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Server

/// State shared by the accept thread, the connection threads and the handle.
struct Shared {
    map: Mutex<HashMap<String, String>>,
    changed: Condvar,
    stop: AtomicBool,
    /// A clone of every open connection, to close them on shutdown.
    conns: Mutex<HashMap<u64, TcpStream>>,
}

/// A TCP key-value store speaking the line protocol of this module, bound but not yet
/// serving. [`KvServer::spawn`] starts serving it.
pub struct KvServer {
    listener: TcpListener,
    addr: SocketAddr,
}

impl fmt::Debug for KvServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl KvServer {
    /// Binds the store's listening socket to `addr` (port 0 picks a free port).
    pub fn bind(addr: SocketAddr) -> io::Result<KvServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        Ok(KvServer { listener, addr })
    }

    /// The address the store listens on (with the actual port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves the store on background threads (one accepting, one per connection) until
    /// the returned handle is shut down or dropped.
    ///
    /// # Panics
    ///
    /// If the operating system cannot create the accepting thread.
    pub fn spawn(self) -> KvServerHandle {
        let shared = Arc::new(Shared {
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
        });
        let listener = self.listener;
        let for_thread = Arc::clone(&shared);
        let accept = thread::Builder::new()
            .name("quiver-kv-accept".into())
            .spawn(move || accept_loop(listener, &for_thread))
            .expect("cannot create the rendezvous store's accepting thread");
        KvServerHandle {
            addr: self.addr,
            shared,
            accept: Some(accept),
        }
    }
}

/// A running [`KvServer`]. Shutting it down (or dropping it) stops accepting, wakes every
/// blocked `GET`, waits (at most 2 s) for the clients to hang up and then
/// closes every connection still open.
pub struct KvServerHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl fmt::Debug for KvServerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvServerHandle")
            .field("addr", &self.addr)
            .field("running", &self.accept.is_some())
            .finish()
    }
}

impl KvServerHandle {
    /// The address the store listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the store: the listener is closed when this returns, blocked `GET`s are
    /// answered `ERR`, and connections are shut down once their clients hung up or 2 s
    /// passed. Calling it again does nothing.
    pub fn shutdown(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.shared.stop.store(true, Ordering::Release);
        {
            // Notify under the map's lock so that no waiter misses the stop flag.
            let _map = lock(&self.shared.map);
            self.shared.changed.notify_all();
        }
        // The accept thread sees the flag within ACCEPT_POLL_MS and drops the listener.
        let _ = accept.join();
        // Let the clients hang up first (for at most SHUTDOWN_GRACE; a connection leaves
        // the map when its thread ends): a `GET` that the last `PUT` answered (the host's
        // last barrier) must reach its rank, and a request still unread when its
        // connection closes makes the kernel reset it, losing the reply. A `GET` still
        // waiting answers `ERR` at once now that the flag is set.
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while !lock(&self.shared.conns).is_empty() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        for (_, conn) in lock(&self.shared.conns).drain() {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for KvServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Waits up to `timeout_ms` for `listener` to have a connection to accept.
fn poll_readable(listener: &TcpListener, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid, initialized pollfd living across the call, and nfds is 1.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if rc < 0 {
        // EINTR or a transient failure: do not spin.
        thread::sleep(Duration::from_millis(5));
    }
    rc > 0
}

fn accept_loop(listener: TcpListener, shared: &Arc<Shared>) {
    let mut next_id = 0u64;
    while !shared.stop.load(Ordering::Acquire) {
        if !poll_readable(&listener, ACCEPT_POLL_MS) {
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                next_id += 1;
                admit(shared, stream, next_id);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => {
                // Out of descriptors or memory: wait for connections to close.
                tracing::warn!("rendezvous store: accept failed: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Registers a new connection and starts its thread.
fn admit(shared: &Arc<Shared>, stream: TcpStream, id: u64) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let Ok(registered) = stream.try_clone() else {
        return;
    };
    {
        let mut conns = lock(&shared.conns);
        if conns.len() >= MAX_CONNECTIONS {
            let _ = (&stream).write_all(b"ERR too many connections\n");
            return;
        }
        conns.insert(id, registered);
    }
    let for_thread = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name("quiver-kv-conn".into())
        .spawn(move || {
            serve_conn(&for_thread, stream);
            lock(&for_thread.conns).remove(&id);
        });
    if spawned.is_err() {
        // The closure, and the stream with it, is dropped: close our clone too.
        if let Some(conn) = lock(&shared.conns).remove(&id) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

fn serve_conn(shared: &Shared, stream: TcpStream) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    let mut line = Vec::with_capacity(256);
    loop {
        let mut reply = match read_line_limited(&mut reader, &mut line, MAX_LINE) {
            Ok(LineRead::Line) => handle_request(shared, &line),
            Ok(LineRead::TooLong) => "ERR line too long".to_string(),
            Ok(LineRead::Eof) | Err(_) => return,
        };
        reply.push('\n');
        if writer.write_all(reply.as_bytes()).is_err() || shared.stop.load(Ordering::Acquire) {
            return;
        }
    }
}

/// A request of the line protocol, as [`parse_request`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// `PUT key value`.
    Put {
        /// The key.
        key: &'a str,
        /// The value.
        value: &'a str,
    },
    /// `PUTNX key value`.
    PutNx {
        /// The key.
        key: &'a str,
        /// The value.
        value: &'a str,
    },
    /// `GET key timeout_ms`.
    Get {
        /// The key.
        key: &'a str,
        /// How long to wait for it.
        timeout: Duration,
    },
    /// `TRYGET key`.
    TryGet {
        /// The key.
        key: &'a str,
    },
}

/// Parses one request line (without its `\n`): the request, or why it is malformed (the
/// text of the `ERR` reply). Touches no state.
pub fn parse_request(line: &[u8]) -> std::result::Result<Request<'_>, String> {
    let Ok(line) = std::str::from_utf8(line) else {
        return Err("the request is not ASCII".into());
    };
    let mut fields = line.split(' ');
    let cmd = fields.next().unwrap_or("");
    let args: Vec<&str> = fields.take(3).collect();
    let (usage, arity) = match cmd {
        "PUT" => ("PUT key value", 2),
        "PUTNX" => ("PUTNX key value", 2),
        "GET" => ("GET key timeout_ms", 2),
        "TRYGET" => ("TRYGET key", 1),
        "" => return Err("empty request".into()),
        _ => return Err("unknown command (expected PUT, PUTNX, GET or TRYGET)".into()),
    };
    if args.len() != arity {
        return Err(format!("usage: {usage}"));
    }
    let key = args[0];
    if let Err(why) = check_item(key) {
        return Err(format!("the key {why}"));
    }
    match cmd {
        "PUT" | "PUTNX" => {
            let value = args[1];
            if let Err(why) = check_item(value) {
                return Err(format!("the value {why}"));
            }
            Ok(if cmd == "PUT" {
                Request::Put { key, value }
            } else {
                Request::PutNx { key, value }
            })
        }
        "GET" => {
            let ms = args[1];
            match ms.parse::<u64>() {
                Ok(ms_n) if ms.bytes().all(|b| b.is_ascii_digit()) => Ok(Request::Get {
                    key,
                    timeout: Duration::from_millis(ms_n),
                }),
                _ => Err("timeout_ms must be a decimal number of milliseconds".into()),
            }
        }
        _ => Ok(Request::TryGet { key }),
    }
}

/// Answers one request line (without its `\n`).
fn handle_request(shared: &Shared, line: &[u8]) -> String {
    let request = match parse_request(line) {
        Ok(request) => request,
        Err(why) => return format!("ERR {why}"),
    };
    match request {
        Request::Put { key, value } => {
            let mut map = lock(&shared.map);
            map.insert(key.to_string(), value.to_string());
            shared.changed.notify_all();
            "OK".into()
        }
        Request::PutNx { key, value } => {
            let mut map = lock(&shared.map);
            if let Some(stored) = map.get(key) {
                format!("VAL {stored}")
            } else {
                map.insert(key.to_string(), value.to_string());
                shared.changed.notify_all();
                format!("VAL {value}")
            }
        }
        Request::Get { key, timeout } => wait_get(shared, key, timeout),
        Request::TryGet { key } => match lock(&shared.map).get(key) {
            Some(v) => format!("VAL {v}"),
            None => "NONE".into(),
        },
    }
}

fn wait_get(shared: &Shared, key: &str, timeout: Duration) -> String {
    let deadline = Deadline::after(timeout);
    let mut map = lock(&shared.map);
    loop {
        if let Some(v) = map.get(key) {
            return format!("VAL {v}");
        }
        if shared.stop.load(Ordering::Acquire) {
            return "ERR the store is shutting down".into();
        }
        let left = deadline.remaining();
        if left.is_zero() {
            return "TIMEOUT".into();
        }
        let wait = left.min(Duration::from_secs(3600));
        map = match shared.changed.wait_timeout(map, wait) {
            Ok((m, _)) => m,
            Err(poisoned) => poisoned.into_inner().0,
        };
    }
}

// ---------------------------------------------------------------------------------------
// TCP client

/// One connection to a store.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn new(stream: TcpStream) -> io::Result<Conn> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(REPLY_SLACK))?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Conn {
            reader,
            writer: stream,
        })
    }

    /// Sends `request` and returns the reply line, waiting up to `server_wait` plus slack.
    fn roundtrip(&mut self, request: &str, server_wait: Duration) -> io::Result<String> {
        let read_timeout = server_wait.checked_add(REPLY_SLACK);
        self.writer.set_read_timeout(read_timeout)?;
        let mut line = Vec::with_capacity(request.len() + 1);
        line.extend_from_slice(request.as_bytes());
        line.push(b'\n');
        self.writer.write_all(&line)?;
        match read_line_limited(&mut self.reader, &mut line, MAX_LINE)? {
            LineRead::Line => String::from_utf8(line)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "the reply is not ASCII")),
            LineRead::TooLong => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the reply line is too long",
            )),
            LineRead::Eof => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the store closed the connection",
            )),
        }
    }
}

/// Connects once to every address `host_port` resolves to, in turn.
fn dial_once(host_port: &str, timeout: Duration) -> io::Result<Conn> {
    let timeout = timeout.max(Duration::from_millis(1));
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host resolves to no address");
    for addr in host_port.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => return Conn::new(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Connects, retrying every [`DIAL_RETRY`] until `deadline`; the error is the last
/// attempt's.
fn dial(host_port: &str, deadline: Deadline) -> std::result::Result<Conn, io::Error> {
    loop {
        let err = match dial_once(host_port, deadline.remaining().min(Duration::from_secs(1))) {
            Ok(conn) => return Ok(conn),
            Err(e) => e,
        };
        let left = deadline.remaining();
        if left.is_zero() {
            return Err(err);
        }
        thread::sleep(left.min(DIAL_RETRY));
    }
}

struct TcpClient {
    host_port: String,
    idle: Mutex<Vec<Conn>>,
    local_ip: Option<IpAddr>,
}

impl TcpClient {
    /// Sends one request on an idle connection (or a new one) and returns the reply line.
    fn request(&self, url: &str, request: &str, server_wait: Duration) -> Result<String> {
        let idle = lock(&self.idle).pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => dial(&self.host_port, Deadline::after(REDIAL_TIMEOUT)).map_err(|e| {
                Error::Rendezvous {
                    url: url.to_string(),
                    reason: format!("cannot open another connection to the store: {e}"),
                }
            })?,
        };
        match conn.roundtrip(request, server_wait) {
            Ok(reply) => {
                let mut idle = lock(&self.idle);
                if idle.len() < MAX_IDLE {
                    idle.push(conn);
                }
                Ok(reply)
            }
            // The connection is dropped: its state is unknown.
            Err(e) => Err(Error::Rendezvous {
                url: url.to_string(),
                reason: format!("request to the store failed: {e}"),
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------
// File store

struct FileStore {
    dir: PathBuf,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl FileStore {
    fn open(dir: PathBuf) -> io::Result<FileStore> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        if !fs::metadata(&dir)?.is_dir() {
            return Err(io::Error::other("not a directory"));
        }
        Ok(FileStore { dir })
    }

    /// The file holding `key` (a valid key).
    fn path_of(&self, key: &str) -> std::result::Result<PathBuf, String> {
        let mut name = String::with_capacity(key.len() + 2);
        name.push_str("k.");
        for c in key.chars() {
            match c {
                '%' => name.push_str("%25"),
                '/' => name.push_str("%2F"),
                c => name.push(c),
            }
        }
        if name.len() > MAX_FILE_NAME {
            return Err(format!(
                "the key {} is too long for a file:// store (at most {MAX_FILE_NAME} bytes \
                 once '%' and '/' are escaped)",
                show(key)
            ));
        }
        Ok(self.dir.join(name))
    }

    /// Writes `value` to a new temporary file in the directory, mode 0600.
    fn write_temp(&self, value: &str) -> io::Result<PathBuf> {
        let pid = std::process::id();
        loop {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let mut salt = [0u8; 8];
            if getrandom::fill(&mut salt).is_err() {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                salt = nanos.to_le_bytes();
            }
            let path = self
                .dir
                .join(format!(".tmp.{pid}.{n}.{:016x}", u64::from_le_bytes(salt)));
            let mut file = match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            };
            if let Err(e) = file.write_all(value.as_bytes()) {
                drop(file);
                let _ = fs::remove_file(&path);
                return Err(e);
            }
            return Ok(path);
        }
    }

    fn put(&self, path: &Path, value: &str) -> io::Result<()> {
        let temp = self.write_temp(value)?;
        fs::rename(&temp, path).inspect_err(|_| {
            let _ = fs::remove_file(&temp);
        })
    }

    fn put_if_absent(&self, path: &Path, value: &str) -> io::Result<Option<String>> {
        let temp = self.write_temp(value)?;
        let linked = fs::hard_link(&temp, path);
        let _ = fs::remove_file(&temp);
        match linked {
            Ok(()) => Ok(Some(value.to_string())),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The value in `path`, `None` if absent; `Err(InvalidData)` if malformed.
    fn read(path: &Path) -> io::Result<Option<String>> {
        let file = match fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        file.take(MAX_ITEM_LEN as u64 + 1).read_to_end(&mut bytes)?;
        match String::from_utf8(bytes) {
            Ok(s) if is_valid_item(&s) => Ok(Some(s)),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the file does not hold a valid value",
            )),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Client

enum Store {
    Tcp(TcpClient),
    File(FileStore),
}

/// A client of a rendezvous store (`tcp://` or `file://`). It is `Send + Sync`: threads
/// may share one, and their requests proceed in parallel.
pub struct Rendezvous {
    url: String,
    store: Store,
}

impl fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rendezvous")
            .field("url", &self.url)
            .finish()
    }
}

impl Rendezvous {
    /// Connects to the store at `url` (`tcp://HOST:PORT` or `file:///DIR`).
    ///
    /// For `tcp://` it retries every 20 ms until `timeout`, since the store (served by
    /// rank 0) may start later than this process. For `file://` it creates the directory
    /// (mode 0700) if missing.
    pub fn connect(url: &str, timeout: Duration) -> Result<Rendezvous> {
        Rendezvous::connect_url(parse_url(url)?, timeout)
    }

    /// Like [`Rendezvous::connect`], from a parsed URL.
    pub fn connect_url(url: RendezvousUrl, timeout: Duration) -> Result<Rendezvous> {
        let url_string = url.to_string();
        let store = match url {
            RendezvousUrl::Tcp(host_port) => {
                let conn =
                    dial(&host_port, Deadline::after(timeout)).map_err(|e| Error::Rendezvous {
                        url: url_string.clone(),
                        reason: format!(
                            "no store answered within {timeout:?} (last attempt: {e}); is it \
                             served at that address?"
                        ),
                    })?;
                let local_ip = conn.writer.local_addr().ok().map(|a| a.ip());
                Store::Tcp(TcpClient {
                    host_port,
                    idle: Mutex::new(vec![conn]),
                    local_ip,
                })
            }
            RendezvousUrl::File(dir) => {
                Store::File(FileStore::open(dir).map_err(|e| Error::Rendezvous {
                    url: url_string.clone(),
                    reason: format!("cannot create or open the directory: {e}"),
                })?)
            }
        };
        Ok(Rendezvous {
            url: url_string,
            store,
        })
    }

    /// The store's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The local address of the connection to a `tcp://` store: the address at which
    /// other nodes can reach this one. `None` for a `file://` store.
    pub fn local_ip(&self) -> Option<IpAddr> {
        match &self.store {
            Store::Tcp(c) => c.local_ip,
            Store::File(_) => None,
        }
    }

    fn error(&self, reason: impl Into<String>) -> Error {
        Error::Rendezvous {
            url: self.url.clone(),
            reason: reason.into(),
        }
    }

    fn check(&self, what: &str, s: &str) -> Result<()> {
        check_item(s)
            .map_err(|why| self.error(format!("the {what} {} {why}; {ITEM_RULE}", show(s))))
    }

    fn file_path(&self, store: &FileStore, key: &str) -> Result<PathBuf> {
        store.path_of(key).map_err(|reason| self.error(reason))
    }

    fn file_error(&self, action: &str, path: &Path, e: io::Error) -> Error {
        self.error(format!("{action} {}: {e}", path.display()))
    }

    /// Turns a reply that is not one of those expected into an error.
    fn unexpected(&self, reply: &str) -> Error {
        match reply.strip_prefix("ERR ") {
            Some(why) => self.error(format!("the store refused the request: {}", show(why))),
            None => self.error(format!("unexpected reply from the store: {}", show(reply))),
        }
    }

    /// Parses `VAL value`, checking the value.
    fn value_of(&self, reply: &str) -> Option<Result<String>> {
        let value = reply.strip_prefix("VAL ")?;
        Some(match check_item(value) {
            Ok(()) => Ok(value.to_string()),
            Err(_) => Err(self.error(format!(
                "the store returned a malformed value {}",
                show(value)
            ))),
        })
    }

    /// Stores `value` under `key`, replacing any earlier value.
    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        self.check("key", key)?;
        self.check("value", value)?;
        match &self.store {
            Store::Tcp(c) => {
                let reply = c.request(&self.url, &format!("PUT {key} {value}"), Duration::ZERO)?;
                if reply == "OK" {
                    Ok(())
                } else {
                    Err(self.unexpected(&reply))
                }
            }
            Store::File(s) => {
                let path = self.file_path(s, key)?;
                s.put(&path, value)
                    .map_err(|e| self.file_error("cannot write", &path, e))
            }
        }
    }

    /// Stores `value` under `key` unless a value is there already, and returns the value
    /// stored: `value` if this call stored it, the earlier one otherwise.
    pub fn put_if_absent(&self, key: &str, value: &str) -> Result<String> {
        self.check("key", key)?;
        self.check("value", value)?;
        match &self.store {
            Store::Tcp(c) => {
                let reply =
                    c.request(&self.url, &format!("PUTNX {key} {value}"), Duration::ZERO)?;
                self.value_of(&reply)
                    .unwrap_or_else(|| Err(self.unexpected(&reply)))
            }
            Store::File(s) => {
                let path = self.file_path(s, key)?;
                match s.put_if_absent(&path, value) {
                    Ok(Some(ours)) => Ok(ours),
                    Ok(None) => match FileStore::read(&path) {
                        Ok(Some(theirs)) => Ok(theirs),
                        Ok(None) => Err(self.error(format!(
                            "{} vanished right after being created",
                            path.display()
                        ))),
                        Err(e) => Err(self.file_error("cannot read", &path, e)),
                    },
                    Err(e) => Err(self.file_error("cannot create", &path, e)),
                }
            }
        }
    }

    /// The value under `key`, or `None` if there is none yet.
    pub fn try_get(&self, key: &str) -> Result<Option<String>> {
        self.check("key", key)?;
        match &self.store {
            Store::Tcp(c) => {
                let reply = c.request(&self.url, &format!("TRYGET {key}"), Duration::ZERO)?;
                if reply == "NONE" {
                    return Ok(None);
                }
                self.value_of(&reply)
                    .map(|r| r.map(Some))
                    .unwrap_or_else(|| Err(self.unexpected(&reply)))
            }
            Store::File(s) => {
                let path = self.file_path(s, key)?;
                FileStore::read(&path).map_err(|e| self.file_error("cannot read", &path, e))
            }
        }
    }

    /// The value under `key`, waiting until it is stored; [`Error::Timeout`] after
    /// `timeout`. A value present already is returned even with a zero timeout.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<String> {
        self.check("key", key)?;
        match &self.store {
            Store::Tcp(c) => {
                let ms = u64::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
                let reply = c.request(&self.url, &format!("GET {key} {ms}"), timeout)?;
                if reply == "TIMEOUT" {
                    return Err(Error::Timeout(timeout));
                }
                self.value_of(&reply)
                    .unwrap_or_else(|| Err(self.unexpected(&reply)))
            }
            Store::File(s) => {
                let path = self.file_path(s, key)?;
                let deadline = Deadline::after(timeout);
                let mut pause = Duration::from_millis(1);
                loop {
                    match FileStore::read(&path) {
                        Ok(Some(v)) => return Ok(v),
                        Ok(None) => {}
                        Err(e) => return Err(self.file_error("cannot read", &path, e)),
                    }
                    let left = deadline.remaining();
                    if left.is_zero() {
                        return Err(Error::Timeout(timeout));
                    }
                    thread::sleep(pause.min(left));
                    pause = (pause * 2).min(Duration::from_millis(10));
                }
            }
        }
    }

    /// Waits until all `size` ranks have called `barrier` with this `name`, or
    /// [`Error::Timeout`] after `timeout`.
    ///
    /// Each barrier instance needs a name of its own (a barrier's keys stay in the store):
    /// reusing a name lets the later barrier through at once. Ranks publish
    /// `barrier/{name}/{rank}`; rank 0 waits for all of them and publishes
    /// `barrier/{name}/done`, which the others wait for (O(size) requests in all).
    pub fn barrier(&self, name: &str, rank: u32, size: u32, timeout: Duration) -> Result<()> {
        if rank >= size {
            return Err(Error::Config(format!(
                "barrier {}: rank {rank} is not below the job size {size}",
                show(name)
            )));
        }
        let done = format!("barrier/{name}/done");
        self.check("barrier key", &done)?;
        self.check("barrier key", &format!("barrier/{name}/{}", size - 1))?;
        if size == 1 {
            return Ok(());
        }
        let deadline = Deadline::after(timeout);
        let as_timeout = |e: Error| match e {
            Error::Timeout(_) => Error::Timeout(timeout),
            e => e,
        };
        if rank == 0 {
            for r in 1..size {
                self.get(&format!("barrier/{name}/{r}"), deadline.remaining())
                    .map_err(|e| {
                        tracing::debug!("barrier {name}: rank {r} did not arrive: {e}");
                        as_timeout(e)
                    })?;
            }
            self.put(&done, "1")
        } else {
            self.put(&format!("barrier/{name}/{rank}"), "1")?;
            self.get(&done, deadline.remaining())
                .map(|_| ())
                .map_err(as_timeout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::net::Ipv4Addr;
    use std::sync::Barrier;

    const T: Duration = Duration::from_secs(10);

    fn server() -> KvServerHandle {
        KvServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .unwrap()
            .spawn()
    }

    fn tcp_url(h: &KvServerHandle) -> String {
        format!("tcp://{}", h.local_addr())
    }

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            TempDir(std::env::temp_dir().join(format!(
                "quiver-rv-test-{tag}-{}-{nanos}-{n}",
                std::process::id()
            )))
        }
        fn url(&self) -> String {
            format!("file://{}", self.0.display())
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn client_is_send_sync() {
        assert_send_sync::<Rendezvous>();
        assert_send_sync::<KvServerHandle>();
    }

    /// The host of the store leaves right after the put that another rank's last `GET`
    /// needs (the job's last barrier), and that `GET` reaches the store only after the
    /// shutdown began: it must still be answered, not cut off with the connection.
    #[test]
    fn a_get_arriving_during_the_shutdown_is_answered() {
        let mut srv = server();
        let url = tcp_url(&srv);
        let late = Rendezvous::connect(&url, T).unwrap();
        let host = Rendezvous::connect(&url, T).unwrap();
        host.put("done", "1").unwrap();
        drop(host);
        let waiter = thread::spawn(move || {
            // Later than the accepting thread takes to stop (ACCEPT_POLL_MS).
            thread::sleep(Duration::from_millis(300));
            let got = late.get("done", T);
            drop(late);
            got
        });
        let started = Instant::now();
        srv.shutdown();
        assert_eq!(waiter.join().unwrap().expect("the late GET"), "1");
        assert!(
            started.elapsed() < SHUTDOWN_GRACE,
            "waited for a client that hung up"
        );
    }

    #[test]
    fn parse_urls() {
        assert_eq!(
            parse_url("tcp://127.0.0.1:7777").unwrap(),
            RendezvousUrl::Tcp("127.0.0.1:7777".into())
        );
        assert_eq!(
            parse_url("tcp://[::1]:7777/").unwrap(),
            RendezvousUrl::Tcp("[::1]:7777".into())
        );
        assert_eq!(
            parse_url("file:///shared/q").unwrap(),
            RendezvousUrl::File(PathBuf::from("/shared/q"))
        );
        for bad in [
            "http://x:1",
            "tcp://host",
            "tcp://:7",
            "tcp://h:0",
            "tcp://h:99999",
            "tcp://h:+7",
            "tcp://::1:7",
            "tcp://h:7/path",
            "file://relative/dir",
            "",
        ] {
            let e = parse_url(bad).unwrap_err().to_string();
            assert!(
                e.contains("expected tcp://HOST:PORT or file:///DIR"),
                "{bad}: {e}"
            );
        }
        assert_eq!(
            parse_url("tcp://h:7").unwrap().to_string(),
            "tcp://h:7".to_string()
        );
    }

    #[test]
    fn invalid_items_rejected_before_sending() {
        let srv = server();
        let rv = Rendezvous::connect(&tcp_url(&srv), T).unwrap();
        let long = "x".repeat(MAX_ITEM_LEN + 1);
        for (k, v) in [
            ("", "v"),
            ("a b", "v"),
            ("k", "v\n"),
            ("k", ""),
            ("k", &long),
            ("é", "v"),
        ] {
            let e = rv.put(k, v).unwrap_err();
            assert!(matches!(e, Error::Rendezvous { .. }), "{e}");
        }
        assert!(rv.get("a\tb", T).is_err());
        let max = "y".repeat(MAX_ITEM_LEN);
        rv.put(&max, &max).unwrap();
        assert_eq!(rv.get(&max, T).unwrap(), max);
    }

    fn put_get_across_threads(url: &str) {
        let rv = Arc::new(Rendezvous::connect(url, T).unwrap());
        let writers: Vec<_> = (0..4)
            .map(|i| {
                let rv = Arc::clone(&rv);
                thread::spawn(move || rv.put(&format!("key/{i}"), &format!("value-{i}")).unwrap())
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let other = Rendezvous::connect(url, T).unwrap();
        for i in 0..4 {
            assert_eq!(
                other.get(&format!("key/{i}"), T).unwrap(),
                format!("value-{i}")
            );
        }
        assert_eq!(other.try_get("absent").unwrap(), None);
        assert_eq!(other.try_get("key/1").unwrap().as_deref(), Some("value-1"));
        other.put("key/1", "replaced").unwrap();
        assert_eq!(rv.get("key/1", T).unwrap(), "replaced");
        // Escaping: '%' and '/' must not collide.
        other.put("a%2Fb", "one").unwrap();
        other.put("a/b", "two").unwrap();
        assert_eq!(rv.get("a%2Fb", T).unwrap(), "one");
        assert_eq!(rv.get("a/b", T).unwrap(), "two");
        other.put("..", "dots").unwrap();
        assert_eq!(rv.get("..", T).unwrap(), "dots");
    }

    fn get_blocks_until_put(url: &str) {
        let rv = Arc::new(Rendezvous::connect(url, T).unwrap());
        let reader = {
            let rv = Arc::clone(&rv);
            thread::spawn(move || {
                let start = Instant::now();
                let v = rv.get("late", T).unwrap();
                (v, start.elapsed())
            })
        };
        thread::sleep(Duration::from_millis(150));
        // The same client: a blocked get must not hold up a put from another thread.
        rv.put("late", "arrived").unwrap();
        let (v, waited) = reader.join().unwrap();
        assert_eq!(v, "arrived");
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
    }

    fn get_times_out(url: &str) {
        let rv = Rendezvous::connect(url, T).unwrap();
        let start = Instant::now();
        let e = rv.get("never", Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        assert!(e.is_retryable());
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(100) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        rv.put("now", "1").unwrap();
        assert_eq!(rv.get("now", Duration::ZERO).unwrap(), "1");
    }

    fn put_if_absent_race(url: &str) {
        let start = Arc::new(Barrier::new(8));
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let url = url.to_string();
                let start = Arc::clone(&start);
                thread::spawn(move || {
                    let rv = Rendezvous::connect(&url, T).unwrap();
                    start.wait();
                    let mine = format!("racer-{i}");
                    let stored = rv.put_if_absent("race", &mine).unwrap();
                    (stored == mine, stored)
                })
            })
            .collect();
        let results: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|(won, _)| *won).count(), 1);
        let seen: HashSet<_> = results.iter().map(|(_, v)| v.clone()).collect();
        assert_eq!(seen.len(), 1, "{seen:?}");
        let rv = Rendezvous::connect(url, T).unwrap();
        assert_eq!(&rv.get("race", T).unwrap(), seen.iter().next().unwrap());
    }

    fn barrier_4(url: &str) {
        let arrived = Arc::new(AtomicU64::new(0));
        let ranks: Vec<_> = (0..4u32)
            .map(|rank| {
                let url = url.to_string();
                let arrived = Arc::clone(&arrived);
                thread::spawn(move || {
                    let rv = Rendezvous::connect(&url, T).unwrap();
                    for round in 0..3 {
                        thread::sleep(Duration::from_millis(u64::from(rank) * 10));
                        arrived.fetch_add(1, Ordering::SeqCst);
                        rv.barrier(&format!("b{round}"), rank, 4, T).unwrap();
                        // Everyone has arrived at this round before anyone leaves it.
                        assert!(arrived.load(Ordering::SeqCst) >= 4 * (round + 1));
                    }
                })
            })
            .collect();
        for r in ranks {
            r.join().unwrap();
        }
        let rv = Rendezvous::connect(url, T).unwrap();
        let e = rv
            .barrier("lonely", 1, 2, Duration::from_millis(50))
            .unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        assert!(matches!(rv.barrier("x", 2, 2, T), Err(Error::Config(_))));
        rv.barrier("solo", 0, 1, T).unwrap();
    }

    #[test]
    fn tcp_put_get_across_threads() {
        let srv = server();
        put_get_across_threads(&tcp_url(&srv));
    }

    #[test]
    fn tcp_get_blocks_until_put() {
        let srv = server();
        get_blocks_until_put(&tcp_url(&srv));
    }

    #[test]
    fn tcp_get_times_out() {
        let srv = server();
        get_times_out(&tcp_url(&srv));
    }

    #[test]
    fn tcp_put_if_absent_race() {
        let srv = server();
        put_if_absent_race(&tcp_url(&srv));
    }

    #[test]
    fn tcp_barrier() {
        let srv = server();
        barrier_4(&tcp_url(&srv));
    }

    #[test]
    fn file_put_get_across_threads() {
        let dir = TempDir::new("putget");
        put_get_across_threads(&dir.url());
        let mode = fs::metadata(&dir.0).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o077, 0);
    }

    #[test]
    fn file_get_blocks_until_put() {
        let dir = TempDir::new("blocks");
        get_blocks_until_put(&dir.url());
    }

    #[test]
    fn file_get_times_out() {
        let dir = TempDir::new("timeout");
        get_times_out(&dir.url());
    }

    #[test]
    fn file_put_if_absent_race() {
        let dir = TempDir::new("race");
        put_if_absent_race(&dir.url());
        // No temporary file is left behind.
        for entry in fs::read_dir(&dir.0).unwrap() {
            let name = entry.unwrap().file_name();
            assert!(!name.to_string_lossy().starts_with(".tmp"), "{name:?}");
        }
    }

    #[test]
    fn file_barrier() {
        let dir = TempDir::new("barrier");
        barrier_4(&dir.url());
    }

    #[test]
    fn file_store_rejects_garbage_and_long_keys() {
        let dir = TempDir::new("garbage");
        let rv = Rendezvous::connect(&dir.url(), T).unwrap();
        fs::write(dir.0.join("k.bad"), b"two words").unwrap();
        assert!(matches!(rv.try_get("bad"), Err(Error::Rendezvous { .. })));
        assert!(matches!(
            rv.put(&"/".repeat(100), "v"),
            Err(Error::Rendezvous { .. })
        ));
        assert_eq!(rv.local_ip(), None);
    }

    #[test]
    fn tcp_connect_waits_for_a_late_server_and_gives_up() {
        // Reserve a port, free it, serve on it a little later.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let late = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            KvServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                .unwrap()
                .spawn()
        });
        let rv = Rendezvous::connect(&format!("tcp://127.0.0.1:{port}"), T).unwrap();
        let _srv = late.join().unwrap();
        rv.put("k", "v").unwrap();
        assert_eq!(rv.local_ip(), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));

        let free = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = Rendezvous::connect(
            &format!("tcp://127.0.0.1:{free}"),
            Duration::from_millis(60),
        )
        .unwrap_err();
        assert!(matches!(e, Error::Rendezvous { .. }), "{e}");
    }

    fn raw_exchange(
        reader: &mut BufReader<TcpStream>,
        writer: &mut TcpStream,
        send: &[u8],
    ) -> String {
        writer.write_all(send).unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        line
    }

    #[test]
    fn malformed_lines_get_err_and_the_connection_goes_on() {
        let srv = server();
        let stream = TcpStream::connect(srv.local_addr()).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let long = format!("PUT k {}\n", "v".repeat(3 * MAX_LINE));
        let bad: Vec<Vec<u8>> = vec![
            b"\n".to_vec(),
            b"HELLO\n".to_vec(),
            b"PUT onlykey\n".to_vec(),
            b"PUT k v extra\n".to_vec(),
            b"PUT  k v\n".to_vec(),
            b"GET k soon\n".to_vec(),
            b"GET k -1\n".to_vec(),
            b"TRYGET\n".to_vec(),
            b"put k v\n".to_vec(),
            b"PUT k \xff\xfe\n".to_vec(),
            long.into_bytes(),
        ];
        for b in &bad {
            let reply = raw_exchange(&mut reader, &mut writer, b);
            assert!(
                reply.starts_with("ERR "),
                "{:?} -> {reply:?}",
                String::from_utf8_lossy(b)
            );
            assert!(reply.ends_with('\n'));
        }
        assert_eq!(raw_exchange(&mut reader, &mut writer, b"PUT k v\n"), "OK\n");
        assert_eq!(
            raw_exchange(&mut reader, &mut writer, b"GET k 0\r\n"),
            "VAL v\n"
        );
        assert_eq!(
            raw_exchange(&mut reader, &mut writer, b"TRYGET nope\n"),
            "NONE\n"
        );
        assert_eq!(
            raw_exchange(&mut reader, &mut writer, b"GET nope 10\n"),
            "TIMEOUT\n"
        );
        assert_eq!(
            raw_exchange(&mut reader, &mut writer, b"PUTNX k w\n"),
            "VAL v\n"
        );
        assert_eq!(
            raw_exchange(&mut reader, &mut writer, b"PUTNX j w\n"),
            "VAL w\n"
        );
    }

    #[test]
    fn shutdown_stops_listener_and_wakes_getters() {
        let mut srv = server();
        let addr = srv.local_addr();
        let rv = Arc::new(Rendezvous::connect(&tcp_url(&srv), T).unwrap());
        let waiter = {
            let rv = Arc::clone(&rv);
            thread::spawn(move || rv.get("never", Duration::from_secs(60)))
        };
        thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        srv.shutdown();
        let res = waiter.join().unwrap();
        assert!(matches!(res, Err(Error::Rendezvous { .. })), "{res:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(TcpStream::connect(addr).is_err());
        srv.shutdown();
    }
}
