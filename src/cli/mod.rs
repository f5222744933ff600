//! The command line. Each subcommand parses its settings (every flag has an environment
//! twin and a documented default), destructures them once, and calls into the library.

pub mod catalog;
pub mod crds;
pub mod demo;
pub mod recommend;
mod recommend_html;
pub mod reference;
#[cfg(feature = "report")]
pub mod report;
pub mod run;
pub mod simulate;

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::catalog::{Catalog, CatalogError, CatalogOptions, DEFAULT_SPOT_DISCOUNT};
use crate::model::{NodeSettings, OverheadModel, RequirementError};

/// Tailor: right-sizes pod requests from Prometheus history and buys the cheapest Azure
/// nodes that fit them.
#[derive(Debug, Parser)]
#[command(name = "tailor", version, about, long_about = None)]
pub struct Cli {
    /// Log filter in RUST_LOG syntax (e.g. `info,tailor=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "warn", global = true)]
    pub log: String,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print Tailor's CustomResourceDefinitions as YAML, or write one file per CRD.
    Crds(crds::CrdsArgs),
    /// List the VM sizes Tailor can buy in a region: allocatable after AKS overhead and
    /// price per offering.
    Catalog(catalog::CatalogArgs),
    /// Recommend right-sized requests for every workload container from its usage history
    /// in Prometheus, with the monthly cost effect. Changes nothing.
    Recommend(Box<recommend::RecommendArgs>),
    /// Cost allocation and savings over a window from Prometheus history and node prices:
    /// per namespace, workload or NodePool, requested vs used vs recommended, dollars
    /// wasted and recoverable. Changes nothing. (Built with the `report` feature.)
    #[cfg(feature = "report")]
    Report(Box<report::ReportArgs>),
    /// Plan a cluster snapshot's pending pods: placements on existing nodes, the cheapest
    /// new nodes that fit the rest, and pods that cannot land with the reason. With
    /// `--disruption`, the nodes it would remove or replace now, with their savings.
    Simulate(simulate::SimulateArgs),
    /// Run the whole loop on a simulated AKS cluster (no cluster needed): the same week in
    /// recommend-only mode, then autonomous, with a summary and an HTML report.
    Demo(demo::DemoArgs),
    /// Run the in-cluster agent: provision nodes for pending pods, manage their lifecycle
    /// and consolidate them (autonomous mode), or report what it would do (recommend mode).
    Run(Box<run::RunArgs>),
    /// Print the reference of every metric Tailor exports: name, type, unit, labels and
    /// meaning (committed as docs/metrics.md).
    MetricsReference,
    /// Write the docs' generated tables (the `tailor run` flags in docs/configuration.md,
    /// the chart values in docs/install.md), or check them with `--check`.
    #[command(hide = true)]
    DocsReference(reference::ReferenceArgs),
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Loading or using the catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A `--requirement` is malformed.
    #[error("--requirement: {0}")]
    Requirement(#[from] RequirementError),
    /// The snapshot or the scheduler's input is invalid.
    #[error("{0}")]
    Input(String),
    /// Writing output failed.
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
    /// Writing a file failed.
    #[error("writing {path}: {source}")]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Encoding output failed.
    #[error("encoding output: {0}")]
    Encode(String),
    /// The command measured nothing: reporting success would mislead.
    #[error("nothing to report: {0}")]
    NothingToReport(String),
    /// A flag value is out of range.
    #[error("{flag}: {reason}")]
    InvalidFlag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Result alias for commands.
pub type Result<T> = std::result::Result<T, CliError>;

/// Runs a parsed command, writing its output to `out`.
/// The `--now` flag (RFC 3339) in Unix seconds; the clock's time when it is not given.
pub(crate) fn now_flag(now: Option<&str>) -> Result<i64> {
    match now {
        Some(t) => t
            .parse::<jiff::Timestamp>()
            .map(|t| t.as_second())
            .map_err(|e| CliError::InvalidFlag {
                flag: "--now",
                reason: format!("{t:?}: {e}"),
            }),
        None => Ok(jiff::Timestamp::now().as_second()),
    }
}

pub fn run(command: Command, out: &mut dyn Write) -> Result<()> {
    match command {
        Command::Crds(args) => crds::run(args, out),
        Command::Catalog(args) => catalog::run(args, out),
        Command::Simulate(args) => simulate::run(args, out),
        Command::Recommend(args) => recommend::run(*args, out),
        #[cfg(feature = "report")]
        Command::Report(args) => report::run(*args, out),
        Command::Demo(args) => demo::run(args, out),
        Command::Run(args) => run::run(*args, out),
        Command::DocsReference(args) => reference::run(args, out),
        Command::MetricsReference => {
            out.write_all(crate::telemetry::metrics::reference_page().as_bytes())?;
            Ok(())
        }
    }
}

/// The kube-reserved memory formula, as a flag value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OverheadModelArg {
    /// Brackets on VM memory plus a 750Mi eviction threshold (AKS before 1.29).
    Brackets,
    /// min(20Mi x maxPods + 50Mi, 25%) plus 100Mi (AKS 1.29 and later).
    MaxPods,
}

impl From<OverheadModelArg> for OverheadModel {
    fn from(a: OverheadModelArg) -> Self {
        match a {
            OverheadModelArg::Brackets => OverheadModel::Brackets,
            OverheadModelArg::MaxPods => OverheadModel::MaxPods,
        }
    }
}

/// The snapshot a command reads; shared by the commands that decide over a cluster.
#[derive(Debug, Clone, Args)]
pub struct SnapshotArgs {
    /// Snapshot files or directories (YAML as `kubectl get -o yaml` writes it); repeat to
    /// merge several.
    #[arg(
        long = "snapshot",
        short = 's',
        env = "TAILOR_SNAPSHOT",
        required = true,
        value_delimiter = ','
    )]
    pub paths: Vec<PathBuf>,
}

