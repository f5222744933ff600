//! Renderers for what Tailor reports: aligned tables for people, JSON and YAML for tools.

pub mod table;

pub use table::Table;

/// An output format chosen with `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for a terminal.
    Table,
    /// JSON (camelCase fields).
    Json,
    /// YAML (same fields as JSON).
    Yaml,
}
