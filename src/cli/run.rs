//! `tailor run`: the in-cluster agent. Watches the cluster, elects a leader through a
//! Lease, and runs the controllers (provisioning, NodeClaim lifecycle, garbage collection);
//! serves `/metrics`, `/healthz` and `/readyz`. Followers keep warm caches and stay ready;
//! only the leader writes.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use kube::Client;
use tokio::task::JoinSet;

use super::recommend::PrometheusArgs;
use super::{CatalogSourceArgs, CliError, Result};
use crate::clock::{Clock, SystemClock};
use crate::cloud::CloudProvider as _;
use crate::cloud::azure::bootstrap::ClusterBootstrap;
use crate::cloud::azure::resources::Placement;
use crate::cloud::azure::{AzureCloud, AzureSettings};
use crate::cloud::kwok::{KwokCloud, KwokSettings, parse_offering};
use crate::controllers::{self, Context, Settings, State, Writer};
use crate::provisioning::Mode;
use crate::server::{Liveness, Readiness};
use crate::telemetry::Metrics;

/// The cloud the agent buys nodes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CloudArg {
    /// Fake nodes in the cluster itself, run by KWOK or Tailor's kubelet stand-in (tests).
    Kwok,
    /// Azure Resource Manager.
    Azure,
}

/// The agent's global mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Decide and report every decision with its price; change nothing.
    Recommend,
    /// Act on the decisions.
    Autonomous,
}

/// How pending pods are packed onto new nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PackingArg {
    /// Tailor's packer: the cheapest set of sizes for the batch (exact on small batches).
    CostAware,
    /// Karpenter's: each new node takes the pods in turn, first fit (for comparison).
    Greedy,
}

