//! Resource lists: requests, capacity and allocatable, with checked arithmetic.

use std::collections::BTreeMap;
use std::fmt;

use super::quantity::{self, QuantityError};

/// Canonical resource names.
pub mod names {
    /// CPU, counted in millicores.
    pub const CPU: &str = "cpu";
    /// Memory, counted in bytes.
    pub const MEMORY: &str = "memory";
    /// Node-local ephemeral storage, counted in bytes.
    pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
    /// The number of pods a node may run.
    pub const PODS: &str = "pods";
}

/// One dimension of a resource list, used to say which dimension did not fit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dimension {
    /// CPU in millicores.
    Cpu,
    /// Memory in bytes.
    Memory,
    /// Ephemeral storage in bytes.
    EphemeralStorage,
    /// Pod slots.
    Pods,
    /// An extended resource such as `nvidia.com/gpu`, counted in whole units.
    Extended(String),
}

impl Dimension {
    /// The Kubernetes resource name of this dimension.
    pub fn name(&self) -> &str {
        match self {
            Dimension::Cpu => names::CPU,
            Dimension::Memory => names::MEMORY,
            Dimension::EphemeralStorage => names::EPHEMERAL_STORAGE,
            Dimension::Pods => names::PODS,
            Dimension::Extended(n) => n,
        }
    }

    /// Formats an amount of this dimension as a Kubernetes quantity string.
    pub fn format(&self, amount: i64) -> String {
        match self {
            Dimension::Cpu => quantity::format_milli(amount),
            _ => quantity::format_value(amount),
        }
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a resource list could not be built or combined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// A quantity string in the list is malformed.
    #[error("resource {name}: {source}")]
    Quantity {
        /// The resource name the bad value was given for.
        name: String,
        /// The parse error, quoting the value.
        #[source]
        source: QuantityError,
    },
    /// A request or capacity is negative.
    #[error("resource {name}: negative value {value:?} is not allowed")]
    Negative {
        /// The resource name.
        name: String,
        /// The value as given.
        value: String,
    },
    /// Adding lists overflowed 64 bits.
    #[error("resource {name} overflows when added")]
    Overflow {
        /// The resource that overflowed.
        name: String,
    },
}

/// A list of resources in Tailor's units: CPU in millicores, everything else whole units.
///
/// Missing dimensions are zero. Extended resources with a zero amount are not stored, so
/// two lists that mean the same compare equal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    /// CPU in millicores.
    pub cpu: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage: i64,
    /// Pod slots (1 for a pod's request, maxPods for a node).
    pub pods: i64,
    /// Extended resources by name, such as `nvidia.com/gpu`.
    pub extended: BTreeMap<String, i64>,
}

impl Resources {
    /// An empty list (every dimension zero).
    pub fn zero() -> Self {
        Self::default()
    }

    /// A list with only CPU (millicores) and memory (bytes).
    pub fn cpu_memory(cpu_milli: i64, memory_bytes: i64) -> Self {
        Self {
            cpu: cpu_milli,
            memory: memory_bytes,
            ..Self::default()
        }
    }

    /// Builds a list from Kubernetes name → quantity-string pairs, rejecting negative or
    /// malformed values with an error naming the resource and quoting the value.
    pub fn parse<'a, I>(entries: I) -> Result<Self, ResourceError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut out = Self::default();
        for (name, value) in entries {
            let parsed = if name == names::CPU {
                quantity::parse_milli(value)
            } else {
                quantity::parse_value(value)
            }
            .map_err(|source| ResourceError::Quantity {
                name: name.to_string(),
                source,
            })?;
            if parsed < 0 {
                return Err(ResourceError::Negative {
                    name: name.to_string(),
                    value: value.to_string(),
                });
            }
            out.set(&Dimension::from_name(name), parsed);
        }
        Ok(out)
    }

    /// The amount of one dimension.
    pub fn get(&self, dimension: &Dimension) -> i64 {
        match dimension {
            Dimension::Cpu => self.cpu,
            Dimension::Memory => self.memory,
            Dimension::EphemeralStorage => self.ephemeral_storage,
            Dimension::Pods => self.pods,
            Dimension::Extended(n) => self.extended.get(n).copied().unwrap_or(0),
        }
    }

    /// Sets the amount of one dimension.
    pub fn set(&mut self, dimension: &Dimension, amount: i64) {
        match dimension {
            Dimension::Cpu => self.cpu = amount,
            Dimension::Memory => self.memory = amount,
            Dimension::EphemeralStorage => self.ephemeral_storage = amount,
            Dimension::Pods => self.pods = amount,
            Dimension::Extended(n) => {
                if amount == 0 {
                    self.extended.remove(n);
                } else {
                    self.extended.insert(n.clone(), amount);
                }
            }
        }
    }

    /// Every dimension that is non-zero in this list, in a stable order.
    pub fn dimensions(&self) -> Vec<Dimension> {
        let mut out = Vec::with_capacity(4 + self.extended.len());
        for (d, v) in [
            (Dimension::Cpu, self.cpu),
            (Dimension::Memory, self.memory),
            (Dimension::EphemeralStorage, self.ephemeral_storage),
            (Dimension::Pods, self.pods),
        ] {
            if v != 0 {
                out.push(d);
            }
        }
        out.extend(self.extended.keys().cloned().map(Dimension::Extended));
        out
    }

    /// The sum of two lists, or the first dimension that overflows.
    pub fn checked_add(&self, other: &Self) -> Result<Self, ResourceError> {
        self.combine(other, i64::checked_add)
    }

    /// The difference of two lists (may go negative: "how much is missing"), or the
    /// first dimension that overflows.
    pub fn checked_sub(&self, other: &Self) -> Result<Self, ResourceError> {
        self.combine(other, i64::checked_sub)
    }

    /// Element-wise maximum, as kube-scheduler combines init containers with the app
    /// containers' sum.
    pub fn max(&self, other: &Self) -> Self {
        let mut out = self.clone();
        for d in other.dimensions() {
            let v = self.get(&d).max(other.get(&d));
            out.set(&d, v);
        }
        out
    }

    /// `self` with every dimension floored at zero.
    pub fn clamp_non_negative(&self) -> Self {
        let mut out = self.clone();
        for d in self.dimensions() {
            out.set(&d, self.get(&d).max(0));
        }
        out
    }

    fn combine(
        &self,
        other: &Self,
        op: fn(i64, i64) -> Option<i64>,
    ) -> Result<Self, ResourceError> {
        let mut out = self.clone();
        let mut dims = self.dimensions();
        dims.extend(other.dimensions());
        dims.sort();
        dims.dedup();
        for d in dims {
            let v = op(self.get(&d), other.get(&d)).ok_or_else(|| ResourceError::Overflow {
                name: d.name().to_string(),
            })?;
            out.set(&d, v);
        }
        Ok(out)
    }

    /// Whether every dimension of `self` (a request) fits within `capacity`.
    pub fn fits(&self, capacity: &Self) -> bool {
        self.exceeded(capacity).is_empty()
    }

    /// The dimensions of `self` that exceed `capacity`, in a stable order.
    pub fn exceeded(&self, capacity: &Self) -> Vec<Dimension> {
        self.dimensions()
            .into_iter()
            .filter(|d| self.get(d) > capacity.get(d))
            .collect()
    }

    /// The share of `capacity` that `self` uses, per dimension present in `capacity`
    /// (0.0 = none, 1.0 = full; above 1.0 when over-committed).
    pub fn utilisation(&self, capacity: &Self) -> BTreeMap<Dimension, f64> {
        capacity
            .dimensions()
            .into_iter()
            .filter(|d| capacity.get(d) > 0)
            .map(|d| {
                let share = self.get(&d) as f64 / capacity.get(&d) as f64;
                (d, share)
            })
            .collect()
    }

    /// The list as Kubernetes name → canonical quantity string pairs.
    pub fn to_quantities(&self) -> BTreeMap<String, String> {
        self.dimensions()
            .into_iter()
            .map(|d| (d.name().to_string(), d.format(self.get(&d))))
            .collect()
    }
}

