//! Running commands: to completion with clear errors, or in the background
//! with a kill on drop and a way to wait for a line of output.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

/// Runs `argv` to completion and returns its stdout; a non-zero exit is an
/// error that carries the command line and its stderr.
pub fn run(argv: &[&str]) -> Result<String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .with_context(|| format!("starting `{}`", argv.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A background process, killed on drop. Its stdout lines arrive on a channel
/// so a test can wait for an event ("ready") instead of sleeping.
pub struct Proc {
    child: Child,
    what: String,
    lines: mpsc::Receiver<String>,
    /// Run (to completion) when the process is killed or dropped: what
    /// stops it for good where killing the child alone does not (a
    /// container outlives its `podman run`).
    cleanup: Option<Vec<String>>,
    /// Set when the process is killed: the log follower stops.
    stop_following: Option<Arc<AtomicBool>>,
    /// Lines a wait passed over (the latest [`PASSED_KEPT`]): a later wait
    /// for a line that may come first looks here too.
    passed: std::collections::VecDeque<String>,
}

/// How many passed-over lines a [`Proc`] keeps.
const PASSED_KEPT: usize = 1000;

/// Where [`Proc::spawn_logged`] writes each process's output, when set
/// (the demo sets it; tests leave their processes' logs on the terminal).
pub const LOG_DIR_VAR: &str = "EGRESS_HARNESS_LOG_DIR";

impl Proc {
    pub fn spawn(cmd: Command, what: String) -> Result<Self> {
        Self::spawn_inner(cmd, what, None)
    }

    /// [`Proc::spawn`], and `cleanup` runs when it is killed or dropped.
    /// Its stderr lines arrive with its stdout lines (an error message is
    /// something to wait for too).
    pub fn spawn_with_cleanup(cmd: Command, what: String, cleanup: Vec<String>) -> Result<Self> {
        Self::spawn_inner(cmd, what, Some(cleanup))
    }

    fn spawn_inner(mut cmd: Command, what: String, cleanup: Option<Vec<String>>) -> Result<Self> {
        cmd.stdout(Stdio::piped()).stdin(Stdio::null());
        if cleanup.is_some() {
            cmd.stderr(Stdio::piped());
        }
        let mut child = cmd.spawn().with_context(|| format!("starting `{what}`"))?;
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout is piped");
        forward_lines(stdout, tx.clone());
        if let Some(stderr) = child.stderr.take() {
            forward_lines(stderr, tx);
        }
        Ok(Self {
            child,
            what,
            lines,
            cleanup,
            stop_following: None,
            passed: Default::default(),
        })
    }

    /// [`Proc::spawn`]; with [`LOG_DIR_VAR`] set, the process writes its
    /// stdout and stderr to `<dir>/<name>.log` instead (plain text: not a
    /// terminal), and its lines are read back from that file. So a process
    /// left running after the caller exits (`demo --keep`) neither writes
    /// to the caller's terminal nor loses its stdout.
    pub fn spawn_logged(mut cmd: Command, what: String, name: &str) -> Result<Self> {
        let Some(dir) = std::env::var_os(LOG_DIR_VAR) else {
            return Self::spawn(cmd, what);
        };
        let path = std::path::Path::new(&dir).join(format!("{name}.log"));
        let file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        cmd.stdout(file.try_clone()?)
            .stderr(file)
            .stdin(Stdio::null());
        let child = cmd.spawn().with_context(|| format!("starting `{what}`"))?;
        let (tx, lines) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        follow_lines(std::fs::File::open(&path)?, tx, Arc::clone(&stop));
        Ok(Self {
            child,
            what,
            lines,
            cleanup: None,
            stop_following: Some(stop),
            passed: Default::default(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// [`Proc::wait_for_line`], but a line an earlier wait passed over
    /// counts too (and is taken): for a line whose order against the one
    /// waited for before is not fixed.
    pub fn wait_for_line_seen_or_next(
        &mut self,
        needle: &str,
        timeout: Duration,
    ) -> Result<String> {
        if let Some(i) = self.passed.iter().position(|l| l.contains(needle)) {
            return Ok(self.passed.remove(i).expect("index found above"));
        }
        self.wait_for_line(needle, timeout)
    }

    /// Waits until a stdout line contains `needle` and returns that line.
    /// Fails when the process exits first or `timeout` passes.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        // The last lines seen, for the error: they usually say why.
        let mut seen = std::collections::VecDeque::new();
        let tail = |seen: &std::collections::VecDeque<String>| {
            let lines: Vec<&str> = seen.iter().map(String::as_str).collect();
            format!("; its last lines:\n{}", lines.join("\n"))
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // A followed log is looked at in slices, to notice an exit.
            let slice = if self.stop_following.is_some() {
                left.min(Duration::from_millis(100))
            } else {
                left
            };
            match self.lines.recv_timeout(slice) {
                Ok(line) if line.contains(needle) => return Ok(line),
                Ok(line) => {
                    if seen.len() == 12 {
                        seen.pop_front();
                    }
                    seen.push_back(line.clone());
                    if self.passed.len() == PASSED_KEPT {
                        self.passed.pop_front();
                    }
                    self.passed.push_back(line);
                }
                Err(mpsc::RecvTimeoutError::Timeout) if self.stop_following.is_some() => {
                    // A followed log never disconnects: an exit is seen here.
                    if let Some(status) = self.exited() {
                        bail!(
                            "`{}` exited ({status}) before printing {needle:?}{}",
                            self.what,
                            tail(&seen)
                        )
                    }
                    if left.is_zero() {
                        bail!(
                            "`{}` printed no line with {needle:?} within {timeout:?}{}",
                            self.what,
                            tail(&seen)
                        )
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!(
                        "`{}` printed no line with {needle:?} within {timeout:?}{}",
                        self.what,
                        tail(&seen)
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    bail!(
                        "`{}` exited ({status:?}) before printing {needle:?}{}",
                        self.what,
                        tail(&seen)
                    )
                }
            }
        }
    }

    /// Sends SIGTERM and waits for the exit (the graceful path).
    pub fn terminate(mut self) -> Result<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        Ok(self.child.wait()?)
    }

    /// Sends SIGTERM without waiting (read the final output with wait_for_line).
    pub fn signal_term(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(stop) = &self.stop_following {
            stop.store(true, Ordering::Relaxed);
        }
        if let Some(argv) = self.cleanup.take() {
            let _ = Command::new(&argv[0])
                .args(&argv[1..])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends every line appended to `file` to `tx`, on a thread of its own,
/// until `stop` is set or nobody listens. At the end of the file it looks
/// again every 20 ms (the writer is another process).
fn follow_lines(file: std::fs::File, tx: mpsc::Sender<String>, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(file);
        let mut line = String::new();
        while !stop.load(Ordering::Relaxed) {
            match r.read_line(&mut line) {
                Ok(0) => std::thread::sleep(Duration::from_millis(20)),
                Ok(_) if line.ends_with('\n') => {
                    if tx.send(line.trim_end().to_owned()).is_err() {
                        break;
                    }
                    line.clear();
                }
                // A partial line: the rest is still being written.
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
    });
}

/// Sends every line `from` yields to `tx`, on a thread of its own.
fn forward_lines(from: impl std::io::Read + Send + 'static, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