/// What consolidation asks of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsolidationArg {
    /// Tailor's: a saving worth its evictions, capacity the requests' cycle expects within
    /// hours kept, replacements packed cost-aware.
    Tailor,
    /// Karpenter's: any saving at all, whatever it evicts, no look ahead, greedy
    /// replacements (for comparison).
    Karpenter,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `tailor run` settings.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kubeconfig file; without it, `$KUBECONFIG` (several files, `:`-separated, merged as
    /// kubectl merges them), `~/.kube/config`, then the in-cluster service account.
    #[arg(long, env = "TAILOR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// The cluster's name: tagged on every instance, so garbage collection touches only
    /// this cluster's.
    #[arg(long, env = "TAILOR_CLUSTER_NAME", default_value = "tailor")]
    pub cluster_name: String,

    /// Catalog, region and zones.
    #[command(flatten)]
    pub catalog: CatalogSourceArgs,

    /// Where nodes come from.
    #[arg(long, env = "TAILOR_CLOUD", value_enum, default_value = "kwok")]
    pub cloud: CloudArg,

    /// Global mode; a NodePool's `tailor.sh/mode` annotation overrides it for its nodes, and
    /// a RightsizingPolicy's `mode` for the workloads it selects.
    #[arg(long, env = "TAILOR_MODE", value_enum, default_value = "recommend")]
    pub mode: ModeArg,

    /// Prometheus-compatible API base URL that right-sizing reads container usage from;
    /// without it right-sizing is off.
    #[arg(long, env = "TAILOR_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,

    /// How to reach and read Prometheus (the same flags as `tailor recommend`).
    #[command(flatten)]
    pub prometheus: PrometheusArgs,

    /// How often right-sizing reads the usage that came in since its last read and rewrites
    /// the Recommendations.
    #[arg(long, env = "TAILOR_RIGHTSIZING_INTERVAL", default_value = "15m", value_parser = parse_std_duration)]
    pub rightsizing_interval: Duration,

    /// Let RightsizingPolicies with `update.mode: RollingRestart` patch their workloads' pod
    /// templates (it needs `patch` on Deployments, StatefulSets and DaemonSets, which the
    /// chart grants only with `settings.rightsizingRollingRestart`). Off, such policies are
    /// told so by an Event on each Recommendation, and new pods still get the
    /// recommendation from the webhook.
    #[arg(long, env = "TAILOR_RIGHTSIZING_ROLLING_RESTART")]
    pub rightsizing_rolling_restart: bool,

    /// Address the admission webhook listens on (HTTPS), e.g. `0.0.0.0:9443`; without it
    /// the webhook is off and new pods keep the requests they are created with.
    #[arg(long, env = "TAILOR_WEBHOOK_ADDRESS")]
    pub webhook_address: Option<SocketAddr>,

    /// URL the API server calls the webhook at (`https://`). A Service's cluster name
    /// (`https://<service>.<namespace>.svc:<port>/<path>`) is written to the configuration
    /// as a Service reference. Default: the chart's Service,
    /// `https://tailor.<namespace>.svc:9443/mutate-pods`.
    #[arg(long, env = "TAILOR_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// Directory holding the webhook's serving certificate (`tls.crt`, `tls.key`, and
    /// `ca.crt` for the configuration's `caBundle` when present), e.g. a mounted Secret; it is
    /// read again every minute. Without it the agent makes a CA and certificate, shares them
    /// between replicas through the Secret `tailor-webhook-cert` and keeps the `caBundle` in step.
    #[arg(long, env = "TAILOR_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,

    /// Address of the Prometheus `/metrics` endpoint.
    #[arg(long, env = "TAILOR_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: SocketAddr,

    /// Address of `/healthz` and `/readyz`.
    #[arg(long, env = "TAILOR_HEALTH_ADDRESS", default_value = "0.0.0.0:8081")]
    pub health_address: SocketAddr,

    /// Namespace of the leader-election Lease (default: the pod's namespace, else `default`).
    #[arg(long, env = "TAILOR_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "TAILOR_LEADER_ELECTION_NAME",
        default_value = "tailor-leader"
    )]
    pub leader_election_name: String,

    /// Close a provisioning batch after this long without a new pending pod.
    #[arg(long, env = "TAILOR_BATCH_IDLE", default_value = "1s", value_parser = parse_std_duration)]
    pub batch_idle: Duration,

    /// Close a provisioning batch this long after it opened.
    #[arg(long, env = "TAILOR_BATCH_MAX", default_value = "10s", value_parser = parse_std_duration)]
    pub batch_max: Duration,

    /// Buy capacity this far ahead of the growth the requests' daily and weekly cycle
    /// expects (learnt while the agent runs and kept in the ConfigMap
    /// `tailor-demand-history`); `0s` buys only for pending pods.
    #[arg(long, env = "TAILOR_HEADROOM_LEAD", default_value = "3h", value_parser = parse_std_duration)]
    pub headroom_lead: Duration,

    /// How pending pods are packed onto new nodes.
    #[arg(long, env = "TAILOR_PACKING", value_enum, default_value = "cost-aware")]
    pub packing: PackingArg,

    /// What consolidation asks of a decision before it removes or replaces nodes.
    #[arg(
        long,
        env = "TAILOR_CONSOLIDATION",
        value_enum,
        default_value = "tailor"
    )]
    pub consolidation: ConsolidationArg,

    /// Log format.
    #[arg(long, env = "TAILOR_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// `--cloud kwok`: delay between a launch and the Node's creation.
    #[arg(long, env = "TAILOR_KWOK_LAUNCH_DELAY", default_value = "0s", value_parser = parse_std_duration)]
    pub kwok_launch_delay: Duration,

    /// `--cloud kwok`: offerings that fail with insufficient capacity, as
    /// `TYPE/ZONE/CAPACITY-TYPE` (comma-separated or repeated), to exercise fallbacks.
    #[arg(long, env = "TAILOR_KWOK_NO_CAPACITY", value_delimiter = ',', value_parser = parse_offering)]
    pub kwok_no_capacity: Vec<(String, String, crate::model::CapacityType)>,

    /// How long an offering that failed for lack of capacity is not tried again.
    #[arg(long, env = "TAILOR_UNAVAILABLE_OFFERINGS_TTL", default_value = "3m", value_parser = parse_std_duration)]
    pub unavailable_offerings_ttl: Duration,

    /// How often garbage collection looks for instances without a NodeClaim.
    #[arg(long, env = "TAILOR_GC_INTERVAL", default_value = "30s", value_parser = parse_std_duration)]
    pub gc_interval: Duration,

    /// Multiplies the protocol timers (the leader-election Lease, disruption's validation
    /// delay and evaluation interval, the provisioner's re-plan cover) by this factor, in
    /// `(0, 1]`. For end-to-end tests, which then see the same sequence of events sooner;
    /// production runs at 1.
    #[arg(long, env = "TAILOR_TIMER_SCALE", default_value = "1", value_parser = parse_timer_scale, hide = true)]
    pub timer_scale: f64,

    /// `--cloud azure`: where and how nodes are made.
    #[command(flatten)]
    pub azure: AzureNodeArgs,
}

