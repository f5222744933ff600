//! Tailor's alert rules (`alerts/*.yaml`) checked and unit-tested by the real promtool
//! (Debian's prometheus package): every alert fires with its labels and annotations and
//! stays quiet on a near miss, follows kubernetes-mixin's conventions, and reads only
//! metrics Tailor exports, so renaming a metric fails here.

#[path = "support/observability.rs"]
mod observability;
#[allow(dead_code)] // only `require` is used here
#[path = "support/prometheus.rs"]
mod prometheus_server;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use observability::{alert_rules, files, lint_rules, repo};
use prometheus_server::require;

fn promtool(args: &[&str], dir: &Path) -> (bool, String) {
    require("promtool");
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn yaml(path: &Path) -> serde_yaml::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rule_files() -> Vec<std::path::PathBuf> {
    let rules = files("alerts", "yaml");
    assert!(!rules.is_empty(), "no rule files under alerts/");
    rules
}

fn test_files() -> Vec<std::path::PathBuf> {
    let tests = files("alerts/tests", "yaml");
    assert!(!tests.is_empty(), "no promtool tests under alerts/tests/");
    tests
}

#[test]
fn promtool_accepts_every_rule_file() {
    for file in rule_files() {
        let path = file.to_string_lossy().into_owned();
        let (ok, out) = promtool(&["check", "rules", &path], &repo());
        assert!(ok, "{out}");
        assert!(out.contains("SUCCESS"), "{out}");
    }
}

#[test]
fn every_alert_fires_and_stays_quiet_in_promtool_unit_tests() {
    // Which alerts the tests show firing and which quiet.
    let mut firing: BTreeMap<String, usize> = BTreeMap::new();
    let mut quiet: BTreeMap<String, usize> = BTreeMap::new();
    for file in test_files() {
        let t = yaml(&file);
        for group in t["tests"].as_sequence().into_iter().flatten() {
            for case in group["alert_rule_test"].as_sequence().into_iter().flatten() {
                let name = case["alertname"].as_str().unwrap_or("?").to_string();
                let fired = case["exp_alerts"]
                    .as_sequence()
                    .is_some_and(|a| !a.is_empty());
                *if fired { &mut firing } else { &mut quiet }
                    .entry(name)
                    .or_default() += 1;
            }
        }
        let dir = file.parent().expect("a directory");
        let name = file
            .file_name()
            .expect("a file")
            .to_string_lossy()
            .into_owned();
        let (ok, out) = promtool(&["test", "rules", &name], dir);
        assert!(ok, "{}: {out}", file.display());
    }
    let mut alerts = Vec::new();
    for file in rule_files() {
        for r in alert_rules(&yaml(&file)) {
            alerts.push(r["alert"].as_str().unwrap_or("?").to_string());
        }
    }
    for alert in &alerts {
        assert!(
            firing.contains_key(alert),
            "no promtool test shows {alert} firing"
        );
        assert!(
            quiet.contains_key(alert),
            "no promtool test shows {alert} quiet"
        );
    }
    let cases: usize = firing.values().chain(quiet.values()).sum();
    eprintln!(
        "{} alerts; {cases} promtool cases ({} firing, {} quiet)",
        alerts.len(),
        firing.values().sum::<usize>(),
        quiet.values().sum::<usize>()
    );
}

#[test]
fn alert_rules_follow_the_mixin_conventions_and_read_exported_metrics() {
    let runbooks =
        std::fs::read_to_string(repo().join("docs/runbooks.md")).expect("docs/runbooks.md");
    for file in rule_files() {
        let problems = lint_rules(&file.to_string_lossy(), &yaml(&file), &runbooks);
        assert!(problems.is_empty(), "{problems:#?}");
    }
}

#[test]
fn the_rule_lint_rejects_an_alert_without_severity_for_runbook_or_known_metric() {
    let bad: serde_yaml::Value = serde_yaml::from_str(
        r#"
groups:
  - name: bad
    rules:
      - alert: Renamed
        expr: tailor_is_leader == 0
        labels: {severity: page}
        annotations:
          summary: s
          description: no values here
          runbook_url: docs/runbooks.md#nosuchsection
      - alert: Bare
        expr: tailor_leader == 0
"#,
    )
    .expect("valid YAML");
    let runbooks = std::fs::read_to_string(repo().join("docs/runbooks.md")).expect("runbooks");
    let problems = lint_rules("bad.yaml", &bad, &runbooks).join("\n");
    for expected in [
        "Renamed: severity \"page\"",
        "Renamed: the description shows no value",
        "Renamed: runbook_url docs/runbooks.md#nosuchsection: no section",
        "Renamed: unknown metric tailor_is_leader",
        "Renamed: no `for`",
        "Bare: no summary",
        "Bare: no description",
        "Bare: no runbook_url",
    ] {
        assert!(
            problems.contains(expected),
            "{expected:?} not in\n{problems}"
        );
    }
}

#[test]
fn a_renamed_metric_makes_the_promtool_unit_tests_fail() {
    // The rules as they would read if `tailor_leader` were renamed: the tests' series no
    // longer match and the alert does not fire, which promtool reports.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("tests")).expect("mkdir");
    for file in rule_files() {
        let text = std::fs::read_to_string(&file).expect("rules");
        let name = file.file_name().expect("a file");
        std::fs::write(
            dir.path().join(name),
            text.replace("tailor_leader{", "tailor_is_leader{"),
        )
        .expect("write");
    }
    for file in test_files() {
        let name = file.file_name().expect("a file");
        std::fs::copy(&file, dir.path().join("tests").join(name)).expect("copy");
    }
    let mut failed = false;
    let mut output = String::new();
    for file in test_files() {
        let name = file
            .file_name()
            .expect("a file")
            .to_string_lossy()
            .into_owned();
        let (ok, out) = promtool(&["test", "rules", &name], &dir.path().join("tests"));
        failed |= !ok;
        output.push_str(&out);
    }
    assert!(failed, "promtool passed with a renamed metric:\n{output}");
    assert!(output.contains("TailorNoLeader"), "{output}");
}
