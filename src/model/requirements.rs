//! Label requirements: the algebra behind node selectors, node affinity and NodePool
//! requirements.
//!
//! A requirement is the set of label states a key may take. The state space of one key is
//! "absent" plus every string value; a requirement says whether absence is allowed, which
//! values are allowed (a finite set, or everything except a finite set), and optional
//! integer bounds from `Gt`/`Lt`/`Gte`/`Lte`. Intersection is then plain set
//! intersection, and "compatible" means the intersection is not empty. Keys written with
//! Karpenter's aliases (`karpenter.sh/capacity-type`, `karpenter.azure.com/sku-family`, ...)
//! are stored under Tailor's canonical `tailor.sh/*` key.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::NodeSelectorTerm;

use crate::apis::labels::{self, canonical_key};
use crate::apis::{NodeRequirement, RequirementOperator};

/// A requirement operator, as written in Kubernetes and Karpenter objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// The label exists and has one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label exists, with any value.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label is an integer greater than the single value.
    Gt,
    /// The label is an integer less than the single value.
    Lt,
    /// The label is an integer greater than or equal to the single value.
    Gte,
    /// The label is an integer less than or equal to the single value.
    Lte,
}

impl Operator {
    /// The operator's name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::Gt => "Gt",
            Operator::Lt => "Lt",
            Operator::Gte => "Gte",
            Operator::Lte => "Lte",
        }
    }

    /// Parses an operator name as it appears in YAML.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            "Gte" => Operator::Gte,
            "Lte" => Operator::Lte,
            _ => return None,
        })
    }
}

impl From<RequirementOperator> for Operator {
    fn from(op: RequirementOperator) -> Self {
        match op {
            RequirementOperator::In => Operator::In,
            RequirementOperator::NotIn => Operator::NotIn,
            RequirementOperator::Exists => Operator::Exists,
            RequirementOperator::DoesNotExist => Operator::DoesNotExist,
            RequirementOperator::Gt => Operator::Gt,
            RequirementOperator::Lt => Operator::Lt,
            RequirementOperator::Gte => Operator::Gte,
            RequirementOperator::Lte => Operator::Lte,
        }
    }
}

/// Why a requirement could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    /// The operator is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt, Gte, Lte.
    #[error("requirement on {key:?}: unknown operator {operator:?}")]
    UnknownOperator {
        /// The label key.
        key: String,
        /// The operator as written.
        operator: String,
    },
    /// The operator needs a different number of values.
    #[error("requirement on {key:?}: operator {operator} {expects}, got {got} value(s)")]
    ValueCount {
        /// The label key.
        key: String,
        /// The operator as written.
        operator: String,
        /// What the operator expects.
        expects: &'static str,
        /// How many values were given.
        got: usize,
    },
    /// A command-line requirement is not `key Operator [v1,v2,...]`.
    #[error("invalid requirement {expression:?}: expected \"<key> <Operator> [value,value...]\"")]
    Syntax {
        /// The expression as given.
        expression: String,
    },
    /// A numeric operator was given a value that is not an integer.
    #[error("requirement on {key:?}: operator {operator} needs an integer, got {value:?}")]
    NotAnInteger {
        /// The label key.
        key: String,
        /// The operator as written.
        operator: String,
        /// The value as written.
        value: String,
    },
}

/// The values a requirement admits for a present label.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Values {
    /// Exactly these values.
    Only(BTreeSet<String>),
    /// Any value except these.
    AllExcept(BTreeSet<String>),
}

/// The allowed states of one label key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    allow_absent: bool,
    values: Values,
    /// Present values must be integers strictly greater than this.
    greater_than: Option<i64>,
    /// Present values must be integers strictly less than this.
    less_than: Option<i64>,
    /// For NodePool requirements: how many distinct values the chosen instance types must
    /// span (Karpenter's `minValues`).
    min_values: Option<u32>,
}

impl Requirement {
    /// Builds a requirement from an operator name (as written in YAML) and its values,
    /// validating arity and integer operands. The key is canonicalised (Karpenter aliases
    /// map to `tailor.sh/*`).
    pub fn new<S: AsRef<str>>(
        key: &str,
        operator: &str,
        values: &[S],
    ) -> Result<Self, RequirementError> {
        let op = Operator::parse(operator).ok_or_else(|| RequirementError::UnknownOperator {
            key: canonical_key(key).to_string(),
            operator: operator.to_string(),
        })?;
        Self::from_operator(key, op, values)
    }