/// Settings of `--cloud azure` (the subscription and endpoints are the catalog's
/// `--subscription-id`, `--azure-resource-manager-endpoint`, `--azure-prices-endpoint`).
#[derive(Debug, Args)]
pub struct AzureNodeArgs {
    /// Resource group the node VMs and NICs go to (AKS's `MC_` group).
    #[arg(long, env = "AZURE_NODE_RESOURCE_GROUP")]
    pub azure_node_resource_group: Option<String>,

    /// Subnet of node NICs when the AKSNodeClass names none.
    #[arg(long, env = "AZURE_SUBNET_ID")]
    pub azure_subnet_id: Option<String>,

    /// SSH public key of the nodes' admin user (the only login).
    #[arg(long, env = "AZURE_SSH_PUBLIC_KEY")]
    pub azure_ssh_public_key: Option<String>,

    /// Admin user of the node VMs.
    #[arg(long, env = "AZURE_ADMIN_USERNAME", default_value = "azureuser")]
    pub azure_admin_username: String,

    /// User-assigned identities attached to every node VM (the kubelet identity),
    /// comma-separated resource IDs.
    #[arg(long, env = "AZURE_NODE_IDENTITIES", value_delimiter = ',')]
    pub azure_node_identities: Vec<String>,

    /// The API server URL nodes join.
    #[arg(long, env = "TAILOR_CLUSTER_ENDPOINT")]
    pub cluster_endpoint: Option<String>,

    /// The cluster CA bundle, base64-encoded PEM, for joining nodes.
    #[arg(long, env = "TAILOR_CLUSTER_CA_BUNDLE")]
    pub cluster_ca_bundle: Option<String>,

    /// A kubelet bootstrap token; without it nodes use secure TLS bootstrapping.
    #[arg(long, env = "TAILOR_KUBELET_BOOTSTRAP_TOKEN")]
    pub kubelet_bootstrap_token: Option<String>,

    /// The cluster DNS service IP.
    #[arg(long, env = "TAILOR_CLUSTER_DNS", default_value = "10.0.0.10")]
    pub cluster_dns: String,

    /// Poll interval of ARM operations that give no Retry-After.
    #[arg(long, env = "TAILOR_AZURE_POLL_INTERVAL", default_value = "3s", value_parser = parse_std_duration)]
    pub azure_poll_interval: Duration,

    /// How often the live catalog (Resource SKUs, Retail Prices) is read again.
    #[arg(long, env = "TAILOR_AZURE_CATALOG_REFRESH", default_value = "12h", value_parser = parse_std_duration)]
    pub azure_catalog_refresh: Duration,
}

impl AzureNodeArgs {
    /// The environment variable of one of these flags, as `tailor run --help` shows it.
    fn env_of(flag: &str) -> String {
        let long = flag.trim_start_matches("--");
        <AzureNodeArgs as Args>::augment_args(clap::Command::new("run"))
            .get_arguments()
            .find(|a| a.get_long() == Some(long))
            .and_then(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_else(|| flag.to_string())
    }

    fn require(value: Option<String>, flag: &'static str) -> Result<String> {
        value
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| CliError::InvalidFlag {
                flag,
                reason: format!(
                    "required with --cloud azure (the chart passes it in extraEnv as {}); see \
                     docs/install.md#where-the-nodes-go-and-how-they-join",
                    Self::env_of(flag)
                ),
            })
    }
}

/// What `--cloud azure` runs with, checked before the agent connects anywhere.
struct AzureSetup {
    settings: AzureSettings,
    credential: Arc<dyn azure_core::auth::TokenCredential>,
    catalog_refresh: Duration,
}

