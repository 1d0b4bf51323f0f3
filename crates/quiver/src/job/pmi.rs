//! The PMI-1 and PMI-2 wire protocols: how a process started by MPICH's Hydra
//! (`mpiexec`) or by Slurm's `srun --mpi=pmi2` reaches its launcher's key-value space.
//!
//! The launcher passes a connected socket (`PMI_FD`) or a port to connect to
//! (`PMI_PORT`, with the process's `PMI_ID`). Both protocols start with a PMI-1 `init`
//! line that names the version; PMI-1 then speaks newline-ended lines of
//! `key=value` words (`cmd=put kvsname=K key=A value=B`), PMI-2 length-prefixed
//! commands (`    29cmd=kvs-put;key=A;value=B;`). Of either, quiver uses what a
//! bootstrap needs: put, fence (PMI-1's barrier), get, finalize.
//!
//! The codec (what is written, how a reply is parsed) is pure and tested on its own;
//! [`Pmi`] runs it over the socket.
//!
//! # Guarantees
//!
//! - A reply is read up to [`MAX_REPLY`] bytes and parsed without panicking; a reply
//!   that is not the one expected, or whose `rc` is not 0, is an [`Error::Launcher`]
//!   naming the command and quoting the reply.
//! - Keys and values are restricted to characters neither protocol needs to escape
//!   ([`check_word`]); quiver's own are.
//! - Every read and write is bounded by the caller's deadline.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::rendezvous::{show, Deadline};
use crate::error::{Error, Result};

/// The longest reply accepted (a value is at most 1024 bytes in Hydra and Slurm).
pub(crate) const MAX_REPLY: usize = 64 << 10;

/// A protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// PMI-1: lines of words.
    One,
    /// PMI-2: length-prefixed commands.
    Two,
}

/// Where the launcher's PMI server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Via {
    /// A connected socket the launcher passed (`PMI_FD`).
    Fd(i32),
    /// A port to connect to (`PMI_PORT` = `HOST:PORT`), as process `id` (`PMI_ID`).
    Port { host_port: String, id: u32 },
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Via::Fd(fd) => write!(f, "descriptor {fd} (PMI_FD)"),
            Via::Port { host_port, .. } => write!(f, "{host_port} (PMI_PORT)"),
        }
    }
}

/// A parsed reply: its command and its attributes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub cmd: String,
    pub attrs: Vec<(String, String)>,
}

impl Reply {
    /// The attribute `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a key or value cannot travel unescaped, if it cannot: both protocols split on
/// `=`, PMI-1 on spaces and newlines, PMI-2 on `;`.
pub(crate) fn check_word(w: &str) -> std::result::Result<(), &'static str> {
    if w.is_empty() || w.len() > 1024 {
        Err("must be 1 to 1024 characters long")
    } else if !w
        .bytes()
        .all(|b| b.is_ascii_graphic() && !matches!(b, b'=' | b';'))
    {
        Err("must be printable ASCII without spaces, '=' or ';'")
    } else {
        Ok(())
    }
}

/// A PMI-1 command line: `cmd=NAME k=v ...\n`.
pub(crate) fn encode_v1(cmd: &str, attrs: &[(&str, &str)]) -> Vec<u8> {
    let mut s = format!("cmd={cmd}");
    for (k, v) in attrs {
        s.push_str(&format!(" {k}={v}"));
    }
    s.push('\n');
    s.into_bytes()
}

/// Parses a PMI-1 reply line (without its newline): words `k=v` separated by spaces, the
/// first `cmd=NAME`. A value may hold `=` (only the first one splits).
pub(crate) fn parse_v1(line: &[u8]) -> std::result::Result<Reply, String> {
    let text = std::str::from_utf8(line).map_err(|_| "the reply is not UTF-8".to_string())?;
    let mut words = text.split(' ').filter(|w| !w.is_empty());
    let cmd = match words.next().and_then(|w| w.strip_prefix("cmd=")) {
        Some(c) if !c.is_empty() => c.to_string(),
        _ => return Err(format!("the reply {} does not start with cmd=", show(text))),
    };
    let mut attrs = Vec::new();
    for w in words {
        let Some((k, v)) = w.split_once('=') else {
            return Err(format!("the reply {} holds a word without '='", show(text)));
        };
        attrs.push((k.to_string(), v.to_string()));
    }
    Ok(Reply { cmd, attrs })
}

