//! Tailor's Grafana dashboards (`dashboards/*.json`): they follow the rules of grafana's
//! dashboard-linter, the lint rejects dashboards that break them, and every panel's query,
//! run against the real Prometheus (Debian's package) scraping a running `tailor demo
//! --serve`, returns data. Screenshots need Grafana; the queries are the test.

#[path = "support/observability.rs"]
mod observability;
#[allow(dead_code)] // only part of it is used here
#[path = "support/prometheus.rs"]
mod prometheus_server;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use observability::{dashboard, files, lint_dashboard, metrics_in};
use prometheus_server::{free_port, require, start_prometheus_scraping};
use serde_json::{Value, json};

const DASHBOARDS: &[&str] = &["overview", "provisioning", "rightsizing", "disruption"];

fn panels(d: &Value) -> Vec<Value> {
    d["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] != "row")
        .cloned()
        .collect()
}

#[test]
fn the_four_dashboards_follow_the_dashboard_linter_rules() {
    let found: Vec<String> = files("dashboards", "json")
        .iter()
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    assert_eq!(found.len(), DASHBOARDS.len(), "{found:?}");
    for name in DASHBOARDS {
        assert!(
            found.iter().any(|f| f == name),
            "dashboards/{name}.json missing"
        );
    }
    let mut uids = std::collections::BTreeSet::new();
    let mut total = 0;
    for path in files("dashboards", "json") {
        let d = dashboard(&path);
        let problems = lint_dashboard(&path.to_string_lossy(), &d);
        assert!(problems.is_empty(), "{problems:#?}");
        assert!(
            uids.insert(d["uid"].to_string()),
            "uid {} used twice",
            d["uid"]
        );
        total += panels(&d).len();
    }
    eprintln!("{total} panels in {} dashboards", DASHBOARDS.len());
}

/// A dashboard that breaks every rule once.
fn bad_dashboard() -> Value {
    json!({
        "uid": "bad", "title": "Bad", "description": "breaks the rules",
        "templating": {"list": [
            {"name": "cluster", "type": "query", "datasource": {"type": "prometheus", "uid": "prom"},
             "query": {"query": "label_values(tailor_build_info, cluster)"}}
        ]},
        "panels": [
            {"id": 1, "type": "timeseries", "title": "", "gridPos": {"x": 0, "y": 0, "w": 12, "h": 8},
             "datasource": {"type": "prometheus", "uid": "prom"},
             "fieldConfig": {"defaults": {}},
             "targets": [{"refId": "A", "expr": "sum(rate(tailor_nodeclaims_launched_total{cluster=~\"$cluster\"}[5m]))"}]},
            {"id": 1, "type": "stat", "title": "Renamed", "description": "d", "gridPos": {"x": 6, "y": 4, "w": 24, "h": 8},
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "fieldConfig": {"defaults": {"unit": "short"}},
             "targets": [{"refId": "A", "expr": "sum(tailor_nodeclaims_launched{cluster=~\"$cluster\", zone=~\"$zone\"})"}]},
            {"id": 3, "type": "timeseries", "title": "Unscoped", "description": "d", "gridPos": {"x": 0, "y": 20, "w": 12, "h": 8},
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "fieldConfig": {"defaults": {"unit": "short"}},
             "targets": []},
            {"id": 4, "type": "timeseries", "title": "Everywhere", "description": "d", "gridPos": {"x": 12, "y": 20, "w": 12, "h": 8},
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "fieldConfig": {"defaults": {"unit": "short"}},
             "targets": [{"refId": "A", "expr": "sum(tailor_leader)"}]}
        ]
    })
}

#[test]
fn the_dashboard_lint_rejects_each_broken_rule() {
    let problems = lint_dashboard("bad.json", &bad_dashboard()).join("\n");
    for expected in [
        "no Prometheus datasource variable",
        "variable cluster does not use the datasource variable",
        "panel 1: no title",
        "panel 1: no description",
        "panel 1: datasource",
        "panel 1: no unit",
        "panel 1: range [5m] instead of [$__rate_interval]",
        "panel \"Renamed\": id 1 is also used by panel 1",
        "panel \"Renamed\": gridPos x 6 + w 24 is past the 24 columns",
        "panel \"Renamed\": gridPos overlaps panel 1",
        "panel \"Renamed\": unknown metric tailor_nodeclaims_launched",
        "panel \"Renamed\": undefined variable $zone",
        "panel \"Unscoped\": no targets",
        "panel \"Everywhere\": tailor_leader is not scoped to $cluster",
    ] {
        assert!(
            problems.contains(expected),
            "{expected:?} not in\n{problems}"
        );
    }
    // The committed dashboards with one metric renamed fail the same lint.
    let path = observability::repo().join("dashboards/provisioning.json");
    let renamed = std::fs::read_to_string(&path)
        .expect("dashboard")
        .replace("tailor_pods_pending", "tailor_pending_pods");
    let d: Value = serde_json::from_str(&renamed).expect("JSON");
    let problems = lint_dashboard("renamed.json", &d).join("\n");
    assert!(
        problems.contains("unknown metric tailor_pending_pods"),
        "{problems}"
    );
}

/// A query as Grafana sends it: variables replaced by what they select. `$__rate_interval`
/// and `$__range` cover the whole run, so rates see every change the demo made.
fn expand(expr: &str) -> String {
    expr.replace("$__rate_interval", "10m")
        .replace("$__range", "10m")
        .replace("$cluster", "demo")
        .replace("$nodepool", ".*")
        .replace("$namespace", ".*")
}

async fn query(client: &reqwest::Client, url: &str, expr: &str) -> Value {
    let response = client
        .get(format!("{url}/api/v1/query"))
        .query(&[("query", expr)])
        .send()
        .await
        .expect("prometheus answers");
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["status"], "success", "{expr}: {body}");
    body["data"]["result"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_query_returns_data_from_prometheus_scraping_the_demo() {
    require("prometheus");
    let port = free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let report = dir.path().join("demo.html");
    let address = format!("127.0.0.1:{port}");
    let mut demo = Command::new(env!("CARGO_BIN_EXE_tailor"))
        .args([
            "demo", "--days", "1", "--serve", &address, "-o", "json", "--report",
        ])
        .arg(&report)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tailor demo starts");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = demo.stderr.take().expect("stderr");
    let demo = Kill(demo);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let over = line.contains("the run is over");
            let _ = tx.send(line);
            if over {
                break;
            }
        }
    });
    let prometheus = start_prometheus_scraping(&address, "demo").await;
    // The demo runs recommend-only, then autonomous (the run its metrics record).
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut log = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                let over = line.contains("the run is over");
                log.push(line);
                if over {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the demo stopped:\n{}", log.join("\n"))
            }
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not finish:\n{}",
            log.join("\n")
        );
    }
    let over_at = jiff::Timestamp::now().as_millisecond() as f64 / 1000.0;
    // `--serve` keeps /metrics up after the run, with the autonomous run recorded.
    assert!(
        log.iter().any(|l| l.contains("serving /metrics")),
        "{log:?}"
    );
    let client = reqwest::Client::new();
    let served = client
        .get(format!("http://{address}/metrics"))
        .send()
        .await
        .expect("/metrics answers after the run");
    assert!(served.status().is_success());
    let body = served.text().await.expect("metrics text");
    for family in [
        "tailor_nodeclaims_launched",
        "tailor_provisioning_duration_seconds",
    ] {
        assert!(body.contains(family), "{family} missing:\n{body}");
    }
    // Prometheus has scraped the final values: a scrape began after the run was over.
    let url = prometheus.url.clone();
    let mut up = serde_json::Value::Null;
    for _ in 0..120 {
        up = query(&client, &url, "timestamp(up{job=\"tailor\"} == 1)").await;
        let scraped = up[0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok());
        if scraped.is_some_and(|t| t > over_at + 1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let scraped = up[0]["value"][1]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        scraped.is_some_and(|t| t > over_at + 1.0),
        "Prometheus scrapes the demo after its run: {up}"
    );

    let mut checked = 0;
    let mut empty = Vec::new();
    let mut metrics = std::collections::BTreeSet::new();
    for name in DASHBOARDS {
        let d = dashboard(&observability::repo().join(format!("dashboards/{name}.json")));
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            let Some(q) = v["query"]["query"].as_str() else {
                continue;
            };
            // label_values(<selector>, <label>): the selector's series carry the label.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|s| s.strip_suffix(')'))
                .and_then(|s| s.rsplit_once(','))
                .unwrap_or_else(|| panic!("{name}: variable query {q}"));
            let (selector, label) = (expand(inner.0), inner.1.trim().to_string());
            let series = query(&client, &url, &selector).await;
            let has = series
                .as_array()
                .is_some_and(|s| s.iter().any(|x| x["metric"][&label].is_string()));
            if !has {
                empty.push(format!(
                    "{name}: variable {}: {selector} has no {label}",
                    v["name"]
                ));
            }
        }
        for p in panels(&d) {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().expect("expr");
                metrics.extend(metrics_in(expr));
                let result = query(&client, &url, &expand(expr)).await;
                checked += 1;
                let finite = result.as_array().is_some_and(|r| {
                    r.iter().any(|s| {
                        s["value"][1]
                            .as_str()
                            .and_then(|v| v.parse::<f64>().ok())
                            .is_some_and(f64::is_finite)
                    })
                });
                if !finite {
                    empty.push(format!("{name}: {:?} {expr}: {result}", p["title"]));
                }
            }
        }
    }
    drop(demo);
    assert!(
        empty.is_empty(),
        "queries without data:\n{}",
        empty.join("\n")
    );
    eprintln!(
        "{checked} panel queries over {} metrics returned data",
        metrics.len()
    );
}