impl AzureNodeArgs {
    /// The settings of `--cloud azure`, or the first one missing, named with its variable
    /// and the docs. Nodes need a way to join: a bootstrap token, or an identity on the VM
    /// for AKS's secure TLS bootstrapping; without either every VM would be paid for and
    /// never become a node.
    fn setup(
        self,
        access: &super::AzureArgs,
        options: &crate::catalog::CatalogOptions,
        cluster_name: &str,
    ) -> Result<AzureSetup> {
        let AzureNodeArgs {
            azure_node_resource_group,
            azure_subnet_id,
            azure_ssh_public_key,
            azure_admin_username,
            azure_node_identities,
            cluster_endpoint,
            cluster_ca_bundle,
            kubelet_bootstrap_token,
            cluster_dns,
            azure_poll_interval,
            azure_catalog_refresh,
        } = self;
        let mut arm = access.arm_settings()?;
        arm.poll_interval = azure_poll_interval;
        let bootstrap_token = kubelet_bootstrap_token.filter(|t| !t.trim().is_empty());
        let node_identities: Vec<String> = azure_node_identities
            .into_iter()
            .filter(|i| !i.trim().is_empty())
            .collect();
        let settings = AzureSettings {
            placement: Placement {
                subscription_id: access.subscription("--cloud azure")?,
                resource_group: Self::require(
                    azure_node_resource_group,
                    "--azure-node-resource-group",
                )?,
                location: options.region.to_ascii_lowercase(),
                default_subnet_id: Self::require(azure_subnet_id, "--azure-subnet-id")?,
                admin_username: azure_admin_username,
                ssh_public_key: Self::require(azure_ssh_public_key, "--azure-ssh-public-key")?,
                node_identities,
            },
            cluster_name: cluster_name.to_string(),
            bootstrap: ClusterBootstrap {
                api_server: Self::require(cluster_endpoint, "--cluster-endpoint")?,
                ca_bundle_base64: Self::require(cluster_ca_bundle, "--cluster-ca-bundle")?,
                bootstrap_token,
                cluster_dns,
                default_max_pods: options.node.max_pods,
            },
            arm,
            prices_endpoint: access.azure_prices_endpoint.clone(),
            throttle_backoff: Duration::from_secs(60),
        };
        if settings.bootstrap.bootstrap_token.is_none()
            && settings.placement.node_identities.is_empty()
        {
            return Err(CliError::InvalidFlag {
                flag: "--azure-node-identities",
                reason: format!(
                    "nodes could not join the cluster: with --cloud azure give the nodes an \
                     identity for AKS's secure TLS bootstrapping ({}, the kubelet identity's \
                     resource ID) or a bootstrap token ({}); the chart passes either in \
                     extraEnv; see docs/install.md#where-the-nodes-go-and-how-they-join",
                    Self::env_of("--azure-node-identities"),
                    Self::env_of("--kubelet-bootstrap-token"),
                ),
            });
        }
        Ok(AzureSetup {
            settings,
            credential: access.credential()?,
            catalog_refresh: azure_catalog_refresh,
        })
    }
}

impl Settings {
    /// These settings with `consolidation`'s rules.
    fn with_consolidation(self, consolidation: ConsolidationArg) -> Self {
        match consolidation {
            ConsolidationArg::Tailor => self,
            ConsolidationArg::Karpenter => Settings {
                disruption: crate::disruption::Settings::karpenter(),
                forecast_horizon: 0,
                ..self
            },
        }
    }
}

/// Parses a Go-style duration (`1s`, `500ms`, `3m`) into a non-negative std duration.
fn parse_std_duration(s: &str) -> std::result::Result<Duration, String> {
    let d = if let Some(ms) = s.strip_suffix("ms") {
        ms.parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 1s, 3m)"))?
    } else {
        let d = crate::apis::duration::parse_duration(s).map_err(|e| e.to_string())?;
        Duration::try_from(d).map_err(|_| format!("{s:?} must not be negative"))?
    };
    Ok(d)
}

/// Parses `--timer-scale`: a factor in `(0, 1]`.
fn parse_timer_scale(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("{s:?} is not a factor in (0, 1]")),
    }
}

/// How long the agent's first request to the API server may wait for an answer before the
/// agent stops, naming the server and the cause.
const API_SERVER_TIMEOUT: Duration = Duration::from_secs(10);

/// The identity this replica campaigns under: `$POD_NAME` (the chart passes it through the
/// downward API), else the hostname with a random suffix.
fn identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.is_empty()
    {
        return pod;
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tailor".to_string());
    format!("{host}-{:08x}", rand::random::<u32>())
}

