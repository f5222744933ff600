//! The Helm charts under deploy/charts rendered by the real `helm` (built from the Go module
//! proxy by scripts/helm) for several values files, and checked for their invariants:
//! least-privilege RBAC with reads apart from writes and no wildcard, a non-root read-only
//! pod kept off the nodes Tailor manages, two replicas behind a PDB, every setting reaching
//! the agent as an environment variable `tailor run` reads, Kubernetes' recommended labels,
//! and the dashboards, alert rules and CRDs embedded unchanged. Bad values fail with a
//! message naming the value.

#[path = "support/helm.rs"]
mod helm;
#[path = "support/observability.rs"]
mod observability;

use std::collections::BTreeSet;
use std::process::Command;

use helm::render;
use observability::{files, repo};
use serde_yaml::Value;

fn kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

const MINIMAL: &str = "settings:\n  clusterName: prod-eastus\n";

const EVERYTHING: &str = "settings:
  clusterName: prod-eastus
  mode: autonomous
  otlpEndpoint: http://otel-collector:4318
serviceMonitor:
  enabled: true
prometheusRule:
  enabled: true
dashboards:
  enabled: true
workloadIdentity:
  enabled: true
  clientId: 00000000-0000-0000-0000-000000000001
";

const KWOK: &str = "settings:\n  clusterName: test\n  cloud: kwok\n";

/// Right-sizing on, so the admission webhook is too.
const RIGHTSIZING: &str =
    "settings:\n  clusterName: prod-eastus\n  prometheusUrl: http://prometheus.monitoring:9090\n";

#[test]
fn rbac_is_least_privilege_with_reads_apart_from_writes() {
    for values in [MINIMAL, EVERYTHING, KWOK, RIGHTSIZING] {
        let objects = render("tailor", values).expect("renders");
        let roles: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
            .collect();
        assert_eq!(
            roles.len(),
            4,
            "read, write, leader-election and state roles"
        );
        let mut node_verbs = BTreeSet::new();
        for role in &roles {
            let name = role["metadata"]["name"].as_str().expect("name");
            for rule in role["rules"].as_sequence().expect("rules") {
                for field in ["apiGroups", "resources", "verbs"] {
                    let values = strings(&rule[field]);
                    assert!(!values.is_empty(), "{name}: a rule without {field}");
                    assert!(
                        !values.iter().any(|v| v.contains('*')),
                        "{name}: wildcard in {field}: {rule:?}"
                    );
                }
                let verbs = strings(&rule["verbs"]);
                if name.ends_with("-read") {
                    assert!(
                        verbs
                            .iter()
                            .all(|v| ["get", "list", "watch"].contains(&v.as_str())),
                        "{name} may only read: {verbs:?}"
                    );
                }
                if name.ends_with("-write") {
                    assert!(
                        !verbs
                            .iter()
                            .any(|v| ["get", "list", "watch"].contains(&v.as_str())),
                        "{name} holds no read verbs: {verbs:?}"
                    );
                    if strings(&rule["resources"]).contains(&"nodes".to_string()) {
                        node_verbs.extend(verbs.clone());
                    }
                }
                if name.ends_with("-state") {
                    assert_eq!(strings(&rule["resources"]), ["configmaps"]);
                    assert_eq!(role["kind"], "Role", "its ConfigMap only");
                    // Reads and writes name the one ConfigMap (create cannot be named).
                    if verbs != ["create"] {
                        assert_eq!(
                            strings(&rule["resourceNames"]),
                            [tailor::controllers::demand::CONFIG_MAP],
                            "{rule:?}"
                        );
                    }
                }
                if name.ends_with("-leader-election") {
                    assert_eq!(strings(&rule["resources"]), ["leases"]);
                    assert_eq!(
                        role["kind"], "Role",
                        "leases only in the release's namespace"
                    );
                }
                assert!(
                    !strings(&rule["resources"]).contains(&"secrets".to_string()),
                    "{name}: no access to Secrets"
                );
            }
        }
        // Only the kwok cloud creates Nodes itself; on Azure the kubelet does.
        assert_eq!(
            node_verbs.contains("create"),
            values == KWOK,
            "{node_verbs:?}"
        );
        for binding in kind(&objects, "ClusterRoleBinding") {
            assert_eq!(binding["subjects"][0]["name"], "tailor");
        }
    }
}

