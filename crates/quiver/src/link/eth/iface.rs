//! Interfaces and Ethernet addresses: which interface carries a rank's address, its
//! index, MAC and MTU, and the text form of a MAC that the rendezvous store carries.

use super::*;

/// A 48-bit Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Why a string is not a MAC address. Converts into [`Error::Config`] and into `String`,
/// so that `?` works in either kind of caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MacParseError(String);

impl fmt::Display for MacParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MacParseError {}

impl From<MacParseError> for Error {
    fn from(e: MacParseError) -> Error {
        Error::Config(e.0)
    }
}

impl From<MacParseError> for String {
    fn from(e: MacParseError) -> String {
        e.0
    }
}

impl FromStr for MacAddr {
    type Err = MacParseError;

    /// Parses six two-digit hexadecimal bytes separated by colons (`02:42:ac:11:00:02`).
    fn from_str(s: &str) -> std::result::Result<MacAddr, MacParseError> {
        let bad = |why: &str| {
            MacParseError(format!(
                "{s:?} is not a MAC address ({why}; expected six two-digit hex bytes separated by colons, like 02:42:ac:11:00:02)"
            ))
        };
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for (i, byte) in mac.iter_mut().enumerate() {
            let p = parts
                .next()
                .ok_or_else(|| bad(&format!("{i} bytes instead of 6")))?;
            if p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(&format!("byte {} is {p:?}", i + 1)));
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| bad("bad hex digit"))?;
        }
        if parts.next().is_some() {
            return Err(bad("more than 6 bytes"));
        }
        Ok(MacAddr(mac))
    }
}

/// An interface found by address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    pub name: String,
    pub index: u32,
    pub mac: MacAddr,
    pub mtu: usize,
}

impl Interface {
    /// The interface that carries IP address `ip` (getifaddrs), with its index, MAC
    /// (SIOCGIFHWADDR) and MTU (SIOCGIFMTU); Ok(None) if no interface has it.
    pub(crate) fn with_addr(ip: IpAddr) -> Result<Option<Interface>> {
        let found = ip_addresses()?
            .into_iter()
            .find(|a| a.ip == ip)
            .map(|a| a.interface);
        match found {
            Some(name) => Interface::by_name(&name).map(Some),
            None => Ok(None),
        }
    }

    /// The interface called `name`, with its index, MAC and MTU. An interface that is not
    /// Ethernet (or loopback) is an error.
    pub(crate) fn by_name(name: &str) -> Result<Interface> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(Error::Config(format!(
                "{name:?} is not an interface name (1 to {} bytes, no NUL)",
                libc::IFNAMSIZ - 1
            )));
        }
        let cname = CString::new(name).expect("checked for NUL above");
        // SAFETY: cname is a valid NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(Error::io(
                format!("network interface {name:?}"),
                io::Error::last_os_error(),
            ));
        }
        // Any socket will do for the SIOCGIF* requests; a UDP one needs no privilege.
        // SAFETY: socket has no memory preconditions; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(Error::io(
                "socket for interface requests",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a fresh descriptor that nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(raw) };
        let ifreq = |request: libc::c_ulong, what: &str| -> Result<libc::ifreq> {
            // SAFETY: ifreq is plain data (a name and a union of plain data); zero is valid.
            let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
            for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
                *d = s as libc::c_char;
            }
            // SAFETY: the request reads the NUL-terminated name and writes into the union
            // of `req`, which is valid for the call.
            if unsafe { libc::ioctl(sock.as_raw_fd(), request as _, &mut req) } < 0 {
                return Err(Error::io(
                    format!("{what} of interface {name}"),
                    io::Error::last_os_error(),
                ));
            }
            Ok(req)
        };
        let hw = ifreq(libc::SIOCGIFHWADDR, "hardware address (SIOCGIFHWADDR)")?;
        // SAFETY: SIOCGIFHWADDR filled the ifru_hwaddr member of the union.
        let hw = unsafe { hw.ifr_ifru.ifru_hwaddr };
        if hw.sa_family != libc::ARPHRD_ETHER && hw.sa_family != libc::ARPHRD_LOOPBACK {
            return Err(Error::Config(format!(
                "interface {name} is not Ethernet (ARPHRD type {}): the raw Ethernet link needs an Ethernet interface",
                hw.sa_family
            )));
        }
        let mut mac = [0u8; 6];
        for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
            *d = *s as u8;
        }
        let mtu = ifreq(libc::SIOCGIFMTU, "MTU (SIOCGIFMTU)")?;
        // SAFETY: SIOCGIFMTU filled the ifru_mtu member of the union.
        let mtu = unsafe { mtu.ifr_ifru.ifru_mtu };
        Ok(Interface {
            name: name.to_owned(),
            index,
            mac: MacAddr(mac),
            mtu: mtu.max(0) as usize,
        })
    }
}

/// An IP address of this host and the interface that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IfAddr {
    /// The interface's name.
    pub interface: String,
    /// The address.
    pub ip: IpAddr,
    /// Whether the interface is up.
    pub up: bool,
}

/// Every IPv4 and IPv6 address of this host's interfaces (getifaddrs), in the kernel's
/// order.
pub(crate) fn ip_addresses() -> Result<Vec<IfAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `list`; checked below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(Error::io("getifaddrs", io::Error::last_os_error()));
    }
    let mut found = Vec::new();
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*at };
        at = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says its real type; the
        // sockaddr_in/_in6 casts below are made only for the matching family.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: family AF_INET: the address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6: the address is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
        found.push(IfAddr {
            interface: name.to_string_lossy().into_owned(),
            ip,
            up: ifa.ifa_flags & libc::IFF_UP as libc::c_uint != 0,
        });
    }
    // SAFETY: `list` came from getifaddrs and is freed once; no reference into it
    // outlives this point (names and addresses were copied).
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}