    /// Builds a requirement from a typed operator and its values, validating arity and
    /// integer operands.
    pub fn from_operator<S: AsRef<str>>(
        key: &str,
        op: Operator,
        values: &[S],
    ) -> Result<Self, RequirementError> {
        let key = canonical_key(key).to_string();
        let operator = op.as_str();
        let set: BTreeSet<String> = values.iter().map(|v| v.as_ref().to_string()).collect();
        let count = |expects: &'static str| RequirementError::ValueCount {
            key: key.clone(),
            operator: operator.to_string(),
            expects,
            got: values.len(),
        };
        let integer = |v: &str| {
            v.parse::<i64>()
                .map_err(|_| RequirementError::NotAnInteger {
                    key: key.clone(),
                    operator: operator.to_string(),
                    value: v.to_string(),
                })
        };
        let mut r = Requirement::any(&key);
        match op {
            Operator::In => {
                if set.is_empty() {
                    return Err(count("needs at least one value"));
                }
                r.allow_absent = false;
                r.values = Values::Only(set);
            }
            Operator::NotIn => {
                if set.is_empty() {
                    return Err(count("needs at least one value"));
                }
                r.values = Values::AllExcept(set);
            }
            Operator::Exists | Operator::DoesNotExist => {
                if !set.is_empty() {
                    return Err(count("takes no values"));
                }
                if op == Operator::Exists {
                    r.allow_absent = false;
                } else {
                    r.values = Values::Only(BTreeSet::new());
                }
            }
            Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte => {
                let [v] = values else {
                    return Err(count("needs exactly one value"));
                };
                let n = integer(v.as_ref())?;
                r.allow_absent = false;
                match op {
                    Operator::Gt => r.greater_than = Some(n),
                    Operator::Gte => r.greater_than = Some(n.saturating_sub(1)),
                    Operator::Lt => r.less_than = Some(n),
                    _ => r.less_than = Some(n.saturating_add(1)),
                }
            }
        }
        Ok(r)
    }

    /// Parses `key Operator v1,v2` as written on the command line
    /// (`kubernetes.io/arch In arm64`, `tailor.sh/sku-cpu Gt 4`, `gpu DoesNotExist`).
    pub fn parse_expression(expression: &str) -> Result<Self, RequirementError> {
        let mut parts = expression.split_whitespace();
        let (Some(key), Some(operator)) = (parts.next(), parts.next()) else {
            return Err(RequirementError::Syntax {
                expression: expression.to_string(),
            });
        };
        let values: Vec<&str> = parts
            .flat_map(|p| p.split(','))
            .filter(|v| !v.is_empty())
            .collect();
        Requirement::new(key, operator, &values)
    }

    /// A requirement that admits every state of `key`, present or absent.
    pub fn any(key: &str) -> Self {
        Requirement {
            key: canonical_key(key).to_string(),
            allow_absent: true,
            values: Values::AllExcept(BTreeSet::new()),
            greater_than: None,
            less_than: None,
            min_values: None,
        }
    }

    /// A requirement that the label is absent (`DoesNotExist`).
    pub fn absent(key: &str) -> Self {
        Requirement {
            allow_absent: true,
            values: Values::Only(BTreeSet::new()),
            ..Requirement::any(key)
        }
    }

    /// A requirement that the label has exactly one of `values` (`In`).
    pub fn one_of<I, S>(key: &str, values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Requirement {
            allow_absent: false,
            values: Values::Only(values.into_iter().map(Into::into).collect()),
            ..Requirement::any(key)
        }
    }

    /// Sets `minValues`.
    pub fn with_min_values(mut self, min_values: Option<u32>) -> Self {
        self.min_values = min_values;
        self
    }

    /// The canonical label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Karpenter's `minValues`, if any.
    pub fn min_values(&self) -> Option<u32> {
        self.min_values
    }

    fn within_bounds(&self, value: &str) -> bool {
        if self.greater_than.is_none() && self.less_than.is_none() {
            return true;
        }
        let Ok(n) = value.parse::<i64>() else {
            return false;
        };
        self.greater_than.is_none_or(|g| n > g) && self.less_than.is_none_or(|l| n < l)
    }

    /// Whether a present label with this value satisfies the requirement.
    pub fn admits_value(&self, value: &str) -> bool {
        let listed = match &self.values {
            Values::Only(set) => set.contains(value),
            Values::AllExcept(set) => !set.contains(value),
        };
        listed && self.within_bounds(value)
    }

    /// Whether a label state (`None` = absent) satisfies the requirement; this is how a
    /// requirement matches an existing node's labels.
    pub fn matches(&self, label: Option<&str>) -> bool {
        match label {
            None => self.allow_absent,
            Some(v) => self.admits_value(v),
        }
    }

    /// Whether the label may be absent.
    pub fn allows_absent(&self) -> bool {
        self.allow_absent
    }

    /// The finite set of admitted values, when the requirement is an `In`-like set.
    pub fn values(&self) -> Option<&BTreeSet<String>> {
        match &self.values {
            Values::Only(set) => Some(set),
            Values::AllExcept(_) => None,
        }
    }

    /// The single admitted value, when exactly one value is admitted and absence is not.
    pub fn single_value(&self) -> Option<&str> {
        match &self.values {
            Values::Only(set) if set.len() == 1 && !self.allow_absent => {
                set.iter().next().map(String::as_str)
            }
            _ => None,
        }
    }

    /// Whether no label state satisfies the requirement.
    pub fn is_empty(&self) -> bool {
        if self.allow_absent {
            return false;
        }
        let bounds_empty = match (self.greater_than, self.less_than) {
            (Some(g), Some(l)) => g.saturating_add(1) >= l,
            _ => false,
        };
        match &self.values {
            Values::Only(set) => set.is_empty(),
            Values::AllExcept(_) => bounds_empty,
        }
    }

    /// The states both requirements admit. `minValues` takes the larger of the two.
    pub fn intersect(&self, other: &Requirement) -> Requirement {
        let greater_than = max_opt(self.greater_than, other.greater_than);
        let less_than = min_opt(self.less_than, other.less_than);
        let values = match (&self.values, &other.values) {
            (Values::Only(a), Values::Only(b)) => {
                Values::Only(a.intersection(b).cloned().collect())
            }
            (Values::Only(only), Values::AllExcept(except))
            | (Values::AllExcept(except), Values::Only(only)) => {
                Values::Only(only.difference(except).cloned().collect())
            }
            (Values::AllExcept(a), Values::AllExcept(b)) => {
                Values::AllExcept(a.union(b).cloned().collect())
            }
        };
        let mut out = Requirement {
            key: self.key.clone(),
            allow_absent: self.allow_absent && other.allow_absent,
            values,
            greater_than,
            less_than,
            min_values: max_opt(self.min_values, other.min_values),
        };
        // A finite set absorbs its bounds, so equal sets compare equal.
        if let Values::Only(set) = &out.values {
            let kept: BTreeSet<String> = set
                .iter()
                .filter(|v| out.within_bounds(v))
                .cloned()
                .collect();
            out.values = Values::Only(kept);
            out.greater_than = None;
            out.less_than = None;
        }
        out
    }

    /// Whether the two requirements admit a common state.
    pub fn intersects(&self, other: &Requirement) -> bool {
        !self.intersect(other).is_empty()
    }
}

