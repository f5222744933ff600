//! Shared test support: building the scheduler's input from scenario YAML with the
//! built-in eastus catalog.

use tailor::catalog::{Catalog, CatalogOptions};
use tailor::model::NodeSettings;
use tailor::scheduling::Input;
use tailor::state::Snapshot;

/// The scheduler's input for a scenario, priced with the built-in eastus catalog.
pub fn input_from_yaml(yaml: &str) -> Input {
    let snapshot = Snapshot::from_yaml("scenario.yaml", yaml).expect("scenario parses");
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = |settings: &NodeSettings| {
        let mut o = CatalogOptions::for_region("eastus");
        o.node = settings.clone();
        catalog
            .instance_types(&o)
            .map(Into::into)
            .map_err(|e| e.to_string())
    };
    Input::from_snapshot(&snapshot, &types).expect("input builds")
}
