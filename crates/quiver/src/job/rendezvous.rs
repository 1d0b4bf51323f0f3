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
//! - Only the job's processes use a `tcp://` store: every request and every reply carries
//!   a keyed MAC of the job's [`StoreKey`] (a secret the launcher passes in
//!   `QUIVER_RENDEZVOUS_KEY`, or the user's own key file, [`StoreKey::from_lookup`]). A
//!   client without the key can neither read nor write; its connection is closed at its
//!   first request. The server bounds what anyone can make it hold: at most
//!   [`MAX_KEYS`] keys and [`MAX_STORED_BYTES`] bytes, [`MAX_UNAUTHENTICATED`]
//!   connections that have not proved the key (each given [`HANDSHAKE_TIMEOUT`] to do
//!   so), and idle connections closed after [`IDLE_TIMEOUT`] (clients redial).
//!   `file://` stores rely on the directory's mode (0700) instead.
//!
//! # Line protocol (tcp)
//!
//! On connecting, the server sends `HELLO nonce` and the client answers `HI nonce` (32
//! hex digits each, fresh per connection; the connection's nonce is the two together).
//! Then one request per line and one reply line per request, each preceded by its tag:
//! `TAG request` and `TAG reply`, where TAG is the first 16 bytes (32 hex digits) of
//! the BLAKE3 keyed hash, under the store key, of a direction label (`req` or `rep`),
//! the nonce, the request's number on the connection (from 0) and the line. A tag
//! binds a line to its connection (chosen by both ends: a recorded conversation cannot
//! be played back to either), its place and its direction: replayed, reordered or
//! reflected lines fail. Fields are separated by a single space; lines end with `\n` (a
//! `\r` before it is ignored) and hold at most 8448 bytes.
//!
//! | request              | reply                                                        |
//! |----------------------|--------------------------------------------------------------|
//! | `PUT key value`      | `OK` (stores, replacing any earlier value)                   |
//! | `PUTNX key value`    | `VAL stored` (stores if absent; replies with what is stored) |
//! | `GET key timeout_ms` | `VAL value` once the key exists, or `TIMEOUT`                |
//! | `TRYGET key`         | `VAL value` or `NONE`                                        |
//! | anything else        | `ERR reason`; the connection goes on serving                 |
//!
//! A request whose tag is wrong is answered `ERR not authenticated` (untagged) and the
//! connection is closed.
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
/// Connections that have not yet sent a request with a valid tag, at once; more are
/// answered `ERR` and closed.
pub const MAX_UNAUTHENTICATED: usize = 64;
/// How long a new connection has to send its first (authenticated) request.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an authenticated connection may stay silent between requests before the
/// server closes it (clients open a new one when they need it).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Keys a store holds at most (a job needs a few per rank and endpoint).
pub const MAX_KEYS: usize = 1 << 20;
/// Bytes of keys and values a store holds at most.
pub const MAX_STORED_BYTES: usize = 256 << 20;
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
// Authentication

/// The secret that admits a process to a job's `tcp://` store: 32 random bytes, written
/// as 64 hex digits in `QUIVER_RENDEZVOUS_KEY`.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreKey([u8; 32]);

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreKey(..)")
    }
}

/// The variable that carries a job's store key.
pub const KEY_VAR: &str = "QUIVER_RENDEZVOUS_KEY";
/// Where a user's own store key lives (under `$HOME`) when no launcher passes one: for
/// jobs started by other launchers (`mpirun`, `srun`) whose rank 0 serves the store.
pub const KEY_FILE: &str = ".quiver/rendezvous.key";

impl StoreKey {
    /// A fresh random key.
    pub fn generate() -> StoreKey {
        let mut k = [0u8; 32];
        getrandom::fill(&mut k).expect("the kernel's random number generator");
        StoreKey(k)
    }

    /// A key for another purpose, named by `context`, derived from this one and
    /// `material` (BLAKE3's key derivation): knowing it tells nothing of this key.
    pub(crate) fn derive(&self, context: &str, material: &[u8]) -> [u8; 32] {
        let mut input = self.0.to_vec();
        input.extend_from_slice(material);
        blake3::derive_key(context, &input)
    }

