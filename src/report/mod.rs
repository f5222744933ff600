//! Renderers for what Tailor reports: aligned tables for people, JSON and YAML for tools.

#[cfg(feature = "report")]
pub mod cost;
pub mod svg;
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

/// Renders `value` in `format`: `table` for people, JSON or YAML (the same fields) for
/// tools. Encoding errors are returned as text.
pub fn render<T: serde::Serialize>(
    format: Format,
    value: &T,
    table: impl FnOnce(&T) -> String,
) -> Result<String, String> {
    match format {
        Format::Table => Ok(table(value)),
        Format::Json => serde_json::to_string_pretty(value)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| e.to_string()),
        Format::Yaml => serde_yaml::to_string(value).map_err(|e| e.to_string()),
    }
}