#[test]
fn the_agent_runs_non_root_read_only_twice_off_its_own_nodes() {
    let objects = render("tailor", MINIMAL).expect("renders");
    let deployment = kind(&objects, "Deployment")[0];
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(pod["priorityClassName"].is_string());
    let container = &pod["containers"][0];
    let sc = &container["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(terms["key"], "tailor.sh/nodepool");
    assert_eq!(terms["operator"], "DoesNotExist");
    assert!(pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"].is_mapping());
    assert!(pod["affinity"]["podAntiAffinity"].is_mapping());
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let pdb = kind(&objects, "PodDisruptionBudget")[0];
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
}

#[test]
fn every_setting_reaches_the_agent_as_a_variable_tailor_run_reads() {
    let objects = render("tailor", EVERYTHING).expect("renders");
    let deployment = kind(&objects, "Deployment")[0];
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .expect("env");
    let out = Command::new(env!("CARGO_BIN_EXE_tailor"))
        .args(["run", "--help"])
        .output()
        .expect("tailor runs");
    let help = String::from_utf8_lossy(&out.stdout);
    // Read by the process rather than by a flag: the pod's namespace and name (leader
    // election) and OpenTelemetry's standard endpoint variable.
    let not_flags = ["POD_NAMESPACE", "POD_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT"];
    for var in env {
        let name = var["name"].as_str().expect("name");
        assert!(
            not_flags.contains(&name) || help.contains(&format!("[env: {name}")),
            "{name} is not a variable `tailor run` reads:\n{help}"
        );
    }
    let value = |name: &str| {
        env.iter()
            .find(|v| v["name"] == name)
            .and_then(|v| v["value"].as_str())
            .map(String::from)
    };
    assert_eq!(value("TAILOR_CLUSTER_NAME").as_deref(), Some("prod-eastus"));
    let pod_name = env
        .iter()
        .find(|v| v["name"] == "POD_NAME")
        .expect("POD_NAME");
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(value("TAILOR_MODE").as_deref(), Some("autonomous"));
    assert_eq!(
        value("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some("http://otel-collector:4318")
    );
    // Workload identity: the pod label and the ServiceAccount's client ID.
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["azure.workload.identity/use"], "true");
    let sa = kind(&objects, "ServiceAccount")[0];
    assert_eq!(
        sa["metadata"]["annotations"]["azure.workload.identity/client-id"],
        "00000000-0000-0000-0000-000000000001"
    );
}

#[test]
fn the_webhook_is_served_on_the_service_with_a_mounted_certificate_and_may_only_apply_its_configuration()
 {
    let objects = render("tailor", RIGHTSIZING).expect("renders");
    let deployment = kind(&objects, "Deployment")[0];
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env = container["env"].as_sequence().expect("env");
    let value = |name: &str| {
        env.iter()
            .find(|v| v["name"] == name)
            .and_then(|v| v["value"].as_str())
            .map(String::from)
    };
    let help = Command::new(env!("CARGO_BIN_EXE_tailor"))
        .args(["run", "--help"])
        .output()
        .expect("tailor runs");
    let help = String::from_utf8_lossy(&help.stdout);
    for var in [
        "TAILOR_WEBHOOK_ADDRESS",
        "TAILOR_WEBHOOK_URL",
        "TAILOR_WEBHOOK_CERT_DIR",
    ] {
        assert!(value(var).is_some(), "{var} is not set");
        assert!(help.contains(&format!("[env: {var}")), "{var}: {help}");
    }
    assert_eq!(
        value("TAILOR_WEBHOOK_ADDRESS").as_deref(),
        Some("0.0.0.0:9443")
    );
    // The URL names the chart's Service and its webhook port, which leads to the container's.
    assert_eq!(
        value("TAILOR_WEBHOOK_URL").as_deref(),
        Some("https://tailor.tailor.svc:9443/mutate-pods")
    );
    let service = kind(&objects, "Service")[0];
    assert_eq!(service["metadata"]["name"], "tailor");
    let port = service["spec"]["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "https-webhook")
        .expect("the webhook's Service port");
    assert_eq!(port["port"].as_u64(), Some(9443));
    assert!(
        container["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .any(|p| p["name"] == "https-webhook" && p["containerPort"].as_u64() == Some(9443))
    );
    // The certificate the chart made is mounted where the agent reads it.
    let secret = kind(&objects, "Secret")[0];
    assert_eq!(secret["metadata"]["name"], "tailor-webhook-cert");
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(
            secret["data"][key].as_str().is_some_and(|v| !v.is_empty()),
            "{key}"
        );
    }
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        "tailor-webhook-cert"
    );
    assert_eq!(
        container["volumeMounts"][0]["mountPath"].as_str(),
        value("TAILOR_WEBHOOK_CERT_DIR").as_deref()
    );
    // The only webhook permission: create and patch the one configuration, by name.
    let write = kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "tailor-write")
        .expect("the write role");
    let rule = write["rules"]
        .as_sequence()
        .expect("rules")
        .iter()
        .find(|r| strings(&r["resources"]) == ["mutatingwebhookconfigurations"])
        .expect("a rule for the webhook configuration");
    assert_eq!(
        strings(&rule["resourceNames"]),
        [tailor::webhook::CONFIGURATION_NAME]
    );
    assert_eq!(strings(&rule["verbs"]), ["create", "patch"]);

    // A certificate of one's own (cert-manager's) is mounted instead of one the chart makes.
    let objects = render(
        "tailor",
        &format!("{RIGHTSIZING}webhook:\n  certSecret: tailor-webhook-tls\n"),
    )
    .expect("renders");
    assert!(kind(&objects, "Secret").is_empty());
    let pod = &kind(&objects, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        "tailor-webhook-tls"
    );
    // Off, or without right-sizing: no webhook parts at all.
    for values in [
        MINIMAL.to_string(),
        format!("{RIGHTSIZING}webhook:\n  enabled: false\n"),
    ] {
        let objects = render("tailor", &values).expect("renders");
        assert!(kind(&objects, "Secret").is_empty(), "{values}");
        let deployment = kind(&objects, "Deployment")[0];
        let deployment = serde_yaml::to_string(deployment).expect("yaml");
        let service = serde_yaml::to_string(kind(&objects, "Service")[0]).expect("yaml");
        let roles: Vec<String> = kind(&objects, "ClusterRole")
            .iter()
            .map(|r| serde_yaml::to_string(r).expect("yaml"))
            .collect();
        assert!(!deployment.contains("TAILOR_WEBHOOK") && !deployment.contains("webhook-cert"));
        assert!(!service.contains("https-webhook"), "{values}: {service}");
        assert!(
            !roles
                .iter()
                .any(|r| r.contains("mutatingwebhookconfigurations")),
            "{values}"
        );
    }
}

#[test]
fn every_object_carries_the_recommended_labels() {
    let objects = render("tailor", EVERYTHING).expect("renders");
    for o in objects
        .iter()
        .filter(|o| o["kind"] != "CustomResourceDefinition")
    {
        let labels = &o["metadata"]["labels"];
        for key in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ] {
            assert!(
                labels[key].is_string(),
                "{} {:?} lacks {key}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"]
            );
        }
    }
}