fn max_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn min_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(",");
        let mut parts = Vec::new();
        match (&self.values, self.allow_absent) {
            (Values::Only(s), false) if s.is_empty() => parts.push("admits nothing".to_string()),
            (Values::Only(s), false) => parts.push(format!("In [{}]", list(s))),
            (Values::Only(s), true) if s.is_empty() => parts.push("DoesNotExist".to_string()),
            (Values::Only(s), true) => parts.push(format!("absent or In [{}]", list(s))),
            (Values::AllExcept(s), true) if s.is_empty() => {}
            (Values::AllExcept(s), true) => parts.push(format!("NotIn [{}]", list(s))),
            (Values::AllExcept(s), false) if s.is_empty() => parts.push("Exists".to_string()),
            (Values::AllExcept(s), false) => parts.push(format!("Exists NotIn [{}]", list(s))),
        }
        if let Some(g) = self.greater_than {
            parts.push(format!("Gt {g}"));
        }
        if let Some(l) = self.less_than {
            parts.push(format!("Lt {l}"));
        }
        if parts.is_empty() {
            parts.push("any".to_string());
        }
        write!(f, "{} {}", self.key, parts.join(" "))
    }
}

/// Why two requirement sets do not meet: the key and both sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The canonical key on which they disagree.
    pub key: String,
    /// What the first set (usually the pod) requires.
    pub wanted: String,
    /// What the second set (usually the node or NodePool) offers.
    pub offered: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key == super::pod::EMPTY_TERM_KEY {
            return write!(
                f,
                "requires an empty node affinity term, which matches no node"
            );
        }
        write!(
            f,
            "requires {} but node offers {}",
            self.wanted, self.offered
        )
    }
}