    /// The key of these bytes (a derived key, [`StoreKey::derive`]).
    pub(crate) fn from_bytes(bytes: [u8; 32]) -> StoreKey {
        StoreKey(bytes)
    }

    /// The key's bytes.
    pub(crate) fn bytes(&self) -> [u8; 32] {
        self.0
    }

    /// The 64 hex digits of `QUIVER_RENDEZVOUS_KEY`.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits.
    pub fn parse(s: &str) -> Option<StoreKey> {
        let s = s.trim();
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut k = [0u8; 32];
        for (i, byte) in k.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(StoreKey(k))
    }

    /// The job's key: `QUIVER_RENDEZVOUS_KEY` if set (`quiver run` sets it), else the
    /// user's key file `$HOME/.quiver/rendezvous.key`, created (mode 0600, in a
    /// directory of mode 0700) with a fresh key if it does not exist yet. A key file
    /// that others may read, or another user's, is refused: anyone who can read it can
    /// join the user's jobs' stores.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<StoreKey> {
        if let Some(v) = get(KEY_VAR) {
            return StoreKey::parse(&v).ok_or_else(|| Error::InvalidEnv {
                var: KEY_VAR.into(),
                value: "(not shown)".into(),
                reason: "expected 64 hex digits (the launcher sets it; `quiver run` does)".into(),
            });
        }
        let home = get("HOME")
            .filter(|h| !h.is_empty())
            .ok_or_else(|| Error::MissingEnv {
                var: KEY_VAR,
                hint: format!(
                    "a tcp:// store needs the job's secret: set {KEY_VAR} to the same 64 hex \
                 digits on every rank, or set HOME so that ~/{KEY_FILE} can hold it"
                ),
            })?;
        load_or_create_key_file(&Path::new(&home).join(KEY_FILE))
    }

    /// The tag of `line`, the `seq`-th of its direction (`req` or `rep`) on the
    /// connection whose nonce is `nonce`.
    fn tag(&self, direction: &[u8; 3], nonce: &[u8; 32], seq: u64, line: &[u8]) -> [u8; 16] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(direction);
        h.update(nonce);
        h.update(&seq.to_le_bytes());
        h.update(line);
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&h.finalize().as_bytes()[..16]);
        tag
    }
}

fn hex16(b: &[u8; 16]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Splits `TAG rest` and checks TAG against `key`'s tag of `rest` (in constant time);
/// `rest` if it holds.
fn verified<'a>(
    key: &StoreKey,
    direction: &[u8; 3],
    nonce: &[u8; 32],
    seq: u64,
    line: &'a [u8],
) -> Option<&'a [u8]> {
    let space = line.iter().position(|&b| b == b' ')?;
    let (tag, rest) = (&line[..space], &line[space + 1..]);
    let tag = parse_hex16(std::str::from_utf8(tag).ok()?)?;
    let want = key.tag(direction, nonce, seq, rest);
    let diff = tag
        .iter()
        .zip(want.iter())
        .fold(0u8, |d, (a, b)| d | (a ^ b));
    (diff == 0).then_some(rest)
}

