//! The real `helm` (built from the Go module proxy by scripts/helm) rendering Tailor's
//! charts, for the chart's render tests and for installing its RBAC into a real control
//! plane.

#![allow(dead_code)] // each test binary uses part of it

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::Deserialize as _;
use serde_yaml::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The helm binary, built once (cached under ~/.cache/tailor-e2e). A test that needs it
/// fails when it cannot be built; it never passes silently.
pub fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new(repo().join("scripts/helm"))
            .arg("build")
            .output()
            .expect("scripts/helm runs");
        assert!(
            out.status.success(),
            "building helm failed (needs Go and the module proxy): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string())
    })
}

/// Renders `chart` (a folder of deploy/charts) as release `tailor` in namespace `tailor`
/// with `values` (YAML); Ok(objects) or Err(helm's message).
pub fn render(chart: &str, values: &str) -> Result<Vec<Value>, String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).expect("write values");
    let out = Command::new(helm())
        .args(["template", "tailor"])
        .arg(repo().join("deploy/charts").join(chart))
        .args(["--namespace", "tailor", "--include-crds", "--values"])
        .arg(&file)
        .env("HELM_CACHE_HOME", dir.path().join("cache"))
        .env("HELM_CONFIG_HOME", dir.path().join("config"))
        .env("HELM_DATA_HOME", dir.path().join("data"))
        .output()
        .expect("helm runs");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc).map_err(|e| format!("{e}: {text}"))?;
        if !v.is_null() {
            objects.push(v);
        }
    }
    Ok(objects)
}