/// A PMI-2 command: its length in six characters (right-aligned, as MPICH writes it),
/// then `cmd=NAME;k=v;...;`.
pub(crate) fn encode_v2(cmd: &str, attrs: &[(&str, &str)]) -> Vec<u8> {
    let mut body = format!("cmd={cmd};");
    for (k, v) in attrs {
        body.push_str(&format!("{k}={v};"));
    }
    let mut out = format!("{:>6}", body.len()).into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// Parses the length field of a PMI-2 reply: six characters, a decimal number padded
/// with spaces on either side.
pub(crate) fn parse_v2_len(field: &[u8; 6]) -> std::result::Result<usize, String> {
    let text = std::str::from_utf8(field).unwrap_or("");
    match text.trim().parse::<usize>() {
        Ok(n) if n <= MAX_REPLY => Ok(n),
        Ok(n) => Err(format!(
            "a reply of {n} bytes is longer than the {MAX_REPLY} accepted"
        )),
        Err(_) => Err(format!(
            "the length field {} is not a number",
            show(&String::from_utf8_lossy(field))
        )),
    }
}

/// Parses a PMI-2 reply body: `cmd=NAME;k=v;...` (`;;` stands for a `;` in a value).
pub(crate) fn parse_v2(body: &[u8]) -> std::result::Result<Reply, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the reply is not UTF-8".to_string())?;
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ';' {
            if chars.peek() == Some(&';') {
                chars.next();
                cur.push(';');
            } else {
                fields.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        fields.push(cur);
    }
    let mut fields = fields.into_iter().filter(|f| !f.is_empty());
    let cmd = match fields
        .next()
        .as_deref()
        .and_then(|f| f.strip_prefix("cmd="))
    {
        Some(c) if !c.is_empty() => c.to_string(),
        _ => return Err(format!("the reply {} does not start with cmd=", show(text))),
    };
    let mut attrs = Vec::new();
    for f in fields {
        let Some((k, v)) = f.split_once('=') else {
            return Err(format!(
                "the reply {} holds a field without '='",
                show(text)
            ));
        };
        attrs.push((k.to_string(), v.to_string()));
    }
    Ok(Reply { cmd, attrs })
}

/// A connection to the launcher's PMI server, initialised.
pub(crate) struct Pmi {
    conn: UnixStream,
    version: Version,
    via: Via,
    /// PMI-1's key-value space name (PMI-2 names none).
    kvsname: String,
    /// What the server said this process is, when it said (PMI-2's `fullinit`, PMI-1's
    /// `initack` over a port).
    rank_size: Option<(u32, u32)>,
    /// Bytes read past the last reply.
    pending: Vec<u8>,
    deadline: Deadline,
}

impl Pmi {
    /// Connects through `via` and initialises, in `want` or else PMI-2 first and PMI-1
    /// if the server speaks only that. `job` is PMI-2's `PMI_JOBID`, `rank` the rank
    /// the environment gives (`PMI_RANK`), both passed to `fullinit` when known.
    pub(crate) fn connect(
        via: Via,
        want: Option<Version>,
        job: Option<&str>,
        rank: Option<u32>,
        deadline: Deadline,
    ) -> Result<Pmi> {
        let conn = match &via {
            Via::Fd(fd) => adopt_socket(*fd)?,
            Via::Port { host_port, .. } => connect_port(host_port, want.is_some(), deadline)?,
        };
        Pmi::connect_stream(conn, via, want, job, rank, deadline)
    }

    /// [`Pmi::connect`] over a stream already connected to the server `via` names.
    pub(crate) fn connect_stream(
        conn: UnixStream,
        via: Via,
        want: Option<Version>,
        job: Option<&str>,
        rank: Option<u32>,
        deadline: Deadline,
    ) -> Result<Pmi> {
        let mut pmi = Pmi {
            conn,
            version: want.unwrap_or(Version::Two),
            via,
            kvsname: String::new(),
            rank_size: None,
            pending: Vec::new(),
            deadline,
        };
        if let Via::Port { id, .. } = pmi.via.clone() {
            pmi.initack(id)?;
        }
        pmi.init(want)?;
        match pmi.version {
            Version::Two => pmi.fullinit(job, rank)?,
            Version::One => {
                let r = pmi.call("get_my_kvsname", &[], "my_kvsname")?;
                pmi.kvsname = pmi.attr(&r, "kvsname")?.to_string();
                if check_word(&pmi.kvsname).is_err() {
                    return Err(pmi.bad("get_my_kvsname", &format!("{r:?}")));
                }
            }
        }
        Ok(pmi)
    }

    /// The protocol spoken.
    pub(crate) fn version(&self) -> Version {
        self.version
    }

    /// Where the server is.
    pub(crate) fn via(&self) -> &Via {
        &self.via
    }

    /// This process's rank and the job size, if the server said.
    pub(crate) fn rank_size(&self) -> Option<(u32, u32)> {
        self.rank_size
    }

    /// Publishes `key` = `value` (seen by the others after the next fence).
    pub(crate) fn put(&mut self, key: &str, value: &str) -> Result<()> {
        for w in [key, value] {
            if let Err(why) = check_word(w) {
                return Err(Error::Config(format!(
                    "PMI key or value {}: {why}",
                    show(w)
                )));
            }
        }
        match self.version {
            Version::One => {
                let kvs = self.kvsname.clone();
                self.call(
                    "put",
                    &[("kvsname", &kvs), ("key", key), ("value", value)],
                    "put_result",
                )?;
            }
            Version::Two => {
                self.call(
                    "kvs-put",
                    &[("key", key), ("value", value)],
                    "kvs-put-response",
                )?;
            }
        }
        Ok(())
    }

    /// Waits until every process of the job has called it: what they put before is then
    /// visible to all.
    pub(crate) fn fence(&mut self) -> Result<()> {
        match self.version {
            Version::One => self.call("barrier_in", &[], "barrier_out")?,
            Version::Two => self.call("kvs-fence", &[], "kvs-fence-response")?,
        };
        Ok(())
    }

    /// The value of `key`, put by rank `source`; `None` if nobody put it.
    pub(crate) fn get(&mut self, source: u32, key: &str) -> Result<Option<String>> {
        if let Err(why) = check_word(key) {
            return Err(Error::Config(format!("PMI key {}: {why}", show(key))));
        }
        let r = match self.version {
            Version::One => {
                let kvs = self.kvsname.clone();
                let r = self.exchange("get", &[("kvsname", &kvs), ("key", key)], "get_result")?;
                // Hydra answers a missing key with rc=-1, Slurm with rc=1.
                if r.get("rc").is_some_and(|rc| rc != "0") || r.get("found") == Some("FALSE") {
                    return Ok(None);
                }
                r
            }
            Version::Two => {
                let src = source.to_string();
                let r = self.call(
                    "kvs-get",
                    &[("srcid", &src), ("key", key)],
                    "kvs-get-response",
                )?;
                if r.get("found") != Some("TRUE") {
                    return Ok(None);
                }
                r
            }
        };
        Ok(Some(self.attr(&r, "value")?.to_string()))
    }

    /// Tells the server this process is done with it, and closes the connection.
    pub(crate) fn finalize(mut self) -> Result<()> {
        match self.version {
            Version::One => self.call("finalize", &[], "finalize_ack")?,
            Version::Two => self.call("finalize", &[], "finalize-response")?,
        };
        Ok(())
    }

    /// PMI-1 over a port: introduces this process, learns its rank and the size.
    fn initack(&mut self, id: u32) -> Result<()> {
        let id = id.to_string();
        self.send(&encode_v1("initack", &[("pmiid", &id)]))?;
        self.expect_v1("initack", "initack")?;
        let (mut rank, mut size) = (None, None);
        for _ in 0..3 {
            let r = self.expect_v1("initack", "set")?;
            for (k, v) in &r.attrs {
                match k.as_str() {
                    "rank" => rank = v.parse().ok(),
                    "size" => size = v.parse().ok(),
                    _ => {}
                }
            }
        }
        match (rank, size) {
            (Some(r), Some(s)) if r < s => {
                self.rank_size = Some((r, s));
                Ok(())
            }
            _ => Err(self.bad("initack", "its rank and size")),
        }
    }

    /// The version handshake, in PMI-1's syntax whatever the version.
    fn init(&mut self, want: Option<Version>) -> Result<()> {
        let v = match want.unwrap_or(Version::Two) {
            Version::One => ("1", "1"),
            Version::Two => ("2", "0"),
        };
        self.send(&encode_v1(
            "init",
            &[("pmi_version", v.0), ("pmi_subversion", v.1)],
        ))?;
        let r = self.expect_v1("init", "response_to_init")?;
        let version = r.get("pmi_version").unwrap_or("");
        let ok = r.get("rc").is_none_or(|rc| rc == "0");
        self.version = match (ok, version) {
            (true, "2") if want != Some(Version::One) => Version::Two,
            (true, "1") if want != Some(Version::Two) => Version::One,
            // A server that refuses PMI-2 may accept PMI-1 on the same connection.
            (_, _) if want.is_none() && v.0 == "2" => {
                self.send(&encode_v1(
                    "init",
                    &[("pmi_version", "1"), ("pmi_subversion", "1")],
                ))?;
                let r = self.expect_v1("init", "response_to_init")?;
                if r.get("rc").is_some_and(|rc| rc != "0") || r.get("pmi_version") != Some("1") {
                    return Err(self.bad("init", &format!("{r:?}")));
                }
                Version::One
            }
            _ => return Err(self.bad("init", &format!("{r:?}"))),
        };
        Ok(())
    }

    /// PMI-2's `fullinit`: rank, size.
    fn fullinit(&mut self, job: Option<&str>, rank: Option<u32>) -> Result<()> {
        // Over a port the rank came with `initack`.
        let rank_text = rank
            .or(self.rank_size.map(|(r, _)| r))
            .map(|r| r.to_string());
        let mut attrs = Vec::new();
        // Slurm wants the job id, Hydra the rank.
        if let Some(j) = job.filter(|j| check_word(j).is_ok()) {
            attrs.push(("pmijobid", j));
        }
        if let Some(r) = rank_text.as_deref() {
            attrs.push(("pmirank", r));
        }
        attrs.push(("threaded", "FALSE"));
        let r = self.call("fullinit", &attrs, "fullinit-response")?;
        let rank: Option<u32> = r.get("rank").and_then(|v| v.parse().ok());
        let size: Option<u32> = r.get("size").and_then(|v| v.parse().ok());
        match (rank, size) {
            (Some(r), Some(s)) if r < s => {
                self.rank_size = Some((r, s));
                Ok(())
            }
            _ => Err(self.bad("fullinit", &format!("{r:?}"))),
        }
    }

    /// Sends a command and reads its reply, which must be `reply` with rc 0.
    fn call(&mut self, cmd: &str, attrs: &[(&str, &str)], reply: &str) -> Result<Reply> {
        let r = self.exchange(cmd, attrs, reply)?;
        if let Some(rc) = r.get("rc").filter(|rc| *rc != "0") {
            let msg = r.get("msg").or(r.get("errmsg")).unwrap_or("");
            return Err(Error::Launcher {
                service: self.service(),
                reason: format!("{cmd} failed: rc={rc} {}", show(msg)),
            });
        }
        Ok(r)
    }

    /// Sends a command and reads its reply, which must be `reply` (any rc).
    fn exchange(&mut self, cmd: &str, attrs: &[(&str, &str)], reply: &str) -> Result<Reply> {
        match self.version {
            Version::One => {
                self.send(&encode_v1(cmd, attrs))?;
                self.expect_v1(cmd, reply)
            }
            Version::Two => {
                self.send(&encode_v2(cmd, attrs))?;
                let mut field = [0u8; 6];
                self.read_exact(cmd, &mut field)?;
                let len = parse_v2_len(&field).map_err(|why| self.bad(cmd, &why))?;
                let mut body = vec![0u8; len];
                self.read_exact(cmd, &mut body)?;
                let r = parse_v2(&body).map_err(|why| self.bad(cmd, &why))?;
                if r.cmd != reply {
                    return Err(self.bad(cmd, &format!("{r:?}")));
                }
                Ok(r)
            }
        }
    }

    /// Reads a PMI-1 line, which must be command `reply`.
    fn expect_v1(&mut self, cmd: &str, reply: &str) -> Result<Reply> {
        let line = self.read_line(cmd)?;
        let r = parse_v1(&line).map_err(|why| self.bad(cmd, &why))?;
        if r.cmd != reply {
            return Err(self.bad(cmd, &format!("{r:?}")));
        }
        Ok(r)
    }

    fn read_line(&mut self, cmd: &str) -> Result<Vec<u8>> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=end).collect();
                line.pop();
                return Ok(line);
            }
            if self.pending.len() > MAX_REPLY {
                return Err(self.bad(cmd, "a line longer than 64 KiB"));
            }
            let mut buf = [0u8; 1024];
            let n = self.read_some(cmd, &mut buf)?;
            self.pending.extend_from_slice(&buf[..n]);
        }
    }

    fn read_exact(&mut self, cmd: &str, out: &mut [u8]) -> Result<()> {
        let mut at = 0;
        let from_pending = self.pending.len().min(out.len());
        out[..from_pending].copy_from_slice(&self.pending[..from_pending]);
        self.pending.drain(..from_pending);
        at += from_pending;
        while at < out.len() {
            let n = self.read_some(cmd, &mut out[at..])?;
            at += n;
        }
        Ok(())
    }

    fn read_some(&mut self, cmd: &str, buf: &mut [u8]) -> Result<usize> {
        self.ready(cmd, libc::POLLIN)?;
        match self.conn.read(buf) {
            Ok(0) => Err(Error::Launcher {
                service: self.service(),
                reason: format!(
                    "the server closed the connection during {cmd} (did this process already \
                     finalize its PMI connection, or is PMI_FD stale?)"
                ),
            }),
            Ok(n) => Ok(n),
            Err(e) => Err(Error::io(format!("reading the PMI reply to {cmd}"), e)),
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        let mut at = 0;
        while at < bytes.len() {
            self.ready("a command", libc::POLLOUT)?;
            match self.conn.write(&bytes[at..]) {
                Ok(0) => {
                    return Err(Error::io(
                        "writing a PMI command",
                        std::io::ErrorKind::WriteZero.into(),
                    ))
                }
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("writing a PMI command", e)),
            }
        }
        Ok(())
    }

    /// Waits until the socket is ready for `events`, at most until the deadline. With
    /// poll(2), not socket timeouts: the socket may be the launcher's, shared with an MPI
    /// library in the same process, whose options must stay as they were.
    fn ready(&self, cmd: &str, events: libc::c_short) -> Result<()> {
        loop {
            let left = self.left(cmd)?;
            let mut pfd = libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&self.conn),
                events,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
            // SAFETY: `pfd` is one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            match n {
                1.. => return Ok(()),
                0 => continue,
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(Error::io("waiting for the PMI socket", e));
                    }
                }
            }
        }
    }

    /// Time left before the deadline, or the error saying it passed.
    fn left(&self, cmd: &str) -> Result<Duration> {
        match self.deadline.remaining() {
            d if d.is_zero() => Err(self.timed_out(cmd)),
            // Socket timeouts take what a `timespec` holds.
            d => Ok(d.min(Duration::from_secs(86_400))),
        }
    }

    fn timed_out(&self, cmd: &str) -> Error {
        Error::Launcher {
            service: self.service(),
            reason: format!(
                "no reply to {cmd} in time (did every rank start? a fence waits for all)"
            ),
        }
    }

    fn attr<'r>(&self, r: &'r Reply, key: &str) -> Result<&'r str> {
        r.get(key)
            .ok_or_else(|| self.bad(&r.cmd, &format!("{r:?} without {key}")))
    }

    fn bad(&self, cmd: &str, what: &str) -> Error {
        Error::Launcher {
            service: self.service(),
            reason: format!("unexpected reply to {cmd}: {}", show(what)),
        }
    }

    fn service(&self) -> String {
        let v = match self.version {
            Version::One => "PMI-1",
            Version::Two => "PMI-2",
        };
        format!("{v} over {}", self.via)
    }
}