/// Reads the key in `path`, or creates it with a fresh key (atomically: concurrent ranks
/// all end with the same key).
fn load_or_create_key_file(path: &Path) -> Result<StoreKey> {
    use std::os::unix::fs::MetadataExt;
    let fail = |what: &str, e: io::Error| Error::io(format!("{what} {}", path.display()), e);
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fail("cannot create the directory of", e))?;
    }
    if !path.exists() {
        // Unique across the nodes that may share this home directory.
        let mut salt = [0u8; 8];
        getrandom::fill(&mut salt)
            .map_err(|e| fail("cannot draw a name for", io::Error::other(e.to_string())))?;
        let tmp = path.with_extension(format!(
            "tmp{}-{:016x}",
            std::process::id(),
            u64::from_le_bytes(salt)
        ));
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| fail("cannot create", e))?;
        f.write_all(format!("{}\n", StoreKey::generate().to_hex()).as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| fail("cannot write", e))?;
        // The first link wins; the others read its key.
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        if let Err(e) = linked {
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(fail("cannot create", e));
            }
        }
    }
    let meta = fs::metadata(path).map_err(|e| fail("cannot read", e))?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(Error::Config(format!(
            "{} belongs to uid {} with mode {:o}: the rendezvous key file must be yours \
             with mode 600 (chmod 600 it, or remove it for a new one)",
            path.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    let text = fs::read_to_string(path).map_err(|e| fail("cannot read", e))?;
    StoreKey::parse(&text).ok_or_else(|| {
        Error::Config(format!(
            "{} does not hold a rendezvous key (64 hex digits); remove it for a new one",
            path.display()
        ))
    })
}

const REQUEST: &[u8; 3] = b"req";
const REPLY: &[u8; 3] = b"rep";

// ---------------------------------------------------------------------------------------
// Server

/// State shared by the accept thread, the connection threads and the handle.
/// What a server holds and waits for at most.
#[derive(Debug, Clone, Copy)]
struct Limits {
    keys: usize,
    bytes: usize,
    unauthenticated: usize,
    handshake: Duration,
    idle: Duration,
}

impl Limits {
    const DEFAULT: Limits = Limits {
        keys: MAX_KEYS,
        bytes: MAX_STORED_BYTES,
        unauthenticated: MAX_UNAUTHENTICATED,
        handshake: HANDSHAKE_TIMEOUT,
        idle: IDLE_TIMEOUT,
    };
}

struct Shared {
    key: StoreKey,
    limits: Limits,
    map: Mutex<HashMap<String, String>>,
    /// Bytes of the keys and values in `map`.
    stored: AtomicU64,
    /// Connections that have not yet proved the key.
    unauthenticated: AtomicU64,
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
    /// the returned handle is shut down or dropped, to the clients that hold `key`.
    ///
    /// # Panics
    ///
    /// If the operating system cannot create the accepting thread.
    pub fn spawn(self, key: StoreKey) -> KvServerHandle {
        self.spawn_limited(key, Limits::DEFAULT)
    }

    fn spawn_limited(self, key: StoreKey, limits: Limits) -> KvServerHandle {
        let shared = Arc::new(Shared {
            key,
            limits,
            stored: AtomicU64::new(0),
            unauthenticated: AtomicU64::new(0),
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
        if conns.len() >= MAX_CONNECTIONS
            || shared.unauthenticated.load(Ordering::Acquire)
                >= shared.limits.unauthenticated as u64
        {
            let _ = (&stream).write_all(b"ERR too many connections\n");
            return;
        }
        shared.unauthenticated.fetch_add(1, Ordering::AcqRel);
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
        // The closure, and the stream with it, is dropped: close our clone too, and the
        // connection no longer counts as waiting to authenticate.
        shared.unauthenticated.fetch_sub(1, Ordering::AcqRel);
        if let Some(conn) = lock(&shared.conns).remove(&id) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

fn serve_conn(shared: &Shared, stream: TcpStream) {
    let mut authenticated = false;
    serve_authenticated(shared, stream, &mut authenticated);
    if !authenticated {
        shared.unauthenticated.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The read half of a server's connection: every read gives up at `deadline`, so a
/// client that trickles bytes holds its connection no longer than a silent one.
struct Deadlined {
    stream: TcpStream,
    deadline: Instant,
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took too long",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Greets the client with the server's half of the connection's nonce, takes the
/// client's half (`HI nonce`), and answers its tagged requests until it hangs up, stays
/// silent too long or sends a request without the key's tag. Until its first valid
/// request a connection has the handshake time in all, however it spends it.
fn serve_authenticated(shared: &Shared, stream: TcpStream, authenticated: &mut bool) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut nonce = [0u8; 32];
    if getrandom::fill(&mut nonce[..16]).is_err() {
        return;
    }
    let accepted = Instant::now();
    let mut reader = BufReader::new(Deadlined {
        stream: read_half,
        deadline: accepted + shared.limits.handshake,
    });
    let mut writer = stream;
    let server_half: [u8; 16] = nonce[..16].try_into().expect("16 bytes");
    if writer
        .write_all(format!("HELLO {}\n", hex16(&server_half)).as_bytes())
        .is_err()
    {
        return;
    }
    let mut line = Vec::with_capacity(256);
    // The client's half of the nonce: replies are then bound to a connection the client
    // chose too, so that a recorded conversation cannot be played back to it.
    let client_half = match read_line_limited(&mut reader, &mut line, MAX_LINE) {
        Ok(LineRead::Line) => std::str::from_utf8(&line)
            .ok()
            .and_then(|l| l.strip_prefix("HI "))
            .and_then(parse_hex16),
        _ => None,
    };
    let Some(client_half) = client_half else {
        let _ = writer.write_all(b"ERR not authenticated\n");
        return;
    };
    nonce[16..].copy_from_slice(&client_half);
    for seq in 0u64.. {
        if *authenticated {
            reader.get_mut().deadline = Instant::now() + shared.limits.idle;
        }
        let reply = match read_line_limited(&mut reader, &mut line, MAX_LINE) {
            Ok(LineRead::Line) => {
                let Some(request) = verified(&shared.key, REQUEST, &nonce, seq, &line) else {
                    // Not the job's: no answer but this, and no second try.
                    let _ = writer.write_all(b"ERR not authenticated\n");
                    return;
                };
                if !*authenticated {
                    *authenticated = true;
                    shared.unauthenticated.fetch_sub(1, Ordering::AcqRel);
                }
                handle_request(shared, request)
            }
            // Unauthenticated: its tag cannot be checked; the connection ends.
            Ok(LineRead::TooLong) => {
                let _ = writer.write_all(b"ERR line too long\n");
                return;
            }
            Ok(LineRead::Eof) | Err(_) => return,
        };
        let tag = shared.key.tag(REPLY, &nonce, seq, reply.as_bytes());
        let out = format!("{} {reply}\n", hex16(&tag));
        if writer.write_all(out.as_bytes()).is_err() || shared.stop.load(Ordering::Acquire) {
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
        Request::Put { key, value } => store(shared, &mut lock(&shared.map), key, value)
            .map_or_else(|full| full, |()| "OK".into()),
        Request::PutNx { key, value } => {
            let mut map = lock(&shared.map);
            if let Some(stored) = map.get(key) {
                return format!("VAL {stored}");
            }
            store(shared, &mut map, key, value)
                .map_or_else(|full| full, |()| format!("VAL {value}"))
        }
        Request::Get { key, timeout } => wait_get(shared, key, timeout),
        Request::TryGet { key } => match lock(&shared.map).get(key) {
            Some(v) => format!("VAL {v}"),
            None => "NONE".into(),
        },
    }
}

/// Stores `value` under `key` within the store's bounds (what a new value brings beyond
/// what it replaces); the `ERR` reply if it does not fit.
fn store(
    shared: &Shared,
    map: &mut HashMap<String, String>,
    key: &str,
    value: &str,
) -> std::result::Result<(), String> {
    let old = map.get(key).map_or(0, |v| key.len() + v.len()) as u64;
    let new = (key.len() + value.len()) as u64;
    let stored = shared.stored.load(Ordering::Relaxed);
    let Limits { keys, bytes, .. } = shared.limits;
    if (old == 0 && map.len() >= keys) || stored - old + new > bytes as u64 {
        return Err(format!(
            "ERR the store is full ({} keys, {stored} bytes; at most {keys} keys and {bytes} \
             bytes)",
            map.len()
        ));
    }
    shared.stored.store(stored - old + new, Ordering::Relaxed);
    map.insert(key.to_string(), value.to_string());
    shared.changed.notify_all();
    Ok(())
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
    key: StoreKey,
    /// The connection's nonce (the server's half, then this client's), and the number of
    /// the next request.
    nonce: [u8; 32],
    seq: u64,
}

impl Conn {
    /// Opens the connection: reads the server's greeting within `timeout`.
    fn new(stream: TcpStream, key: &StoreKey, timeout: Duration) -> io::Result<Conn> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(REPLY_SLACK))?;
        stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut line = Vec::with_capacity(64);
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        if !matches!(
            read_line_limited(&mut reader, &mut line, MAX_LINE)?,
            LineRead::Line
        ) {
            return Err(bad("the store closed the connection without a greeting"));
        }
        let greeting = String::from_utf8_lossy(&line);
        let server_half = match greeting.strip_prefix("HELLO ").and_then(parse_hex16) {
            Some(n) => n,
            None if greeting.starts_with("ERR ") => return Err(bad(&greeting)),
            None => return Err(bad("this is not a quiver store (no HELLO greeting)")),
        };
        let mut client_half = [0u8; 16];
        getrandom::fill(&mut client_half).map_err(|e| io::Error::other(e.to_string()))?;
        (&stream).write_all(format!("HI {}\n", hex16(&client_half)).as_bytes())?;
        let mut nonce = [0u8; 32];
        nonce[..16].copy_from_slice(&server_half);
        nonce[16..].copy_from_slice(&client_half);
        Ok(Conn {
            reader,
            writer: stream,
            key: key.clone(),
            nonce,
            seq: 0,
        })
    }

    /// Sends `request` and returns the reply line, waiting up to `server_wait` plus slack.
    fn roundtrip(&mut self, request: &str, server_wait: Duration) -> io::Result<String> {
        let read_timeout = server_wait.checked_add(REPLY_SLACK);
        self.writer.set_read_timeout(read_timeout)?;
        let seq = self.seq;
        self.seq += 1;
        let tag = self.key.tag(REQUEST, &self.nonce, seq, request.as_bytes());
        let mut line = format!("{} {request}\n", hex16(&tag)).into_bytes();
        self.writer.write_all(&line)?;
        let not_ours = |why: &str| io::Error::new(io::ErrorKind::PermissionDenied, why.to_string());
        match read_line_limited(&mut self.reader, &mut line, MAX_LINE)? {
            LineRead::Line => {
                let reply = String::from_utf8(line).map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "the reply is not ASCII")
                })?;
                if reply == "ERR not authenticated" {
                    return Err(not_ours(&format!(
                        "the store refused this process's key: {KEY_VAR} (or ~/{KEY_FILE}) \
                         differs from the store's"
                    )));
                }
                match verified(&self.key, REPLY, &self.nonce, seq, reply.as_bytes()) {
                    Some(body) => Ok(String::from_utf8_lossy(body).into_owned()),
                    None => Err(not_ours(&format!(
                        "the store's reply is not signed with this job's key ({KEY_VAR}): \
                         another process answers at that address"
                    ))),
                }
            }
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
fn dial_once(host_port: &str, key: &StoreKey, timeout: Duration) -> io::Result<Conn> {
    let timeout = timeout.max(Duration::from_millis(1));
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host resolves to no address");
    for addr in host_port.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => return Conn::new(stream, key, HANDSHAKE_TIMEOUT),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Connects, retrying every [`DIAL_RETRY`] until `deadline`; the error is the last
/// attempt's.
fn dial(
    host_port: &str,
    key: &StoreKey,
    deadline: Deadline,
) -> std::result::Result<Conn, io::Error> {
    loop {
        let err = match dial_once(
            host_port,
            key,
            deadline.remaining().min(Duration::from_secs(1)),
        ) {
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
    key: StoreKey,
    idle: Mutex<Vec<Conn>>,
    local_ip: Option<IpAddr>,
}

impl TcpClient {
    /// Sends one request on an idle connection (or a new one) and returns the reply line.
    /// Every request is idempotent (a `PUT` of the same value, a `PUTNX` that returns
    /// what is stored, reads), so one that failed on a pooled connection (closed by the
    /// server after [`IDLE_TIMEOUT`]) is sent again on a new one.
    fn request(&self, url: &str, request: &str, server_wait: Duration) -> Result<String> {
        let failed = |e: io::Error| Error::Rendezvous {
            url: url.to_string(),
            reason: format!("request to the store failed: {e}"),
        };
        let pooled = lock(&self.idle).pop();
        let reply = match pooled {
            Some(mut conn) => match conn.roundtrip(request, server_wait) {
                Ok(reply) => Ok((conn, reply)),
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(failed(e)),
                Err(_) => self.request_on_new(url, request, server_wait),
            },
            None => self.request_on_new(url, request, server_wait),
        };
        let (conn, reply) = reply.map_err(failed)?;
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
        Ok(reply)
    }

    fn request_on_new(
        &self,
        url: &str,
        request: &str,
        server_wait: Duration,
    ) -> io::Result<(Conn, String)> {
        let mut conn =
            dial(&self.host_port, &self.key, Deadline::after(REDIAL_TIMEOUT)).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot open another connection to the store at {url}: {e}"),
                )
            })?;
        let reply = conn.roundtrip(request, server_wait)?;
        Ok((conn, reply))
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
    pub fn connect(url: &str, key: &StoreKey, timeout: Duration) -> Result<Rendezvous> {
        Rendezvous::connect_url(parse_url(url)?, Some(key), timeout)
    }

    /// Like [`Rendezvous::connect`], from a parsed URL; a `tcp://` store needs the job's
    /// `key` (a `file://` store none).
    pub fn connect_url(
        url: RendezvousUrl,
        key: Option<&StoreKey>,
        timeout: Duration,
    ) -> Result<Rendezvous> {
        let url_string = url.to_string();
        let store = match url {
            RendezvousUrl::Tcp(host_port) => {
                let key = key.ok_or_else(|| Error::Rendezvous {
                    url: url_string.clone(),
                    reason: format!("a tcp:// store needs the job's key ({KEY_VAR})"),
                })?;
                let conn = dial(&host_port, key, Deadline::after(timeout)).map_err(|e| {
                    Error::Rendezvous {
                        url: url_string.clone(),
                        reason: format!(
                            "no store answered within {timeout:?} (last attempt: {e}); is it \
                             served at that address?"
                        ),
                    }
                })?;
                let local_ip = conn.writer.local_addr().ok().map(|a| a.ip());
                Store::Tcp(TcpClient {
                    host_port,
                    key: key.clone(),
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

    /// The store key of the tests' stores.
    fn key() -> StoreKey {
        StoreKey([7; 32])
    }
    use std::collections::HashSet;
    use std::net::Ipv4Addr;
    use std::sync::Barrier;

    const T: Duration = Duration::from_secs(10);

    fn server() -> KvServerHandle {
        KvServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .unwrap()
            .spawn(key())
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
        let late = Rendezvous::connect(&url, &key(), T).unwrap();
        let host = Rendezvous::connect(&url, &key(), T).unwrap();
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
        let rv = Rendezvous::connect(&tcp_url(&srv), &key(), T).unwrap();
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
        let rv = Arc::new(Rendezvous::connect(url, &key(), T).unwrap());
        let writers: Vec<_> = (0..4)
            .map(|i| {
                let rv = Arc::clone(&rv);
                thread::spawn(move || rv.put(&format!("key/{i}"), &format!("value-{i}")).unwrap())
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let other = Rendezvous::connect(url, &key(), T).unwrap();
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
        let rv = Arc::new(Rendezvous::connect(url, &key(), T).unwrap());
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
        let rv = Rendezvous::connect(url, &key(), T).unwrap();
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
                    let rv = Rendezvous::connect(&url, &key(), T).unwrap();
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
        let rv = Rendezvous::connect(url, &key(), T).unwrap();
        assert_eq!(&rv.get("race", T).unwrap(), seen.iter().next().unwrap());
    }

    fn barrier_4(url: &str) {
        let arrived = Arc::new(AtomicU64::new(0));
        let ranks: Vec<_> = (0..4u32)
            .map(|rank| {
                let url = url.to_string();
                let arrived = Arc::clone(&arrived);
                thread::spawn(move || {
                    let rv = Rendezvous::connect(&url, &key(), T).unwrap();
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
        let rv = Rendezvous::connect(url, &key(), T).unwrap();
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
        let rv = Rendezvous::connect(&dir.url(), &key(), T).unwrap();
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
                .spawn(key())
        });
        let rv = Rendezvous::connect(&format!("tcp://127.0.0.1:{port}"), &key(), T).unwrap();
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
            &key(),
            Duration::from_millis(60),
        )
        .unwrap_err();
        assert!(matches!(e, Error::Rendezvous { .. }), "{e}");
    }

    /// A hand-made client of the line protocol: it tags its lines with `key`.
    struct Raw {
        reader: BufReader<TcpStream>,
        writer: TcpStream,
        key: StoreKey,
        nonce: [u8; 32],
        seq: u64,
    }

    impl Raw {
        /// Connects and gives the server a client nonce, as the library's client does.
        fn connect(srv: &KvServerHandle, key: StoreKey) -> Raw {
            let mut raw = Raw::greeted(srv, key);
            (&raw.writer)
                .write_all(b"HI 0123456789abcdef0123456789abcdef\n")
                .unwrap();
            raw.nonce[16..]
                .copy_from_slice(&parse_hex16("0123456789abcdef0123456789abcdef").unwrap());
            raw
        }

        /// Connects and reads the server's greeting only.
        fn greeted(srv: &KvServerHandle, key: StoreKey) -> Raw {
            let stream = TcpStream::connect(srv.local_addr()).unwrap();
            stream.set_read_timeout(Some(T)).unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut hello = String::new();
            reader.read_line(&mut hello).unwrap();
            let mut nonce = [0u8; 32];
            nonce[..16].copy_from_slice(
                &parse_hex16(hello.trim_end().strip_prefix("HELLO ").unwrap()).unwrap(),
            );
            Raw {
                reader,
                writer: stream,
                key,
                nonce,
                seq: 0,
            }
        }

        /// Sends raw bytes; the reply line as it came.
        fn send(&mut self, bytes: &[u8]) -> String {
            self.writer.write_all(bytes).unwrap();
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            line
        }

        /// Whether the server has closed the connection (a request sent now gets no
        /// reply: end of stream, or a reset).
        fn is_closed(&mut self, bytes: &[u8]) -> bool {
            let _ = self.writer.write_all(bytes);
            let mut line = String::new();
            // A connection cut off before it authenticated says so first.
            if matches!(self.reader.read_line(&mut line), Ok(n) if n > 0) {
                if line != "ERR not authenticated\n" {
                    return false;
                }
                line.clear();
                return !matches!(self.reader.read_line(&mut line), Ok(n) if n > 0);
            }
            true
        }

        /// Sends `request` (bytes, then `end`) tagged; the reply's body, its tag checked.
        fn tagged(&mut self, request: &[u8], end: &str) -> String {
            let tag = self.key.tag(REQUEST, &self.nonce, self.seq, request);
            let mut line = format!("{} ", hex16(&tag)).into_bytes();
            line.extend_from_slice(request);
            line.extend_from_slice(end.as_bytes());
            let reply = self.send(&line);
            let body = verified(
                &self.key,
                REPLY,
                &self.nonce,
                self.seq,
                reply.trim_end().as_bytes(),
            )
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_else(|| panic!("reply {reply:?} is not tagged"));
            self.seq += 1;
            body
        }
    }

    #[test]
    fn malformed_lines_get_err_and_the_connection_goes_on() {
        let srv = server();
        let mut raw = Raw::connect(&srv, key());
        let bad: Vec<&[u8]> = vec![
            b"",
            b"HELLO",
            b"PUT onlykey",
            b"PUT k v extra",
            b"PUT  k v",
            b"GET k soon",
            b"GET k -1",
            b"TRYGET",
            b"put k v",
            b"PUT k \xff\xfe",
        ];
        for b in &bad {
            let reply = raw.tagged(b, "\n");
            assert!(
                reply.starts_with("ERR "),
                "{:?} -> {reply:?}",
                String::from_utf8_lossy(b)
            );
        }
        assert_eq!(raw.tagged(b"PUT k v", "\n"), "OK");
        assert_eq!(raw.tagged(b"GET k 0", "\r\n"), "VAL v");
        assert_eq!(raw.tagged(b"TRYGET nope", "\n"), "NONE");
        assert_eq!(raw.tagged(b"GET nope 10", "\n"), "TIMEOUT");
        assert_eq!(raw.tagged(b"PUTNX k w", "\n"), "VAL v");
        assert_eq!(raw.tagged(b"PUTNX j w", "\n"), "VAL w");
        // A line too long cannot be authenticated: refused, and the connection ends.
        let long = format!("PUT k {}\n", "v".repeat(3 * MAX_LINE));
        assert_eq!(raw.send(long.as_bytes()), "ERR line too long\n");
        assert!(raw.is_closed(b"x\n"));
    }

    /// Issue 28, item 5: a client that does not hold the job's key (another local user,
    /// a host on the network) can neither read nor write, nor replay another
    /// connection's requests; its connection ends at its first request.
    #[test]
    fn a_client_without_the_key_reads_and_writes_nothing() {
        let srv = server();
        let rv = Rendezvous::connect(&tcp_url(&srv), &key(), T).unwrap();
        rv.put("secret", "token").unwrap();
        // Untagged, as before the store had keys.
        let mut plain = Raw::connect(&srv, key());
        assert_eq!(plain.send(b"TRYGET secret\n"), "ERR not authenticated\n");
        assert!(
            plain.is_closed(b"PUT secret mine\n"),
            "the connection must be closed"
        );
        // Tagged with another key.
        let mut wrong = Raw::connect(&srv, StoreKey([8; 32]));
        let tag = wrong.key.tag(REQUEST, &wrong.nonce, 0, b"PUT secret mine");
        let line = format!("{} PUT secret mine\n", hex16(&tag));
        assert_eq!(wrong.send(line.as_bytes()), "ERR not authenticated\n");
        // A valid line of one connection replayed on another.
        let first = Raw::connect(&srv, key());
        let tag = first.key.tag(REQUEST, &first.nonce, 0, b"PUT secret mine");
        let line = format!("{} PUT secret mine\n", hex16(&tag));
        let mut second = Raw::connect(&srv, key());
        assert_eq!(second.send(line.as_bytes()), "ERR not authenticated\n");
        // The library's client with the wrong key says what is wrong.
        let e = Rendezvous::connect(&tcp_url(&srv), &StoreKey([8; 32]), T)
            .and_then(|r| r.try_get("secret"))
            .unwrap_err();
        assert!(e.to_string().contains(KEY_VAR), "{e}");
        assert_eq!(rv.try_get("secret").unwrap().as_deref(), Some("token"));
    }

    /// The server bounds what a client can make it hold or wait for: connections that
    /// have not proved the key, their time to do so, keys and bytes stored.
    #[test]
    fn the_store_bounds_connections_keys_and_bytes() {
        let limits = Limits {
            keys: 3,
            bytes: 40,
            unauthenticated: 2,
            handshake: Duration::from_millis(300),
            idle: Duration::from_millis(300),
        };
        let srv = KvServer::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .unwrap()
            .spawn_limited(key(), limits);
        // One silent, one that trickles a byte of a line every 50 ms (each read comes
        // well within the handshake time; the whole line never does).
        let mut silent = Raw::greeted(&srv, key());
        let mut trickler = Raw::connect(&srv, key());
        let mut third = TcpStream::connect(srv.local_addr()).unwrap();
        let mut refused = String::new();
        third.set_read_timeout(Some(T)).unwrap();
        BufReader::new(&mut third).read_line(&mut refused).unwrap();
        assert_eq!(refused, "ERR too many connections\n");
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(600) {
            let _ = (&trickler.writer).write_all(b"x");
            thread::sleep(Duration::from_millis(50));
        }
        // Both are cut off after the handshake time; then others get in.
        assert!(silent.is_closed(b""));
        assert!(trickler.is_closed(b"\n"));
        let rv = Rendezvous::connect(&tcp_url(&srv), &key(), T).unwrap();
        rv.put("a", "1").unwrap();
        rv.put("b", "2").unwrap();
        rv.put("a", "3").unwrap(); // a replacement needs no new key
        rv.put("c", "4").unwrap();
        let full = rv.put("d", "5").unwrap_err();
        assert!(full.to_string().contains("full"), "{full}");
        let too_big = rv.put("a", &"x".repeat(40)).unwrap_err();
        assert!(too_big.to_string().contains("full"), "{too_big}");
        // An idle connection is closed by the server; the client redials.
        thread::sleep(Duration::from_millis(600));
        assert_eq!(rv.try_get("a").unwrap().as_deref(), Some("3"));
    }

    #[test]
    fn shutdown_stops_listener_and_wakes_getters() {
        let mut srv = server();
        let addr = srv.local_addr();
        let rv = Arc::new(Rendezvous::connect(&tcp_url(&srv), &key(), T).unwrap());
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
