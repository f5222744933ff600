//! The examples of README.md and docs/ are tested. Every fenced block is tagged `sh`,
//! `yaml` or `text`:
//!
//! - every `tailor` command (also as `cargo run -- ...`) parses with Tailor's own command
//!   line, and those that need no cluster, Prometheus or Azure (`catalog`, `simulate` of a
//!   committed snapshot, `crds`) run with the built binary;
//! - every `helm install` / `helm upgrade` renders with the real helm, with the page's
//!   values example as its `values.yaml`;
//! - every Kubernetes object is created on the real control plane (its CRD schemas and
//!   validation rules decide), and every chart values example renders;
//! - any other command must be of a kind this test knows it does not run (kubectl, docker,
//!   the scripts, cargo builds), so a new kind of example is a decision, not an omission.

#[path = "support/control_plane.rs"]
#[allow(dead_code)] // shared with tests/agent.rs, which uses all of it
mod control_plane;
#[path = "support/helm.rs"]
mod helm;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use clap::Parser;
use control_plane::{ControlPlane, create_value};
use serde::Deserialize as _;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fenced block: the page, the line its fence opens on, its tag and its text.
struct Block {
    page: String,
    line: usize,
    tag: String,
    body: String,
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn blocks() -> Vec<Block> {
    let mut out = Vec::new();
    for path in pages() {
        let text = std::fs::read_to_string(&path).expect("a page");
        let page = path
            .strip_prefix(repo())
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        let mut open: Option<(usize, String, String)> = None;
        for (i, line) in text.lines().enumerate() {
            match (&mut open, line.strip_prefix("```")) {
                (None, Some(tag)) => open = Some((i + 1, tag.trim().to_string(), String::new())),
                (Some(_), Some(_)) => {
                    let (line, tag, body) = open.take().expect("open");
                    out.push(Block {
                        page: page.clone(),
                        line,
                        tag,
                        body,
                    });
                }
                (Some((_, _, body)), None) => {
                    body.push_str(line);
                    body.push('\n');
                }
                (None, None) => {}
            }
        }
        assert!(open.is_none(), "{page}: a fence is never closed");
    }
    out
}

/// The words of each command of a shell block, as the shell splits them: continuation
/// lines joined, quotes removed, a comment dropped, and the command ending at a pipe,
/// redirection or `&&` (what follows is another program's).
fn commands(body: &str) -> Vec<Vec<String>> {
    let joined = body.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut in_word = false;
        let mut quote: Option<char> = None;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    in_word = true;
                }
                (None, '\\') => {
                    if let Some(n) = chars.next() {
                        word.push(n);
                        in_word = true;
                    }
                }
                (None, c) if c.is_whitespace() => {
                    if in_word {
                        words.push(std::mem::take(&mut word));
                        in_word = false;
                    }
                }
                (None, '#') if !in_word => break,
                (None, '|' | '>' | '&') if !in_word => break,
                (None, c) => {
                    word.push(c);
                    in_word = true;
                }
            }
        }
        if in_word {
            words.push(word);
        }
        if !words.is_empty() {
            out.push(words);
        }
    }
    out
}

/// The arguments of a Tailor invocation: `tailor ARGS` or `cargo run [--release] -- ARGS`.
fn tailor_args(words: &[String]) -> Option<Vec<String>> {
    if words[0] == "tailor" {
        return Some(words[1..].to_vec());
    }
    if words.len() > 2 && words[0] == "cargo" && words[1] == "run" {
        let dash = words.iter().position(|w| w == "--")?;
        return Some(words[dash + 1..].to_vec());
    }
    None
}

