//! Tailor's custom resources, group `tailor.sh`, version `v1alpha1`, and the well-known labels.
//!
//! | kind | scope | what it is for |
//! | --- | --- | --- |
//! | [`NodePool`] | cluster | the nodes Tailor may buy and when it may take them away (Karpenter `karpenter.sh/v1` layout) |
//! | [`NodeClaim`] | cluster | one node being bought, running, or torn down (Karpenter `karpenter.sh/v1` layout) |
//! | [`AKSNodeClass`] | cluster | Azure settings for nodes (Karpenter `karpenter.azure.com/v1beta1` layout) |
//! | [`RightsizingPolicy`] | namespace | which workloads are right-sized and how; `default` in the agent's namespace is the cluster default |
//! | [`Recommendation`] | namespace | the current advice for one workload, with its cost effect |
//!
//! The Rust types are the source of truth: [`crds`] and [`crd_yaml`] render the
//! CustomResourceDefinitions (schemas, defaults, CEL rules, printer columns) from them. Field
//! doc comments become the field descriptions `kubectl explain` shows.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResourceExt;

pub mod aksnodeclass;
pub mod duration;
pub mod labels;
pub mod nodeclaim;
pub mod nodepool;
pub mod recommendation;
pub mod rightsizingpolicy;
pub mod schema;

pub use aksnodeclass::{
    AKSNodeClass, AKSNodeClassSpec, AKSNodeClassStatus, CpuManagerPolicy, FipsMode, ImageFamily,
    KubeletConfiguration, NodeImage, OverheadModel, TopologyManagerPolicy,
};
pub use nodeclaim::{
    NodeClaim, NodeClaimResources, NodeClaimSpec, NodeClaimStatus, NodeClassReference,
    NodeRequirement, RequirementOperator,
};
pub use nodepool::{
    Budget, BudgetNodes, ConsolidationPolicy, Disruption, DisruptionReason, NodeClaimTemplate,
    NodeClaimTemplateSpec, NodePool, NodePoolSpec, NodePoolStatus, TemplateMetadata,
};
pub use recommendation::{
    ContainerRecommendation, ContainerResources, Recommendation, RecommendationSpec,
    RecommendationStatus, RecommendationSummary, TargetReference,
};
pub use rightsizingpolicy::{
    CpuPolicy, HpaPolicy, LimitsPolicy, MemoryPolicy, Mode, Profile, ResourceKind,
    RightsizingPolicy, RightsizingPolicySpec, RightsizingPolicyStatus, UpdateMode, UpdatePolicy,
    WorkloadReference,
};

/// Resource amounts by resource name (`cpu`, `memory`, `pods`, `nvidia.com/gpu`, ...), as in a
/// pod's requests.
pub type ResourceList = BTreeMap<String, Quantity>;

/// A value in one of Tailor's resources that the API server accepted but Tailor cannot use.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A duration field does not hold a Go duration.
    #[error(
        "invalid duration {value:?}: {reason}; write a Go duration such as \"90s\", \"1h30m\" or \"720h\""
    )]
    InvalidDuration {
        /// The text as written.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A disruption budget's `nodes` is neither a count nor a percentage.
    #[error(
        "invalid disruption budget nodes {value:?}: write a count such as \"5\" or a percentage from \"0%\" to \"100%\""
    )]
    InvalidBudgetNodes {
        /// The text as written.
        value: String,
    },
    /// A CustomResourceDefinition could not be rendered as YAML.
    #[error("cannot render the CustomResourceDefinition {name} as YAML")]
    RenderCrd {
        /// Name of the CRD, such as `nodepools.tailor.sh`.
        name: String,
        /// The YAML serializer's complaint.
        #[source]
        source: serde_yaml::Error,
    },
}

/// Result of the fallible helpers in this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every Tailor CustomResourceDefinition, in a fixed order: NodePool, NodeClaim, AKSNodeClass,
/// RightsizingPolicy, Recommendation.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        NodePool::crd(),
        NodeClaim::crd(),
        AKSNodeClass::crd(),
        RightsizingPolicy::crd(),
        Recommendation::crd(),
    ]
}

/// Every CRD rendered as YAML, with the file name it is committed under
/// (`tailor.sh_nodepools.yaml`, ...), in the order of [`crds`]. The output is deterministic, so
/// a test can compare it with the committed files.
pub fn crd_yaml() -> Result<Vec<(String, String)>> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let file = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            let body =
                serde_yaml::to_string(&crd).map_err(|source| Error::RenderCrd { name, source })?;
            let header = "# Generated from the Rust types by `tailor crds`; do not edit.\n";
            Ok((file, format!("{header}{body}")))
        })
        .collect()
}

