//! The `tailor` binary end to end: what a user types and what they get.

#[path = "support/bin.rs"]
mod bin;

use std::path::PathBuf;

use bin::tailor;

fn shared_data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/azure")
}

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

fn quantity(v: &serde_json::Value) -> &str {
    v.as_str().expect("quantities are strings")
}

#[test]
fn catalog_json_lists_d2s_v5_allocatable_as_the_aks_formula_gives_by_hand() {
    let (ok, stdout, stderr) = tailor(&["catalog", "--region", "eastus", "-o", "json"]);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    let d2 = report["instanceTypes"]
        .as_array()
        .expect("a list")
        .iter()
        .find(|t| t["name"] == "Standard_D2s_v5")
        .expect("D2s_v5 is in the built-in catalog");
    assert_eq!(d2["vcpus"], 2);
    assert_eq!(d2["memoryGiB"], 8.0);
    // By hand: capacity memory = 8 GiB less 7.5% (rounded up to the byte); kube-reserved
    // memory = 25% of 4 GiB + 20% of 4 GiB = 1.8 GiB = 1843 MiB (truncated); eviction
    // threshold 750 MiB. kube-reserved CPU = 60m + 40m.
    let capacity_memory = 8 * GIB - (8.0 * GIB as f64 * 0.075).ceil() as i64;
    let allocatable_memory = capacity_memory - 1843 * MIB - 750 * MIB;
    assert_eq!(quantity(&d2["allocatable"]["cpu"]), "1900m");
    assert_eq!(
        quantity(&d2["allocatable"]["memory"]),
        allocatable_memory.to_string()
    );
    assert_eq!(quantity(&d2["allocatable"]["pods"]), "250");
    assert_eq!(quantity(&d2["overhead"]["memory"]), "2593Mi");
    let offerings = d2["offerings"].as_array().expect("offerings");
    assert_eq!(offerings.len(), 6, "3 zones x on-demand and spot");
    let on_demand = offerings
        .iter()
        .find(|o| o["capacityType"] == "on-demand")
        .expect("on-demand offered");
    assert_eq!(on_demand["pricePerHour"], 0.096);
    assert_eq!(on_demand["priceIsEstimate"], false);
    assert!(
        offerings
            .iter()
            .filter(|o| o["capacityType"] == "spot")
            .all(|o| o["priceIsEstimate"] == true)
    );
    assert_eq!(report["spotPricesAreEstimates"], true);
}