/// A conjunction of requirements, at most one per canonical key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Requirements {
    by_key: BTreeMap<String, Requirement>,
}

impl Requirements {
    /// No requirements: admits everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a requirement, intersecting it with any existing one on the same key.
    pub fn add(&mut self, requirement: Requirement) {
        match self.by_key.get_mut(&requirement.key) {
            Some(existing) => *existing = existing.intersect(&requirement),
            None => {
                self.by_key.insert(requirement.key.clone(), requirement);
            }
        }
    }

    /// Builder form of [`Requirements::add`].
    pub fn with(mut self, requirement: Requirement) -> Self {
        self.add(requirement);
        self
    }

    /// Requirements from a `nodeSelector` map: each `key: value` is `key In [value]`.
    pub fn from_node_selector<'a, I>(selector: I) -> Self
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        let mut out = Self::new();
        for (k, v) in selector {
            out.add(Requirement::one_of(k, [v.clone()]));
        }
        out
    }

    /// Requirements from a NodePool's or NodeClaim's requirement list, keeping `minValues`.
    pub fn from_node_requirements(list: &[NodeRequirement]) -> Result<Self, RequirementError> {
        let mut out = Self::new();
        for r in list {
            let min_values = r.min_values.and_then(|m| u32::try_from(m).ok());
            out.add(
                Requirement::from_operator(&r.key, r.operator.into(), &r.values)?
                    .with_min_values(min_values),
            );
        }
        Ok(out)
    }

    /// Requirements from one node-selector term of a pod's node affinity (its
    /// `matchExpressions`; `matchFields` on `metadata.name` constrain the node's name, which
    /// on AKS equals its hostname label).
    pub fn from_node_selector_term(term: &NodeSelectorTerm) -> Result<Self, RequirementError> {
        let mut out = Self::new();
        for e in term.match_expressions.iter().flatten() {
            out.add(Requirement::new(
                &e.key,
                &e.operator,
                e.values.as_deref().unwrap_or_default(),
            )?);
        }
        for f in term.match_fields.iter().flatten() {
            let key = if f.key == "metadata.name" {
                labels::HOSTNAME
            } else {
                f.key.as_str()
            };
            out.add(Requirement::new(
                key,
                &f.operator,
                f.values.as_deref().unwrap_or_default(),
            )?);
        }
        Ok(out)
    }

    /// Requirements that pin every label of a concrete node to its value; keys the node
    /// lacks are left out (use [`Requirements::compatible`], which treats them as absent).
    pub fn from_labels<'a, I>(labels: I) -> Self
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        Self::from_node_selector(labels)
    }

    /// The requirement on `key` (canonicalised), if any.
    pub fn get(&self, key: &str) -> Option<&Requirement> {
        self.by_key.get(canonical_key(key))
    }

    /// Every requirement, ordered by key.
    pub fn iter(&self) -> impl Iterator<Item = &Requirement> {
        self.by_key.values()
    }

    /// The number of keys constrained.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether nothing is constrained.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The conjunction of both sets.
    pub fn intersect(&self, other: &Requirements) -> Requirements {
        let mut out = self.clone();
        for r in other.iter() {
            out.add(r.clone());
        }
        out
    }

    /// Whether both sets can hold at once, treating a key missing from one side as
    /// unconstrained. Used to merge what co-scheduled pods ask for.
    pub fn intersects(&self, other: &Requirements) -> Result<(), Conflict> {
        for (key, mine) in &self.by_key {
            if let Some(theirs) = other.by_key.get(key)
                && !mine.intersects(theirs)
            {
                return Err(Conflict {
                    key: key.clone(),
                    wanted: mine.to_string(),
                    offered: theirs.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Whether a node described by `node` can satisfy these (pod) requirements. A key
    /// the node side does not define is treated as absent on the node: a node only has
    /// the labels its NodePool template, requirements and instance type give it.
    pub fn compatible(&self, node: &Requirements) -> Result<(), Conflict> {
        self.compatible_allowing(node, &|_| false)
    }

    /// Like [`Requirements::compatible`], but a key the node side leaves undefined is
    /// accepted when `undefined_ok(key)` says so. Karpenter allows undefined well-known
    /// labels on a node-to-be: the instance type chosen later defines them.
    pub fn compatible_allowing(
        &self,
        node: &Requirements,
        undefined_ok: &dyn Fn(&str) -> bool,
    ) -> Result<(), Conflict> {
        for (key, mine) in &self.by_key {
            let theirs = match node.by_key.get(key) {
                Some(t) => t.clone(),
                None if undefined_ok(key) => continue,
                None => Requirement::absent(key),
            };
            if !mine.intersects(&theirs) {
                return Err(Conflict {
                    key: key.clone(),
                    wanted: mine.to_string(),
                    offered: theirs.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Whether a set of labels satisfies every requirement; the cheap form of
    /// [`Requirements::matches_labels`] for when the reason is not needed.
    pub fn admits_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.by_key
            .iter()
            .all(|(key, r)| r.matches(label_value(labels, key)))
    }

    /// Whether a concrete node's labels satisfy every requirement (kube-scheduler's
    /// node-selector match). Label keys are canonicalised before matching.
    pub fn matches_labels(&self, labels: &BTreeMap<String, String>) -> Result<(), Conflict> {
        for (key, r) in &self.by_key {
            let value = label_value(labels, key);
            if !r.matches(value) {
                return Err(Conflict {
                    key: key.clone(),
                    wanted: r.to_string(),
                    offered: match value {
                        Some(v) => format!("{key}={v}"),
                        None => format!("no {key} label"),
                    },
                });
            }
        }
        Ok(())
    }

    /// The labels a node built to these requirements must carry: every key pinned to a
    /// single value.
    pub fn single_valued_labels(&self) -> BTreeMap<String, String> {
        self.by_key
            .iter()
            .filter_map(|(k, r)| r.single_value().map(|v| (k.clone(), v.to_string())))
            .collect()
    }
}

/// The value of a canonical key in a label map whose keys may be Karpenter aliases.
fn label_value<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    labels
        .get(key)
        .or_else(|| {
            labels
                .iter()
                .find(|(k, _)| canonical_key(k) == key)
                .map(|(_, v)| v)
        })
        .map(String::as_str)
}

/// A pod's node requirements: the node selector ANDed with one of several ORed required
/// node-affinity terms. A node is eligible when any alternative is satisfied.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeRequirements {
    alternatives: Vec<Requirements>,
}

impl Default for NodeRequirements {
    fn default() -> Self {
        Self {
            alternatives: vec![Requirements::new()],
        }
    }
}

impl NodeRequirements {
    /// Combines a node selector with required node-affinity terms (ORed). No terms means
    /// the selector alone.
    pub fn new(selector: Requirements, terms: Vec<Requirements>) -> Self {
        if terms.is_empty() {
            return Self {
                alternatives: vec![selector],
            };
        }
        Self {
            alternatives: terms.iter().map(|t| selector.intersect(t)).collect(),
        }
    }

    /// The ORed alternatives, each a conjunction.
    pub fn alternatives(&self) -> &[Requirements] {
        &self.alternatives
    }

    /// Whether any alternative matches a concrete node's labels; otherwise the conflict
    /// of the first alternative, for the reason text.
    pub fn matches_labels(&self, labels: &BTreeMap<String, String>) -> Result<(), Conflict> {
        first_success(self.alternatives.iter().map(|a| a.matches_labels(labels)))
    }

    /// Whether any alternative matches a concrete node's labels (no reason built).
    pub fn admits_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.alternatives.iter().any(|a| a.admits_labels(labels))
    }

    /// Whether any alternative is compatible with a node-to-be's requirements.
    pub fn compatible(&self, node: &Requirements) -> Result<(), Conflict> {
        first_success(self.alternatives.iter().map(|a| a.compatible(node)))
    }
}

/// The first success, or the first conflict when every alternative conflicts (none: success).
pub(crate) fn first_success<I: Iterator<Item = Result<(), Conflict>>>(
    mut results: I,
) -> Result<(), Conflict> {
    let mut first_err = None;
    for r in results.by_ref() {
        match r {
            Ok(()) => return Ok(()),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(key: &str, op: &str, values: &[&str]) -> Requirement {
        Requirement::new(key, op, values).expect("valid test requirement")
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_operator_matches_label_states_like_kubernetes() {
        // (operator, values, absent, "a", "5") -> expected matches
        let table: &[(&str, &[&str], bool, bool, bool)] = &[
            ("In", &["a", "b"], false, true, false),
            ("NotIn", &["a"], true, false, true),
            ("Exists", &[], false, true, true),
            ("DoesNotExist", &[], true, false, false),
            ("Gt", &["4"], false, false, true),
            ("Gt", &["5"], false, false, false),
            ("Lt", &["6"], false, false, true),
            ("Lt", &["5"], false, false, false),
            ("Gte", &["5"], false, false, true),
            ("Gte", &["6"], false, false, false),
            ("Lte", &["5"], false, false, true),
            ("Lte", &["4"], false, false, false),
        ];
        for (op, values, absent, a, five) in table {
            let r = req("k", op, values);
            assert_eq!(r.matches(None), *absent, "{op} {values:?} on absent");
            assert_eq!(r.matches(Some("a")), *a, "{op} {values:?} on a");
            assert_eq!(r.matches(Some("5")), *five, "{op} {values:?} on 5");
        }
    }

    #[test]
    fn operators_reject_wrong_value_counts_and_non_integers() {
        assert!(Requirement::new("k", "In", &[] as &[&str]).is_err());
        assert!(Requirement::new("k", "NotIn", &[] as &[&str]).is_err());
        assert!(Requirement::new("k", "Exists", &["a"]).is_err());
        assert!(Requirement::new("k", "Gt", &["1", "2"]).is_err());
        let err = Requirement::new("k", "Lt", &["ten"]).expect_err("not an integer");
        assert!(err.to_string().contains("\"ten\""));
        let err = Requirement::new("k", "Like", &["a"]).expect_err("unknown operator");
        assert!(err.to_string().contains("\"Like\""));
    }

    #[test]
    fn command_line_expressions_parse_into_requirements() {
        let r = Requirement::parse_expression("kubernetes.io/arch In arm64,amd64").expect("valid");
        assert!(r.matches(Some("arm64")) && r.matches(Some("amd64")) && !r.matches(None));
        let r = Requirement::parse_expression("karpenter.azure.com/sku-cpu Gt 4").expect("valid");
        assert_eq!(r.key(), "tailor.sh/sku-cpu");
        assert!(r.matches(Some("8")) && !r.matches(Some("4")));
        assert!(Requirement::parse_expression("gpu DoesNotExist").is_ok());
        let err = Requirement::parse_expression("arm64").expect_err("no operator");
        assert!(err.to_string().contains("\"arm64\""));
    }

    /// (left operand, right operand, admits absent, admits "a", admits "b", admits "7", empty)
    type IntersectionCase = (
        (&'static str, &'static [&'static str]),
        (&'static str, &'static [&'static str]),
        bool,
        bool,
        bool,
        bool,
        bool,
    );

    #[test]
    fn intersection_table_covers_every_pair_of_shapes() {
        let cases: &[IntersectionCase] = &[
            (
                ("In", &["a", "b"]),
                ("In", &["b", "c"]),
                false,
                false,
                true,
                false,
                false,
            ),
            (
                ("In", &["a"]),
                ("In", &["b"]),
                false,
                false,
                false,
                false,
                true,
            ),
            (
                ("In", &["a", "b"]),
                ("NotIn", &["a"]),
                false,
                false,
                true,
                false,
                false,
            ),
            (
                ("NotIn", &["a"]),
                ("NotIn", &["b"]),
                true,
                false,
                false,
                true,
                false,
            ),
            (
                ("Exists", &[]),
                ("NotIn", &["a"]),
                false,
                false,
                true,
                true,
                false,
            ),
            (
                ("Exists", &[]),
                ("DoesNotExist", &[]),
                false,
                false,
                false,
                false,
                true,
            ),
            (
                ("NotIn", &["a"]),
                ("DoesNotExist", &[]),
                true,
                false,
                false,
                false,
                false,
            ),
            (
                ("Gt", &["5"]),
                ("Lt", &["8"]),
                false,
                false,
                false,
                true,
                false,
            ),
            (
                ("Gt", &["5"]),
                ("Lt", &["6"]),
                false,
                false,
                false,
                false,
                true,
            ),
            (
                ("Gte", &["7"]),
                ("Lte", &["7"]),
                false,
                false,
                false,
                true,
                false,
            ),
            (
                ("In", &["6", "7", "a"]),
                ("Gt", &["6"]),
                false,
                false,
                false,
                true,
                false,
            ),
            (
                ("In", &["a"]),
                ("Gt", &["1"]),
                false,
                false,
                false,
                false,
                true,
            ),
        ];
        for ((op_a, va), (op_b, vb), absent, a, b, seven, empty) in cases {
            let ra = req("k", op_a, va);
            let rb = req("k", op_b, vb);
            for r in [ra.intersect(&rb), rb.intersect(&ra)] {
                let what = format!("{op_a} {va:?} ∩ {op_b} {vb:?}");
                assert_eq!(r.matches(None), *absent, "{what} absent");
                assert_eq!(r.matches(Some("a")), *a, "{what} a");
                assert_eq!(r.matches(Some("b")), *b, "{what} b");
                assert_eq!(r.matches(Some("7")), *seven, "{what} 7");
                assert_eq!(r.is_empty(), *empty, "{what} empty");
            }
        }
    }

    fn arb_requirement() -> impl Strategy<Value = Requirement> {
        let value = prop::sample::select(vec!["a", "b", "c", "1", "5", "7", "9"]);
        let values = prop::collection::vec(value, 1..4);
        let number = prop::sample::select(vec!["1", "5", "7"]);
        prop_oneof![
            values.clone().prop_map(|v| req("k", "In", &v)),
            values.prop_map(|v| req("k", "NotIn", &v)),
            Just(req("k", "Exists", &[])),
            Just(req("k", "DoesNotExist", &[])),
            (prop::sample::select(vec!["Gt", "Lt", "Gte", "Lte"]), number).prop_map(|(op, n)| req(
                "k",
                op,
                &[n]
            )),
        ]
    }

    proptest! {
        #[test]
        fn intersection_admits_exactly_what_both_sides_admit(
            a in arb_requirement(),
            b in arb_requirement(),
            state in prop::option::of(prop::sample::select(vec!["a", "b", "c", "d", "1", "5", "6", "7", "9"])),
        ) {
            let both = a.intersect(&b);
            prop_assert_eq!(both.matches(state), a.matches(state) && b.matches(state));
            prop_assert_eq!(both.intersects(&a), !both.is_empty());
        }
    }

    #[test]
    fn nodepool_requirements_keep_min_values_and_fold_aliases() {
        let yaml = "- {key: karpenter.azure.com/sku-family, operator: In, values: [D, E, F], minValues: 2}\n\
                    - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n\
                    - {key: tailor.sh/sku-cpu, operator: Lte, values: ['16']}\n";
        let list: Vec<NodeRequirement> = serde_yaml::from_str(yaml).expect("valid requirements");
        let set = Requirements::from_node_requirements(&list).expect("valid");
        assert_eq!(
            set.get("tailor.sh/sku-family").and_then(|r| r.min_values()),
            Some(2)
        );
        assert!(
            set.get("tailor.sh/sku-cpu")
                .is_some_and(|r| r.matches(Some("16")) && !r.matches(Some("32")))
        );
        assert_eq!(
            set.single_valued_labels()["tailor.sh/capacity-type"],
            "on-demand"
        );
    }

    #[test]
    fn node_selector_terms_read_expressions_and_the_node_name_field() {
        let yaml = "matchExpressions:\n- {key: topology.kubernetes.io/zone, operator: In, values: [eastus-1]}\n\
                    matchFields:\n- {key: metadata.name, operator: NotIn, values: [bad-node]}\n";
        let term: NodeSelectorTerm = serde_yaml::from_str(yaml).expect("valid term");
        let set = Requirements::from_node_selector_term(&term).expect("valid");
        let node = labels(&[
            ("topology.kubernetes.io/zone", "eastus-1"),
            ("kubernetes.io/hostname", "bad-node"),
        ]);
        let conflict = set.matches_labels(&node).expect_err("excluded by name");
        assert_eq!(conflict.key, "kubernetes.io/hostname");
    }

    #[test]
    fn min_values_survive_intersection_and_take_the_larger() {
        let a = req("tailor.sh/sku-family", "In", &["D", "E", "F"]).with_min_values(Some(2));
        let b = req("tailor.sh/sku-family", "NotIn", &["F"]).with_min_values(Some(1));
        let r = a.intersect(&b);
        assert_eq!(r.min_values(), Some(2));
        assert_eq!(r.values().map(|v| v.len()), Some(2));
    }

    #[test]
    fn karpenter_alias_keys_are_the_same_requirement_as_tailor_keys() {
        let mut set = Requirements::new();
        set.add(req(
            "karpenter.sh/capacity-type",
            "In",
            &["spot", "on-demand"],
        ));
        set.add(req("tailor.sh/capacity-type", "In", &["spot"]));
        set.add(req("karpenter.azure.com/sku-family", "In", &["D"]));
        assert_eq!(set.len(), 2);
        assert_eq!(
            set.get("tailor.sh/capacity-type")
                .and_then(|r| r.single_value()),
            Some("spot")
        );
        assert!(set.get("karpenter.azure.com/sku-family").is_some());
        // A node labelled with the alias key satisfies the canonical requirement.
        let node = labels(&[
            ("karpenter.sh/capacity-type", "spot"),
            ("karpenter.azure.com/sku-family", "D"),
        ]);
        assert_eq!(set.matches_labels(&node), Ok(()));
    }

    #[test]
    fn pod_requirements_on_keys_a_new_node_lacks_are_incompatible_unless_absence_is_allowed() {
        let node = Requirements::new().with(req("kubernetes.io/arch", "In", &["amd64"]));
        let wants_gpu = Requirements::new().with(req("gpu", "Exists", &[]));
        let conflict = wants_gpu.compatible(&node).expect_err("no gpu label");
        assert_eq!(conflict.key, "gpu");
        let avoids_gpu = Requirements::new().with(req("gpu", "NotIn", &["true"]));
        assert_eq!(avoids_gpu.compatible(&node), Ok(()));
        let wants_arm = Requirements::new().with(req("kubernetes.io/arch", "In", &["arm64"]));
        assert!(wants_arm.compatible(&node).is_err());
        // Symmetric intersection treats missing keys as unconstrained.
        assert_eq!(wants_gpu.intersects(&node), Ok(()));
    }

    #[test]
    fn affinity_terms_are_ored_and_each_is_anded_with_the_node_selector() {
        let selector = Requirements::from_node_selector(&labels(&[("kubernetes.io/os", "linux")]));
        let zone1 =
            Requirements::new().with(req("topology.kubernetes.io/zone", "In", &["eastus-1"]));
        let arm = Requirements::new().with(req("kubernetes.io/arch", "In", &["arm64"]));
        let pod = NodeRequirements::new(selector, vec![zone1, arm]);
        let ok_zone = labels(&[
            ("kubernetes.io/os", "linux"),
            ("topology.kubernetes.io/zone", "eastus-1"),
        ]);
        let ok_arch = labels(&[
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "arm64"),
        ]);
        let wrong_os = labels(&[
            ("kubernetes.io/os", "windows"),
            ("kubernetes.io/arch", "arm64"),
        ]);
        let neither = labels(&[
            ("kubernetes.io/os", "linux"),
            ("topology.kubernetes.io/zone", "eastus-2"),
        ]);
        assert_eq!(pod.matches_labels(&ok_zone), Ok(()));
        assert_eq!(pod.matches_labels(&ok_arch), Ok(()));
        assert!(pod.matches_labels(&wrong_os).is_err());
        let err = pod.matches_labels(&neither).expect_err("no term matches");
        assert_eq!(err.key, "topology.kubernetes.io/zone");
    }

    #[test]
    fn single_valued_requirements_become_node_labels() {
        let set = Requirements::new()
            .with(req("tailor.sh/capacity-type", "In", &["on-demand"]))
            .with(req(
                "topology.kubernetes.io/zone",
                "In",
                &["eastus-1", "eastus-2"],
            ))
            .with(req("team", "In", &["payments"]));
        let l = set.single_valued_labels();
        assert_eq!(l.len(), 2);
        assert_eq!(l["team"], "payments");
    }
}