/// Runs the agent until SIGINT or SIGTERM.
pub fn run(args: RunArgs, out: &mut dyn Write) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CliError::Io)?;
    let result = runtime.block_on(agent(args, out));
    // Tasks that ignore cancellation (a blocked exporter, a client mid-request) must not
    // keep a terminating pod alive past its grace period.
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

async fn agent(args: RunArgs, out: &mut dyn Write) -> Result<()> {
    let RunArgs {
        kubeconfig,
        cluster_name,
        catalog,
        cloud,
        mode,
        prometheus_url,
        prometheus,
        rightsizing_interval,
        rightsizing_rolling_restart,
        webhook_address,
        webhook_url,
        webhook_cert_dir,
        metrics_address,
        health_address,
        leader_election_namespace,
        leader_election_name,
        batch_idle,
        batch_max,
        headroom_lead,
        packing,
        consolidation,
        log_format: _,
        kwok_launch_delay,
        kwok_no_capacity,
        unavailable_offerings_ttl,
        gc_interval,
        timer_scale,
        azure,
    } = args;
    if rightsizing_interval.is_zero() {
        return Err(CliError::InvalidFlag {
            flag: "--rightsizing-interval",
            reason: "must be longer than 0s".to_string(),
        });
    }
    if cluster_name.trim().is_empty() {
        return Err(CliError::InvalidFlag {
            flag: "--cluster-name",
            reason: "is empty (TAILOR_CLUSTER_NAME; the chart's settings.clusterName): every VM \
                     Tailor creates is tagged with it and garbage collection deletes only the \
                     VMs tagged with it, so it must name this cluster; see docs/install.md#install"
                .to_string(),
        });
    }
    // Checked before anything starts, so a bad flag is reported at once.
    let prometheus = prometheus_url
        .filter(|u| !u.trim().is_empty())
        .map(|url| prometheus.settings(&url, &catalog.azure))
        .transpose()?;
    let azure_access = catalog.azure.clone();
    let (catalog, catalog_options) = catalog.load()?;
    let types = catalog.instance_types(&catalog_options)?;
    // Azure's settings and identity are checked before anything connects, so a missing one
    // is reported at once, naming its variable and the docs.
    let azure_setup = match cloud {
        CloudArg::Azure => Some(azure.setup(&azure_access, &catalog_options, &cluster_name)?),
        CloudArg::Kwok => None,
    };
    let file = kubeconfig.as_deref().filter(|p| !p.as_os_str().is_empty());
    let (client, server) = crate::state::cluster::client(file, None)
        .await
        .map_err(|e| CliError::Input(e.to_string()))?;
    crate::state::cluster::check_reachable(&client, &server, API_SERVER_TIMEOUT)
        .await
        .map_err(|e| CliError::Input(e.to_string()))?;
    let write_client = crate::state::cluster::write_client(file)
        .await
        .map_err(|e| CliError::Input(e.to_string()))?;
    let metrics = Metrics::new(&opentelemetry::global::meter("tailor"));
    record_catalog(&metrics, &types);
    let ready = Readiness::default();
    let live = Liveness::default();
    let mut tasks = JoinSet::new();
    // Every listener shares the process' descriptors: the limits leave half to the agent.
    let listeners =
        1 + usize::from(metrics_address != health_address) + usize::from(webhook_address.is_some());
    let limits = crate::server::ConnectionLimits::scaled(timer_scale).within_descriptors(listeners);
    serve(
        &mut tasks,
        metrics_address,
        health_address,
        &metrics,
        &ready,
        &live,
        limits,
    )
    .await?;

    let identity = identity();
    let namespace = leader_election_namespace
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| "default".to_string());
    let election = elect(
        &client,
        &namespace,
        &leader_election_name,
        &identity,
        timer_scale,
        &metrics,
        &live,
    );
    let leader = election.leader();

    let state = State::start(&client, &mut tasks);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let settings = Settings {
        mode: match mode {
            ModeArg::Recommend => Mode::RecommendOnly,
            ModeArg::Autonomous => Mode::Autonomous,
        },
        cluster_name: cluster_name.clone(),
        batch_idle,
        batch_max,
        gc_interval,
        prometheus,
        rightsizing_interval,
        rolling_restart: rightsizing_rolling_restart,
        namespace: namespace.clone(),
        webhook: webhook_address.is_some(),
        headroom_lead: i64::try_from(headroom_lead.as_secs()).unwrap_or(i64::MAX),
        cost_aware: packing == PackingArg::CostAware,
        timers: controllers::Timers::scaled(timer_scale),
        ..Settings::default()
    }
    .with_consolidation(consolidation);
    let writer = Writer::new(write_client, leader.clone(), &identity);
    if let Some(address) = webhook_address {
        let endpoint = crate::webhook::Endpoint::parse(
            &webhook_url
                .filter(|u| !u.trim().is_empty())
                .unwrap_or_else(|| crate::webhook::default_url(&namespace)),
        )
        .map_err(|reason| CliError::InvalidFlag {
            flag: "--webhook-url",
            reason,
        })?;
        let webhook = Webhook {
            address,
            endpoint,
            limits,
            cert_dir: webhook_cert_dir.filter(|d| !d.as_os_str().is_empty()),
            settings: crate::webhook::Settings {
                global_mode: match mode {
                    ModeArg::Recommend => crate::apis::Mode::Recommend,
                    ModeArg::Autonomous => crate::apis::Mode::Auto,
                },
                agent_namespace: namespace.clone(),
            },
        };
        webhook
            .start(&mut tasks, &state, writer.clone(), &metrics)
            .await?;
    }
    match azure_setup {
        None => {
            let cloud = KwokCloud::new(
                client.clone(),
                clock.clone(),
                types,
                KwokSettings {
                    cluster_name,
                    launch_delay: kwok_launch_delay,
                    no_capacity: kwok_no_capacity.into_iter().collect(),
                    unavailable_ttl: jiff::SignedDuration::try_from(unavailable_offerings_ttl)
                        .unwrap_or(jiff::SignedDuration::from_mins(3)),
                },
            );
            // Every cloud call is counted, timed and its failures counted by kind.
            let cloud = crate::cloud::metered::MeteredCloud::new(cloud, Some(metrics.clone()));
            let ctx = Arc::new(Context {
                state: state.clone(),
                writer,
                cloud,
                metrics: metrics.clone(),
                clock,
                catalog: std::sync::Arc::new(std::sync::RwLock::new(catalog)),
                catalog_options,
                rightsizing: settings.prometheus.is_some(),
                settings,
                demand: Default::default(),
                names: controllers::Names::random(),
            });
            controllers::run(ctx, &mut tasks);
        }
        Some(AzureSetup {
            settings: settings_azure,
            credential,
            catalog_refresh,
        }) => {
            let shared = Arc::new(std::sync::RwLock::new(catalog));
            let cloud = AzureCloud::new(
                credential,
                settings_azure,
                clock.clone(),
                shared.clone(),
                catalog_options.clone(),
            );
            // The built-in (or given) catalog serves until the live one is read.
            if let Err(e) = cloud.refresh_catalog().await {
                tracing::warn!(error = %e, "live catalog unavailable; using the {} catalog until the next refresh", shared.read().map(|c| c.source.clone()).unwrap_or_default());
            }
            match cloud.collect_leaked().await {
                Ok(n) if n > 0 => tracing::info!(
                    resources = n,
                    "deleted network interfaces a crash left behind"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "looking for leaked network interfaces failed")
                }
            }
            tasks.spawn(cloud.clone().refresh_forever(catalog_refresh));
            let ctx = Arc::new(Context {
                state: state.clone(),
                writer,
                cloud,
                metrics: metrics.clone(),
                clock,
                catalog: shared,
                catalog_options,
                rightsizing: settings.prometheus.is_some(),
                settings,
                demand: Default::default(),
                names: controllers::Names::random(),
            });
            controllers::run(ctx, &mut tasks);
        }
    }
    writeln!(out, "tailor agent {identity} watching {server}")?;
    out.flush()?;
    tokio::select! {
        () = state.wait_synced() => {
            ready.set(true);
            tracing::info!("caches synced; ready");
        }
        () = shutdown_signal() => {
            election.stop(Duration::from_secs(3)).await;
            let _ = tokio::time::timeout(Duration::from_secs(5), tasks.shutdown()).await;
            return Ok(());
        }
    }
    shutdown_signal().await;
    tracing::info!("shutting down");
    // The Lease is released first, so a follower leads while this replica winds down.
    election.stop(Duration::from_secs(3)).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), tasks.shutdown()).await;
    Ok(())
}

