//! `tailor crds`: the CustomResourceDefinitions generated from the Rust types.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::{CliError, Result};
use crate::apis;

/// Arguments of `tailor crds`.
#[derive(Debug, Clone, Args)]
pub struct CrdsArgs {
    /// Write one file per CRD into this directory (as committed under `deploy/crds`)
    /// instead of printing a multi-document stream.
    #[arg(long, env = "TAILOR_CRDS_OUTPUT_DIR")]
    pub output_dir: Option<PathBuf>,
}

/// Prints or writes the CRDs.
pub fn run(args: CrdsArgs, out: &mut dyn Write) -> Result<()> {
    let CrdsArgs { output_dir } = args;
    let files = apis::crd_yaml().map_err(|e| CliError::Encode(e.to_string()))?;
    match output_dir {
        None => {
            for (_, yaml) in &files {
                writeln!(out, "---")?;
                out.write_all(yaml.as_bytes())?;
            }
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(|source| CliError::WriteFile {
                path: dir.clone(),
                source,
            })?;
            for (name, yaml) in &files {
                let path = dir.join(name);
                std::fs::write(&path, yaml).map_err(|source| CliError::WriteFile {
                    path: path.clone(),
                    source,
                })?;
                writeln!(out, "wrote {}", path.display())?;
            }
        }
    }
    Ok(())
}