#[test]
fn dashboards_rules_and_crds_are_embedded_unchanged() {
    let objects = render("tailor", EVERYTHING).expect("renders");
    let rule = kind(&objects, "PrometheusRule")[0];
    let source: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("alerts/tailor.yaml")).expect("alerts"),
    )
    .expect("YAML");
    assert_eq!(rule["spec"]["groups"], source["groups"]);

    let maps = kind(&objects, "ConfigMap");
    let dashboards = files("dashboards", "json");
    assert_eq!(maps.len(), dashboards.len());
    for path in &dashboards {
        let file = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let map = maps
            .iter()
            .find(|m| m["data"][format!("tailor-{file}").as_str()].is_string())
            .unwrap_or_else(|| panic!("no ConfigMap holds {file}"));
        assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
        let embedded = map["data"][format!("tailor-{file}").as_str()]
            .as_str()
            .expect("text");
        let original = std::fs::read_to_string(path).expect("dashboard");
        assert_eq!(embedded, original.trim_end(), "{file} changed on the way");
    }
    let monitor = kind(&objects, "ServiceMonitor")[0];
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");

    let crds = files("deploy/crds", "yaml");
    for chart in ["tailor", "tailor-crd"] {
        let objects = render(chart, MINIMAL).expect("renders");
        let rendered = kind(&objects, "CustomResourceDefinition");
        assert_eq!(rendered.len(), crds.len(), "{chart}");
        for path in &crds {
            let original: Value =
                serde_yaml::from_str(&std::fs::read_to_string(path).expect("crd")).expect("YAML");
            assert!(
                rendered.iter().any(|c| **c == original),
                "{chart}: {} changed on the way",
                path.display()
            );
        }
    }
    // Without the optional parts, none of them is rendered.
    let minimal = render("tailor", MINIMAL).expect("renders");
    for k in ["PrometheusRule", "ServiceMonitor", "ConfigMap"] {
        assert!(kind(&minimal, k).is_empty(), "{k} rendered while disabled");
    }
}

