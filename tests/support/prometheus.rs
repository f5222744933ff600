//! A real Prometheus server (Debian's package) on a free loopback port, over history
//! backfilled from OpenMetrics text with promtool. Shared by the Prometheus tests and the
//! backtest program.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Prometheus server on a free loopback port over a backfilled copy of the data.
pub struct TestPrometheus {
    child: Child,
    /// Base URL.
    pub url: String,
    _dir: tempfile::TempDir,
    args: Vec<String>,
}

impl Drop for TestPrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(dead_code)] // not every test binary uses it
impl TestPrometheus {
    /// Stops the server (SIGKILL), as an outage would; its data stays.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the stopped server again on the same port and data, ready to query.
    pub async fn restart(&mut self) {
        self.child = Command::new("prometheus")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts again");
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !client
            .get(format!("{}/-/ready", self.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(
                Instant::now() < deadline,
                "prometheus did not become ready again"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Fails (never skips) when `binary` is not installed.
pub fn require(binary: &str) {
    let found = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    // A test that needs the real server fails when it is missing; it never passes silently.
    assert!(
        found,
        "{binary} is not installed: run ./scripts/test, which installs Debian's prometheus package"
    );
}

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Two days of one-minute cadvisor samples ending a minute ago, as OpenMetrics text: for each
/// `(pod, cores, MiB)` in `namespace`, container `app` using a steady `cores` of CPU and `MiB`
/// of working set. Pods named as a Deployment's are (`<name>-<hash>-<suffix>`) map to it.
#[allow(dead_code)] // not every test binary uses it
pub fn steady_usage(namespace: &str, pods: &[(&str, f64, f64)]) -> String {
    use std::fmt::Write as _;
    let end = jiff::Timestamp::now().as_second() / 60 * 60 - 60;
    let mut om = String::from("# TYPE container_cpu_usage_seconds counter\n");
    for (pod, cores, _) in pods {
        for (i, t) in (end - 2 * 86_400..=end).step_by(60).enumerate() {
            let total = cores * 60.0 * i as f64;
            let _ = writeln!(
                om,
                "container_cpu_usage_seconds_total{{namespace=\"{namespace}\",pod=\"{pod}\",container=\"app\"}} {total} {t}"
            );
        }
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for (pod, _, mib) in pods {
        for t in (end - 2 * 86_400..=end).step_by(60) {
            let _ = writeln!(
                om,
                "container_memory_working_set_bytes{{namespace=\"{namespace}\",pod=\"{pod}\",container=\"app\"}} {} {t}",
                mib * 1_048_576.0
            );
        }
    }
    om.push_str("# EOF\n");
    om
}

/// Backfills `openmetrics` with promtool and starts Prometheus over it, ready to query.
pub async fn start_prometheus(openmetrics: &str) -> TestPrometheus {
    start_prometheus_with_auth(openmetrics, None).await
}

/// [`start_prometheus`] behind basic auth: `auth` is the user, the password and its
/// bcrypt hash (Prometheus' web config takes only the hash).
#[allow(dead_code)] // not every test binary uses it
pub async fn start_prometheus_with_auth(
    openmetrics: &str,
    auth: Option<(&str, &str, &str)>,
) -> TestPrometheus {
    require("prometheus");
    require("promtool");
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("history.om");
    std::fs::write(&input, openmetrics).expect("write history");
    let data = dir.path().join("data");
    let status = Command::new("promtool")
        .args([
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=1000h",
        ])
        .arg(&input)
        .arg(&data)
        .stdout(Stdio::null())
        .status()
        .expect("promtool runs");
    assert!(status.success(), "promtool backfill failed");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        "global:\n  scrape_interval: 1m\nscrape_configs: []\n",
    )
    .expect("write config");
    let port = free_port();
    let mut command = Command::new("prometheus");
    if let Some((user, _, hash)) = auth {
        let web = dir.path().join("web.yml");
        std::fs::write(&web, format!("basic_auth_users:\n  {user}: '{hash}'\n"))
            .expect("write web config");
        command.arg(format!("--web.config.file={}", web.display()));
    }
    let args = vec![
        format!("--config.file={}", config.display()),
        format!("--storage.tsdb.path={}", data.display()),
        "--storage.tsdb.retention.time=3650d".to_string(),
        format!("--web.listen-address=127.0.0.1:{port}"),
    ];
    let child = command
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus starts");
    let url = format!("http://127.0.0.1:{port}");
    let server = TestPrometheus {
        child,
        url,
        _dir: dir,
        args,
    };
    tailor::telemetry::install_tls_provider();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut request = client.get(format!("{}/-/ready", server.url));
        if let Some((user, password, _)) = auth {
            request = request.basic_auth(user, Some(password));
        }
        let ready = request.send().await.is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "prometheus did not become ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server
}

/// Starts Prometheus with an empty database scraping `target` (`host:port`) every second as
/// job `tailor`, with a `cluster` label of `cluster` on every series, as a cluster's
/// Prometheus scrapes the agent.
#[allow(dead_code)] // not every test binary uses it
pub async fn start_prometheus_scraping(target: &str, cluster: &str) -> TestPrometheus {
    require("prometheus");
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: tailor\n    static_configs:\n      - targets: ['{target}']\n        labels:\n          cluster: {cluster}\n"
        ),
    )
    .expect("write config");
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus starts");
    let server = TestPrometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
        args: Vec::new(),
    };
    tailor::telemetry::install_tls_provider();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = client
            .get(format!("{}/-/ready", server.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "prometheus did not become ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server
}
