//! Whole-process time of `tailor simulate`, as a program: `cargo bench --bench simulate`.
//!
//! Writes Karpenter's scheduling benchmark mix (the pods of the `scheduling` bench) as a
//! `kind: List` snapshot of pending pods, the way `kubectl get pods -o yaml` lists them,
//! and runs `tailor simulate -o json` on it as a child process against the eastus catalog
//! in `../shared`: load, plan and JSON out, from spawn to exit. Best of three runs per
//! size; the peak resident memory from `wait4` beside each.
//!
//! The baseline, run the same way in the same sitting, is the same binary on a 200-pod
//! snapshot of the mix: what starting the process and reading the catalog cost before the
//! snapshot's size matters. The targets are for 20,000 pods with the release profile
//! (1.0 s) and 100,000 pods with `dist` (3.0 s). This bench's own binary is built with the
//! bench profile, which optimises as `dist` does; to time other builds of the same
//! source, list them in `TAILOR_BENCH_BINARIES` as `label=path`, comma-separated, e.g.
//! `TAILOR_BENCH_BINARIES=release=target/release/tailor,dist=target/dist/tailor`.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a small smoke run
//! that still checks every pod was planned.

#[path = "common/mix.rs"]
mod mix;
#[path = "common/process.rs"]
mod process;

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Writes `n` pods of the mix as one `kind: List` file; returns its size in bytes. The
/// pods are generated in a child process (this program run with `TAILOR_BENCH_WRITE_MIX`):
/// the peak memory `wait4` reports for a child counts the memory of the process it was
/// spawned from, which must stay small.
fn write_mix(path: &Path, n: usize) -> u64 {
    let status = std::process::Command::new(std::env::current_exe().expect("this program"))
        .env("TAILOR_BENCH_WRITE_MIX", format!("{n}:{}", path.display()))
        .status()
        .expect("start the snapshot writer");
    assert!(
        status.success(),
        "writing the {n}-pod snapshot failed: {status}"
    );
    fs::metadata(path).expect("written").len()
}

/// The snapshot writer: `n` pods of the mix at `path`.
fn write_mix_here(path: &Path, n: usize) {
    let mut out = std::io::BufWriter::new(fs::File::create(path).expect("create the snapshot"));
    out.write_all(b"apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\nitems:\n")
        .expect("write");
    for pod in mix::diverse_pods(n, 42) {
        // One-element sequences concatenate into the list's items.
        let item = serde_yaml::to_string(&[pod]).expect("pods serialise");
        out.write_all(item.as_bytes()).expect("write");
    }
    out.flush().expect("flush");
}

/// The plan's summary, read back from the JSON the run wrote. Only the summary is built:
/// the rest is skipped as it is read, so this process stays small (a child's peak, as
/// `wait4` reports it, counts the memory of the process it was spawned from).
fn summary(scratch: &Path) -> serde_json::Value {
    #[derive(serde::Deserialize)]
    struct Output {
        summary: serde_json::Value,
    }
    let file = fs::File::open(scratch.join("simulate.json")).expect("simulate wrote JSON");
    let output: Output =
        serde_json::from_reader(std::io::BufReader::new(file)).expect("simulate's JSON parses");
    output.summary
}

/// Best of `repeats` runs; checks each run planned every pod onto new nodes.
fn best(
    tailor: &Path,
    snapshot: &Path,
    pods: usize,
    repeats: usize,
    scratch: &Path,
) -> process::Run {
    let catalog = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/azure");
    let catalog = catalog.to_str().expect("UTF-8 path");
    let mut best: Option<process::Run> = None;
    for _ in 0..repeats {
        let run = process::simulate(
            tailor,
            snapshot,
            &["--catalog-dir", catalog, "--region", "eastus"],
            scratch,
        );
        let s = summary(scratch);
        assert_eq!(s["pods"], pods, "every pod of the snapshot is read: {s}");
        assert_eq!(
            s["scheduledOnNew"], pods,
            "every pod lands on a new node: {s}"
        );
        assert_eq!(s["unschedulable"], 0, "no pod is left out: {s}");
        assert!(
            s["newNodes"].as_u64().unwrap_or(0) > 0,
            "nodes are bought: {s}"
        );
        if best.is_none_or(|b| run.seconds < b.seconds) {
            best = Some(run);
        }
    }
    best.expect("ran at least once")
}

fn main() {
    if let Ok(job) = std::env::var("TAILOR_BENCH_WRITE_MIX") {
        let (n, path) = job
            .split_once(':')
            .expect("TAILOR_BENCH_WRITE_MIX is <pods>:<path>");
        write_mix_here(Path::new(path), n.parse().expect("a pod count"));
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if full { &[20_000, 100_000] } else { &[500] };
    let repeats = if full { 3 } else { 1 };
    let scratch = tempfile::tempdir().expect("temporary directory");

    let mut binaries = vec![(
        "bench profile".to_string(),
        PathBuf::from(env!("CARGO_BIN_EXE_tailor")),
    )];
    if let Ok(list) = std::env::var("TAILOR_BENCH_BINARIES") {
        for entry in list.split(',').filter(|e| !e.is_empty()) {
            let (label, path) = entry.split_once('=').unwrap_or((entry, entry));
            binaries.push((label.to_string(), PathBuf::from(path)));
        }
    }

    let base_file = scratch.path().join("mix-200.yaml");
    let base_bytes = write_mix(&base_file, 200);
    let files: Vec<(usize, PathBuf, u64)> = sizes
        .iter()
        .map(|&n| {
            let path = scratch.path().join(format!("mix-{n}.yaml"));
            let bytes = write_mix(&path, n);
            (n, path, bytes)
        })
        .collect();

    println!(
        "== `tailor simulate -o json` on Karpenter's benchmark mix, whole process (best of {repeats}) =="
    );
    println!(
        "{:<16} {:>8} {:>9} {:>9} {:>9} {:>12}",
        "binary", "pods", "file MB", "seconds", "peak MiB", "x baseline"
    );
    for (label, tailor) in &binaries {
        let base = best(tailor, &base_file, 200, repeats, scratch.path());
        println!(
            "{label:<16} {:>8} {:>9.1} {:>9.3} {:>9.1} {:>12}",
            200,
            base_bytes as f64 / 1e6,
            base.seconds,
            base.peak_mib,
            "baseline"
        );
        for (n, path, bytes) in &files {
            let run = best(tailor, path, *n, repeats, scratch.path());
            println!(
                "{label:<16} {n:>8} {:>9.1} {:>9.3} {:>9.1} {:>11.1}x",
                *bytes as f64 / 1e6,
                run.seconds,
                run.peak_mib,
                run.seconds / base.seconds
            );
            let target = match n {
                20_000 => Some(("release", 1.0)),
                100_000 => Some(("dist", 3.0)),
                _ => None,
            };
            if let Some((profile, secs)) = target {
                println!(
                    "  target for {n} pods with the {profile} profile: <= {secs:.1} s; this binary: {:.2}x target",
                    run.seconds / secs
                );
            }
        }
    }
}
