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
//! - any other command must be of a kind this test knows it does not run here (docker, the
//!   Azure CLI, the scripts, cargo builds), so a new kind of example is a decision, not an
//!   omission;
//! - the install walk-through runs end to end on a control plane of its own, as a user
//!   follows it: README's values and `helm install` of both charts with the real helm, the
//!   agent run from the built binary as the installed Deployment configures it and under its
//!   ServiceAccount, the first Recommendation and `WouldProvision` Event, the Grafana
//!   upgrade, a NodePool switched to autonomous and a node launched, then install.md's
//!   uninstall; on the way, every other kubectl line of every page runs with kubectl against
//!   that cluster, but for a listed few that it cannot answer.

#[path = "support/control_plane.rs"]
#[allow(dead_code)] // shared with tests/agent.rs, which uses all of it
mod control_plane;
#[path = "support/helm.rs"]
mod helm;
#[path = "support/objects.rs"]
mod objects;
#[path = "support/prometheus.rs"]
#[allow(dead_code)] // shared with the Prometheus tests, which use all of it
mod prometheus_server;

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
        // (line of the fence, its indentation, tag, body): a block inside a list item is
        // indented, and its lines lose that indentation.
        let mut open: Option<(usize, usize, String, String)> = None;
        for (i, line) in text.lines().enumerate() {
            let indent = line.len() - line.trim_start().len();
            match (&mut open, line.trim_start().strip_prefix("```")) {
                (None, Some(tag)) => {
                    open = Some((i + 1, indent, tag.trim().to_string(), String::new()))
                }
                (Some(_), Some(_)) => {
                    let (line, _, tag, body) = open.take().expect("open");
                    out.push(Block {
                        page: page.clone(),
                        line,
                        tag,
                        body,
                    });
                }
                (Some((_, fence_indent, _, body)), None) => {
                    let cut = indent.min(*fence_indent);
                    body.push_str(&line[cut..]);
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
    let mut out = Vec::new();
    for line in lines(body) {
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
    "kubectl",                 // a live cluster: the install walk-through below runs them
    "helm uninstall",          // likewise
    "az",                      // the Azure CLI, against a subscription
    "docker",                  // builds and pushes the image
    "./scripts/test",          // the test suite itself
    "./scripts/control-plane", // the install walk-through runs the development guide's block
    "export",                  // sets a variable for the lines after it
    "KUBECONFIG=",             // a kubectl line with a variable
    "PROPTEST_CASES=",         // a long fuzzing run of a test that runs in the suite
    "TAILOR_BENCH_BINARIES=",  // a bench
    "cargo build",             // builds
    "cargo bench",
    "cargo test",
];

fn not_run(words: &[String]) -> bool {
    // `VAR=$(command ...)` runs `command`.
    let mut words = words.to_vec();
    if let Some((_, inner)) = words[0].split_once("=$(")
        && !inner.is_empty()
    {
        words[0] = inner.to_string();
    }
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
            // The page's values example is the `values.yaml` a line names, and what a
            // release upgraded with `--reuse-values` would hold.
            flag @ ("--values" | "-f" | "--reuse-values") => {
                let file = dir.path().join("values.yaml");
                let text = values.ok_or_else(|| format!("{page}: {flag} without an example"))?;
                std::fs::write(&file, text).expect("write values");
                args.push("--values".to_string());
                args.push(file.to_string_lossy().into_owned());
                if flag != "--reuse-values" {
                    i += 1;
                }
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

// ---------------------------------------------------------------------------------------
// The install walk-through, end to end.

/// A shell for the docs' command lines: bash with the control plane's kubectl and the real
/// helm first on `PATH`, the plane's admin kubeconfig, in a directory of its own (where the
/// files a line names, such as `values.yaml`, are written). Remembers every line it ran.
struct Shell {
    dir: tempfile::TempDir,
    path: String,
    kubeconfig: PathBuf,
    ran: std::collections::BTreeSet<String>,
}

/// The lines of a shell block as the shell reads them: continuations joined, blank and
/// comment-only lines dropped.
fn lines(body: &str) -> Vec<String> {
    body.replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The shell block of `page` holding `needle`: the walk-through follows the docs, so a
/// block it needs that is gone fails here.
fn block<'a>(blocks: &'a [Block], page: &str, needle: &str) -> &'a Block {
    blocks
        .iter()
        .find(|b| b.page == page && b.tag == "sh" && b.body.contains(needle))
        .unwrap_or_else(|| panic!("{page} has no shell block with `{needle}`"))
}

/// The YAML block of `page` holding `needle`.
fn yaml<'a>(blocks: &'a [Block], page: &str, needle: &str) -> &'a str {
    &blocks
        .iter()
        .find(|b| b.page == page && b.tag == "yaml" && b.body.contains(needle))
        .unwrap_or_else(|| panic!("{page} has no YAML block with `{needle}`"))
        .body
}

/// The changes the walk-through makes to a documented line: a `helm install` or
/// `helm upgrade` with the user's `values.yaml` also reads the test's overrides (the KWOK
/// cloud instead of Azure, the test's Prometheus), as a second `--values` file; and the
/// development guide's `/tmp/cp` is a directory of the test's own.
fn adapt(line: &str) -> String {
    if line.starts_with("helm ") && line.contains("--values values.yaml") {
        line.replace(
            "--values values.yaml",
            "--values values.yaml --values test-overrides.yaml",
        )
    } else {
        line.replace("/tmp/cp", "./cp")
    }
}

impl Shell {
    fn new(cp: &ControlPlane) -> Shell {
        let kubectl = control_plane::binaries();
        let helm = helm::helm()
            .parent()
            .expect("helm's directory")
            .to_path_buf();
        let path = format!(
            "{}:{}:{}",
            kubectl.display(),
            helm.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let dir = tempfile::tempdir().expect("a working directory");
        // The docs' paths are relative to a clone of the repository.
        for part in ["deploy", "scripts", "tests"] {
            std::os::unix::fs::symlink(repo().join(part), dir.path().join(part))
                .expect("link a folder of the repository");
        }
        Shell {
            dir,
            path,
            kubeconfig: cp.kubeconfig.clone(),
            ran: Default::default(),
        }
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.path().join(name), text).expect("write a file");
    }

    /// Runs `line` (as documented; see [`adapt`]); Ok(stdout) or Err(what it printed).
    fn try_run(&mut self, line: &str) -> Result<String, String> {
        self.ran.insert(line.to_string());
        let out = Command::new("bash")
            .args(["-o", "pipefail", "-c", &adapt(line)])
            .current_dir(self.dir.path())
            .env("PATH", &self.path)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.path().join(".helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.path().join(".helm/config"))
            .env("HELM_DATA_HOME", self.dir.path().join(".helm/data"))
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "`{line}` exited {:?}:\n{stdout}{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn run(&mut self, line: &str) -> String {
        self.try_run(line).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs every line of `b` in order, returning each line's output.
    fn run_block(&mut self, b: &Block) -> Vec<(String, String)> {
        lines(&b.body)
            .into_iter()
            .map(|l| {
                let out = self.run(&l);
                (l, out)
            })
            .collect()
    }

    /// Runs `line` until its output satisfies `ok`, for at most `secs`.
    async fn until(&mut self, line: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let out = self.try_run(line);
            match out {
                Ok(text) if ok(&text) => return text,
                other => assert!(
                    std::time::Instant::now() < deadline,
                    "`{line}` did not show what the docs promise within {secs} s; last: {other:?}"
                ),
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
}

/// The user's cluster before Tailor: two system nodes (tainted `CriticalAddonsOnly`, as an
/// AKS system pool can be, so workloads wait for capacity while the agent's replicas run)
/// and the shop's storefront, whose two replicas no node can take yet.
fn user_cluster() -> String {
    let system_node = |i: usize| {
        format!(
            r#"
apiVersion: v1
kind: Node
metadata:
  name: aks-system-{i}
  annotations: {{kwok.x-k8s.io/node: fake}}
  labels: {{kubernetes.io/hostname: aks-system-{i}, kubernetes.io/os: linux, kubernetes.io/arch: amd64, topology.kubernetes.io/zone: eastus-{zone}, kubernetes.azure.com/agentpool: system}}
spec:
  taints: [{{key: CriticalAddonsOnly, value: "true", effect: NoSchedule}}]
status:
  capacity: {{cpu: "4", memory: 16Gi, pods: "110"}}
  allocatable: {{cpu: "3860m", memory: 12Gi, pods: "110"}}
"#,
            zone = i + 1
        )
    };
    [
        system_node(0),
        system_node(1),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n".to_string(),
        objects::deployment_in("shop", "storefront", 2, "1", "2Gi", ""),
    ]
    .join("\n---\n")
}

/// `tailor run` as the chart's Deployment runs it: its container's arguments and
/// environment, as the API server holds them after `helm install`, with the downward API's
/// values of one of its pods, the webhook certificate of the chart's Secret, and the
/// identity of the chart's ServiceAccount (a token from the TokenRequest API). The one
/// difference from the pod: its listeners are on loopback ports of this machine.
struct ChartAgent {
    child: std::process::Child,
    log: PathBuf,
    pod: String,
}

impl Drop for ChartAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChartAgent {
    async fn start(cp: &ControlPlane, dir: &std::path::Path) -> ChartAgent {
        use k8s_openapi::api::apps::v1::Deployment;
        use k8s_openapi::api::core::v1::{Pod, Secret};
        use kube::api::{Api, ListParams};

        let deployment = Api::<Deployment>::namespaced(cp.client.clone(), "tailor")
            .get("tailor")
            .await
            .expect("helm installed the Deployment tailor/tailor");
        let spec = deployment
            .spec
            .and_then(|s| s.template.spec)
            .expect("a pod template");
        let container = spec
            .containers
            .iter()
            .find(|c| c.name == "agent")
            .expect("the agent container");
        // One of the chart's pods, running on a system node: its name is the agent's
        // identity, as the downward API gives it.
        let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "tailor");
        let pod = control_plane::eventually(
            std::time::Duration::from_secs(60),
            "the chart's pods Running on the system nodes",
            || async {
                let list = pods
                    .list(&ListParams::default().labels("app.kubernetes.io/name=tailor"))
                    .await
                    .ok()?;
                let running: Vec<String> = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                (running.len() == 2).then(|| running[0].clone())
            },
        )
        .await;

        // The webhook certificate, where the chart mounts it.
        let secret = Api::<Secret>::namespaced(cp.client.clone(), "tailor")
            .get("tailor-webhook-cert")
            .await
            .expect("the chart's webhook certificate Secret");
        let cert_dir = dir.join("webhook");
        std::fs::create_dir_all(&cert_dir).expect("certificate dir");
        for (name, value) in secret.data.unwrap_or_default() {
            std::fs::write(cert_dir.join(name), value.0).expect("a certificate file");
        }

        // The ServiceAccount's identity, as its projected token gives it in the pod.
        let account = spec.service_account_name.clone().expect("a ServiceAccount");
        let kubeconfig = control_plane::service_account_kubeconfig(cp, "tailor", &account).await;

        let mut env: Vec<(String, String)> = Vec::new();
        for var in container.env.clone().unwrap_or_default() {
            let value = match (&var.value, &var.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => {
                    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                        Some("metadata.name") => pod.clone(),
                        Some("metadata.namespace") => "tailor".to_string(),
                        other => {
                            panic!("{}: a value from {other:?} the test cannot give", var.name)
                        }
                    }
                }
                (None, None) => String::new(),
            };
            let value = match var.name.as_str() {
                "TAILOR_METRICS_ADDRESS" | "TAILOR_HEALTH_ADDRESS" | "TAILOR_WEBHOOK_ADDRESS" => {
                    format!("127.0.0.1:{}", control_plane::free_port())
                }
                "TAILOR_WEBHOOK_CERT_DIR" => cert_dir.to_string_lossy().into_owned(),
                _ => value,
            };
            env.push((var.name, value));
        }
        env.push((
            "KUBECONFIG".to_string(),
            kubeconfig.to_string_lossy().into_owned(),
        ));
        let log = cp.dir().join("logs").join("agent-chart.log");
        let child = Command::new(env!("CARGO_BIN_EXE_tailor"))
            .args(container.args.clone().unwrap_or_default())
            .env_clear()
            .envs(env)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("agent log"))
            .spawn()
            .expect("tailor starts");
        ChartAgent { child, log, pod }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The first lines of a command's output, for the test's log.
fn head(out: &str) -> String {
    out.lines().take(8).collect::<Vec<_>>().join("\n")
}

/// kubectl and helm lines of the docs the walk-through does not run, and why. Every other
/// one, on every page, it runs.
const NOT_IN_WALK_THROUGH: &[(&str, &str)] = &[
    (
        "kubectl -n tailor logs",
        "the kubelet stand-in serves no logs; the test reads the agent's log itself",
    ),
    (
        "kubectl -n tailor run tailor-report",
        "runs the image; the kubelet stand-in runs no containers",
    ),
    (
        "kubectl get nodepools.karpenter.sh",
        "Karpenter's CRDs; tests/karpenter covers reading its objects",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_walk_through_runs_end_to_end_as_documented() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::Api;
    use tailor::apis::{NodeClaim, RightsizingPolicy};

    let blocks = blocks();
    let started = std::time::Instant::now();
    let phase = |what: &str| println!("[{:>5.1} s] {what}", started.elapsed().as_secs_f64());
    // A plane of its own: the walk-through installs Tailor's CRDs with helm and uninstalls
    // them at the end, which a pooled plane (CRDs installed once, kept) must not see.
    let cp = ControlPlane::start_bare().await;
    let mut shell = Shell::new(&cp);
    let prometheus = prometheus_server::start_prometheus(&prometheus_server::steady_usage(
        "shop",
        // A third of a core and 600 MiB per replica, against requests of a core and 2 GiB.
        &[
            ("storefront-7c9d8b6f5-abcde", 0.33, 600.0),
            ("storefront-7c9d8b6f5-fghij", 0.33, 600.0),
        ],
    ))
    .await;
    cp.apply_yaml(&user_cluster()).await;

    phase("install");
    // 1. Install, recommend-only (README): the values example as values.yaml.
    shell.write(
        "values.yaml",
        &values_example(&blocks, "README.md").expect("README values"),
    );
    shell.write(
        "test-overrides.yaml",
        &format!(
            "settings:\n  cloud: kwok\n  prometheusUrl: {}\n",
            prometheus.url
        ),
    );
    shell.run_block(block(&blocks, "README.md", "helm install tailor-crd"));
    let agent = ChartAgent::start(&cp, shell.dir.path()).await;
    // install.md's checks of the rollout: the Deployment is available and the Lease is held
    // by the pod whose name the agent was given.
    let check = block(&blocks, "docs/install.md", "rollout status");
    for line in lines(&check.body) {
        if line.starts_with("kubectl -n tailor logs") {
            continue;
        }
        let expected = agent.pod.clone();
        let out = shell
            .until(&line, 60, |out| {
                !line.contains("lease") || out.trim() == expected
            })
            .await;
        println!("{line}\n{out}");
    }

    phase("pools and policies");
    // 2. A NodePool, an AKSNodeClass and RightsizingPolicies from configuration.md.
    for needle in [
        "kind: AKSNodeClass",
        "kind: NodePool",
        "kind: RightsizingPolicy",
    ] {
        shell.write(
            "objects.yaml",
            yaml(&blocks, "docs/configuration.md", needle),
        );
        shell.run("kubectl apply -f objects.yaml");
    }

    phase("first results");
    // 3. The first results (README): a Recommendation for the storefront, and the
    // WouldProvision Event for its pending replicas, in recommend-only mode.
    let results = block(&blocks, "README.md", "kubectl get recommendations -A");
    for line in lines(&results.body) {
        let out = shell
            .until(&line, 90, |out| {
                !line.contains("get recommendations -A") || out.contains("deployment-storefront")
            })
            .await;
        println!("{line}\n{}", head(&out));
    }
    // Two days of history: the storefront's row says it can be acted on.
    let table = shell.run("kubectl get recommendations -n shop");
    let header = table.lines().next().unwrap_or_default();
    let column = header.find("ACTIONABLE").expect("an ACTIONABLE column");
    let row = table
        .lines()
        .find(|l| l.starts_with("deployment-storefront"))
        .expect("the storefront's row");
    assert!(
        row.get(column..).is_some_and(|v| v.starts_with("True")),
        "{table}"
    );
    for line in lines(&block(&blocks, "README.md", "reason=WouldProvision").body) {
        let out = shell
            .until(&line, 90, |out| {
                !line.contains("reason=WouldProvision") || out.contains("WouldProvision")
            })
            .await;
        println!("{line}\n{out}");
    }
    let claims: Api<NodeClaim> = Api::all(cp.client.clone());
    assert!(
        control_plane::list(&claims).await.is_empty(),
        "recommend-only launched a node"
    );
    phase("Grafana upgrade");
    // The dashboards, scrape config and alerts, with the Prometheus Operator's CRDs
    // installed as kube-prometheus-stack would have them.
    let crds = Command::new(repo().join("scripts/control-plane"))
        .arg("operator-crds")
        .output()
        .expect("scripts/control-plane runs");
    assert!(
        crds.status.success(),
        "{}",
        String::from_utf8_lossy(&crds.stderr)
    );
    for file in String::from_utf8_lossy(&crds.stdout).lines() {
        shell.run(&format!("kubectl create -f {file}"));
    }
    shell.run("kubectl wait --for condition=established --timeout=60s crd/servicemonitors.monitoring.coreos.com crd/prometheusrules.monitoring.coreos.com");
    shell.run_block(block(&blocks, "README.md", "serviceMonitor.enabled=true"));
    let monitoring =
        shell.run("kubectl -n tailor get servicemonitors,prometheusrules,configmaps -o name");
    for name in [
        "servicemonitor.monitoring.coreos.com/tailor",
        "prometheusrule.monitoring.coreos.com/tailor",
    ] {
        assert!(monitoring.contains(name), "{name} missing:\n{monitoring}");
    }
    assert!(
        monitoring.matches("configmap/tailor-dashboard").count() >= 4,
        "the four dashboards:\n{monitoring}"
    );

    phase("autonomous");
    // 4. One NodePool autonomous (README): a node is launched for the storefront, and its
    // replicas run there; then back to the global mode.
    let autonomous = lines(&block(&blocks, "README.md", "tailor.sh/mode=autonomous").body);
    let find = |needle: &str| {
        autonomous
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("README's autonomous block has no `{needle}`"))
            .clone()
    };
    let (to_autonomous, back) = (find("tailor.sh/mode=autonomous"), find("tailor.sh/mode-"));
    shell.run(&to_autonomous);
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "shop");
    let nodes: Api<Node> = Api::all(cp.client.clone());
    let node = control_plane::eventually(
        std::time::Duration::from_secs(120),
        "the storefront Running on a node Tailor launched",
        || async {
            let running: Vec<String> = control_plane::list(&pods)
                .await
                .into_iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| p.spec.and_then(|s| s.node_name))
                .collect();
            let launched: Vec<String> = control_plane::list(&nodes)
                .await
                .into_iter()
                .filter(|n| {
                    n.metadata.labels.as_ref().is_some_and(|l| {
                        l.get("tailor.sh/nodepool").map(String::as_str) == Some("default")
                    })
                })
                .filter_map(|n| n.metadata.name)
                .collect();
            (running.len() == 2 && running.iter().all(|n| launched.contains(n)))
                .then(|| running[0].clone())
        },
    )
    .await;
    println!("storefront runs on {node}");
    assert!(
        !control_plane::list(&claims).await.is_empty(),
        "a NodeClaim"
    );
    shell.run(&back);
    let pool = Api::<tailor::apis::NodePool>::all(cp.client.clone())
        .get("default")
        .await
        .expect("the NodePool");
    assert!(
        !pool
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("tailor.sh/mode"),
        "`{back}` left the mode annotation"
    );

    // A RightsizingPolicy to Auto and back (README).
    let policies: Api<RightsizingPolicy> = Api::namespaced(cp.client.clone(), "shop");
    for mode in ["Auto", "Recommend"] {
        let line = find(&format!("{{\"mode\":\"{mode}\"}}"));
        shell.run(&line);
        let spec = serde_json::to_value(policies.get("storefront").await.expect("policy").spec)
            .expect("spec");
        assert_eq!(spec["mode"], mode, "after `{line}`");
    }

    phase("other pages' lines");
    // 5. Every other kubectl line of every page that a cluster in this state can answer.
    let mut skipped = Vec::new();
    for b in blocks.iter().filter(|b| b.tag == "sh") {
        for line in lines(&b.body) {
            let program = line.split_whitespace().next().unwrap_or_default();
            if program != "kubectl" && !line.starts_with("KUBECONFIG=") {
                continue;
            }
            // The uninstall's lines run last, below.
            let uninstall = b.page == "docs/install.md"
                && (b.body.contains("kubectl delete nodepools")
                    || b.body.contains("helm uninstall"));
            if shell.ran.contains(&line) || uninstall {
                continue;
            }
            if let Some((_, why)) = NOT_IN_WALK_THROUGH
                .iter()
                .find(|(p, _)| line.starts_with(p))
            {
                skipped.push(format!("{}:{} `{line}`: {why}", b.page, b.line));
                continue;
            }
            if b.body.contains("./scripts/control-plane down") {
                // Another plane started and stopped as the development guide shows, its
                // kubeconfig read by kubectl: the whole block, in order.
                let out = shell.run_block(b);
                println!("{}:{} {out:?}", b.page, b.line);
                continue;
            }
            if line.contains("-f nodepool.yaml") {
                shell.write(
                    "nodepool.yaml",
                    yaml(&blocks, "docs/configuration.md", "kind: NodePool"),
                );
            }
            let out = shell.run(&line);
            println!("{}:{} {line}\n{}", b.page, b.line, head(&out));
        }
    }
    println!("not run:\n{}", skipped.join("\n"));
    for (prefix, _) in NOT_IN_WALK_THROUGH {
        assert!(
            skipped.iter().any(|s| s.contains(&format!("`{prefix}"))),
            "NOT_IN_WALK_THROUGH lists `{prefix}`, which no page has any more"
        );
    }
    // A documented line that fails fails the walk-through: the shell reports kubectl's exit.
    assert!(
        shell
            .try_run("kubectl annotate nodepools.tailor.sh no-such-pool tailor.sh/mode=autonomous")
            .is_err()
    );

    phase("uninstall");
    // 6. Uninstall (install.md): the pool's nodes drained and deleted while the agent still
    // runs, then the agent (its pods go with the Deployment, so the process stops too), the
    // objects it made, the namespace and the CRDs.
    let uninstall_pools = block(&blocks, "docs/install.md", "kubectl delete nodepools");
    shell.run_block(uninstall_pools);
    control_plane::eventually(
        std::time::Duration::from_secs(120),
        "the NodeClaims and their nodes gone",
        || async {
            let claims_left = control_plane::list(&claims).await.len();
            let nodes_left = control_plane::list(&nodes)
                .await
                .iter()
                .filter(|n| {
                    n.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key("tailor.sh/nodepool"))
                })
                .count();
            (claims_left == 0 && nodes_left == 0).then_some(())
        },
    )
    .await;
    let uninstall = block(
        &blocks,
        "docs/install.md",
        "helm uninstall tailor --namespace tailor",
    );
    let mut agent = Some(agent);
    for line in lines(&uninstall.body) {
        shell.run(&line);
        if line.starts_with("helm uninstall tailor ") {
            let log = agent.as_ref().map(ChartAgent::log).unwrap_or_default();
            drop(agent.take());
            assert!(
                !log.contains("\"level\":\"ERROR\""),
                "the agent logged errors:\n{log}"
            );
        }
    }
    // The API server removes a CRD once its objects are gone.
    shell
        .until("kubectl get crd -o name", 60, |crds| {
            !crds.contains("tailor.sh")
        })
        .await;
    let namespaces = shell.run("kubectl get namespaces -o name");
    assert!(!namespaces.contains("namespace/tailor"), "{namespaces}");
}
