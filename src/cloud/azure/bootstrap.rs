//! The custom data a VM boots with: a script that writes the kubelet's bootstrap
//! kubeconfig and flags and starts it, so the node joins the cluster by itself. Pure: the
//! rendered text depends only on the cluster settings and the node's launch settings.
//!
//! Karpenter's default ("scriptless") mode hands the AKS node image's own provisioning
//! script its variables; Tailor renders the same facts (API server, CA, bootstrap token or
//! TLS bootstrapping, kubelet flags, labels, taints, max pods) into one script.

use std::fmt::Write as _;

use base64::Engine as _;

use crate::apis::aksnodeclass::{CpuManagerPolicy, KubeletConfiguration, TopologyManagerPolicy};
use crate::cloud::NodeLaunch;

/// Where the node finds the cluster and how it authenticates for its first certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterBootstrap {
    /// The API server URL (`https://<fqdn>:443`).
    pub api_server: String,
    /// The cluster CA bundle, base64-encoded PEM.
    pub ca_bundle_base64: String,
    /// A bootstrap token (`abcdef.0123456789abcdef`); `None` uses TLS bootstrapping with the
    /// node's managed identity (AKS secure TLS bootstrapping).
    pub bootstrap_token: Option<String>,
    /// The cluster DNS service IP.
    pub cluster_dns: String,
    /// Pods per node when the node class does not say.
    pub default_max_pods: u32,
}

/// Where the bootstrap kubeconfig is written on the node.
pub const BOOTSTRAP_KUBECONFIG_PATH: &str = "/var/lib/kubelet/bootstrap-kubeconfig";
/// Marker lines around the embedded kubeconfig, so tests and tools can find it.
pub const KUBECONFIG_BEGIN: &str = "cat > /var/lib/kubelet/bootstrap-kubeconfig <<'KUBECONFIG'";
/// End marker of the embedded kubeconfig.
pub const KUBECONFIG_END: &str = "KUBECONFIG";

/// The kubelet flags for a node.
pub fn kubelet_flags(
    cluster: &ClusterBootstrap,
    node: &NodeLaunch,
    provider_id: &str,
) -> Vec<String> {
    let mut flags = vec![
        format!("--bootstrap-kubeconfig={BOOTSTRAP_KUBECONFIG_PATH}"),
        "--kubeconfig=/var/lib/kubelet/kubeconfig".to_string(),
        format!("--cluster-dns={}", cluster.cluster_dns),
        format!(
            "--max-pods={}",
            node.max_pods.unwrap_or(cluster.default_max_pods)
        ),
        format!("--provider-id={provider_id}"),
        "--cloud-provider=external".to_string(),
    ];
    if !node.labels.is_empty() {
        let labels: Vec<String> = node
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        flags.push(format!("--node-labels={}", labels.join(",")));
    }
    if !node.taints.is_empty() {
        flags.push(format!("--register-with-taints={}", node.taints.join(",")));
    }
    if let Some(k) = &node.kubelet {
        flags.extend(kubelet_config_flags(k));
    }
    flags
}

fn kubelet_config_flags(k: &KubeletConfiguration) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some(p) = k.cpu_manager_policy {
        let p = match p {
            CpuManagerPolicy::None => "none",
            CpuManagerPolicy::Static => "static",
        };
        flags.push(format!("--cpu-manager-policy={p}"));
    }
    if let Some(q) = k.cpu_cfs_quota {
        flags.push(format!("--cpu-cfs-quota={q}"));
    }
    if let Some(h) = k.image_gc_high_threshold_percent {
        flags.push(format!("--image-gc-high-threshold={h}"));
    }
    if let Some(l) = k.image_gc_low_threshold_percent {
        flags.push(format!("--image-gc-low-threshold={l}"));
    }
    if let Some(p) = k.topology_manager_policy {
        let p = match p {
            TopologyManagerPolicy::None => "none",
            TopologyManagerPolicy::BestEffort => "best-effort",
            TopologyManagerPolicy::Restricted => "restricted",
            TopologyManagerPolicy::SingleNumaNode => "single-numa-node",
        };
        flags.push(format!("--topology-manager-policy={p}"));
    }
    if !k.allowed_unsafe_sysctls.is_empty() {
        flags.push(format!(
            "--allowed-unsafe-sysctls={}",
            k.allowed_unsafe_sysctls.join(",")
        ));
    }
    if let Some(s) = &k.container_log_max_size {
        flags.push(format!("--container-log-max-size={s}"));
    }
    if let Some(n) = k.container_log_max_files {
        flags.push(format!("--container-log-max-files={n}"));
    }
    if let Some(n) = k.pod_pids_limit {
        flags.push(format!("--pod-max-pids={n}"));
    }
    flags
}

