//! The generated parts of the docs: the `tailor run` flag table (docs/configuration.md),
//! from the command line's own definitions, and the chart values table (docs/install.md),
//! from the comments of the chart's `values.yaml`. Each sits between `<!-- NAME:begin -->`
//! and `<!-- NAME:end -->` markers, and a test fails when the committed table differs from
//! what these functions make.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use super::{CliError, Result};

/// Arguments of `tailor docs-reference`.
#[derive(Debug, clap::Args)]
pub struct ReferenceArgs {
    /// The repository's root, holding docs/ and deploy/.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Change nothing; fail naming each page whose generated table is stale.
    #[arg(long)]
    pub check: bool,
}

/// The pages and the tables generated into them.
fn generated(root: &Path) -> Result<Vec<(PathBuf, &'static str, String)>> {
    let values_path = root.join("deploy/charts/tailor/values.yaml");
    let values = std::fs::read_to_string(&values_path)
        .map_err(|e| CliError::Input(format!("{}: {e}", values_path.display())))?;
    Ok(vec![
        (root.join("docs/configuration.md"), RUN_FLAGS, run_flags()),
        (
            root.join("docs/install.md"),
            CHART_VALUES,
            chart_values(&values).map_err(CliError::Input)?,
        ),
    ])
}

/// Writes the generated tables into their pages, or with `--check` reports the stale ones.
pub fn run(args: ReferenceArgs, out: &mut dyn Write) -> Result<()> {
    let mut stale = Vec::new();
    for (page_path, name, table) in generated(&args.root)? {
        let page = std::fs::read_to_string(&page_path)
            .map_err(|e| CliError::Input(format!("{}: {e}", page_path.display())))?;
        let updated = replace_section(&page, name, &table).ok_or_else(|| {
            CliError::Input(format!(
                "{}: no <!-- {name}:begin --> ... <!-- {name}:end --> section",
                page_path.display()
            ))
        })?;
        if updated == page {
            writeln!(out, "{}: {name} is current", page_path.display())?;
            continue;
        }
        if args.check {
            stale.push(format!("{} ({name})", page_path.display()));
        } else {
            std::fs::write(&page_path, updated).map_err(|source| CliError::WriteFile {
                path: page_path.clone(),
                source,
            })?;
            writeln!(out, "{}: {name} written", page_path.display())?;
        }
    }
    if stale.is_empty() {
        Ok(())
    } else {
        Err(CliError::Input(format!(
            "stale generated tables in {}: run `cargo run -- docs-reference`",
            stale.join(", ")
        )))
    }
}

/// The flag table's markers' name in docs/configuration.md.
pub const RUN_FLAGS: &str = "run-flags";
/// The values table's markers' name in docs/install.md.
pub const CHART_VALUES: &str = "values-reference";

fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// Every flag of `tailor run` (hidden ones left out), in the order `--help` lists them: its
/// environment variable, default and help, and the values it takes when they are a fixed set.
pub fn run_flags() -> String {
    let mut cli = super::Cli::command();
    cli.build();
    let mut out = String::from(
        "| flag | environment variable | default | what it sets |\n|---|---|---|---|\n",
    );
    let Some(run) = cli.get_subcommands().find(|c| c.get_name() == "run") else {
        return out;
    };
    for arg in run.get_arguments() {
        if arg.is_hide_set() || arg.is_positional() {
            continue;
        }
        let Some(long) = arg.get_long() else {
            continue;
        };
        if matches!(long, "help" | "version") {
            continue;
        }
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_else(|| "-".to_string());
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = if defaults.is_empty() {
            "-".to_string()
        } else {
            format!("`{}`", defaults.join(","))
        };
        let mut help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        // clap drops the closing period of a one-paragraph doc comment; the table keeps
        // sentences whole.
        let trimmed = help.trim_end().to_string();
        help = if trimmed.is_empty() || trimmed.ends_with(['.', '!', '?']) {
            trimmed
        } else {
            format!("{trimmed}.")
        };
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        // A boolean switch lists true and false; that says nothing.
        if !values.is_empty() && arg.get_action().takes_values() {
            help = format!("{} One of {}.", help.trim_end(), values.join(", "));
        }
        out.push_str(&format!(
            "| `--{long}` | {env} | {default} | {} |\n",
            cell(&help)
        ));
    }
    out
}

/// A YAML value on one line, as the table shows a default: JSON for scalars, and `{"k": v}`
/// / `[a, b]` for maps and lists.
fn inline(v: &serde_yaml::Value) -> String {
    use serde_yaml::Value;
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}")),
        Value::Sequence(items) => format!(
            "[{}]",
            items.iter().map(inline).collect::<Vec<_>>().join(", ")
        ),
        Value::Mapping(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", inline(k), inline(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Tagged(t) => inline(&t.value),
    }
}