/// A private duplicate of the socket the launcher passed as `fd` (which stays open for
/// whoever else may use it).
fn adopt_socket(fd: i32) -> Result<UnixStream> {
    let invalid = |reason: &str| Error::InvalidEnv {
        var: "PMI_FD".into(),
        value: fd.to_string(),
        reason: reason.into(),
    };
    if fd < 0 {
        return Err(invalid("not a descriptor"));
    }
    // SAFETY: F_DUPFD_CLOEXEC reads no memory; on a descriptor that is not open it fails
    // with EBADF.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(invalid(
            "not an open descriptor in this process (was the program started by a launcher \
             that passes PMI_FD, and not by a process it started?)",
        ));
    }
    // SAFETY: `dup` was just created by fcntl and is owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `owned` is open; `st` is valid for writes of a `stat`.
    if unsafe { libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&owned), &mut st) } != 0
        || st.st_mode & libc::S_IFMT != libc::S_IFSOCK
    {
        return Err(invalid("not a socket"));
    }
    // Hydra and Slurm pass one end of a Unix stream socket pair: a descriptor of another
    // kind is one of the program's own that took a stale PMI_FD's number.
    let option = |name: libc::c_int| -> Option<libc::c_int> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` and `len` are valid for writes of an int and its length.
        let rc = unsafe {
            libc::getsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&owned),
                libc::SOL_SOCKET,
                name,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (rc == 0).then_some(v)
    };
    if option(libc::SO_DOMAIN) != Some(libc::AF_UNIX)
        || option(libc::SO_TYPE) != Some(libc::SOCK_STREAM)
    {
        return Err(invalid(
            "not a Unix stream socket, as launchers pass (a descriptor of this program that \
             took a stale PMI_FD's number?)",
        ));
    }
    // Reads and writes on any connected stream socket; the timeouts are socket options.
    Ok(UnixStream::from(owned))
}

/// Connects to `HOST:PORT`, as a stream like [`adopt_socket`]'s.
/// A port other hosts can reach is used only when asked for by name (`allow_remote`):
/// whoever reaches a PMI port can read what the job's processes put there, the store's
/// key among it (Hydra admits any `initack`).
fn connect_port(host_port: &str, allow_remote: bool, deadline: Deadline) -> Result<UnixStream> {
    use std::net::{TcpStream, ToSocketAddrs};
    let invalid = |reason: String| Error::InvalidEnv {
        var: "PMI_PORT".into(),
        value: host_port.into(),
        reason,
    };
    let addrs: Vec<_> = host_port
        .to_socket_addrs()
        .map_err(|e| invalid(format!("expected HOST:PORT ({e})")))?
        .collect();
    if !allow_remote && addrs.iter().any(|a| !a.ip().is_loopback()) {
        return Err(Error::Launcher {
            service: format!("PMI over {host_port} (PMI_PORT)"),
            reason: "the PMI port is reachable from other hosts, and whoever reaches it can \
                     read the job's store key: set QUIVER_BOOTSTRAP=pmi2 (or pmi1) to use it \
                     anyway, or QUIVER_RENDEZVOUS"
                .into(),
        });
    }
    let mut last = None;
    for a in addrs {
        let left = deadline
            .remaining()
            .clamp(Duration::from_millis(1), Duration::from_secs(60));
        match TcpStream::connect_timeout(&a, left) {
            Ok(s) => return Ok(UnixStream::from(OwnedFd::from(s))),
            Err(e) => last = Some(e),
        }
    }
    Err(Error::Launcher {
        service: format!("PMI-1 over {host_port} (PMI_PORT)"),
        reason: format!(
            "cannot connect: {}",
            last.map_or("no address".to_string(), |e| e.to_string())
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn commands_are_encoded_as_each_protocol_writes_them() {
        assert_eq!(
            encode_v1("put", &[("kvsname", "k_1"), ("key", "a"), ("value", "b")]),
            b"cmd=put kvsname=k_1 key=a value=b\n"
        );
        assert_eq!(
            encode_v2("kvs-put", &[("key", "a"), ("value", "b")]),
            b"    26cmd=kvs-put;key=a;value=b;"
        );
    }

    #[test]
    fn replies_of_hydra_and_slurm_parse() {
        let r = parse_v1(b"cmd=get_result rc=0 msg=success value=tcp://1.2.3.4:5").unwrap();
        assert_eq!(r.cmd, "get_result");
        assert_eq!(r.get("value"), Some("tcp://1.2.3.4:5"));
        let r = parse_v1(b"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1").unwrap();
        assert_eq!(r.get("pmi_version"), Some("1"));
        assert_eq!(parse_v2_len(b"   113").unwrap(), 113);
        assert_eq!(parse_v2_len(b"114   ").unwrap(), 114);
        let r = parse_v2(b"cmd=kvs-get-response;rc=0;found=TRUE;value=a;;b;").unwrap();
        assert_eq!(r.cmd, "kvs-get-response");
        assert_eq!(r.get("value"), Some("a;b"));
        assert_eq!(r.get("found"), Some("TRUE"));
    }

    #[test]
    fn malformed_replies_are_errors() {
        assert!(parse_v1(b"").is_err());
        assert!(parse_v1(b"rc=0 cmd=x").is_err());
        assert!(parse_v1(b"cmd=x word").is_err());
        assert!(parse_v1(b"cmd=x \xff").is_err());
        assert!(parse_v2(b"rc=0;").is_err());
        assert!(parse_v2(b"cmd=;").is_err());
        assert!(parse_v2(b"cmd=x;noequals;").is_err());
        assert!(parse_v2_len(b"abcdef").is_err());
        assert!(parse_v2_len(b"999999").is_err());
    }

    #[test]
    fn words_that_would_need_escaping_are_refused() {
        assert!(check_word("tcp://10.0.0.1:4000,tcp://127.0.0.1:4000").is_ok());
        for bad in ["", "a b", "a=b", "a;b", "a\nb", "é"] {
            assert!(check_word(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn any_reply_parses_or_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_v1(&bytes);
            let _ = parse_v2(&bytes);
        }

        #[test]
        fn encoded_words_come_back(key in "[a-z][a-z0-9-]{0,20}", value in "[!-:<>-~]{1,60}") {
            let v1 = encode_v1("put", &[("key", &key), ("value", &value)]);
            let r = parse_v1(&v1[..v1.len() - 1]).unwrap();
            prop_assert_eq!(r.get("value"), Some(value.as_str()));
            let v2 = encode_v2("kvs-put", &[("key", &key), ("value", &value)]);
            let len = parse_v2_len(v2[..6].try_into().unwrap()).unwrap();
            prop_assert_eq!(len, v2.len() - 6);
            let r = parse_v2(&v2[6..]).unwrap();
            prop_assert_eq!(r.get("key"), Some(key.as_str()));
            prop_assert_eq!(r.get("value"), Some(value.as_str()));
        }
    }
}
