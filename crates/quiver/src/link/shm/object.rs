//! Named shared-memory objects of the job's processes, mapped whole: the memory behind
//! shared buffers and split-copy boards (`crate::rma`).
//!
//! An object is a POSIX shared-memory object of mode 0600, like the job's segments, named
//! `/quiver-UID-JOB-...` (the job id in 8 hex digits) so that [`super::cleanup_job`]
//! removes it with them. Its creator
//! maps it writable; others map it read-only or writable, and only if it is their own
//! user's with mode 0600 ([`check_owned`]). Every read through
//! [`Mapping::get`] is checked against the size of the object as mapped: a bad offset
//! from a peer is an error, not an out-of-bounds read.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::io;

/// A mapping of a shared-memory object.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// Creates (`create`: that many bytes) or opens the object `name` and maps it
    /// (all of it when opening), read-only when opened with `create` `None`.
    pub(crate) fn open(name: &str, create: Option<usize>) -> Result<Mapping> {
        Mapping::map(name, create, false, false)
    }

    /// [`Mapping::open`] with every page mapped at once (`MAP_POPULATE`): for an object
    /// that is used whole and often, whose first pass would otherwise take a page fault
    /// per page on the way (a ring of messages).
    pub(crate) fn open_populated(name: &str, create: Option<usize>) -> Result<Mapping> {
        Mapping::map(name, create, false, true)
    }

    /// Opens the existing object `name` and maps all of it readable and writable.
    pub(crate) fn open_writable(name: &str) -> Result<Mapping> {
        Mapping::map(name, None, true, false)
    }

    fn map(name: &str, create: Option<usize>, writable: bool, populate: bool) -> Result<Mapping> {
        let c = CString::new(name).map_err(|_| Error::Config(format!("bad name {name:?}")))?;
        let writable = writable || create.is_some();
        let flags = match create {
            Some(_) => libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            None if writable => libc::O_RDWR,
            None => libc::O_RDONLY,
        };
        // SAFETY: c is a valid NUL-terminated string; the result is checked.
        let fd = unsafe { libc::shm_open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o600) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::AlreadyExists {
                check_existing(name)?;
            }
            return Err(Error::io(format!("shm_open {name}"), e));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        use std::os::fd::{AsRawFd, FromRawFd};
        // Another user's object under this job's name is never mapped.
        let st = check_owned(fd.as_raw_fd(), name)?;
        let len = match create {
            Some(len) => {
                // SAFETY: ftruncate on our descriptor.
                if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
                    let e = io::Error::last_os_error();
                    // SAFETY: c names the object we just created.
                    unsafe { libc::shm_unlink(c.as_ptr()) };
                    return Err(Error::io(format!("sizing {name}"), e));
                }
                if populate {
                    // Backed now, or refused now: a mapping populated over a full
                    // /dev/shm would raise SIGBUS at its first touch instead.
                    // SAFETY: posix_fallocate on our descriptor.
                    let rc =
                        unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len as libc::off_t) };
                    if rc != 0 {
                        // SAFETY: c names the object we just created.
                        unsafe { libc::shm_unlink(c.as_ptr()) };
                        return Err(Error::io(
                            format!("reserving the {len} bytes of {name}"),
                            io::Error::from_raw_os_error(rc),
                        ));
                    }
                }
                len
            }
            None => st.st_size as usize,
        };
        if len == 0 {
            return Ok(Mapping {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            });
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: maps `len` bytes of our descriptor; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 },
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            if create.is_some() {
                // SAFETY: c names the object we just created.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
            return Err(Error::io(format!("mmap {name}"), e));
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// First byte of the mapping (dangling when it is empty).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes `offset..offset + len`, if they lie inside the mapping.
    pub(crate) fn get(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let end = usize::try_from(offset).ok()?.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: offset + len <= self.len: inside the live mapping.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(offset as usize), len) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: ptr/len is a mapping made by `open` and unmapped only here.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// Checks that the object open on `fd` (named `name`) is this user's and that nobody
/// else may open it (mode 0600): an object another user created under the job's name,
/// or opened to others, is refused ([`Error::SegmentSquatted`]) before anything reads or
/// writes it. Returns its status.
pub(crate) fn check_owned(fd: std::os::fd::RawFd, name: &str) -> Result<libc::stat> {
    // SAFETY: st is plain data, filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a descriptor the caller holds open, into a writable struct.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Error::io(
            format!("fstat {name}"),
            io::Error::last_os_error(),
        ));
    }
    refuse_foreign(name, st.st_uid, st.st_mode)?;
    Ok(st)
}

/// For an object `name` that already exists where this process wanted to create one:
/// [`Error::SegmentSquatted`] if another user holds it (this user's own leftover is
/// `Ok`, for the caller to judge).
pub(crate) fn check_existing(name: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(format!("/dev/shm{name}")) {
        Ok(m) => refuse_foreign(name, m.uid(), m.mode()),
        // Gone meanwhile, or /dev/shm elsewhere: the caller's next try says.
        Err(_) => Ok(()),
    }
}

fn refuse_foreign(name: &str, uid: u32, mode: u32) -> Result<()> {
    let expected = self::uid();
    if uid != expected || mode & 0o077 != 0 {
        return Err(Error::SegmentSquatted {
            name: name.to_string(),
            uid,
            mode: mode & 0o7777,
            expected,
        });
    }
    Ok(())
}

/// This process's user id, which every object name starts with.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Removes the object `name` (its mappings stay valid until unmapped).
pub(crate) fn unlink(name: &str) {
    if let Ok(c) = CString::new(name) {
        // SAFETY: c is a valid NUL-terminated string.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
}