/// Where a command reads the cluster's objects: snapshot files or a live cluster.
#[derive(Debug, Clone, Args)]
pub struct ClusterSourceArgs {
    /// Snapshot files or directories (YAML as `kubectl get -o yaml` writes it); repeat to
    /// merge several.
    #[arg(
        long = "snapshot",
        short = 's',
        env = "TAILOR_SNAPSHOT",
        value_delimiter = ',',
        required_unless_present = "kubeconfig",
        conflicts_with = "kubeconfig"
    )]
    pub paths: Vec<PathBuf>,

    /// Read the objects from a live cluster: this kubeconfig FILE, or without a value the
    /// usual lookup ($KUBECONFIG, ~/.kube/config, then the in-cluster service account).
    // Absent, given without a value, or given a file. (An empty default missing value
    // would not do: clap refuses an empty path with "a value is required".)
    #[arg(long, env = "TAILOR_KUBECONFIG", num_args = 0..=1, value_name = "FILE")]
    pub kubeconfig: Option<Option<PathBuf>>,

    /// The kubeconfig context to use (default: the current one).
    #[arg(long, env = "TAILOR_CONTEXT", requires = "kubeconfig")]
    pub context: Option<String>,
}

impl ClusterSourceArgs {
    /// Loads the snapshot files, or lists `kinds` from the cluster (in `namespaces`, or
    /// everywhere when empty); `pending` says whether workloads are expanded into pending
    /// pods.
    pub async fn load(
        &self,
        namespaces: &[String],
        kinds: &[crate::state::cluster::Kind],
        pending: crate::state::PendingPods,
    ) -> Result<crate::state::Snapshot> {
        use crate::state::{Snapshot, cluster};
        let Some(kubeconfig) = &self.kubeconfig else {
            return Snapshot::load_with(&self.paths, pending)
                .map_err(|e| CliError::Input(e.to_string()));
        };
        let file = kubeconfig.as_deref().filter(|p| !p.as_os_str().is_empty());
        let (client, server) = cluster::client(file, self.context.as_deref())
            .await
            .map_err(|e| CliError::Input(e.to_string()))?;
        cluster::read(&client, &server, namespaces, kinds, pending)
            .await
            .map_err(|e| CliError::Input(e.to_string()))
    }
}

/// The output format of a command that reports.
#[derive(Debug, Clone, Copy, Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(
        long,
        short = 'o',
        env = "TAILOR_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: crate::report::Format,
}

/// Which catalog to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CatalogSource {
    /// The built-in catalog, or `--catalog-dir`.
    Builtin,
    /// Live: Resource SKUs for the subscription and the Retail Prices API.
    Azure,
}

/// How Tailor reaches Azure; shared by the live catalog and the Azure cloud.
#[derive(Debug, Clone, Args)]
pub struct AzureArgs {
    /// Azure subscription ID (the live catalog's Resource SKUs and the VMs).
    #[arg(long, env = "AZURE_SUBSCRIPTION_ID")]
    pub subscription_id: Option<String>,

