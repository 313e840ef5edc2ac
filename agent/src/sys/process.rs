//! Starting a command whose `execve` waits for us: `lookback run` must attach its probes and
//! register the child as a target before the child's first instruction runs. `std`'s
//! `Command::spawn` cannot do this (it blocks until the child has exec'd), so this is a
//! plain fork/exec with a gate pipe, and a pidfd to wait on asynchronously.
use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, process::ExitStatusExt as _},
    },
    path::Path,
    process::ExitStatus,
};

use super::SyscallError;

/// Failure to start the command.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("argument contains a NUL byte")]
    Nul,
    #[error(transparent)]
    Syscall(#[from] SyscallError),
    #[error("cannot execute {program}")]
    Exec {
        program: String,
        #[source]
        source: io::Error,
    },
}

/// A forked child held before `execve` until [`HeldProcess::release`].
#[derive(Debug)]
pub struct HeldProcess {
    pid: u32,
    gate: Option<OwnedFd>,
    exec_errors: Option<OwnedFd>,
    pidfd: OwnedFd,
    program: String,
    status: Option<ExitStatus>,
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SyscallError> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two fds into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SyscallError::last("pipe2"));
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl HeldProcess {
    /// Forks; the child waits for [`release`](Self::release), then executes `program` with
    /// `argv` (argv[0] included) and the current environment.
    pub fn spawn(program: &Path, argv: &[String]) -> Result<Self, SpawnError> {
        let c_program =
            CString::new(program.as_os_str().as_bytes()).map_err(|_| SpawnError::Nul)?;
        let c_args: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|_| SpawnError::Nul)?;
        let mut argv_ptrs: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let (gate_read, gate_write) = pipe()?;
        let (err_read, err_write) = pipe()?;
        // SAFETY: after fork the child only makes async-signal-safe calls (close, read,
        // execv, write, _exit) on memory prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(SyscallError::last("fork").into());
        }
        if pid == 0 {
            // SAFETY: see above; this branch never returns.
            unsafe {
                libc::close(gate_write.as_raw_fd());
                libc::close(err_read.as_raw_fd());
                let mut byte = 0u8;
                if libc::read(gate_read.as_raw_fd(), (&raw mut byte).cast(), 1) != 1 {
                    libc::_exit(127); // lookback went away before releasing us
                }
                libc::execv(c_program.as_ptr(), argv_ptrs.as_ptr());
                let errno = *libc::__errno_location();
                libc::write(err_write.as_raw_fd(), (&raw const errno).cast(), 4);
                libc::_exit(127);
            }
        }
        drop((gate_read, err_write));
        #[expect(clippy::cast_sign_loss, reason = "fork returned a positive pid")]
        let pid = pid as u32;
        // SAFETY: pidfd_open(pid, 0) on our own child, which cannot be reaped behind our back.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            return Err(SyscallError::last("pidfd_open").into());
        }
        // SAFETY: a fresh fd returned by the kernel.
        let pidfd = unsafe { OwnedFd::from_raw_fd(i32::try_from(raw).unwrap_or(-1)) };
        Ok(Self {
            pid,
            gate: Some(gate_write),
            exec_errors: Some(err_read),
            pidfd,
            program: program.display().to_string(),
            status: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Readable when the child has exited.
    pub fn pidfd(&self) -> &OwnedFd {
        &self.pidfd
    }

    /// Lets the child exec; reports an exec failure (e.g. permission denied).
    pub fn release(&mut self) -> Result<(), SpawnError> {
        let Some(gate) = self.gate.take() else {
            return Ok(());
        };
        // SAFETY: writing one byte from a valid buffer to our pipe.
        unsafe { libc::write(gate.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        let Some(errors) = self.exec_errors.take() else {
            return Ok(());
        };
        let mut errno = 0i32;
        // SAFETY: reading at most 4 bytes into an i32 we own; EOF (0) means exec succeeded.
        let n = unsafe { libc::read(errors.as_raw_fd(), (&raw mut errno).cast(), 4) };
        if n == 4 {
            return Err(SpawnError::Exec {
                program: self.program.clone(),
                source: io::Error::from_raw_os_error(errno),
            });
        }
        Ok(())
    }

    /// The exit status if the child has exited (reaps it once).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, SyscallError> {
        if self.status.is_some() {
            return Ok(self.status);
        }
        let mut status = 0i32;
        #[expect(clippy::cast_possible_wrap, reason = "pids fit in pid_t")]
        // SAFETY: waitpid on our own child with a valid out pointer.
        let r = unsafe { libc::waitpid(self.pid as i32, &raw mut status, libc::WNOHANG) };
        if r < 0 {
            return Err(SyscallError::last("waitpid"));
        }
        if r == 0 {
            return Ok(None);
        }
        self.status = Some(ExitStatus::from_raw(status));
        Ok(self.status)
    }

    /// Sends `signal` to the child (ignored once it has been reaped).
    pub fn kill(&self, signal: i32) {
        if self.status.is_none() {
            #[expect(clippy::cast_possible_wrap, reason = "pids fit in pid_t")]
            // SAFETY: kill has no memory preconditions; the pid is our unreaped child.
            unsafe {
                libc::kill(self.pid as i32, signal);
            }
        }
    }
}