async fn serve(
    tasks: &mut JoinSet<()>,
    metrics_address: SocketAddr,
    health_address: SocketAddr,
    metrics: &Metrics,
    ready: &Readiness,
    live: &Liveness,
    limits: crate::server::ConnectionLimits,
) -> Result<()> {
    use crate::telemetry::names::Listener;
    let addresses = if metrics_address == health_address {
        vec![(metrics_address, Listener::Metrics)]
    } else {
        vec![
            (metrics_address, Listener::Metrics),
            (health_address, Listener::Health),
        ]
    };
    for (address, name) in addresses {
        // Bind before anything else starts, so an address in use is reported at once.
        let listener =
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|e| CliError::InvalidFlag {
                    flag: "--metrics-address/--health-address",
                    reason: format!("binding {address}: {e}"),
                })?;
        let router = crate::server::router(metrics.clone(), ready.clone(), live.clone());
        tasks.spawn(crate::server::serve_connections(
            listener,
            router,
            None,
            limits,
            name,
            Some(metrics.clone()),
        ));
    }
    Ok(())
}

/// The admission webhook's settings, from `--webhook-*`.
struct Webhook {
    address: SocketAddr,
    endpoint: crate::webhook::Endpoint,
    limits: crate::server::ConnectionLimits,
    cert_dir: Option<PathBuf>,
    settings: crate::webhook::Settings,
}