/// The `# --` comment above each key of `values.yaml`, by dotted path. A comment starts at
/// a line `# -- text` and runs over the `#` lines after it, up to the key.
fn comments(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(rest) = trimmed.strip_prefix("# --") {
            pending = Some(rest.trim().to_string());
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('#') {
            if let Some(p) = pending.as_mut() {
                p.push(' ');
                p.push_str(rest.trim());
            }
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        if trimmed.starts_with("- ") || trimmed == "-" {
            pending = None;
            continue;
        }
        let Some((key, _)) = trimmed.split_once(':') else {
            pending = None;
            continue;
        };
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let key = key.trim().trim_matches('"').to_string();
        let path = stack
            .iter()
            .map(|(_, k)| k.as_str())
            .chain(std::iter::once(key.as_str()))
            .collect::<Vec<_>>()
            .join(".");
        if let Some(c) = pending.take() {
            out.insert(path, c);
        }
        stack.push((indent, key));
    }
    out
}

/// Whether a documented key or one below it has a comment of its own.
fn documented_below(path: &str, comments: &BTreeMap<String, String>) -> bool {
    let prefix = format!("{path}.");
    comments.keys().any(|k| k.starts_with(&prefix))
}

fn rows(
    map: &serde_yaml::Mapping,
    prefix: &str,
    comments: &BTreeMap<String, String>,
    out: &mut Vec<(String, String, String)>,
) -> std::result::Result<(), String> {
    // A key without a comment of its own shares the one of the key before it at its level
    // (`podLabels` and `podAnnotations` under one comment).
    let mut previous: Option<String> = None;
    for (k, v) in map {
        let key = k
            .as_str()
            .ok_or_else(|| format!("values.yaml: a key under {prefix:?} is not a string"))?;
        let path = if prefix.is_empty() {
            key.to_string()
        } else {
            format!("{prefix}.{key}")
        };
        let own = comments.get(&path).cloned();
        let nested = v.as_mapping().filter(|m| !m.is_empty());
        match (nested, &own) {
            // A map documented below: its keys are the values.
            (Some(m), _) if documented_below(&path, comments) => {
                rows(m, &path, comments, out)?;
                previous = None;
            }
            // A map without any comment: its keys are the values, each needing one.
            (Some(m), None) => {
                rows(m, &path, comments, out)?;
                previous = None;
            }
            _ => {
                let description = own.clone().or_else(|| previous.clone()).ok_or_else(|| {
                    format!(
                        "values.yaml: {path} has no `# --` comment above it (nor does the key before it)"
                    )
                })?;
                out.push((path, inline(v), description.clone()));
                previous = Some(description);
            }
        }
    }
    Ok(())
}

/// The values table of a chart's `values.yaml`: every value with its default and the `# --`
/// comment above it. An error names a value without a description.
pub fn chart_values(text: &str) -> std::result::Result<String, String> {
    let parsed: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|e| format!("values.yaml: {e}"))?;
    let map = parsed
        .as_mapping()
        .ok_or_else(|| "values.yaml: the top level is not a map".to_string())?;
    let comments = comments(text);
    let mut found = Vec::new();
    rows(map, "", &comments, &mut found)?;
    let mut out = String::from("| value | default | description |\n|---|---|---|\n");
    for (path, default, description) in found {
        out.push_str(&format!(
            "| `{path}` | `{}` | {} |\n",
            default.replace('`', "'"),
            cell(&description)
        ));
    }
    Ok(out)
}

/// Where the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` lies in a page
/// (the lines strictly between the markers).
fn bounds(page: &str, name: &str) -> Option<(usize, usize)> {
    let begin = format!("<!-- {name}:begin -->\n");
    let end = format!("<!-- {name}:end -->");
    let start = page.find(&begin)? + begin.len();
    let stop = page[start..].find(&end)? + start;
    Some((start, stop))
}

/// The text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in a page.
pub fn section<'a>(page: &'a str, name: &str) -> Option<&'a str> {
    bounds(page, name).map(|(start, stop)| &page[start..stop])
}

/// `page` with the section `name` replaced by `body`; `None` when the markers are missing.
pub fn replace_section(page: &str, name: &str, body: &str) -> Option<String> {
    let (start, stop) = bounds(page, name)?;
    Some(format!("{}{body}{}", &page[..start], &page[stop..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_take_their_comment_the_previous_keys_or_are_refused() {
        let text = "# file header, not a value's\n\n# -- The image.\nimage:\n  # -- Repository.\n  repository: x\n  # -- Tag; long\n  # enough to wrap.\n  tag: \"\"\n# -- Labels and annotations.\npodLabels: {}\npodAnnotations: {}\n# -- Resources.\nresources:\n  limits:\n    memory: 1Gi\n# -- Tolerations.\ntolerations:\n  - key: a\n    operator: Exists\n";
        let table = chart_values(text).expect("documented");
        assert_eq!(
            table,
            "| value | default | description |\n|---|---|---|\n\
             | `image.repository` | `\"x\"` | Repository. |\n\
             | `image.tag` | `\"\"` | Tag; long enough to wrap. |\n\
             | `podLabels` | `{}` | Labels and annotations. |\n\
             | `podAnnotations` | `{}` | Labels and annotations. |\n\
             | `resources` | `{\"limits\": {\"memory\": \"1Gi\"}}` | Resources. |\n\
             | `tolerations` | `[{\"key\": \"a\", \"operator\": \"Exists\"}]` | Tolerations. |\n"
        );
        let err = chart_values("replicas: 2\n").expect_err("undocumented");
        assert!(err.contains("replicas has no `# --` comment"), "{err}");
    }

    #[test]
    fn the_flag_table_lists_every_visible_run_flag_with_its_env_and_default() {
        let table = run_flags();
        assert!(
            table.contains("| `--cluster-name` | `TAILOR_CLUSTER_NAME` | `tailor` |"),
            "{table}"
        );
        assert!(table.contains("| `--mode` | `TAILOR_MODE` | `recommend` |"));
        assert!(
            table.contains("One of `recommend`, `autonomous`."),
            "{table}"
        );
        assert!(!table.contains("--timer-scale"), "hidden flags stay out");
        assert!(table.lines().count() > 40, "{table}");
    }

    #[test]
    fn a_section_is_found_and_replaced_between_its_markers_only() {
        let page = "a\n<!-- t:begin -->\nold\n<!-- t:end -->\nb\n";
        assert_eq!(section(page, "t"), Some("old\n"));
        assert_eq!(
            replace_section(page, "t", "new\n").as_deref(),
            Some("a\n<!-- t:begin -->\nnew\n<!-- t:end -->\nb\n")
        );
        assert_eq!(section(page, "u"), None);
    }
}
