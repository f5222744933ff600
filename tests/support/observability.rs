//! Checks shared by the dashboard and alert tests: every metric a query names must be one
//! Tailor exports (so a renamed metric fails), Grafana dashboards follow the rules of
//! grafana's dashboard-linter, and alert rules follow kubernetes-mixin's conventions.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;
use tailor::telemetry::names::CATALOGUE;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Files in `dir` (relative to the repository) ending in `ext`, sorted.
pub fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    out
}

/// Every series name Tailor exposes (`_total`, `_bucket`, `_sum`, `_count` included).
pub fn exported_series() -> BTreeSet<String> {
    CATALOGUE.iter().flat_map(|d| d.series_names()).collect()
}

/// Names in `expr` that look like Tailor's metrics but are not exported.
pub fn unknown_metrics(expr: &str) -> Vec<String> {
    let known = exported_series();
    let re = regex::Regex::new(r"\btailor_[a-z0-9_]+\b").expect("valid regex");
    re.find_iter(expr)
        .map(|m| m.as_str().to_string())
        .filter(|m| !known.contains(m))
        .collect()
}

/// Tailor's metrics a query reads.
pub fn metrics_in(expr: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\btailor_[a-z0-9_]+\b").expect("valid regex");
    re.find_iter(expr).map(|m| m.as_str().to_string()).collect()
}

/// Grafana's built-in variables a query may use without defining them.
const BUILTIN_VARIABLES: &[&str] = &["__rate_interval", "__interval", "__range", "__range_s"];

/// Units panels of these types must declare (dashboard-linter's panel-units-rule).
const PANELS_WITH_UNITS: &[&str] = &["timeseries", "stat", "gauge", "bargauge", "table"];

/// The problems of one dashboard, each naming the dashboard, panel and field. Empty when it
/// follows the rules: a Prometheus datasource variable and a cluster variable; every panel
/// with a unique id, a title, a description, the datasource variable, a unit, and targets;
/// every range function over `$__rate_interval` (or `$__range`); every variable a query uses
/// defined; every metric exported; every selector scoped to `$cluster`; and panels inside
/// the 24-column grid without overlapping.
pub fn lint_dashboard(name: &str, d: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut say = |s: String| problems.push(format!("{name}: {s}"));
    for field in ["uid", "title", "description"] {
        if d[field].as_str().is_none_or(str::is_empty) {
            say(format!("dashboard has no {field}"));
        }
    }
    let vars = d["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let defined: BTreeSet<String> = vars
        .iter()
        .filter_map(|v| v["name"].as_str().map(String::from))
        .collect();
    let datasource = vars
        .iter()
        .find(|v| v["type"] == "datasource" && v["query"] == "prometheus");
    let ds_name = match datasource {
        Some(v) => v["name"].as_str().unwrap_or_default().to_string(),
        None => {
            say("no Prometheus datasource variable (template-datasource-rule)".into());
            String::new()
        }
    };
    let ds_ref = format!("${{{ds_name}}}");
    if !defined.contains("cluster") {
        say("no cluster variable".into());
    }
    for v in &vars {
        let vname = v["name"].as_str().unwrap_or("?");
        if v["type"] == "query" {
            if v["datasource"]["uid"].as_str() != Some(ds_ref.as_str()) {
                say(format!(
                    "variable {vname} does not use the datasource variable"
                ));
            }
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or("");
            for m in unknown_metrics(q) {
                say(format!("variable {vname} reads unknown metric {m}"));
            }
        }
    }
    let var_re = regex::Regex::new(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)").expect("valid regex");
    let range_re = regex::Regex::new(r"\[([^\]]*)\]").expect("valid regex");
    let selector_re = regex::Regex::new(r"\b(tailor_[a-z0-9_]+)(\{[^}]*\})?").expect("valid regex");
    let mut ids = BTreeMap::new();
    let mut rects: Vec<(i64, i64, i64, i64, String)> = Vec::new();
    let panels = d["panels"].as_array().cloned().unwrap_or_default();
    if panels.iter().all(|p| p["type"] == "row") {
        say("no panels".into());
    }
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("").to_string();
        let label = if title.is_empty() {
            format!("panel {}", p["id"])
        } else {
            format!("panel {title:?}")
        };
        match p["id"].as_i64() {
            Some(id) => {
                if let Some(other) = ids.insert(id, label.clone()) {
                    say(format!("{label}: id {id} is also used by {other}"));
                }
            }
            None => say(format!("{label}: no id")),
        }
        let g = &p["gridPos"];
        match (
            g["x"].as_i64(),
            g["y"].as_i64(),
            g["w"].as_i64(),
            g["h"].as_i64(),
        ) {
            (Some(x), Some(y), Some(w), Some(h)) if x >= 0 && y >= 0 && w > 0 && h > 0 => {
                if x + w > 24 {
                    say(format!(
                        "{label}: gridPos x {x} + w {w} is past the 24 columns"
                    ));
                }
                for (ox, oy, ow, oh, other) in &rects {
                    if x < ox + ow && *ox < x + w && y < oy + oh && *oy < y + h {
                        say(format!("{label}: gridPos overlaps {other}"));
                    }
                }
                rects.push((x, y, w, h, label.clone()));
            }
            _ => say(format!("{label}: invalid gridPos {g}")),
        }
        if p["type"] == "row" {
            continue;
        }
        if title.is_empty() {
            say(format!("{label}: no title (panel-title-description-rule)"));
        }
        if p["description"].as_str().is_none_or(str::is_empty) {
            say(format!(
                "{label}: no description (panel-title-description-rule)"
            ));
        }
        if p["datasource"]["uid"].as_str() != Some(ds_ref.as_str()) {
            say(format!(
                "{label}: datasource {} is not the datasource variable (panel-datasource-rule)",
                p["datasource"]
            ));
        }
        if PANELS_WITH_UNITS.contains(&p["type"].as_str().unwrap_or(""))
            && p["fieldConfig"]["defaults"]["unit"]
                .as_str()
                .is_none_or(str::is_empty)
        {
            say(format!("{label}: no unit (panel-units-rule)"));
        }
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            say(format!("{label}: no targets (panel-no-targets-rule)"));
        }
        let mut refs = BTreeSet::new();
        for t in &targets {
            let expr = t["expr"].as_str().unwrap_or("");
            if expr.is_empty() {
                say(format!("{label}: a target has no expr"));
            }
            if !refs.insert(t["refId"].as_str().unwrap_or("").to_string()) {
                say(format!("{label}: duplicate refId {}", t["refId"]));
            }
            for m in unknown_metrics(expr) {
                say(format!("{label}: unknown metric {m}"));
            }
            for c in var_re.captures_iter(expr) {
                let v = &c[1];
                if !defined.contains(v) && !BUILTIN_VARIABLES.contains(&v) {
                    say(format!(
                        "{label}: undefined variable ${v} (template-label-promql-rule)"
                    ));
                }
            }
            for c in range_re.captures_iter(expr) {
                let range = c[1].trim();
                if range != "$__rate_interval" && range != "$__range" {
                    say(format!(
                        "{label}: range [{range}] instead of [$__rate_interval] (target-rate-interval-rule)"
                    ));
                }
            }
            for c in selector_re.captures_iter(expr) {
                let scoped = c
                    .get(2)
                    .is_some_and(|s| s.as_str().contains("cluster=~\"$cluster\""));
                if !scoped {
                    say(format!("{label}: {} is not scoped to $cluster", &c[1]));
                }
            }
        }
    }
    problems
}