impl Dimension {
    /// The dimension a Kubernetes resource name denotes.
    pub fn from_name(name: &str) -> Self {
        match name {
            names::CPU => Dimension::Cpu,
            names::MEMORY => Dimension::Memory,
            names::EPHEMERAL_STORAGE => Dimension::EphemeralStorage,
            names::PODS => Dimension::Pods,
            other => Dimension::Extended(other.to_string()),
        }
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .to_quantities()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(entries: &[(&str, &str)]) -> Resources {
        Resources::parse(entries.iter().copied()).expect("valid test resources")
    }

    #[test]
    fn a_request_fits_when_every_dimension_fits() {
        let request = res(&[("cpu", "500m"), ("memory", "1Gi"), ("nvidia.com/gpu", "1")]);
        let node = res(&[("cpu", "2"), ("memory", "4Gi"), ("nvidia.com/gpu", "1")]);
        assert!(request.fits(&node));
        let no_gpu = res(&[("cpu", "2"), ("memory", "4Gi")]);
        assert_eq!(
            request.exceeded(&no_gpu),
            vec![Dimension::Extended("nvidia.com/gpu".into())]
        );
    }

    #[test]
    fn arithmetic_is_checked_and_exact() {
        let a = res(&[("cpu", "1500m"), ("memory", "1Gi"), ("pods", "1")]);
        let b = res(&[("cpu", "0.5"), ("memory", "1Gi"), ("pods", "1")]);
        let sum = a.checked_add(&b).expect("no overflow");
        assert_eq!(sum, res(&[("cpu", "2"), ("memory", "2Gi"), ("pods", "2")]));
        assert_eq!(sum.checked_sub(&b).expect("no overflow"), a);
        let huge = Resources::cpu_memory(i64::MAX, 0);
        assert!(matches!(
            huge.checked_add(&Resources::cpu_memory(1, 0)),
            Err(ResourceError::Overflow { name }) if name == "cpu"
        ));
    }

    #[test]
    fn utilisation_is_reported_per_dimension() {
        let used = res(&[("cpu", "1"), ("memory", "1Gi")]);
        let cap = res(&[("cpu", "4"), ("memory", "2Gi"), ("pods", "110")]);
        let u = used.utilisation(&cap);
        assert_eq!(u[&Dimension::Cpu], 0.25);
        assert_eq!(u[&Dimension::Memory], 0.5);
        assert_eq!(u[&Dimension::Pods], 0.0);
    }

    #[test]
    fn malformed_and_negative_values_name_the_resource() {
        let err = Resources::parse([("memory", "12XB")]).expect_err("bad suffix");
        assert!(err.to_string().contains("memory") && err.to_string().contains("\"12XB\""));
        let err = Resources::parse([("cpu", "-1")]).expect_err("negative");
        assert!(err.to_string().contains("cpu") && err.to_string().contains("\"-1\""));
    }

    #[test]
    fn element_wise_max_covers_both_lists() {
        let a = res(&[("cpu", "2"), ("memory", "1Gi")]);
        let b = res(&[("cpu", "1"), ("memory", "2Gi"), ("nvidia.com/gpu", "1")]);
        assert_eq!(
            a.max(&b),
            res(&[("cpu", "2"), ("memory", "2Gi"), ("nvidia.com/gpu", "1")])
        );
    }
}