impl Webhook {
    /// Binds the address and reads a mounted certificate at once (so a bad flag stops the
    /// agent), then on `tasks`: makes or reads the shared certificate when none is mounted,
    /// serves, and keeps the configuration applied. Every replica does this; it writes only
    /// the webhook's own objects.
    async fn start(
        self,
        tasks: &mut JoinSet<()>,
        state: &State,
        writer: Writer,
        metrics: &Metrics,
    ) -> Result<()> {
        use crate::webhook::{self, certificate};
        let Webhook {
            address,
            endpoint,
            limits,
            cert_dir,
            settings,
        } = self;
        let listener =
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|e| CliError::InvalidFlag {
                    flag: "--webhook-address",
                    reason: format!("binding {address}: {e}"),
                })?;
        let namespace = settings.agent_namespace.clone();
        let mounted = match &cert_dir {
            Some(dir) => {
                let invalid = |e: certificate::CertificateError| CliError::InvalidFlag {
                    flag: "--webhook-cert-dir",
                    reason: e.to_string(),
                };
                let cert = certificate::read_dir(dir).map_err(invalid)?;
                let key = certificate::certified_key(&cert).map_err(invalid)?;
                Some((cert, key))
            }
            None => None,
        };
        let router = webhook::router(
            Arc::new(webhook::Stores::of(state, &namespace)),
            settings,
            Some(metrics.clone()),
        );
        let served_metrics = metrics.clone();
        tasks.spawn(async move {
            let (cert, resolver) = match mounted {
                Some((cert, key)) => {
                    let resolver = certificate::Resolver::new(key);
                    if let Some(dir) = cert_dir {
                        tokio::spawn(
                            resolver
                                .clone()
                                .reload_forever(dir, Duration::from_secs(60)),
                        );
                    }
                    (cert, resolver)
                }
                None => loop {
                    match shared_certificate(&writer, &namespace, &endpoint).await {
                        Ok(pair) => break pair,
                        Err(e) => {
                            tracing::warn!(error = %e, "webhook certificate unavailable; retrying in 10s (pods are created unchanged meanwhile)");
                            tokio::time::sleep(Duration::from_secs(10)).await;
                        }
                    }
                },
            };
            tracing::info!(address = %address, url = %endpoint.url, "admission webhook serving");
            let configuration =
                webhook::configuration(&endpoint, cert.ca_pem.as_deref(), &namespace);
            tokio::spawn(async move {
                // Applied again every few minutes, so a configuration deleted or edited by
                // hand comes back with the caBundle that fits the certificate served.
                loop {
                    if let Err(e) = writer.apply_webhook_configuration(&configuration).await {
                        tracing::warn!(error = %e, "applying the webhook configuration failed");
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        continue;
                    }
                    tokio::time::sleep(Duration::from_secs(300)).await;
                }
            });
            webhook::serve_tls(listener, resolver, router, limits, Some(served_metrics)).await;
        });
        Ok(())
    }
}

