//! Checks a Tailor object against the OpenAPI schema of its CustomResourceDefinition, as the
//! API server does on create, with the API server's messages.
//!
//! Objects read from files never met an API server, so without this a NodePool budget with
//! a four-field cron or an AKSNodeClass with `maxPods: 0` would load and fail (or, worse,
//! act) later. The schema is the one [`super::crds`] renders, so the file path and the
//! cluster path accept exactly the same objects. Checked: `pattern`, `enum`, `minimum` /
//! `maximum`, `minLength` / `maxLength`, `minItems` / `maxItems` and `maxProperties`.
//! CEL rules (`x-kubernetes-validations`) are left to the typed checks of the code that
//! reads the fields.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

/// A field the schema refuses, and the API server's message for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SchemaViolation {
    /// Dotted path of the field (`spec.disruption.budgets[0].schedule`).
    pub field: String,
    /// The API server's message (`Invalid value: 0: spec.maxPods in body should be
    /// greater than or equal to 10`).
    pub message: String,
}

/// The schemas of Tailor's kinds, and every pattern they use, compiled once.
struct Schemas {
    by_kind: BTreeMap<String, Value>,
    patterns: BTreeMap<String, Regex>,
}

fn schemas() -> &'static Schemas {
    static SCHEMAS: OnceLock<Schemas> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut by_kind = BTreeMap::new();
        let mut patterns = BTreeMap::new();
        for crd in super::crds() {
            let Some(schema) = crd
                .spec
                .versions
                .first()
                .and_then(|v| v.schema.as_ref())
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| serde_json::to_value(s).ok())
            else {
                continue;
            };
            collect_patterns(&schema, &mut patterns);
            by_kind.insert(crd.spec.names.kind.clone(), schema);
        }
        Schemas { by_kind, patterns }
    })
}

fn collect_patterns(schema: &Value, out: &mut BTreeMap<String, Regex>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::String(p)) = map.get("pattern")
                && !out.contains_key(p)
                && let Ok(re) = Regex::new(p)
            {
                out.insert(p.clone(), re);
            }
            for v in map.values() {
                collect_patterns(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_patterns(v, out)),
        _ => {}
    }
}

/// Checks `object` (a whole object: apiVersion, kind, metadata, spec, ...) against the
/// schema of Tailor's `kind`; a kind without a schema passes.
pub fn validate(kind: &str, object: &Value) -> Result<(), SchemaViolation> {
    let schemas = schemas();
    match schemas.by_kind.get(kind) {
        Some(schema) => walk(schemas, schema, object, ""),
        None => Ok(()),
    }
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn walk(
    schemas: &Schemas,
    schema: &Value,
    value: &Value,
    path: &str,
) -> Result<(), SchemaViolation> {
    let violation = |message: String| {
        Err(SchemaViolation {
            field: path.to_string(),
            message,
        })
    };
    // Go's %v of the value, as the API server prints it: strings quoted, numbers bare.
    let shown = value.to_string();
    let limit = |name: &str| schema.get(name).and_then(Value::as_f64);
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        let supported: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return violation(format!(
            "Unsupported value: {shown}: supported values: {}",
            supported.join(", ")
        ));
    }
    match value {
        Value::String(s) => {
            if let Some(Value::String(p)) = schema.get("pattern")
                && let Some(re) = schemas.patterns.get(p)
                && !re.is_match(s)
            {
                return violation(format!(
                    "Invalid value: {shown}: {path} in body should match '{p}'"
                ));
            }
            let chars = s.chars().count() as f64;
            if let Some(max) = limit("maxLength")
                && chars > max
            {
                return violation(format!("Too long: may not be more than {max} bytes"));
            }
            if let Some(min) = limit("minLength")
                && chars < min
            {
                return violation(format!(
                    "Invalid value: {shown}: {path} in body should be at least {min} chars long"
                ));
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = limit("minimum")
                && x < min
            {
                return violation(format!(
                    "Invalid value: {shown}: {path} in body should be greater than or equal to {min}"
                ));
            }
            if let Some(max) = limit("maximum")
                && x > max
            {
                return violation(format!(
                    "Invalid value: {shown}: {path} in body should be less than or equal to {max}"
                ));
            }
        }
        Value::Array(items) => {
            let count = items.len() as f64;
            if let Some(max) = limit("maxItems")
                && count > max
            {
                return violation(format!("Too many: {count}: must have at most {max} items"));
            }
            if let Some(min) = limit("minItems")
                && count < min
            {
                return violation(format!(
                    "Invalid value: {count}: {path} in body should have at least {min} items"
                ));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(schemas, item_schema, item, &format!("{path}[{i}]"))?;
                }
            }
        }
        Value::Object(map) => {
            let count = map.len() as f64;
            if let Some(max) = limit("maxProperties")
                && count > max
            {
                return violation(format!("Too many: {count}: must have at most {max} items"));
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, v) in map {
                let sub = properties.and_then(|p| p.get(key)).or(additional);
                if let Some(sub) = sub {
                    walk(schemas, sub, v, &child(path, key))?;
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violation(kind: &str, yaml: &str) -> SchemaViolation {
        let value: Value = serde_yaml::from_str(yaml).expect("test YAML");
        validate(kind, &value).expect_err("the schema refuses it")
    }

    #[test]
    fn a_budget_cron_with_four_fields_is_refused_with_the_api_servers_message() {
        let v = violation(
            "NodePool",
            "spec:\n  disruption:\n    budgets:\n    - {nodes: '10%', schedule: '0 9 * *', duration: 8h}\n",
        );
        assert_eq!(v.field, "spec.disruption.budgets[0].schedule");
        assert!(
            v.message.starts_with(
                "Invalid value: \"0 9 * *\": spec.disruption.budgets[0].schedule in body should match '"
            ),
            "{}",
            v.message
        );
    }

    #[test]
    fn max_pods_outside_its_range_is_refused() {
        let v = violation("AKSNodeClass", "spec: {maxPods: 0}\n");
        assert_eq!(v.field, "spec.maxPods");
        assert_eq!(
            v.message,
            "Invalid value: 0: spec.maxPods in body should be greater than or equal to 10"
        );
        let v = violation("AKSNodeClass", "spec: {maxPods: 251}\n");
        assert!(
            v.message.contains("less than or equal to 250"),
            "{}",
            v.message
        );
    }

    #[test]
    fn objects_the_schema_accepts_pass() {
        let value: Value =
            serde_yaml::from_str("spec:\n  maxPods: 110\n  tags: {team: shop}\n").expect("YAML");
        assert_eq!(validate("AKSNodeClass", &value), Ok(()));
        assert_eq!(validate("ConfigMap", &value), Ok(()));
    }
}
