//! Runs `tailor simulate` as a child process and measures it from outside: wall time, and
//! peak resident memory from `wait4` (std's `Child::wait` does not report resource usage).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// What one whole `tailor simulate` process took.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Wall time from spawn to exit, in seconds.
    pub seconds: f64,
    /// Peak resident memory, in MiB.
    pub peak_mib: f64,
}

/// Runs `tailor simulate --output json --snapshot <snapshot> <extra>`, its output written
/// to `simulate.json` in `scratch`; panics with its log when it fails.
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which also reports its peak memory"
)]
pub fn simulate(tailor: &Path, snapshot: &Path, extra: &[&str], scratch: &Path) -> Run {
    let log = scratch.join("simulate.log");
    let start = Instant::now();
    let child = Command::new(tailor)
        .args(["simulate", "--output", "json", "--snapshot"])
        .arg(snapshot)
        .args(extra)
        .env("RUST_LOG", "error")
        .stdout(fs::File::create(scratch.join("simulate.json")).expect("output file"))
        .stderr(fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start tailor simulate");
    let (status, max_rss_kib) = wait4(child.id());
    let seconds = start.elapsed().as_secs_f64();
    assert!(
        status == 0,
        "tailor simulate on {} failed ({status}): {}",
        snapshot.display(),
        fs::read_to_string(&log).unwrap_or_default()
    );
    Run {
        seconds,
        peak_mib: max_rss_kib as f64 / 1024.0,
    }
}

/// Waits for child `pid` and returns its exit code (or 128 + signal) and its peak
/// resident set in KiB.
fn wait4(pid: u32) -> (i32, i64) {
    let mut status: libc::c_int = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `pid` is a child of this process that nothing else waits for; `status` and
    // `usage` are valid for writes for the duration of the call.
    let waited = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, usage.as_mut_ptr()) };
    assert_eq!(waited, pid as libc::pid_t, "wait4 on the child failed");
    // SAFETY: zero is a valid `rusage`, and wait4 succeeded and filled it in.
    let usage = unsafe { usage.assume_init() };
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    (code, usage.ru_maxrss)
}