/// The certificate every replica serves when none is mounted: the Secret's, made here when
/// it is missing or was made for other hosts.
async fn shared_certificate(
    writer: &Writer,
    namespace: &str,
    endpoint: &crate::webhook::Endpoint,
) -> std::result::Result<
    (
        crate::webhook::certificate::ServingCertificate,
        Arc<crate::webhook::certificate::Resolver>,
    ),
    String,
> {
    use crate::webhook::{CERTIFICATE_SECRET, HOSTS_ANNOTATION, certificate};
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    let hosts = endpoint.hosts();
    let joined = hosts.join(",");
    let generated = certificate::generate(&hosts).map_err(|e| e.to_string())?;
    let wanted = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(CERTIFICATE_SECRET.to_string()),
            namespace: Some(namespace.to_string()),
            annotations: Some([(HOSTS_ANNOTATION.to_string(), joined.clone())].into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(
            [
                ("tls.crt", &generated.cert_pem),
                ("tls.key", &generated.key_pem),
                (
                    "ca.crt",
                    generated.ca_pem.as_ref().unwrap_or(&generated.cert_pem),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect(),
        ),
        ..Default::default()
    };
    let field = |s: &Secret, key: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    let current = |s: &Secret| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HOSTS_ANNOTATION))
            == Some(&joined)
            && ["tls.crt", "tls.key", "ca.crt"]
                .iter()
                .all(|k| field(s, k).is_some())
    };
    let secret = writer
        .ensure_secret(namespace, &wanted, current)
        .await
        .map_err(|e| e.to_string())?;
    let cert = certificate::ServingCertificate {
        cert_pem: field(&secret, "tls.crt").unwrap_or_default(),
        key_pem: field(&secret, "tls.key").unwrap_or_default(),
        ca_pem: field(&secret, "ca.crt"),
    };
    let key = certificate::certified_key(&cert)
        .map_err(|e| format!("secret {namespace}/{CERTIFICATE_SECRET}: {e}"))?;
    Ok((cert, certificate::Resolver::new(key)))
}

/// Campaigns for the Lease ([`controllers::leader`]); the election's receiver says whether
/// this replica leads now. Losing the Lease is seen within one retry period, and every write
/// checks it first.
fn elect(
    client: &Client,
    namespace: &str,
    name: &str,
    identity: &str,
    timer_scale: f64,
    metrics: &Metrics,
    live: &Liveness,
) -> controllers::leader::Election {
    let settings = controllers::leader::Settings::scaled(namespace, name, identity, timer_scale);
    metrics.set_leader(false);
    let metrics = metrics.clone();
    controllers::leader::start(client.clone(), settings, live.clone(), move |leads| {
        metrics.set_leader(leads);
        tracing::info!(leader = leads, "leadership changed");
    })
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Records what the catalog offers per capacity type and when it was loaded.
pub(crate) fn record_catalog(metrics: &Metrics, types: &[crate::model::InstanceType]) {
    for capacity in [
        crate::model::CapacityType::Spot,
        crate::model::CapacityType::OnDemand,
    ] {
        let offered = types
            .iter()
            .filter(|t| t.offerings.iter().any(|o| o.capacity_type == capacity))
            .count();
        metrics.set_catalog_instance_types(capacity.as_str(), offered);
    }
    metrics.set_catalog_updated(jiff::Timestamp::now().as_second());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_azure_setting_names_its_flag_its_variable_and_the_docs_page() {
        let e =
            AzureNodeArgs::require(Some("  ".to_string()), "--azure-subnet-id").expect_err("blank");
        let text = e.to_string();
        assert!(
            text.starts_with("--azure-subnet-id: required with --cloud azure")
                && text.contains("AZURE_SUBNET_ID")
                && text.contains("docs/install.md#where-the-nodes-go-and-how-they-join"),
            "{text}"
        );
        assert_eq!(
            AzureNodeArgs::require(Some("x".to_string()), "--azure-subnet-id").ok(),
            Some("x".to_string())
        );
    }

    #[test]
    fn the_timer_scale_is_a_factor_in_zero_to_one() {
        assert!(parse_timer_scale("0.2").is_ok());
        for bad in ["0", "-1", "1.5", "fast"] {
            let e = parse_timer_scale(bad).expect_err(bad);
            assert!(e.contains(bad), "{e}");
        }
    }
}