#[test]
fn bad_values_fail_with_a_message_naming_the_value() {
    let err = render("tailor", "{}\n").expect_err("a cluster name is required");
    assert!(err.contains("settings.clusterName is required"), "{err}");
    let err = render(
        "tailor",
        "settings:\n  clusterName: c\nworkloadIdentity:\n  enabled: true\n",
    )
    .expect_err("a client ID is required");
    assert!(
        err.contains("workloadIdentity.clientId is required"),
        "{err}"
    );
}

#[test]
fn a_user_assigned_managed_identity_reaches_the_agent_and_excludes_workload_identity() {
    let values = "settings:\n  clusterName: prod\nmanagedIdentity:\n  clientId: 7c9f2a4e-1b3d-4e5f-8a6b-0c1d2e3f4a5b\n";
    let objects = render("tailor", values).expect("renders");
    let deployment = kind(&objects, "Deployment")[0];
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .expect("env");
    let client = env
        .iter()
        .find(|v| v["name"] == "AZURE_CLIENT_ID")
        .expect("AZURE_CLIENT_ID set");
    assert_eq!(client["value"], "7c9f2a4e-1b3d-4e5f-8a6b-0c1d2e3f4a5b");
    let help = Command::new(env!("CARGO_BIN_EXE_tailor"))
        .args(["run", "--help"])
        .output()
        .expect("tailor runs");
    assert!(String::from_utf8_lossy(&help.stdout).contains("[env: AZURE_CLIENT_ID"));
    let both = format!("{values}workloadIdentity:\n  enabled: true\n  clientId: x\n");
    let err = render("tailor", &both).expect_err("refused");
    assert!(
        err.contains("managedIdentity.clientId") && err.contains("workloadIdentity.enabled"),
        "{err}"
    );
}

#[test]
fn workloads_may_be_patched_only_when_rolling_restarts_are_allowed() {
    // Whether any role grants `patch` on Deployments, and whether the agent is told it may.
    let grants = |values: &str| {
        let objects = render("tailor", values).expect("renders");
        let patch = objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
            .flat_map(|r| r["rules"].as_sequence().cloned().unwrap_or_default())
            .any(|rule| {
                strings(&rule["resources"]).contains(&"deployments".to_string())
                    && strings(&rule["verbs"]).contains(&"patch".to_string())
            });
        let deployment = kind(&objects, "Deployment")[0];
        let told = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_sequence()
            .expect("env")
            .iter()
            .any(|v| v["name"] == "TAILOR_RIGHTSIZING_ROLLING_RESTART" && v["value"] == "true");
        (patch, told)
    };
    assert_eq!(grants(RIGHTSIZING), (false, false), "off by default");
    let allowed = format!("{RIGHTSIZING}  rightsizingRollingRestart: true\n");
    assert_eq!(grants(&allowed), (true, true));
    // Without right-sizing there is nothing to roll.
    let no_prometheus = "settings:\n  clusterName: x\n  rightsizingRollingRestart: true\n";
    assert!(!grants(no_prometheus).0);
}

#[test]
fn extra_volumes_are_mounted_beside_the_webhook_certificate() {
    // Prometheus credentials as files, on a read-only root filesystem.
    let values = format!(
        "{RIGHTSIZING}extraVolumes: [{{name: prometheus-auth, secret: {{secretName: prometheus-auth}}}}]\n\
         extraVolumeMounts: [{{name: prometheus-auth, mountPath: /etc/tailor/prometheus, readOnly: true}}]\n"
    );
    let objects = render("tailor", &values).expect("renders");
    let pod = &kind(&objects, "Deployment")[0]["spec"]["template"]["spec"];
    let volumes: Vec<&str> = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(volumes, ["webhook-cert", "prometheus-auth"]);
    let mounts: Vec<&str> = pod["containers"][0]["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    assert_eq!(mounts, ["/etc/tailor/webhook", "/etc/tailor/prometheus"]);
    // Without right-sizing (no webhook), the extra ones alone.
    let objects = render(
        "tailor",
        "settings: {clusterName: e2e}\nextraVolumes: [{name: a, emptyDir: {}}]\nextraVolumeMounts: [{name: a, mountPath: /a}]\n",
    )
    .expect("renders");
    let pod = &kind(&objects, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["name"], "a");
    assert_eq!(pod["containers"][0]["volumeMounts"][0]["mountPath"], "/a");
}
