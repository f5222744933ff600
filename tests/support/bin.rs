//! Running the built `tailor` binary from integration tests.

use std::process::Command;

/// Runs `tailor` with `args` (RUST_LOG cleared); returns success, stdout and stderr.
pub fn tailor(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tailor"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("tailor runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The two-day demo with its HTML report (`tailor demo --days 2 --report FILE -o json`):
/// run once per build of the binary and shared by the tests that read it (the summary's
/// figures, the report rendered in a browser), which each take minutes in a debug build.
/// Returns the JSON summary, stderr and the report's HTML. The run is kept under the
/// target directory, keyed by the binary's size and modification time, and made under an
/// exclusive lock, so tests in other processes wait for it rather than run it again.
#[allow(dead_code)] // not every test binary reads the demo
pub fn two_day_demo() -> (String, String, String) {
    use std::os::fd::AsRawFd;
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_tailor"));
    let meta = std::fs::metadata(binary).expect("the tailor binary");
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("two-day-demo-{}-{modified}", meta.len()));
    std::fs::create_dir_all(&dir).expect("the demo's directory");
    let lock = std::fs::File::create(dir.join("lock")).expect("the demo's lock");
    // SAFETY: flock on a descriptor `lock` owns and keeps open until the end of this call.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let (json, err, html) = (
        dir.join("out.json"),
        dir.join("err.txt"),
        dir.join("demo.html"),
    );
    if !json.exists() {
        let report = html.to_str().expect("utf-8");
        let (ok, stdout, stderr) =
            tailor(&["demo", "--days", "2", "--report", report, "-o", "json"]);
        assert!(ok, "{stderr}");
        std::fs::write(&err, &stderr).expect("write stderr");
        std::fs::write(&json, &stdout).expect("write the summary");
    }
    let read = |p: &std::path::Path| std::fs::read_to_string(p).expect("the demo's output");
    (read(&json), read(&err), read(&html))
}