/// Commands the docs show that this test does not run, by their first word (or two), and
/// why: they act on a live cluster, build images, or are the test suite itself.
const NOT_RUN: &[&str] = &[
    "kubectl",                 // a live cluster; the objects they apply are tested below
    "docker",                  // builds and pushes the image
    "./scripts/test",          // the test suite itself
    "./scripts/control-plane", // the end-to-end tests start it through the same script
    "export",                  // sets a variable for the lines after it
    "KUBECONFIG=",             // a kubectl line with a variable
    "PROPTEST_CASES=",         // a long fuzzing run of a test that runs in the suite
    "TAILOR_BENCH_BINARIES=",  // a bench
    "cargo build",             // builds
    "cargo bench",
    "cargo test",
];

fn not_run(words: &[String]) -> bool {
    let two = words[..words.len().min(2)].join(" ");
    NOT_RUN.iter().any(|k| {
        if k.ends_with('=') {
            words[0].starts_with(k)
        } else if k.contains(' ') {
            two == *k
        } else {
            words[0] == *k
        }
    })
}

/// The chart values example of a page: its YAML block that is not a Kubernetes object.
fn values_example(blocks: &[Block], page: &str) -> Option<String> {
    blocks
        .iter()
        .filter(|b| b.page == page && b.tag == "yaml")
        .find(|b| !b.body.contains("apiVersion:"))
        .map(|b| b.body.clone())
}

