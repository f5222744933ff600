//! The validator's own reading of Kubernetes placement rules, written against the objects
//! as the user wrote them (node selectors, node affinity terms, tolerations, label
//! selectors, container ports, NodePool requirements).
//!
//! Nothing here calls the scheduler's parsed requirements, selectors, taint helpers or label
//! canonicalisation: a mistake there must not hide itself by being repeated here. Each
//! function cites the kube-scheduler (or Karpenter) rule it mirrors.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerPort, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::apis::labels::{ALIASES, ZONE};
use crate::apis::{NodeRequirement, RequirementOperator};

/// The value of a node label. Karpenter's alias of a Tailor key and the key itself name
/// the same label (a node may carry either; the NodePool and pod may write either).
pub fn node_label<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    if let Some(v) = labels.get(key) {
        return Some(v);
    }
    let twin = ALIASES.iter().find_map(|&(alias, tailor)| {
        if alias == key {
            Some(tailor)
        } else if tailor == key {
            Some(alias)
        } else {
            None
        }
    })?;
    labels.get(twin).map(String::as_str)
}

/// Whether one node-label expression holds for a label's state (`None`: absent), as
/// kube-scheduler's node selector requirements read it: `In` needs the label with a listed
/// value, `NotIn` is satisfied by an absent label, `Gt`/`Lt` compare integers and fail on a
/// missing or non-integer label. `Gte`/`Lte` are Karpenter's, for NodePool requirements.
/// An error names an operator or operand the API would have refused.
pub fn expression_holds(
    operator: &str,
    values: &[String],
    label: Option<&str>,
) -> Result<bool, String> {
    let listed = |v: &str| values.iter().any(|x| x == v);
    Ok(match operator {
        "In" => label.is_some_and(listed),
        "NotIn" => label.is_none_or(|v| !listed(v)),
        "Exists" => label.is_some(),
        "DoesNotExist" => label.is_none(),
        "Gt" | "Lt" | "Gte" | "Lte" => {
            let [bound] = values else {
                return Err(format!(
                    "operator {operator} takes one value, got {}",
                    values.len()
                ));
            };
            let bound: i64 = bound
                .parse()
                .map_err(|_| format!("operator {operator} needs an integer, got {bound:?}"))?;
            let Some(value) = label.and_then(|v| v.parse::<i64>().ok()) else {
                return Ok(false);
            };
            match operator {
                "Gt" => value > bound,
                "Lt" => value < bound,
                "Gte" => value >= bound,
                _ => value <= bound,
            }
        }
        other => return Err(format!("unknown operator {other:?}")),
    })
}

fn node_expression(
    e: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    let values = e.values.as_deref().unwrap_or_default();
    expression_holds(&e.operator, values, node_label(labels, &e.key))
        .map_err(|m| format!("{}: {m}", e.key))
}

/// Whether a node satisfies one required node-affinity term: every `matchExpressions`
/// entry over its labels and every `matchFields` entry over its name hold. As in
/// kube-scheduler, a term with neither matches no node.
pub fn term_matches(
    term: &NodeSelectorTerm,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return Ok(false);
    }
    for e in expressions {
        if !node_expression(e, labels)? {
            return Ok(false);
        }
    }
    for f in fields {
        // The only field selector the API allows on nodes.
        if f.key != "metadata.name" {
            return Err(format!("matchFields key {:?} is not metadata.name", f.key));
        }
        let values = f.values.as_deref().unwrap_or_default();
        if !expression_holds(&f.operator, values, Some(node_name))? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether a node may run a pod by its `nodeSelector` (every entry equal) and its required
/// node affinity (any term, the terms being ORed), kube-scheduler's NodeAffinity filter.
/// `Err` says why not, for the report.
pub fn node_admits(
    node_selector: &BTreeMap<String, String>,
    required: Option<&NodeSelector>,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), String> {
    for (k, v) in node_selector {
        let found = node_label(labels, k);
        if found != Some(v.as_str()) {
            return Err(match found {
                Some(f) => format!("nodeSelector wants {k}={v}, node has {k}={f}"),
                None => format!("nodeSelector wants {k}={v}, node has no {k} label"),
            });
        }
    }
    let Some(required) = required else {
        return Ok(());
    };
    for term in &required.node_selector_terms {
        if term_matches(term, node_name, labels)? {
            return Ok(());
        }
    }
    Err(format!(
        "none of the {} required node affinity terms matches",
        required.node_selector_terms.len()
    ))
}

/// Whether a nodeSelector and required node affinity leave `zone` possible for a node whose
/// other labels are not known yet: only their expressions on the zone label are judged.
pub fn zone_possible(
    node_selector: &BTreeMap<String, String>,
    required: Option<&NodeSelector>,
    zone: &str,
) -> bool {
    if node_label(node_selector, ZONE).is_some_and(|z| z != zone) {
        return false;
    }
    let Some(required) = required else {
        return true;
    };
    let zone_labels = BTreeMap::from([(ZONE.to_string(), zone.to_string())]);
    required.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        (!expressions.is_empty() || !fields.is_empty())
            && expressions
                .iter()
                .filter(|e| e.key == ZONE)
                .all(|e| node_expression(e, &zone_labels).unwrap_or(false))
    })
}

