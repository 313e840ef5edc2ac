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
    /// `argv` (argv[0] included) and the current environment. `stdout_to_stderr`: the
    /// child's stdout is our stderr (our stdout carries `--json -` lines).
    pub fn spawn(
        program: &Path,
        argv: &[String],
        stdout_to_stderr: bool,
    ) -> Result<Self, SpawnError> {
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
        // dup2, execv, write, _exit) on memory prepared before the fork.
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
                if stdout_to_stderr && libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) < 0 {
                    let errno = *libc::__errno_location();
                    libc::write(err_write.as_raw_fd(), (&raw const errno).cast(), 4);
                    libc::_exit(127);
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

    /// The exit status once [`try_wait`](Self::try_wait) has seen the child exit.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
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

/// Makes this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`):
/// a server that daemonizes under `run` (forks, and the parent exits) stays our
/// descendant, so `run` can tell when the last of them is gone. The orphans see us as
/// their parent (`getppid`) instead of init, as under systemd, tini or a container's init.
pub fn become_subreaper() -> Result<(), SyscallError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(SyscallError::last("prctl(PR_SET_CHILD_SUBREAPER)"));
    }
    Ok(())
}

/// Reaps exited children other than `keep` (the command, whose status
/// [`HeldProcess::try_wait`] takes) and says whether any child is left.
/// In: nothing. Out: `true` while a child (living, or `keep` exited but unreaped) remains.
/// Why a peek first (`WNOWAIT`): `waitpid(-1)` could take the command's status.
pub fn reap_orphans(keep: Option<u32>) -> Result<bool, SyscallError> {
    loop {
        // SAFETY: an all-zero siginfo_t is a valid out buffer for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes into the siginfo we own.
        let r = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &raw mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if r < 0 {
            let error = SyscallError::last("waitid");
            return if error.errno() == Some(libc::ECHILD) {
                Ok(false)
            } else {
                Err(error)
            };
        }
        // SAFETY: waitid filled the siginfo (si_pid 0: children, none exited).
        let pid = unsafe { info.si_pid() };
        #[expect(clippy::cast_sign_loss, reason = "waitid reports positive pids")]
        if pid == 0 || keep == Some(pid as u32) {
            return Ok(true);
        }
        let mut status = 0i32;
        // SAFETY: reaping the exited child waitid just named.
        unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) };
        log::debug!("reaped descendant {pid}");
    }
}
