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