fn helm_template(words: &[String], values: Option<&str>, page: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut args: Vec<String> = vec!["template".to_string()];
    let mut i = 2;
    while i < words.len() {
        match words[i].as_str() {
            "--create-namespace" | "--wait" => {}
            "--values" | "-f" => {
                let file = dir.path().join("values.yaml");
                let text = values.ok_or_else(|| format!("{page}: --values without an example"))?;
                std::fs::write(&file, text).expect("write values");
                args.push("--values".to_string());
                args.push(file.to_string_lossy().into_owned());
                i += 1;
            }
            w => args.push(w.to_string()),
        }
        i += 1;
    }
    let out = Command::new(helm::helm())
        .args(&args)
        .current_dir(repo())
        .env("HELM_CACHE_HOME", dir.path().join("cache"))
        .env("HELM_CONFIG_HOME", dir.path().join("config"))
        .env("HELM_DATA_HOME", dir.path().join("data"))
        .output()
        .expect("helm runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "helm {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether a documented invocation needs nothing outside this machine, so it is run.
fn runs_offline(args: &[String]) -> bool {
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    match args.first().map(String::as_str) {
        Some("catalog") => value("--source").is_none_or(|s| s != "azure"),
        Some("crds") => !has("--output-dir"),
        Some("simulate") => {
            value("--snapshot").is_some_and(|s| s.split(',').all(|f| repo().join(f).exists()))
        }
        _ => false,
    }
}

#[test]
fn every_command_in_the_docs_parses_and_the_offline_ones_run() {
    let blocks = blocks();
    for b in &blocks {
        assert!(
            matches!(b.tag.as_str(), "sh" | "yaml" | "text"),
            "{}:{}: a fence tagged {:?} (sh, yaml or text)",
            b.page,
            b.line,
            b.tag
        );
    }
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for b in blocks.iter().filter(|b| b.tag == "sh") {
        for words in commands(&b.body) {
            let at = format!("{}:{} `{}`", b.page, b.line, words.join(" "));
            if let Some(args) = tailor_args(&words) {
                let parsed = tailor::cli::Cli::try_parse_from(
                    std::iter::once("tailor".to_string()).chain(args.iter().cloned()),
                );
                if let Err(e) = parsed {
                    failures.push(format!("{at}: {e}"));
                    continue;
                }
                *tally.entry("tailor commands parsed").or_default() += 1;
                if runs_offline(&args) {
                    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                    let out = Command::new(env!("CARGO_BIN_EXE_tailor"))
                        .args(&refs)
                        .current_dir(repo())
                        .output()
                        .expect("tailor runs");
                    if !out.status.success() || out.stdout.is_empty() {
                        failures.push(format!(
                            "{at}: exit {:?}: {}",
                            out.status.code(),
                            String::from_utf8_lossy(&out.stderr)
                        ));
                    } else {
                        *tally.entry("tailor commands run").or_default() += 1;
                    }
                }
            } else if words[0] == "helm"
                && matches!(
                    words.get(1).map(String::as_str),
                    Some("install" | "upgrade")
                )
            {
                match helm_template(&words, values_example(&blocks, &b.page).as_deref(), &b.page) {
                    Ok(rendered) if rendered.contains("kind:") => {
                        *tally.entry("helm commands rendered").or_default() += 1;
                    }
                    Ok(_) => failures.push(format!("{at}: rendered nothing")),
                    Err(e) => failures.push(format!("{at}: {e}")),
                }
            } else if not_run(&words) {
                *tally
                    .entry("not run (cluster, image, suite or build)")
                    .or_default() += 1;
            } else {
                failures.push(format!(
                    "{at}: a command of a kind this test neither runs nor lists in NOT_RUN"
                ));
            }
        }
    }
    println!("{tally:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The counts at the time of writing, so a parser that skipped everything fails.
    assert!(
        tally.get("tailor commands parsed").copied().unwrap_or(0) >= 25,
        "{tally:?}"
    );
    assert!(
        tally.get("tailor commands run").copied().unwrap_or(0) >= 5,
        "{tally:?}"
    );
    assert!(
        tally.get("helm commands rendered").copied().unwrap_or(0) >= 5,
        "{tally:?}"
    );
}

#[test]
fn a_stale_flag_or_an_unknown_command_in_an_example_is_caught() {
    let bad = commands("tailor simulate --snapshot x.yaml --no-such-flag\nfrobnicate --now\n");
    let args = tailor_args(&bad[0]).expect("a tailor command");
    assert!(
        tailor::cli::Cli::try_parse_from(std::iter::once("tailor".to_string()).chain(args))
            .is_err()
    );
    assert!(tailor_args(&bad[1]).is_none() && !not_run(&bad[1]));
    // Quotes, continuation lines, comments and pipes split as the shell splits them.
    let words =
        commands("tailor catalog -r 'kubernetes.io/arch In arm64' \\\n  -o json | jq . # note\n");
    assert_eq!(
        words,
        [[
            "tailor",
            "catalog",
            "-r",
            "kubernetes.io/arch In arm64",
            "-o",
            "json"
        ]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kubernetes_object_in_the_docs_is_accepted_and_every_values_example_renders() {
    let blocks = blocks();
    let cp = ControlPlane::start().await;
    let mut created = 0;
    let mut rendered = 0;
    let mut failures = Vec::new();
    for b in blocks.iter().filter(|b| b.tag == "yaml") {
        let at = format!("{}:{}", b.page, b.line);
        let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&b.body)
            .map(|d| serde_json::Value::deserialize(d).unwrap_or_else(|e| panic!("{at}: {e}")))
            .filter(|v| !v.is_null())
            .collect();
        if docs.iter().all(|d| d.get("kind").is_none()) {
            // Chart values: the agent's Deployment renders with them.
            match helm::render("tailor", &b.body) {
                Ok(objects) => {
                    let deployment = objects
                        .iter()
                        .any(|o| o["kind"].as_str() == Some("Deployment"));
                    if deployment {
                        rendered += 1;
                    } else {
                        failures.push(format!("{at}: no Deployment rendered"));
                    }
                }
                Err(e) => failures.push(format!("{at}: {e}")),
            }
            continue;
        }
        for doc in docs {
            if let Some(ns) = doc["metadata"]["namespace"].as_str() {
                let _ = create_value(
                    &cp.client,
                    serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                )
                .await;
            }
            match create_value(&cp.client, doc).await {
                Ok(()) => created += 1,
                Err(e) => failures.push(format!("{at}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("{created} objects created, {rendered} values examples rendered");
    assert!(
        created >= 4 && rendered >= 2,
        "{created} created, {rendered} rendered"
    );
}
