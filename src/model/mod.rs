//! Tailor's vocabulary, pure and free of I/O: quantities, resource lists, label
//! requirements and instance types with their offerings.

pub mod instance_type;
pub mod pod;
pub mod quantity;
pub mod requirements;
pub mod resources;

pub use instance_type::{
    CapacityType, InstanceType, NodeSettings, Offering, OverheadModel, Sku, SkuName,
};
pub use requirements::{
    Conflict, NodeRequirements, Operator, Requirement, RequirementError, Requirements,
};
pub use resources::{Dimension, ResourceError, Resources};