    /// Azure Resource Manager endpoint (another cloud, or a test double). The token scope
    /// is `<endpoint>/.default`.
    #[arg(
        long,
        env = "TAILOR_AZURE_RESOURCE_MANAGER_ENDPOINT",
        default_value = crate::cloud::azure::DEFAULT_ARM_ENDPOINT
    )]
    pub azure_resource_manager_endpoint: String,

    /// Azure Retail Prices endpoint.
    #[arg(
        long,
        env = "TAILOR_AZURE_PRICES_ENDPOINT",
        default_value = crate::cloud::azure::DEFAULT_PRICES_ENDPOINT
    )]
    pub azure_prices_endpoint: String,

    /// Client ID of the identity: workload identity's application when
    /// AZURE_FEDERATED_TOKEN_FILE is set, otherwise the user-assigned managed identity to
    /// use (without it and the two flags below, the system-assigned one).
    #[arg(long, env = "AZURE_CLIENT_ID")]
    pub azure_client_id: Option<String>,

    /// Object (principal) ID of the user-assigned managed identity to use.
    #[arg(long, env = "TAILOR_AZURE_MANAGED_IDENTITY_OBJECT_ID")]
    pub azure_managed_identity_object_id: Option<String>,

    /// ARM resource ID of the user-assigned managed identity to use.
    #[arg(long, env = "TAILOR_AZURE_MANAGED_IDENTITY_RESOURCE_ID")]
    pub azure_managed_identity_resource_id: Option<String>,

    /// Instance Metadata Service base URL for managed-identity tokens (default
    /// http://169.254.169.254, or AZURE_POD_IDENTITY_AUTHORITY_HOST when set).
    #[arg(long, env = "TAILOR_AZURE_IMDS_ENDPOINT")]
    pub azure_imds_endpoint: Option<String>,
}

impl AzureArgs {
    /// The subscription ID, which Azure calls require.
    pub fn subscription(&self, why: &str) -> Result<String> {
        self.subscription_id
            .clone()
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| CliError::InvalidFlag {
                flag: "--subscription-id",
                reason: format!("{why} needs the Azure subscription ID (or AZURE_SUBSCRIPTION_ID)"),
            })
    }

    /// ARM settings for the endpoint: the public cloud's scope, or `<endpoint>/.default`.
    pub fn arm_settings(&self) -> Result<crate::cloud::azure::arm::ArmSettings> {
        let endpoint =
            azure_core::Url::parse(&self.azure_resource_manager_endpoint).map_err(|e| {
                CliError::InvalidFlag {
                    flag: "--azure-resource-manager-endpoint",
                    reason: format!("{:?}: {e}", self.azure_resource_manager_endpoint),
                }
            })?;
        Ok(crate::cloud::azure::arm::ArmSettings::for_endpoint(
            endpoint,
        ))
    }

    /// Which credential the flags and environment select: workload identity when the
    /// webhook's variables are set, else the managed identity (user-assigned when named).
    pub fn auth_settings(&self) -> Result<crate::cloud::azure::auth::AuthSettings> {
        let env = |k: &str| std::env::var(k).ok();
        crate::cloud::azure::auth::AuthSettings::select(crate::cloud::azure::auth::IdentityChoice {
            tenant_id: env("AZURE_TENANT_ID"),
            client_id: self.azure_client_id.clone(),
            federated_token_file: env("AZURE_FEDERATED_TOKEN_FILE"),
            authority_host: env("AZURE_AUTHORITY_HOST"),
            object_id: self.azure_managed_identity_object_id.clone(),
            resource_id: self.azure_managed_identity_resource_id.clone(),
            imds_endpoint: self
                .azure_imds_endpoint
                .clone()
                .or_else(|| env("AZURE_POD_IDENTITY_AUTHORITY_HOST")),
        })
        .map_err(CliError::Input)
    }

    /// The credential [`AzureArgs::auth_settings`] selects.
    pub fn credential(&self) -> Result<std::sync::Arc<dyn azure_core::auth::TokenCredential>> {
        self.auth_settings()?.credential().map_err(CliError::Input)
    }

    /// Reads the live catalog of `region`.
    pub async fn live_catalog(&self, region: &str) -> Result<Catalog> {
        let subscription = self.subscription("--source azure")?;
        let arm = crate::cloud::azure::arm::Arm::new(
            self.credential()?,
            self.arm_settings()?,
            &subscription,
            "",
        );
        let (catalog, _) = crate::cloud::azure::catalog::fetch(
            &arm,
            &reqwest::Client::new(),
            &self.azure_prices_endpoint,
            region,
        )
        .await
        .map_err(|e| CliError::Input(e.to_string()))?;
        Ok(catalog)
    }
}

