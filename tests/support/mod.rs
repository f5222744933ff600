//! Shared test support: building the scheduler's input from scenario YAML with the
//! built-in eastus catalog.

use tailor::catalog::{Catalog, CatalogOptions};
use tailor::model::NodeSettings;
use tailor::scheduling::{Input, PoolTypes};
use tailor::state::Snapshot;

/// A pool's instance types for its node settings, from `catalog`'s eastus offerings: what
/// `Input::from_snapshot` asks for.
#[allow(dead_code)] // not every test binary builds inputs by hand
pub fn eastus_types(catalog: &Catalog) -> impl Fn(&NodeSettings) -> Result<PoolTypes, String> + '_ {
    move |settings: &NodeSettings| {
        let mut o = CatalogOptions::for_region("eastus");
        o.node = settings.clone();
        catalog
            .instance_types(&o)
            .map(Into::into)
            .map_err(|e| e.to_string())
    }
}

/// The scheduler's input for a scenario, priced with the built-in eastus catalog.
pub fn input_from_yaml(yaml: &str) -> Input {
    let snapshot = Snapshot::from_yaml("scenario.yaml", yaml).expect("scenario parses");
    let catalog = Catalog::builtin().expect("built-in catalog");
    Input::from_snapshot(&snapshot, &eastus_types(&catalog)).expect("input builds")
}