/// Whether a toleration tolerates a taint, kube's `ToleratesTaint`: a set effect must be
/// the taint's, a set key must be the taint's (an empty key with `Exists` tolerates every
/// taint), `Exists` ignores the value and `Equal` (the default) compares it.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "Exists" => true,
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// The first taint that keeps a pod off a node: a `NoSchedule` or `NoExecute` taint no
/// toleration tolerates. `PreferNoSchedule` is only a preference and never keeps a pod off.
pub fn untolerated<'t>(taints: &'t [Taint], tolerations: &[Toleration]) -> Option<&'t Taint> {
    taints.iter().find(|t| {
        matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations.iter().any(|tol| tolerates(tol, t))
    })
}

/// A taint as kubectl prints it: `key=value:Effect`.
pub fn describe_taint(taint: &Taint) -> String {
    match taint.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{}={v}:{}", taint.key, taint.effect),
        None => format!("{}:{}", taint.key, taint.effect),
    }
}

/// Whether pod labels satisfy a label selector (null: no pod; empty: every pod) ANDed with
/// `same` pairs that must be present with that value and `different` pairs that must not
/// have that value — how `matchLabelKeys` and `mismatchLabelKeys` are merged into the
/// selector. Pod labels are matched by exact key; an operator the API would refuse matches
/// nothing.
pub fn selector_matches(
    selector: Option<&LabelSelector>,
    same: &[(&str, &str)],
    different: &[(&str, &str)],
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    let label = |k: &str| labels.get(k).map(String::as_str);
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| label(k) == Some(v.as_str()));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let listed = |v: &str| values.iter().any(|x| x == v);
        match e.operator.as_str() {
            "In" => label(&e.key).is_some_and(listed),
            "NotIn" => label(&e.key).is_none_or(|v| !listed(v)),
            "Exists" => label(&e.key).is_some(),
            "DoesNotExist" => label(&e.key).is_none(),
            _ => false,
        }
    });
    by_labels
        && by_expressions
        && same.iter().all(|(k, v)| label(k) == Some(*v))
        && different.iter().all(|(k, v)| label(k) != Some(*v))
}

fn protocol(p: &ContainerPort) -> &str {
    p.protocol
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("TCP")
}

fn host_ip(p: &ContainerPort) -> &str {
    p.host_ip
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("0.0.0.0")
}

/// Whether two container ports bind the same host port on one node (kube-scheduler's
/// NodePorts filter): same `hostPort` and protocol (TCP when unset), and the same host IP or
/// either one the wildcard `0.0.0.0` (the default). Ports without a `hostPort` bind nothing.
pub fn host_ports_conflict(a: &ContainerPort, b: &ContainerPort) -> bool {
    let (Some(pa), Some(pb)) = (a.host_port, b.host_port) else {
        return false;
    };
    pa > 0
        && pa == pb
        && protocol(a) == protocol(b)
        && (host_ip(a) == host_ip(b) || host_ip(a) == "0.0.0.0" || host_ip(b) == "0.0.0.0")
}