/// The bootstrap kubeconfig (YAML).
pub fn bootstrap_kubeconfig(cluster: &ClusterBootstrap) -> String {
    let user = match &cluster.bootstrap_token {
        Some(token) => format!("    token: \"{token}\"\n"),
        // Secure TLS bootstrapping: the node's identity gets the token from AAD.
        None => "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /opt/azure/tlsbootstrap/tls-bootstrap-client\n      args: [\"bootstrap\"]\n      interactiveMode: Never\n".to_string(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: cluster\n  cluster:\n    server: \"{}\"\n    certificate-authority-data: \"{}\"\nusers:\n- name: kubelet-bootstrap\n  user:\n{user}contexts:\n- name: bootstrap\n  context:\n    cluster: cluster\n    user: kubelet-bootstrap\ncurrent-context: bootstrap\n",
        cluster.api_server, cluster.ca_bundle_base64
    )
}

/// The boot script.
pub fn render(cluster: &ClusterBootstrap, node: &NodeLaunch, provider_id: &str) -> String {
    let mut s = String::from(
        "#!/bin/bash\n# Written by Tailor: joins this VM to the cluster as a node.\nset -euo pipefail\nmkdir -p /var/lib/kubelet\n",
    );
    let _ = writeln!(s, "{KUBECONFIG_BEGIN}");
    s.push_str(&bootstrap_kubeconfig(cluster));
    let _ = writeln!(s, "{KUBECONFIG_END}");
    let flags = kubelet_flags(cluster, node, provider_id);
    let _ = writeln!(
        s,
        "echo 'KUBELET_FLAGS={}' > /etc/default/kubelet",
        flags.join(" ").replace('\'', "")
    );
    s.push_str("systemctl daemon-reload\nsystemctl enable --now kubelet\n");
    s
}

/// The script as `osProfile.customData` wants it: base64.
pub fn custom_data(cluster: &ClusterBootstrap, node: &NodeLaunch, provider_id: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(render(cluster, node, provider_id))
}

/// The kubeconfig embedded in a rendered script, if any.
pub fn embedded_kubeconfig(script: &str) -> Option<&str> {
    let start = script.find(KUBECONFIG_BEGIN)? + KUBECONFIG_BEGIN.len() + 1;
    let rest = &script[start..];
    let end = rest.find(&format!("\n{KUBECONFIG_END}\n"))?;
    Some(&rest[..=end])
}

/// The kubelet flags in a rendered script, if any.
pub fn embedded_flags(script: &str) -> Option<Vec<&str>> {
    let line = script
        .lines()
        .find_map(|l| l.strip_prefix("echo 'KUBELET_FLAGS="))?;
    let flags = line.split('\'').next()?;
    Some(flags.split(' ').collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cluster(token: Option<&str>) -> ClusterBootstrap {
        ClusterBootstrap {
            api_server: "https://aks.example:443".to_string(),
            ca_bundle_base64: "Q0E=".to_string(),
            bootstrap_token: token.map(str::to_string),
            cluster_dns: "10.0.0.10".to_string(),
            default_max_pods: 250,
        }
    }

    #[test]
    fn the_script_carries_a_kubeconfig_and_the_node_flags() {
        let node = NodeLaunch {
            labels: BTreeMap::from([("tailor.sh/nodepool".to_string(), "default".to_string())]),
            taints: vec!["gpu=true:NoSchedule".to_string()],
            max_pods: Some(110),
            kubelet: Some(KubeletConfiguration {
                cpu_manager_policy: Some(CpuManagerPolicy::Static),
                ..Default::default()
            }),
            ..Default::default()
        };
        let script = render(
            &cluster(Some("abcdef.0123456789abcdef")),
            &node,
            "azure:///x",
        );
        let kubeconfig = embedded_kubeconfig(&script).expect("kubeconfig");
        let v: serde_yaml::Value = serde_yaml::from_str(kubeconfig).expect("yaml");
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://aks.example:443"
        );
        assert_eq!(v["users"][0]["user"]["token"], "abcdef.0123456789abcdef");
        let flags = embedded_flags(&script).expect("flags");
        for f in [
            "--max-pods=110",
            "--node-labels=tailor.sh/nodepool=default",
            "--register-with-taints=gpu=true:NoSchedule",
            "--cpu-manager-policy=static",
            "--provider-id=azure:///x",
        ] {
            assert!(flags.contains(&f), "{f} missing from {flags:?}");
        }
    }

    #[test]
    fn without_a_token_the_kubelet_uses_tls_bootstrapping() {
        let script = render(&cluster(None), &NodeLaunch::default(), "azure:///x");
        let v: serde_yaml::Value =
            serde_yaml::from_str(embedded_kubeconfig(&script).expect("kubeconfig")).expect("yaml");
        assert!(v["users"][0]["user"]["exec"]["command"].is_string());
        assert!(
            embedded_flags(&script)
                .expect("flags")
                .contains(&"--max-pods=250")
        );
    }
}