/// Reads and parses a dashboard.
pub fn dashboard(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every alerting rule of a rule file.
pub fn alert_rules(rules: &serde_yaml::Value) -> Vec<serde_yaml::Value> {
    rules["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .filter(|r| r["alert"].is_string())
        .collect()
}

/// The problems of a rule file, each naming the alert and field: every alert has a
/// severity (critical, warning or info), a `for`, a summary, a description that shows a
/// value or a label, a runbook_url into `runbooks` (the text of docs/runbooks.md) whose
/// section exists, and reads only exported metrics.
pub fn lint_rules(name: &str, rules: &serde_yaml::Value, runbooks: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let sections: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    let alerts = alert_rules(rules);
    if alerts.is_empty() {
        problems.push(format!("{name}: no alerts"));
    }
    for r in alerts {
        let alert = r["alert"].as_str().unwrap_or("?");
        let mut say = |s: String| problems.push(format!("{name}: {alert}: {s}"));
        let severity = r["labels"]["severity"].as_str().unwrap_or("");
        if !["critical", "warning", "info"].contains(&severity) {
            say(format!(
                "severity {severity:?} is not critical, warning or info"
            ));
        }
        if r["for"].as_str().is_none_or(str::is_empty) {
            say("no `for`".into());
        }
        let a = &r["annotations"];
        if a["summary"].as_str().is_none_or(str::is_empty) {
            say("no summary".into());
        }
        let description = a["description"].as_str().unwrap_or("");
        if description.is_empty() {
            say("no description".into());
        }
        let expr = r["expr"].as_str().unwrap_or("");
        let aggregated_away = expr.trim_start().starts_with("absent(");
        if !aggregated_away && !description.contains("{{") {
            say("the description shows no value or label".into());
        }
        match a["runbook_url"].as_str() {
            Some(url) => match url.split_once('#') {
                Some((doc, anchor)) if doc.ends_with("docs/runbooks.md") => {
                    if !sections.contains(anchor) {
                        say(format!(
                            "runbook_url {url}: no section {anchor} in docs/runbooks.md"
                        ));
                    }
                }
                _ => say(format!(
                    "runbook_url {url} does not point into docs/runbooks.md"
                )),
            },
            None => say("no runbook_url".into()),
        }
        for m in unknown_metrics(expr) {
            say(format!("unknown metric {m}"));
        }
    }
    problems
}