/// The condition of type `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of type `type_` is present with status `"True"`.
pub fn is_condition_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Adds or updates a condition following Kubernetes conventions: `lastTransitionTime` moves
/// only when the status changes. Returns whether anything changed, so callers can skip a
/// no-op status write.
pub fn set_condition(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == new.type_) else {
        conditions.push(new);
        return true;
    };
    let mut changed = false;
    if existing.status != new.status {
        existing.status = new.status;
        existing.last_transition_time = new.last_transition_time;
        changed = true;
    }
    if existing.reason != new.reason {
        existing.reason = new.reason;
        changed = true;
    }
    if existing.message != new.message {
        existing.message = new.message;
        changed = true;
    }
    if existing.observed_generation != new.observed_generation {
        existing.observed_generation = new.observed_generation;
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionVersion, JSONSchemaProps,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::Value;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// Renders every CRD to YAML and parses it back, as `kubectl apply` would read the files.
    fn round_tripped()
    -> std::result::Result<Vec<CustomResourceDefinition>, Box<dyn std::error::Error>> {
        let mut parsed = Vec::new();
        for (_, yaml) in crd_yaml()? {
            parsed.push(serde_yaml::from_str::<CustomResourceDefinition>(&yaml)?);
        }
        Ok(parsed)
    }

    fn by_kind<'a>(
        crds: &'a [CustomResourceDefinition],
        kind: &str,
    ) -> &'a CustomResourceDefinition {
        crds.iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap_or_else(|| panic!("no CRD for {kind}"))
    }

    fn only_version(crd: &CustomResourceDefinition) -> &CustomResourceDefinitionVersion {
        assert_eq!(crd.spec.versions.len(), 1, "{}", crd.spec.names.kind);
        &crd.spec.versions[0]
    }

    fn root_schema(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
        only_version(crd)
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap_or_else(|| panic!("{} has no openAPIV3Schema", crd.spec.names.kind))
    }

    /// Follows `.properties.<name>` (and `.items` for `[]`) down a schema.
    fn at<'a>(schema: &'a JSONSchemaProps, path: &[&str]) -> &'a JSONSchemaProps {
        path.iter().fold(schema, |s, step| {
            if *step == "[]" {
                match &s.items {
                    Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(inner)) => inner,
                    other => panic!("no items schema at {step}: {other:?}"),
                }
            } else {
                s.properties
                    .as_ref()
                    .and_then(|p| p.get(*step))
                    .unwrap_or_else(|| panic!("no property {step} in {path:?}"))
            }
        })
    }

    fn enum_values(schema: &JSONSchemaProps) -> Vec<String> {
        schema
            .enum_
            .iter()
            .flatten()
            .filter_map(|v| v.0.as_str().map(str::to_owned))
            .collect()
    }

    fn rules(schema: &JSONSchemaProps) -> Vec<String> {
        schema
            .x_kubernetes_validations
            .iter()
            .flatten()
            .map(|r| r.rule.clone())
            .collect()
    }

    fn default_of(schema: &JSONSchemaProps) -> Option<&Value> {
        schema.default.as_ref().map(|d| &d.0)
    }

    #[test]
    fn crds_come_in_a_fixed_order_with_their_file_names() -> TestResult {
        let files: Vec<String> = crd_yaml()?.into_iter().map(|(name, _)| name).collect();
        assert_eq!(
            files,
            [
                "tailor.sh_nodepools.yaml",
                "tailor.sh_nodeclaims.yaml",
                "tailor.sh_aksnodeclasses.yaml",
                "tailor.sh_rightsizingpolicies.yaml",
                "tailor.sh_recommendations.yaml",
            ]
        );
        Ok(())
    }

    #[test]
    fn rendering_the_crds_twice_gives_identical_yaml() -> TestResult {
        assert_eq!(crd_yaml()?, crd_yaml()?);
        Ok(())
    }

    #[test]
    fn every_crd_round_trips_through_yaml_unchanged() -> TestResult {
        assert_eq!(round_tripped()?, crds());
        Ok(())
    }

    #[test]
    fn every_crd_serves_and_stores_v1alpha1_with_a_status_subresource_in_the_tailor_category()
    -> TestResult {
        for crd in round_tripped()? {
            let kind = &crd.spec.names.kind;
            assert_eq!(crd.spec.group, labels::GROUP, "{kind}");
            let version = only_version(&crd);
            assert_eq!(version.name, labels::VERSION, "{kind}");
            assert!(version.served && version.storage, "{kind}");
            let status = version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref());
            assert!(status.is_some(), "{kind} has no status subresource");
            assert_eq!(
                crd.spec.names.categories.as_deref(),
                Some(&[labels::CATEGORY.to_owned()][..]),
                "{kind}"
            );
            assert_eq!(
                crd.spec.names.short_names.as_ref().map(Vec::len),
                Some(1),
                "{kind}"
            );
            let schema = root_schema(&crd);
            assert!(
                at(schema, &["spec"]).type_.as_deref() == Some("object"),
                "{kind}"
            );
            assert!(
                at(schema, &["status"]).type_.as_deref() == Some("object"),
                "{kind}"
            );
            let description = schema.description.as_deref().unwrap_or_default();
            assert!(
                !description.starts_with("Auto-generated"),
                "{kind} lacks a description"
            );
        }
        Ok(())
    }

    #[test]
    fn cluster_scoped_and_namespaced_kinds_are_as_designed() -> TestResult {
        let crds = round_tripped()?;
        for kind in ["NodePool", "NodeClaim", "AKSNodeClass"] {
            assert_eq!(by_kind(&crds, kind).spec.scope, "Cluster", "{kind}");
        }
        for kind in ["RightsizingPolicy", "Recommendation"] {
            assert_eq!(by_kind(&crds, kind).spec.scope, "Namespaced", "{kind}");
        }
        Ok(())
    }

    #[test]
    fn printer_columns_and_short_names_match_the_kubectl_design() -> TestResult {
        let crds = round_tripped()?;
        let expected: [(&str, &str, &[&str]); 5] = [
            (
                "NodePool",
                "tnp",
                &["NodeClass", "Nodes", "Ready", "Weight", "Age"],
            ),
            (
                "NodeClaim",
                "tnc",
                &["Type", "Capacity", "Zone", "Node", "Ready", "Age"],
            ),
            ("AKSNodeClass", "taksnc", &["ImageFamily", "Ready", "Age"]),
            (
                "RightsizingPolicy",
                "rsp",
                &["Mode", "Update", "Workloads", "Age"],
            ),
            (
                "Recommendation",
                "rec",
                &[
                    "Workload",
                    "Containers",
                    "CPU",
                    "Memory",
                    "$/Month",
                    "Confidence",
                    "Mode",
                    "Ready",
                    "Actionable",
                    "Stale",
                    "Age",
                ],
            ),
        ];
        for (kind, short, columns) in expected {
            let crd = by_kind(&crds, kind);
            assert_eq!(
                crd.spec.names.short_names,
                Some(vec![short.to_owned()]),
                "{kind}"
            );
            let shown: Vec<&str> = only_version(crd)
                .additional_printer_columns
                .iter()
                .flatten()
                .filter(|c| c.priority.unwrap_or(0) == 0)
                .map(|c| c.name.as_str())
                .collect();
            assert_eq!(shown, columns, "{kind}");
        }
        Ok(())
    }

    #[test]
    fn every_field_of_every_schema_is_structural() -> TestResult {
        // Kubernetes rejects a CRD unless every node names its type (or is an int-or-string /
        // preserve-unknown-fields node), and it allows no references.
        fn walk(kind: &str, path: &str, node: &Value) {
            let Some(obj) = node.as_object() else { return };
            for banned in ["$ref", "definitions", "$defs", "const", "oneOf", "anyOf"] {
                assert!(!obj.contains_key(banned), "{kind}{path} has {banned}");
            }
            let typed = obj.contains_key("type")
                || obj.contains_key("x-kubernetes-int-or-string")
                || obj.contains_key("x-kubernetes-preserve-unknown-fields");
            assert!(typed, "{kind}{path} has no type: {node}");
            if let Some(props) = obj.get("properties").and_then(Value::as_object) {
                for (name, child) in props {
                    walk(kind, &format!("{path}.{name}"), child);
                }
            }
            for key in ["items", "additionalProperties"] {
                if let Some(child) = obj.get(key).filter(|c| c.is_object()) {
                    walk(kind, &format!("{path}[{key}]"), child);
                }
            }
        }
        for crd in round_tripped()? {
            let schema = serde_json::to_value(root_schema(&crd))?;
            walk(&crd.spec.names.kind, "", &schema);
        }
        Ok(())
    }

    #[test]
    fn the_nodepool_schema_carries_enums_defaults_ranges_and_cel_rules() -> TestResult {
        let crds = round_tripped()?;
        let schema = root_schema(by_kind(&crds, "NodePool"));

        let policy = at(schema, &["spec", "disruption", "consolidationPolicy"]);
        assert_eq!(
            enum_values(policy),
            ["WhenEmpty", "WhenEmptyOrUnderutilized"]
        );
        assert_eq!(
            default_of(policy),
            Some(&Value::from("WhenEmptyOrUnderutilized"))
        );
        let after = at(schema, &["spec", "disruption", "consolidateAfter"]);
        assert_eq!(default_of(after), Some(&Value::from("0s")));
        assert!(
            after
                .pattern
                .as_deref()
                .is_some_and(|p| p.contains("Never"))
        );
        let budget_nodes = at(schema, &["spec", "disruption", "budgets", "[]", "nodes"]);
        assert_eq!(default_of(budget_nodes), Some(&Value::from("10%")));
        let reasons = at(
            schema,
            &["spec", "disruption", "budgets", "[]", "reasons", "[]"],
        );
        assert_eq!(enum_values(reasons), ["Underutilized", "Empty", "Drifted"]);
        let budget = at(schema, &["spec", "disruption", "budgets", "[]"]);
        assert!(rules(budget).contains(&"has(self.schedule) == has(self.duration)".to_owned()));

        let weight = at(schema, &["spec", "weight"]);
        assert_eq!((weight.minimum, weight.maximum), (Some(1.0), Some(100.0)));
        let template = at(schema, &["spec", "template", "spec"]);
        assert_eq!(
            default_of(at(template, &["expireAfter"])),
            Some(&Value::from("720h"))
        );
        assert!(!rules(at(template, &["requirements"])).is_empty());

        let requirement = at(template, &["requirements", "[]"]);
        let operators = enum_values(at(requirement, &["operator"]));
        assert_eq!(
            operators,
            [
                "In",
                "NotIn",
                "Exists",
                "DoesNotExist",
                "Gt",
                "Lt",
                "Gte",
                "Lte"
            ]
        );
        let min_values = at(requirement, &["minValues"]);
        assert_eq!(
            (min_values.minimum, min_values.maximum),
            (Some(1.0), Some(50.0))
        );
        let requirement_rules = rules(requirement);
        assert!(
            requirement_rules
                .iter()
                .any(|r| r.contains("self.operator != 'In'") && r.contains("size(self.values) > 0")),
            "{requirement_rules:?}"
        );
        assert!(
            requirement_rules
                .iter()
                .any(|r| r.contains("self.minValues <= size(self.values)")),
            "{requirement_rules:?}"
        );
        let messages: Vec<_> = requirement
            .x_kubernetes_validations
            .iter()
            .flatten()
            .filter_map(|r| r.message.clone())
            .collect();
        assert_eq!(
            messages.len(),
            requirement_rules.len(),
            "every rule explains itself"
        );
        assert_eq!(
            requirement.required.as_deref(),
            Some(&["key".to_owned(), "operator".to_owned()][..])
        );
        Ok(())
    }

    #[test]
    fn status_conditions_merge_by_type_under_server_side_apply() -> TestResult {
        for crd in round_tripped()? {
            let conditions = at(root_schema(&crd), &["status", "conditions"]);
            let kind = &crd.spec.names.kind;
            assert_eq!(
                conditions.x_kubernetes_list_type.as_deref(),
                Some("map"),
                "{kind}"
            );
            assert_eq!(
                conditions.x_kubernetes_list_map_keys,
                Some(vec!["type".to_owned()]),
                "{kind}"
            );
        }
        Ok(())
    }

    #[test]
    fn the_nodeclaim_spec_is_immutable_and_the_aksnodeclass_has_its_defaults() -> TestResult {
        let crds = round_tripped()?;
        let claim = root_schema(by_kind(&crds, "NodeClaim"));
        assert!(rules(at(claim, &["spec"])).contains(&"self == oldSelf".to_owned()));

        let class = root_schema(by_kind(&crds, "AKSNodeClass"));
        let disk = at(class, &["spec", "osDiskSizeGB"]);
        assert_eq!(default_of(disk), Some(&Value::from(128)));
        assert_eq!((disk.minimum, disk.maximum), (Some(30.0), Some(2048.0)));
        let family = at(class, &["spec", "imageFamily"]);
        assert_eq!(default_of(family), Some(&Value::from("Ubuntu2204")));
        assert!(enum_values(family).contains(&"AzureLinux".to_owned()));
        let overhead = at(class, &["spec", "overheadModel"]);
        assert_eq!(enum_values(overhead), ["Brackets", "MaxPods"]);
        assert_eq!(default_of(overhead), Some(&Value::from("Brackets")));
        let max_pods = at(class, &["spec", "maxPods"]);
        assert_eq!(
            (max_pods.minimum, max_pods.maximum),
            (Some(10.0), Some(250.0))
        );
        assert!(!rules(at(class, &["spec", "kubelet"])).is_empty());
        Ok(())
    }

    #[test]
    fn the_rightsizing_policy_schema_shows_its_defaults() -> TestResult {
        let crds = round_tripped()?;
        let spec = at(root_schema(by_kind(&crds, "RightsizingPolicy")), &["spec"]);
        assert_eq!(
            default_of(at(spec, &["mode"])),
            Some(&Value::from("Recommend"))
        );
        assert_eq!(enum_values(at(spec, &["mode"])), ["Recommend", "Auto"]);
        assert_eq!(
            default_of(at(spec, &["resources"])),
            Some(&serde_json::json!(["cpu", "memory"]))
        );
        assert_eq!(
            default_of(at(spec, &["cpu", "percentile"])),
            Some(&Value::from(0.5))
        );
        assert_eq!(
            default_of(at(spec, &["cpu", "burstHeadroom"])),
            Some(&Value::from(3.0))
        );
        assert_eq!(
            default_of(at(spec, &["historyWindow"])),
            Some(&Value::from("336h"))
        );
        assert_eq!(
            default_of(at(spec, &["update", "mode"])),
            Some(&Value::from("InPlace"))
        );
        assert_eq!(
            default_of(at(spec, &["limits"])),
            Some(&Value::from("KeepRatio"))
        );
        assert_eq!(default_of(at(spec, &["hpa"])), Some(&Value::from("Skip")));
        assert_eq!(
            default_of(at(spec, &["oomMinBump"])),
            Some(&Value::from("100Mi"))
        );
        assert!(!rules(at(spec, &["cpu"])).is_empty());
        Ok(())
    }

    #[test]
    fn every_field_has_a_description_for_kubectl_explain() -> TestResult {
        fn walk(kind: &str, path: &str, node: &Value, missing: &mut Vec<String>) {
            let Some(props) = node.get("properties").and_then(Value::as_object) else {
                return;
            };
            for (name, child) in props {
                let here = format!("{kind}{path}.{name}");
                if child.get("description").is_none() {
                    missing.push(here.clone());
                }
                walk(kind, &format!("{path}.{name}"), child, missing);
                if let Some(items) = child.get("items") {
                    walk(kind, &format!("{path}.{name}[]"), items, missing);
                }
            }
        }
        let mut missing = Vec::new();
        for crd in round_tripped()? {
            // apiVersion, kind and metadata are described by Kubernetes itself.
            let schema = serde_json::to_value(root_schema(&crd))?;
            for part in ["spec", "status"] {
                let node = &schema["properties"][part];
                walk(
                    &crd.spec.names.kind,
                    &format!(".{part}"),
                    node,
                    &mut missing,
                );
            }
        }
        assert!(
            missing.is_empty(),
            "fields without description: {missing:#?}"
        );
        Ok(())
    }

    fn condition(type_: &str, status: &str, reason: &str, at_secs: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(jiff::Timestamp::from_second(at_secs).unwrap_or_default()),
        }
    }

    #[test]
    fn set_condition_moves_the_transition_time_only_when_the_status_changes() {
        let mut conditions = vec![];
        assert!(set_condition(
            &mut conditions,
            condition("Ready", "False", "NodeNotReady", 10)
        ));
        assert!(!set_condition(
            &mut conditions,
            condition("Ready", "False", "NodeNotReady", 20)
        ));
        assert_eq!(conditions[0].last_transition_time.0.as_second(), 10);

        assert!(set_condition(
            &mut conditions,
            condition("Ready", "False", "NodeNotFound", 30)
        ));
        assert_eq!(conditions[0].last_transition_time.0.as_second(), 10);
        assert_eq!(conditions[0].reason, "NodeNotFound");

        assert!(set_condition(
            &mut conditions,
            condition("Ready", "True", "Ready", 40)
        ));
        assert_eq!(conditions[0].last_transition_time.0.as_second(), 40);
        assert!(is_condition_true(&conditions, "Ready"));
        assert_eq!(conditions.len(), 1);
    }
}