/// Where instance types and prices come from; shared by every command that prices nodes.
#[derive(Debug, Clone, Args)]
pub struct CatalogSourceArgs {
    /// `builtin` (or `--catalog-dir`), or `azure`: the live catalog for the subscription.
    #[arg(
        long,
        env = "TAILOR_CATALOG_SOURCE",
        value_enum,
        default_value = "builtin"
    )]
    pub source: CatalogSource,

    /// How to reach Azure.
    #[command(flatten)]
    pub azure: AzureArgs,

    /// Directory holding `skus.csv` and `prices.csv` (the full Azure catalog). Without
    /// it, the built-in catalog of common D/E/F sizes is used.
    #[arg(long, env = "TAILOR_CATALOG_DIR")]
    pub catalog_dir: Option<PathBuf>,

    /// Azure region whose prices to use.
    #[arg(long, env = "TAILOR_REGION", default_value = "eastus")]
    pub region: String,

    /// Zones to offer, comma-separated (default: `<region>-1,<region>-2,<region>-3`).
    #[arg(long, env = "TAILOR_ZONES", value_delimiter = ',')]
    pub zones: Vec<String>,

    /// Fraction off the on-demand price used to estimate spot prices (spot prices are
    /// not published in the catalog; every spot price shown is this estimate).
    #[arg(long, env = "TAILOR_SPOT_DISCOUNT", default_value_t = DEFAULT_SPOT_DISCOUNT)]
    pub spot_discount: f64,

    /// Offer on-demand capacity only.
    #[arg(long, env = "TAILOR_NO_SPOT")]
    pub no_spot: bool,

    /// kube-reserved memory formula.
    #[arg(
        long,
        env = "TAILOR_OVERHEAD_MODEL",
        value_enum,
        default_value = "brackets"
    )]
    pub overhead_model: OverheadModelArg,

    /// Pods per node (Azure CNI overlay: 250; node-subnet CNI: 30; kubenet: 110).
    #[arg(long, env = "TAILOR_MAX_PODS", default_value_t = 250)]
    pub max_pods: u32,
}

impl CatalogSourceArgs {
    /// Loads the catalog and the options for turning it into instance types.
    pub fn load(self) -> Result<(Catalog, CatalogOptions)> {
        let CatalogSourceArgs {
            source,
            azure,
            catalog_dir,
            region,
            zones,
            spot_discount,
            no_spot,
            overhead_model,
            max_pods,
        } = self;
        if !(10..=250).contains(&max_pods) {
            return Err(CliError::InvalidFlag {
                flag: "--max-pods",
                reason: format!("{max_pods} is outside 10..=250"),
            });
        }
        let catalog = match (source, &catalog_dir) {
            (CatalogSource::Azure, Some(_)) => {
                return Err(CliError::InvalidFlag {
                    flag: "--catalog-dir",
                    reason: "cannot be combined with --source azure".to_string(),
                });
            }
            (CatalogSource::Azure, None) => {
                // Commands here are synchronous or start their runtime later: read the
                // live catalog on a runtime of its own.
                let region = region.clone();
                std::thread::scope(|scope| {
                    scope
                        .spawn(|| {
                            let rt = tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build()
                                .map_err(CliError::Io)?;
                            rt.block_on(azure.live_catalog(&region))
                        })
                        .join()
                        .unwrap_or_else(|_| {
                            Err(CliError::Input(
                                "reading the live catalog panicked".to_string(),
                            ))
                        })
                })?
            }
            (CatalogSource::Builtin, Some(dir)) => Catalog::load_dir(dir)?,
            (CatalogSource::Builtin, None) => Catalog::builtin()?,
        };
        let options = CatalogOptions {
            region,
            zones,
            spot_discount,
            include_spot: !no_spot,
            node: NodeSettings {
                overhead_model: overhead_model.into(),
                max_pods,
                ..NodeSettings::default()
            },
        };
        Ok((catalog, options))
    }
}