fn operator_name(op: &RequirementOperator) -> &'static str {
    match op {
        RequirementOperator::In => "In",
        RequirementOperator::NotIn => "NotIn",
        RequirementOperator::Exists => "Exists",
        RequirementOperator::DoesNotExist => "DoesNotExist",
        RequirementOperator::Gt => "Gt",
        RequirementOperator::Lt => "Lt",
        RequirementOperator::Gte => "Gte",
        RequirementOperator::Lte => "Lte",
    }
}

/// Whether a node's labels satisfy one NodePool requirement; `Err` says how not.
pub fn pool_requirement_holds(
    r: &NodeRequirement,
    labels: &BTreeMap<String, String>,
) -> Result<(), String> {
    let op = operator_name(&r.operator);
    let found = node_label(labels, &r.key);
    match expression_holds(op, &r.values, found) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "requirement {} {op} [{}] does not hold for {}",
            r.key,
            r.values.join(","),
            found.map_or_else(|| "an absent label".to_string(), |v| format!("{v:?}"))
        )),
        Err(m) => Err(format!("requirement {}: {m}", r.key)),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeSelectorRequirement;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;
    use crate::apis::labels;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.to_string(),
            operator: operator.to_string(),
            values: (!values.is_empty()).then(|| strings(values)),
        }
    }

    fn term(expressions: &[NodeSelectorRequirement]) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(expressions.to_vec()),
            match_fields: None,
        }
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.to_string(),
            value: (!value.is_empty()).then(|| value.to_string()),
            effect: effect.to_string(),
            time_added: None,
        }
    }

    fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
        Toleration {
            key: (!key.is_empty()).then(|| key.to_string()),
            operator: (!operator.is_empty()).then(|| operator.to_string()),
            value: (!value.is_empty()).then(|| value.to_string()),
            effect: (!effect.is_empty()).then(|| effect.to_string()),
            toleration_seconds: None,
        }
    }

    fn port(host_port: i32, protocol: &str, host_ip: &str) -> ContainerPort {
        ContainerPort {
            container_port: 80,
            host_port: Some(host_port),
            protocol: (!protocol.is_empty()).then(|| protocol.to_string()),
            host_ip: (!host_ip.is_empty()).then(|| host_ip.to_string()),
            name: None,
        }
    }

    #[test]
    fn each_node_operator_both_matches_and_refuses() {
        // (operator, values, label state, holds)
        let table: &[(&str, &[&str], Option<&str>, bool)] = &[
            ("In", &["a", "b"], Some("b"), true),
            ("In", &["a", "b"], Some("c"), false),
            ("In", &["a"], None, false),
            ("NotIn", &["a"], Some("c"), true),
            ("NotIn", &["a"], Some("a"), false),
            ("NotIn", &["a"], None, true),
            ("Exists", &[], Some("x"), true),
            ("Exists", &[], None, false),
            ("DoesNotExist", &[], None, true),
            ("DoesNotExist", &[], Some("x"), false),
            ("Gt", &["4"], Some("5"), true),
            ("Gt", &["5"], Some("5"), false),
            ("Gt", &["4"], Some("five"), false),
            ("Gt", &["4"], None, false),
            ("Lt", &["6"], Some("5"), true),
            ("Lt", &["5"], Some("5"), false),
            ("Gte", &["5"], Some("5"), true),
            ("Gte", &["6"], Some("5"), false),
            ("Lte", &["5"], Some("5"), true),
            ("Lte", &["4"], Some("5"), false),
        ];
        for (op, values, label, holds) in table {
            assert_eq!(
                expression_holds(op, &strings(values), *label),
                Ok(*holds),
                "{op} {values:?} on {label:?}"
            );
        }
    }

    #[test]
    fn malformed_node_expressions_are_errors_not_matches() {
        assert!(expression_holds("Near", &[], Some("a")).is_err());
        assert!(expression_holds("Gt", &strings(&["x"]), Some("5")).is_err());
        assert!(expression_holds("Lt", &strings(&["1", "2"]), Some("0")).is_err());
    }

    #[test]
    fn node_selector_entries_must_all_equal_node_labels() {
        let node = labels(&[(labels::ARCH, "arm64"), (labels::OS, "linux")]);
        let arm = labels(&[(labels::ARCH, "arm64")]);
        let amd = labels(&[(labels::ARCH, "amd64")]);
        let gpu = labels(&[("gpu", "true")]);
        assert_eq!(node_admits(&arm, None, "n1", &node), Ok(()));
        let refused = node_admits(&amd, None, "n1", &node).expect_err("amd64 wanted");
        assert!(
            refused.contains("node has kubernetes.io/arch=arm64"),
            "{refused}"
        );
        let missing = node_admits(&gpu, None, "n1", &node).expect_err("gpu wanted");
        assert!(missing.contains("no gpu label"), "{missing}");
    }

    #[test]
    fn a_karpenter_alias_and_its_tailor_key_name_one_label() {
        let node = labels(&[(labels::CAPACITY_TYPE, "spot")]);
        let aliased = labels(&[(labels::KARPENTER_CAPACITY_TYPE, "spot")]);
        assert_eq!(
            node_label(&node, labels::KARPENTER_CAPACITY_TYPE),
            Some("spot")
        );
        assert_eq!(node_label(&aliased, labels::CAPACITY_TYPE), Some("spot"));
        assert_eq!(node_label(&node, labels::ZONE), None);
        assert_eq!(node_admits(&aliased, None, "n1", &node), Ok(()));
    }

    #[test]
    fn node_affinity_terms_are_ored_and_their_expressions_anded() {
        let node = labels(&[(labels::ZONE, "z1"), (labels::ARCH, "amd64")]);
        let z1_arm = term(&[
            expression(labels::ZONE, "In", &["z1"]),
            expression(labels::ARCH, "In", &["arm64"]),
        ]);
        let z1_amd = term(&[
            expression(labels::ZONE, "In", &["z1"]),
            expression(labels::ARCH, "In", &["amd64"]),
        ]);
        assert_eq!(term_matches(&z1_arm, "n1", &node), Ok(false));
        assert_eq!(term_matches(&z1_amd, "n1", &node), Ok(true));
        let none = BTreeMap::new();
        let only_arm = NodeSelector {
            node_selector_terms: vec![z1_arm.clone()],
        };
        let either = NodeSelector {
            node_selector_terms: vec![z1_arm, z1_amd],
        };
        assert!(node_admits(&none, Some(&only_arm), "n1", &node).is_err());
        assert_eq!(node_admits(&none, Some(&either), "n1", &node), Ok(()));
        // The selector and the affinity must both hold.
        let z2 = labels(&[(labels::ZONE, "z2")]);
        assert!(node_admits(&z2, Some(&either), "n1", &node).is_err());
    }

    #[test]
    fn an_empty_node_affinity_term_matches_no_node() {
        let node = labels(&[(labels::ZONE, "z1")]);
        assert_eq!(term_matches(&term(&[]), "n1", &node), Ok(false));
    }

    #[test]
    fn match_fields_compare_the_node_name() {
        let named = |op: &str, names: &[&str]| NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![expression("metadata.name", op, names)]),
        };
        let node = BTreeMap::new();
        assert_eq!(term_matches(&named("In", &["n1"]), "n1", &node), Ok(true));
        assert_eq!(term_matches(&named("In", &["n2"]), "n1", &node), Ok(false));
        assert_eq!(
            term_matches(&named("NotIn", &["n1"]), "n1", &node),
            Ok(false)
        );
        assert_eq!(
            term_matches(&named("NotIn", &["n2"]), "n1", &node),
            Ok(true)
        );
        let other = NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![expression("metadata.uid", "In", &["x"])]),
        };
        assert!(term_matches(&other, "n1", &node).is_err());
    }

    #[test]
    fn only_zone_expressions_decide_whether_a_zone_is_possible() {
        let none = BTreeMap::new();
        let affinity = NodeSelector {
            node_selector_terms: vec![term(&[
                expression(labels::ZONE, "NotIn", &["z2"]),
                expression(labels::ARCH, "In", &["arm64"]),
            ])],
        };
        assert!(zone_possible(&none, Some(&affinity), "z1"));
        assert!(!zone_possible(&none, Some(&affinity), "z2"));
        assert!(zone_possible(&none, None, "z2"));
        let pinned = labels(&[(labels::ZONE, "z1")]);
        assert!(zone_possible(&pinned, None, "z1"));
        assert!(!zone_possible(&pinned, None, "z2"));
    }

    #[test]
    fn tolerations_match_taints_like_kube() {
        let gpu = taint("gpu", "true", "NoSchedule");
        // (toleration, tolerates)
        let table = [
            (toleration("gpu", "Equal", "true", "NoSchedule"), true),
            (toleration("gpu", "", "true", ""), true),
            (toleration("gpu", "Equal", "false", "NoSchedule"), false),
            (toleration("gpu", "Exists", "", ""), true),
            (toleration("gpu", "Exists", "", "NoSchedule"), true),
            (toleration("gpu", "Exists", "", "NoExecute"), false),
            (toleration("other", "Exists", "", ""), false),
            (toleration("", "Exists", "", ""), true),
            (toleration("", "Exists", "", "NoExecute"), false),
            (toleration("gpu", "Near", "true", ""), false),
        ];
        for (tol, expected) in table {
            assert_eq!(tolerates(&tol, &gpu), expected, "{tol:?}");
        }
    }

    #[test]
    fn only_no_schedule_and_no_execute_taints_keep_pods_off() {
        let taints = [
            taint("soft", "", "PreferNoSchedule"),
            taint("hard", "x", "NoExecute"),
        ];
        let found = untolerated(&taints, &[]).expect("the NoExecute taint");
        assert_eq!(describe_taint(found), "hard=x:NoExecute");
        assert!(untolerated(&taints, &[toleration("hard", "Exists", "", "")]).is_none());
        assert!(untolerated(&taints[..1], &[]).is_none());
        let no_schedule = [taint("dedicated", "", "NoSchedule")];
        assert!(untolerated(&no_schedule, &[]).is_some());
        assert_eq!(describe_taint(&no_schedule[0]), "dedicated:NoSchedule");
    }

    fn selector(match_labels: &[(&str, &str)], expressions: &[Expression<'_>]) -> LabelSelector {
        LabelSelector {
            match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
            match_expressions: (!expressions.is_empty()).then(|| {
                expressions
                    .iter()
                    .map(|(k, op, values)| LabelSelectorRequirement {
                        key: k.to_string(),
                        operator: op.to_string(),
                        values: (!values.is_empty()).then(|| strings(values)),
                    })
                    .collect()
            }),
        }
    }

    /// A selector expression: key, operator, values.
    type Expression<'a> = (&'a str, &'a str, &'a [&'a str]);
    /// matchLabels, matchExpressions, and whether the pod matches.
    type SelectorCase<'a> = (&'a [(&'a str, &'a str)], &'a [Expression<'a>], bool);

    #[test]
    fn each_label_selector_operator_both_matches_and_refuses() {
        let pod = labels(&[("app", "web"), ("tier", "front")]);
        // (matchLabels, expressions, matches)
        let table: &[SelectorCase<'_>] = &[
            (&[("app", "web")], &[], true),
            (&[("app", "db")], &[], false),
            (&[("app", "web"), ("tier", "back")], &[], false),
            (&[], &[("tier", "In", &["front", "x"])], true),
            (&[], &[("tier", "In", &["back"])], false),
            (&[], &[("missing", "In", &["x"])], false),
            (&[], &[("tier", "NotIn", &["back"])], true),
            (&[], &[("tier", "NotIn", &["front"])], false),
            (&[], &[("missing", "NotIn", &["x"])], true),
            (&[], &[("app", "Exists", &[])], true),
            (&[], &[("missing", "Exists", &[])], false),
            (&[], &[("missing", "DoesNotExist", &[])], true),
            (&[], &[("app", "DoesNotExist", &[])], false),
            (&[], &[("app", "Gt", &["1"])], false),
            (&[("app", "web")], &[("tier", "In", &["back"])], false),
            (&[], &[], true),
        ];
        for (ml, ex, expected) in table {
            let s = selector(ml, ex);
            assert_eq!(
                selector_matches(Some(&s), &[], &[], &pod),
                *expected,
                "{ml:?} {ex:?}"
            );
        }
        assert!(
            !selector_matches(None, &[], &[], &pod),
            "a null selector matches no pod"
        );
    }

    #[test]
    fn match_label_keys_narrow_a_selector_and_mismatch_keys_exclude() {
        let every = selector(&[], &[]);
        let v1 = labels(&[("app", "web"), ("hash", "v1")]);
        let v2 = labels(&[("app", "web"), ("hash", "v2")]);
        assert!(selector_matches(Some(&every), &[("hash", "v1")], &[], &v1));
        assert!(!selector_matches(Some(&every), &[("hash", "v1")], &[], &v2));
        assert!(!selector_matches(Some(&every), &[], &[("hash", "v1")], &v1));
        assert!(selector_matches(Some(&every), &[], &[("hash", "v1")], &v2));
    }

    #[test]
    fn host_ports_conflict_by_port_protocol_and_ip() {
        let any_tcp = port(8080, "", "");
        // (other, conflicts)
        let table = [
            (port(8080, "TCP", "0.0.0.0"), true),
            (port(8080, "TCP", "10.0.0.1"), true),
            (port(8080, "UDP", ""), false),
            (port(8081, "", ""), false),
        ];
        for (other, expected) in table {
            assert_eq!(host_ports_conflict(&any_tcp, &other), expected, "{other:?}");
            assert_eq!(host_ports_conflict(&other, &any_tcp), expected, "{other:?}");
        }
        let a = port(53, "UDP", "10.0.0.1");
        assert!(host_ports_conflict(&a, &port(53, "UDP", "10.0.0.1")));
        assert!(!host_ports_conflict(&a, &port(53, "UDP", "10.0.0.2")));
        let unbound = ContainerPort {
            host_port: None,
            ..port(0, "", "")
        };
        assert!(!host_ports_conflict(&unbound, &unbound));
    }

    #[test]
    fn nodepool_requirements_hold_or_name_the_label() {
        let node = labels(&[(labels::SKU_FAMILY, "D"), (labels::SKU_CPU, "8")]);
        let req = |key: &str, operator: RequirementOperator, values: &[&str]| NodeRequirement {
            key: key.to_string(),
            operator,
            values: strings(values),
            min_values: None,
        };
        use RequirementOperator::*;
        assert_eq!(
            pool_requirement_holds(&req(labels::SKU_FAMILY, In, &["D", "E"]), &node),
            Ok(())
        );
        assert_eq!(
            pool_requirement_holds(&req(labels::KARPENTER_SKU_FAMILY, In, &["D"]), &node),
            Ok(())
        );
        assert_eq!(
            pool_requirement_holds(&req(labels::SKU_CPU, Gte, &["8"]), &node),
            Ok(())
        );
        assert_eq!(
            pool_requirement_holds(&req(labels::SKU_CPU, Lte, &["8"]), &node),
            Ok(())
        );
        let e = pool_requirement_holds(&req(labels::SKU_FAMILY, NotIn, &["D"]), &node)
            .expect_err("D is excluded");
        assert!(
            e.contains("tailor.sh/sku-family NotIn [D]") && e.contains("\"D\""),
            "{e}"
        );
        assert!(pool_requirement_holds(&req(labels::SKU_CPU, Gt, &["8"]), &node).is_err());
        let absent = pool_requirement_holds(&req("team", Exists, &[]), &node).expect_err("absent");
        assert!(absent.contains("an absent label"), "{absent}");
        assert!(pool_requirement_holds(&req("team", DoesNotExist, &[]), &node).is_ok());
    }
}