#[test]
fn catalog_requirements_filter_sizes_and_offerings() {
    let (ok, stdout, stderr) = tailor(&[
        "catalog",
        "--region",
        "westeurope",
        "--requirement",
        "kubernetes.io/arch In arm64",
        "-r",
        "karpenter.sh/capacity-type In on-demand",
        "-r",
        "topology.kubernetes.io/zone In westeurope-2",
        "-o",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    let types = report["instanceTypes"].as_array().expect("a list");
    assert!(types.len() >= 10, "{} arm64 sizes", types.len());
    for t in types {
        assert_eq!(t["arch"], "arm64", "{}", t["name"]);
        let offerings = t["offerings"].as_array().expect("offerings");
        assert_eq!(offerings.len(), 1, "{}", t["name"]);
        assert_eq!(offerings[0]["zone"], "westeurope-2");
        assert_eq!(offerings[0]["capacityType"], "on-demand");
    }
}

#[test]
fn catalog_table_is_readable_and_marks_spot_prices_as_estimates() {
    let (ok, stdout, stderr) = tailor(&[
        "catalog",
        "-r",
        "tailor.sh/sku-cpu Lte 4",
        "-r",
        "tailor.sh/sku-family In D",
    ]);
    assert!(ok, "{stderr}");
    let header = stdout.lines().next().expect("a header");
    for column in [
        "NAME",
        "ALLOC CPU",
        "ALLOC MEMORY",
        "ON-DEMAND $/H",
        "SPOT $/H (EST.)",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let d2 = stdout
        .lines()
        .find(|l| l.starts_with("Standard_D2s_v5 "))
        .expect("D2s_v5 row");
    assert!(
        d2.contains("1.9") && d2.contains("4.87Gi") && d2.contains("0.0960"),
        "{d2}"
    );
    assert!(
        !stdout.contains("Standard_D8s_v5"),
        "8 vCPU sizes are filtered out"
    );
    assert!(stdout.contains("spot prices are estimates"));
}

#[test]
fn catalog_reads_the_full_csv_catalog_from_a_directory() {
    let dir = shared_data();
    let dir = dir.to_str().expect("utf-8 path");
    let (ok, stdout, stderr) = tailor(&[
        "catalog",
        "--catalog-dir",
        dir,
        "--region",
        "eastus",
        "--no-spot",
        "-o",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    let types = report["instanceTypes"].as_array().expect("a list");
    assert!(
        types.len() > 400,
        "full eastus catalog has {} sizes",
        types.len()
    );
    assert!(types.iter().all(|t| {
        t["offerings"]
            .as_array()
            .is_some_and(|o| o.iter().all(|o| o["capacityType"] == "on-demand"))
    }));
}

#[test]
fn bad_flags_fail_with_a_message_naming_the_value() {
    let (ok, _, stderr) = tailor(&["catalog", "--region", "marsnorth"]);
    assert!(!ok);
    assert!(stderr.contains("\"marsnorth\""), "{stderr}");
    let (ok, _, stderr) = tailor(&["catalog", "-r", "kubernetes.io/arch Like arm64"]);
    assert!(!ok);
    assert!(stderr.contains("\"Like\""), "{stderr}");
    let (ok, _, stderr) = tailor(&["catalog", "--spot-discount", "1.5"]);
    assert!(!ok);
    assert!(stderr.contains("1.5"), "{stderr}");
}

#[test]
fn the_flag_and_chart_value_tables_in_the_docs_are_what_the_definitions_generate() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root_arg = root.to_string_lossy().into_owned();
    let (ok, stdout, stderr) = tailor(&["docs-reference", "--check", "--root", &root_arg]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("configuration.md: run-flags is current")
            && stdout.contains("install.md: values-reference is current"),
        "{stdout}"
    );

    // A copy whose tables went stale: a flag row dropped, a value's default changed. The
    // check names both pages and writes nothing; without --check both are rewritten.
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::create_dir_all(dir.path().join("docs")).expect("docs/");
    std::fs::create_dir_all(dir.path().join("deploy/charts/tailor")).expect("deploy/");
    let configuration = std::fs::read_to_string(root.join("docs/configuration.md")).expect("page");
    let install = std::fs::read_to_string(root.join("docs/install.md")).expect("page");
    let values = std::fs::read_to_string(root.join("deploy/charts/tailor/values.yaml"))
        .expect("values.yaml");
    let flag_row = configuration
        .lines()
        .find(|l| l.starts_with("| `--cluster-name`"))
        .expect("the --cluster-name row");
    let stale_configuration = configuration.replace(&format!("{flag_row}\n"), "");
    std::fs::write(
        dir.path().join("docs/configuration.md"),
        &stale_configuration,
    )
    .expect("write");
    std::fs::write(dir.path().join("docs/install.md"), &install).expect("write");
    std::fs::write(
        dir.path().join("deploy/charts/tailor/values.yaml"),
        values.replacen("replicas: 2", "replicas: 3", 1),
    )
    .expect("write");
    let copy = dir.path().to_string_lossy().into_owned();
    let (ok, _, stderr) = tailor(&["docs-reference", "--check", "--root", &copy]);
    assert!(!ok);
    assert!(
        stderr.contains("configuration.md (run-flags)")
            && stderr.contains("install.md (values-reference)"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("docs/configuration.md")).expect("page"),
        stale_configuration,
        "--check writes nothing"
    );
    let (ok, _, stderr) = tailor(&["docs-reference", "--root", &copy]);
    assert!(ok, "{stderr}");
    let rewritten = std::fs::read_to_string(dir.path().join("docs/install.md")).expect("page");
    assert!(
        rewritten.contains("| `replicas` | `3` |"),
        "the new default is in the table"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("docs/configuration.md")).expect("page"),
        configuration,
        "the dropped row is back"
    );

    // A value without a description is refused, naming it.
    std::fs::write(
        dir.path().join("deploy/charts/tailor/values.yaml"),
        format!("{values}\nundocumented: 1\n"),
    )
    .expect("write");
    let (ok, _, stderr) = tailor(&["docs-reference", "--check", "--root", &copy]);
    assert!(!ok);
    assert!(
        stderr.contains("undocumented has no `# --` comment"),
        "{stderr}"
    );
}

#[test]
fn an_empty_cluster_name_is_refused_before_anything_starts_naming_the_setting_and_the_page() {
    // The chart's default settings.clusterName is empty: the agent must say what to set
    // instead of tagging VMs with an empty name. The kubeconfig points nowhere: the refusal
    // comes before any connection.
    let (ok, _, stderr) = tailor(&[
        "run",
        "--cluster-name",
        "",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--metrics-address",
        "127.0.0.1:0",
        "--health-address",
        "127.0.0.1:0",
    ]);
    assert!(!ok);
    for needle in [
        "--cluster-name: is empty",
        "TAILOR_CLUSTER_NAME",
        "settings.clusterName",
        "docs/install.md#install",
    ] {
        assert!(stderr.contains(needle), "{needle} missing: {stderr}");
    }
    assert!(!stderr.contains("kubeconfig"), "{stderr}");
}

/// `tailor run --cloud azure` with every node setting but `leave_out`, against a kubeconfig
/// that points nowhere: what it printed as it refused to start (it must not start).
fn azure_run_without(leave_out: &[&str]) -> String {
    let settings = [
        ("--subscription-id", "00000000-0000-0000-0000-000000000000"),
        ("--azure-node-resource-group", "MC_prod_prod-eastus_eastus"),
        (
            "--azure-subnet-id",
            "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/prod/providers/Microsoft.Network/virtualNetworks/prod/subnets/nodes",
        ),
        (
            "--azure-ssh-public-key",
            "ssh-ed25519 AAAAC3Nza ops@example.com",
        ),
        (
            "--cluster-endpoint",
            "https://prod.hcp.eastus.azmk8s.io:443",
        ),
        (
            "--cluster-ca-bundle",
            "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t",
        ),
        ("--kubelet-bootstrap-token", "abcdef.0123456789abcdef"),
    ];
    let mut args = vec![
        "run",
        "--cloud",
        "azure",
        "--cluster-name",
        "prod-eastus",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--metrics-address",
        "127.0.0.1:0",
        "--health-address",
        "127.0.0.1:0",
    ];
    for (flag, value) in settings {
        if !leave_out.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    let (ok, _, stderr) = tailor(&args);
    assert!(!ok, "tailor run started without {leave_out:?}");
    stderr
}

#[test]
fn missing_azure_node_settings_are_refused_before_any_connection_naming_variable_and_page() {
    // The kubeconfig points nowhere: each refusal must come before the agent reads it.
    let stderr = azure_run_without(&["--azure-subnet-id"]);
    for needle in [
        "--azure-subnet-id: required with --cloud azure",
        "AZURE_SUBNET_ID",
        "docs/install.md#where-the-nodes-go-and-how-they-join",
    ] {
        assert!(stderr.contains(needle), "{needle} missing: {stderr}");
    }
    assert!(!stderr.contains("kubeconfig"), "{stderr}");
    // Neither a bootstrap token nor a node identity: nodes could not join, so nothing starts.
    let stderr = azure_run_without(&["--kubelet-bootstrap-token"]);
    for needle in [
        "nodes could not join the cluster",
        "AZURE_NODE_IDENTITIES",
        "TAILOR_KUBELET_BOOTSTRAP_TOKEN",
        "docs/install.md#where-the-nodes-go-and-how-they-join",
    ] {
        assert!(stderr.contains(needle), "{needle} missing: {stderr}");
    }
    assert!(!stderr.contains("kubeconfig"), "{stderr}");
    // With every setting, the next step is the kubeconfig: the checks above refused nothing
    // that was there.
    let stderr = azure_run_without(&[]);
    assert!(stderr.contains("/nonexistent/kubeconfig"), "{stderr}");
}

#[test]
fn committed_metric_reference_matches_what_tailor_metrics_reference_generates() {
    let (ok, fresh, stderr) = tailor(&["metrics-reference"]);
    assert!(ok, "{stderr}");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        fresh == committed,
        "docs/metrics.md is stale: run `cargo run -- metrics-reference > docs/metrics.md`"
    );
    for metric in [
        "tailor_nodeclaims_launched_total",
        "tailor_pod_startup_duration_seconds_bucket",
    ] {
        assert!(fresh.contains(metric), "{metric} missing");
    }
}

#[test]
fn committed_crd_yaml_matches_what_tailor_crds_generates() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().to_str().expect("utf-8 path");
    let (ok, _, stderr) = tailor(&["crds", "--output-dir", out]);
    assert!(ok, "{stderr}");
    let committed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/crds");
    let mut generated: Vec<_> = std::fs::read_dir(dir.path())
        .expect("generated")
        .map(|e| e.expect("entry").file_name())
        .collect();
    generated.sort();
    let mut on_disk: Vec<_> = std::fs::read_dir(&committed)
        .expect("deploy/crds exists")
        .map(|e| e.expect("entry").file_name())
        .collect();
    on_disk.sort();
    assert_eq!(
        generated, on_disk,
        "run `cargo run -- crds --output-dir deploy/crds`"
    );
    for name in generated {
        let fresh = std::fs::read_to_string(dir.path().join(&name)).expect("read");
        let old = std::fs::read_to_string(committed.join(&name)).expect("read");
        assert!(
            fresh == old,
            "deploy/crds/{} is stale: run `cargo run -- crds --output-dir deploy/crds`",
            name.to_string_lossy()
        );
    }
}

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/snapshots")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn simulate_json_has_the_documented_shape() {
    let (ok, stdout, stderr) = tailor(&[
        "simulate",
        "--snapshot",
        &example("shop.yaml"),
        "-o",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    let claim = &plan["nodeClaims"][0];
    for field in [
        "name",
        "nodePool",
        "instanceType",
        "zone",
        "capacityType",
        "pricePerHour",
        "pods",
    ] {
        assert!(
            !claim[field].is_null(),
            "nodeClaims[0].{field} missing: {claim}"
        );
    }
    for side in ["requests", "allocatable"] {
        assert!(
            claim[side]["cpu"].is_string() && claim[side]["memory"].is_string(),
            "{claim}"
        );
    }
    assert_eq!(plan["existingNodes"][0]["node"], "aks-default-7xk2p");
    assert!(
        plan["existingNodes"][0]["pods"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    );
    assert_eq!(plan["unschedulable"][0]["pod"], "shop/ml-inference-00000");
    assert!(
        plan["unschedulable"][0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("600Gi"))
    );
    let summary = &plan["summary"];
    assert_eq!(summary["pods"], 30);
    assert_eq!(summary["unschedulable"], 1);
    let on_new: usize = plan["nodeClaims"]
        .as_array()
        .expect("list")
        .iter()
        .map(|c| c["pods"].as_array().map_or(0, |p| p.len()))
        .sum();
    assert_eq!(
        summary["scheduledOnExisting"].as_u64().unwrap_or(0) as usize + on_new + 1,
        30
    );
    let cost: f64 = plan["nodeClaims"]
        .as_array()
        .expect("list")
        .iter()
        .map(|c| c["pricePerHour"].as_f64().unwrap_or(0.0))
        .sum();
    assert!((summary["hourlyCost"].as_f64().unwrap_or(0.0) - cost).abs() < 1e-6);
    assert_eq!(
        summary["newNodes"].as_u64(),
        Some(plan["nodeClaims"].as_array().map_or(0, |c| c.len()) as u64)
    );
}

#[test]
fn simulate_table_shows_nodes_types_zones_prices_pods_and_utilisation() {
    let (ok, stdout, stderr) = tailor(&["simulate", "--snapshot", &example("shop.yaml")]);
    assert!(ok, "{stderr}");
    let header = stdout.lines().next().expect("a header");
    for column in [
        "NODECLAIM",
        "INSTANCE TYPE",
        "ZONE",
        "$/HOUR",
        "PODS",
        "CPU%",
        "MEM%",
    ] {
        assert!(header.contains(column), "{header}");
    }
    assert!(stdout.contains("UNSCHEDULABLE POD"));
    assert!(stdout.contains("30 pending pods:"), "{stdout}");
}

#[test]
fn simulate_reports_a_broken_snapshot_with_its_document_and_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, resources: {requests: {memory: lots}}}]\n").expect("write");
    let (ok, stdout, stderr) = tailor(&["simulate", "--snapshot", file.to_str().expect("utf-8")]);
    assert!(!ok);
    assert!(
        stdout.is_empty(),
        "nothing is printed on a failed validation"
    );
    assert!(
        stderr.contains("document 1")
            && stderr.contains("spec.containers[0].resources.requests")
            && stderr.contains("\"lots\""),
        "{stderr}"
    );
}

#[test]
fn tailor_crds_into_a_closed_pipe_stops_quietly_and_succeeds() {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_tailor"))
        .arg("crds")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tailor runs");
    // The reader goes away before reading anything, as `head -1` does after one line.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("tailor ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}

#[test]
fn logs_to_a_file_carry_no_colour_codes() {
    // Warnings (an unknown kind) go to stderr, which is a pipe here, not a terminal.
    let (ok, _, stderr) = tailor(&["simulate", "--snapshot", &fixture_path("cluster-list.yaml")]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("ConfigMap shop/settings"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

fn fixture_path(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

#[test]
fn history_and_step_out_of_bounds_are_refused_before_anything_is_read() {
    let snapshot = fixture_path("scenario.yaml");
    for (flag, value, message) in [
        ("--history", "0s", "--history: \"0s\": must be at least 1s"),
        (
            "--history",
            "999999999d",
            "--history: \"999999999d\": must be at most 366d",
        ),
        ("--history", "99999d", "must be at most 366d"),
        (
            "--history",
            "9999999999999999999d",
            "--history: \"9999999999999999999d\"",
        ),
        ("--step", "0s", "--step: \"0s\": must be at least 1s"),
        ("--step", "2h", "--step: \"2h\": must be at most 1h"),
    ] {
        // Nothing listens on port 1: a flag that passed would fail later, differently.
        let (ok, _, stderr) = tailor(&[
            "recommend",
            "--prometheus-url",
            "http://127.0.0.1:1",
            "--snapshot",
            &snapshot,
            flag,
            value,
        ]);
        assert!(!ok);
        assert!(stderr.contains(message), "{flag} {value}: {stderr}");
        assert!(!stderr.contains("127.0.0.1:1"), "{stderr}");
    }
}

#[test]
fn kubeconfig_without_a_value_is_accepted_before_a_namespace_flag() {
    let home = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tailor"))
        .args([
            "recommend",
            "--prometheus-url",
            "http://127.0.0.1:1",
            "--kubeconfig",
            "-n",
            "shop",
        ])
        .env_remove("RUST_LOG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", home.path().join("missing-kubeconfig"))
        .env("HOME", home.path())
        .output()
        .expect("tailor runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // No cluster is reachable, so it fails, but past the argument parser: looking for
    // the kubeconfig.
    assert!(!out.status.success());
    assert!(!stderr.contains("a value is required"), "{stderr}");
    assert!(!stderr.contains("Usage:"), "{stderr}");
}

#[test]
fn an_address_in_use_for_serve_is_refused_before_the_demo_runs() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("address").to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let report = dir.path().join("demo.html");
    let (ok, _, stderr) = tailor(&[
        "demo",
        "--days",
        "1",
        "--serve",
        &addr,
        "--report",
        report.to_str().expect("utf-8"),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("--serve: cannot listen on {addr}")),
        "{stderr}"
    );
    // Refused before the run: no progress and no report.
    assert!(!stderr.contains("virtual day"), "{stderr}");
    assert!(!report.exists());
}

#[test]
fn an_empty_zone_list_is_refused_naming_the_zone() {
    let (ok, _, stderr) = tailor(&["catalog", "--zones", ""]);
    assert!(!ok);
    assert!(
        stderr.contains("zone \"\": a zone name must not be empty"),
        "{stderr}"
    );
}

#[test]
fn figures_of_an_empty_cluster_are_zero_never_negative_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("one-node.yaml");
    std::fs::write(
        &snapshot,
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {kubernetes.io/arch: amd64}}\n\
         status: {allocatable: {cpu: '2', memory: 4Gi, pods: '110'}}\n",
    )
    .expect("write");
    let path = snapshot.to_str().expect("utf-8");
    for args in [
        vec!["simulate", "--disruption", "--snapshot", path, "-o", "json"],
        vec!["simulate", "--disruption", "--snapshot", path],
        vec!["simulate", "--snapshot", path, "-o", "json"],
        vec!["simulate", "--snapshot", path],
    ] {
        let (ok, stdout, stderr) = tailor(&args);
        assert!(ok, "{stderr}");
        assert!(!stdout.contains("-0.0"), "{args:?}:\n{stdout}");
        assert!(!stdout.contains("$-0"), "{args:?}:\n{stdout}");
    }
}
