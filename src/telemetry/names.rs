//! Every metric Tailor exports, in one place: its name, type, unit, labels and meaning
//! ([`CATALOGUE`]), the label keys, the bounded sets of label values as enums, and the
//! histogram bucket boundaries. The metrics facade registers exactly the catalogue, the
//! reference page `docs/metrics.md` is generated from it, and the dashboards and alert rules
//! are checked against it, so a renamed metric fails a test everywhere it is used.

/// A metric's type, as Prometheus exposes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// Only goes up; exposed with a `_total` suffix.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets; exposed as `_bucket`, `_sum` and `_count`.
    Histogram,
}

impl MetricType {
    /// The name Prometheus uses for the type.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
}

/// What the reference page says about one metric; the facade registers it from this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricDef {
    /// The family name (counters without their `_total` suffix).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricType,
    /// Unit of the value (`seconds`, `dollars per hour`, `1` for counts).
    pub unit: &'static str,
    /// Label keys, in exposition order.
    pub labels: &'static [&'static str],
    /// What it means; the exposition's HELP text.
    pub help: &'static str,
    /// Which part records it.
    pub area: Area,
}

impl MetricDef {
    /// The series names Prometheus stores for this family.
    pub fn series_names(&self) -> Vec<String> {
        match self.kind {
            MetricType::Counter => vec![format!("{}_total", self.name)],
            MetricType::Gauge => vec![self.name.to_string()],
            MetricType::Histogram => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|s| format!("{}{s}", self.name))
                .collect(),
        }
    }
}

/// The part of Tailor a metric belongs to (a section of the reference page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Area {
    /// Pending pods to running nodes.
    Provisioning,
    /// What the nodes cost and what was saved.
    Cost,
    /// Consolidation, drift, expiration and draining.
    Disruption,
    /// Requests from usage history.
    Rightsizing,
    /// The agent process itself.
    Agent,
}

impl Area {
    /// Heading on the reference page.
    pub fn title(self) -> &'static str {
        match self {
            Area::Provisioning => "Provisioning",
            Area::Cost => "Cost",
            Area::Disruption => "Disruption",
            Area::Rightsizing => "Right-sizing",
            Area::Agent => "Agent",
        }
    }
}

/// Label keys. Values are always bounded sets (no pod names, no free text).
pub mod label {
    /// Tailor version.
    pub const VERSION: &str = "version";
    /// NodePool name (bounded by the NodePools a cluster defines).
    pub const NODEPOOL: &str = "nodepool";
    /// VM size (bounded by the catalog).
    pub const INSTANCE_TYPE: &str = "instance_type";
    /// `spot` or `on-demand`.
    pub const CAPACITY_TYPE: &str = "capacity_type";
    /// Zone label value.
    pub const ZONE: &str = "zone";
    /// Cloud operation: [`super::CloudOperation`].
    pub const OPERATION: &str = "operation";
    /// Error kind from `CloudError::kind`.
    pub const ERROR_KIND: &str = "kind";
    /// Decision name: [`super::Decision`].
    pub const DECISION: &str = "decision";
    /// Kubernetes kind.
    pub const KIND: &str = "kind";
    /// Disruption method: [`super::METHODS`].
    pub const METHOD: &str = "method";
    /// `recommend` or `autonomous`.
    pub const MODE: &str = "mode";
    /// Why a NodeClaim went away: [`super::TerminationReason`]; why a node was left:
    /// [`super::BlockedReason`].
    pub const REASON: &str = "reason";
    /// A NodeClaim's lifecycle step: [`super::Stage`].
    pub const STAGE: &str = "stage";
    /// Namespace (bounded by the cluster's namespaces).
    pub const NAMESPACE: &str = "namespace";
    /// `requested` or `used`: [`super::Usage`].
    pub const USAGE: &str = "usage";
    /// Where a saving comes from: [`super::SavingsSource`].
    pub const SOURCE: &str = "source";
    /// A recommendation's state: [`super::RecommendationState`].
    pub const STATE: &str = "state";
    /// `before` or `after` right-sizing: [`super::When`].
    pub const WHEN: &str = "when";
    /// Which requests a provisioning plan used: [`super::PlanRequests`].
    pub const REQUESTS: &str = "requests";
    /// A controller: [`super::Controller`].
    pub const CONTROLLER: &str = "controller";
    /// An OTLP signal: [`super::Signal`].
    pub const SIGNAL: &str = "signal";
    /// A kind of usage query: [`super::PrometheusQuery`].
    pub const QUERY: &str = "query";
    /// What the admission webhook did with a pod: [`super::WebhookOutcome`].
    pub const OUTCOME: &str = "outcome";
    /// One of the agent's HTTP listeners: [`super::Listener`].
    pub const LISTENER: &str = "listener";
}

macro_rules! vocabulary {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $value:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// Every value, for the reference page.
            pub const ALL: &[$name] = &[$($name::$variant),+];

            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $value),+
                }
            }
        }
    };
}

vocabulary!(
    /// A NodeClaim's lifecycle step, timed from the step before.
    Stage {
        /// Created → the cloud accepted the VM.
        Launched => "launched",
        /// Launched → its Node joined the cluster.
        Registered => "registered",
        /// Registered → the Node is ready for pods.
        Initialized => "initialized",
    }
);

vocabulary!(
    /// Why a NodeClaim was deleted.
    TerminationReason {
        /// Consolidation: a node with only DaemonSet pods.
        Empty => "empty",
        /// Its NodePool or node class changed.
        Drift => "drift",
        /// Consolidation of several nodes.
        Multi => "multi",
        /// Consolidation of one node.
        Single => "single",
        /// Older than `expireAfter`.
        Expiration => "expiration",
        /// Consolidation carried out by the demo's disrupter.
        Consolidation => "consolidation",
        /// Its node did not register in time.
        Liveness => "liveness",
        /// The cloud could not launch it.
        LaunchFailed => "launch_failed",
        /// The cloud reclaimed a spot VM.
        Interrupted => "interrupted",
        /// Deleted by someone else.
        Deleted => "deleted",
        /// A reason outside this list (an annotation set by hand).
        Other => "other",
    }
);

impl TerminationReason {
    /// The reason for a label value written by Tailor; anything else is `other`, which keeps
    /// the label bounded whatever a person writes in the annotation.
    pub fn parse(value: &str) -> Self {
        Self::ALL
            .iter()
            .copied()
            .find(|r| r.as_str() == value)
            .unwrap_or(TerminationReason::Other)
    }
}

vocabulary!(
    /// Cloud operations, one per `CloudProvider` method.
    CloudOperation {
        /// Launch a VM.
        Create => "create",
        /// Delete a VM.
        Delete => "delete",
        /// Read one VM.
        Get => "get",
        /// List the VMs.
        List => "list",
        /// Sizes and offerings on sale.
        InstanceTypes => "instance_types",
        /// Drift check of one VM.
        IsDrifted => "is_drifted",
        /// Spot interruption notices.
        Interruptions => "interruptions",
    }
);

vocabulary!(
    /// Timed pure decisions.
    Decision {
        /// Pending pods onto existing and new nodes.
        Scheduling => "scheduling",
        /// The agent's consolidation pass.
        Consolidation => "consolidation",
        /// The demo's disruption pass (consolidation, drift, expiration).
        Disruption => "disruption",
        /// One launch through the cloud.
        Launch => "launch",
        /// Recommendations for every workload.
        Rightsizing => "rightsizing",
    }
);

/// Cloud error kinds (label `kind` of the cloud error counter), as `CloudError::kind` names
/// them. The counter starts at zero for each, so a rate is 0 rather than absent.
pub const CLOUD_ERROR_KINDS: &[&str] = &[
    "insufficient_capacity",
    "quota",
    "invalid_request",
    "not_found",
    "throttled",
];

/// Disruption methods (label `method`), as `disruption::Method` names them.
pub const METHODS: &[&str] = &["empty", "drift", "multi", "single", "expiration"];

/// Modes (label `mode`).
pub const MODES: &[&str] = &["recommend", "autonomous"];

vocabulary!(
    /// Why a node was left alone by a disruption pass (label `reason`).
    BlockedReason {
        /// A PodDisruptionBudget allows no eviction.
        Pdb => "pdb",
        /// The node or one of its pods is annotated do-not-disrupt.
        DoNotDisrupt => "do_not_disrupt",
        /// The NodePool's disruption budget is used up.
        Budget => "budget",
        /// Its pods changed more recently than `consolidateAfter`.
        ConsolidateAfter => "consolidate_after",
        /// The NodePool's policy forbids it (`WhenEmpty`, `Never`).
        Policy => "policy",
        /// No cheaper replacement that fits, or the saving is below the threshold.
        NoCheaperReplacement => "no_cheaper_replacement",
        /// The node has no price.
        NoPrice => "no_price",
        /// Not owned by a NodePool.
        Unmanaged => "unmanaged",
        /// Launched or chosen for pending pods in this pass.
        InFlight => "in_flight",
        /// Its NodePool's workloads are expected to scale down soon, freeing nodes
        /// without evictions.
        ScaleDown => "scale_down",
        /// Anything else.
        Other => "other",
    }
);

impl BlockedReason {
    /// Classifies the disruption pass's explanation (free text naming nodes and pods) into
    /// a bounded label value.
    pub fn classify(why: &str) -> Self {
        let has = |s: &str| why.contains(s);
        if has("PodDisruptionBudget") {
            BlockedReason::Pdb
        } else if has("do-not-disrupt") {
            BlockedReason::DoNotDisrupt
        } else if has("disruption budget") {
            BlockedReason::Budget
        } else if has("consolidateAfter is Never") || has("consolidationPolicy") {
            BlockedReason::Policy
        } else if has("consolidateAfter") {
            BlockedReason::ConsolidateAfter
        } else if has("no price") {
            BlockedReason::NoPrice
        } else if has("not owned by a NodePool") {
            BlockedReason::Unmanaged
        } else if has("scale-down frees nodes") {
            BlockedReason::ScaleDown
        } else if has("this pass") {
            BlockedReason::InFlight
        } else if has("would not fit")
            || has("new nodes")
            || has("below the threshold")
            || has("spot sizes fit")
            || has("drifted, but")
        {
            BlockedReason::NoCheaperReplacement
        } else {
            BlockedReason::Other
        }
    }
}

vocabulary!(
    /// Cost of what pods ask for or what they use.
    Usage {
        /// Priced requests.
        Requested => "requested",
        /// Priced usage.
        Used => "used",
    }
);

vocabulary!(
    /// Where a saving comes from.
    SavingsSource {
        /// Smaller requests.
        Rightsizing => "rightsizing",
        /// Fewer or cheaper nodes.
        Consolidation => "consolidation",
    }
);

vocabulary!(
    /// A recommendation's state.
    RecommendationState {
        /// Differs enough from the requests to act on.
        Actionable => "actionable",
        /// Applied to the workload.
        Applied => "applied",
        /// Not enough recent usage history to recommend.
        Stale => "stale",
    }
);

vocabulary!(
    /// Requests before Tailor changed them, or now.
    When {
        /// As the workload was written.
        Before => "before",
        /// As they are now.
        After => "after",
    }
);

vocabulary!(
    /// The requests a provisioning batch was planned with.
    PlanRequests {
        /// As carried out: right-sized where right-sizing is in `Auto` mode, as requested
        /// elsewhere.
        Planned => "planned",
        /// With every actionable recommendation applied, whatever its mode.
        RightSized => "right_sized",
    }
);

vocabulary!(
    /// The controllers whose reconciles are timed.
    Controller {
        /// Pending pods → NodeClaims.
        Provisioning => "provisioning",
        /// Disruption passes.
        Disruption => "disruption",
        /// Right-sizing rounds.
        Rightsizing => "rightsizing",
        /// A NodeClaim's lifecycle.
        Nodeclaim => "nodeclaim",
        /// Orphan instances and claims.
        GarbageCollection => "garbage_collection",
    }
);

vocabulary!(
    /// The requests a usage read sends to Prometheus.
    PrometheusQuery {
        /// The container series in the window (`/api/v1/series`).
        Series => "series",
        /// CPU usage rates (a range query).
        Cpu => "cpu",
        /// Memory peaks per interval (a range query).
        Memory => "memory",
        /// OOM kills (a range query).
        OomKills => "oom_kills",
        /// Share of CFS periods throttled per interval (a range query).
        Throttling => "throttling",
        /// The cost report's series: requests, owners, nodes and usage per step.
        Report => "report",
    }
);

vocabulary!(
    /// Why a request to Prometheus failed (label `kind` of [`PROMETHEUS_QUERY_ERRORS`]).
    QueryError {
        /// No answer within the timeout.
        Timeout => "timeout",
        /// The connection failed.
        Unreachable => "unreachable",
        /// A server error (HTTP 5xx) without an API answer.
        ServerError => "server_error",
        /// HTTP 401 or 403: the credentials are wrong.
        Unauthorized => "unauthorized",
        /// The answer was larger than the cap.
        TooLarge => "too_large",
        /// The answer was not the Prometheus API (HTML, or not its JSON).
        NotPrometheus => "not_prometheus",
        /// Prometheus answered with an error for the query.
        Query => "query",
    }
);

vocabulary!(
    /// Why a pod could not be resized in place (label `reason` of
    /// [`RIGHTSIZING_EVICTIONS`]).
    StuckResize {
        /// The node can never hold the new resources (`PodResizePending` `Infeasible`).
        Infeasible => "infeasible",
        /// The resize was `Deferred` for more than 5 minutes.
        Deferred => "deferred",
        /// The API server refused the resize call.
        Refused => "refused",
    }
);

vocabulary!(
    /// Why a pod that cannot be resized in place is not evicted yet (label `reason` of
    /// [`RIGHTSIZING_EVICTIONS_WAITING`]).
    EvictionWait {
        /// Evicting would leave fewer than the policy's `update.minReplicas` available.
        MinReplicas => "min_replicas",
        /// The pod's PodDisruptionBudget allows no disruption now (HTTP 429).
        Pdb => "pdb",
        /// No admission webhook serves, so a replacement would not get the new requests.
        NoWebhook => "no_webhook",
    }
);

vocabulary!(
    /// What the admission webhook answered for a pod (label `outcome` of
    /// [`WEBHOOK_REQUESTS`]). Every answer allows the pod.
    WebhookOutcome {
        /// Requests (and limits) were set from an actionable recommendation.
        Patched => "patched",
        /// Allowed as it is: no Auto recommendation applies, or it matches already.
        Unchanged => "unchanged",
        /// Allowed as it is because the review or an object it needs could not be read.
        Error => "error",
    }
);

vocabulary!(
    /// One of the agent's HTTP listeners (label `listener` of [`HTTP_CONNECTIONS`]).
    Listener {
        /// `/metrics`, and `/healthz` and `/readyz` when they share its address.
        Metrics => "metrics",
        /// `/healthz` and `/readyz` on an address of their own.
        Health => "health",
        /// The admission webhook (HTTPS).
        Webhook => "webhook",
    }
);

vocabulary!(
    /// Why a listener closed a connection before it was done with (label `reason` of
    /// [`HTTP_CONNECTIONS_SHED`]).
    ConnectionShed {
        /// The listener held as many connections as it may.
        Limit => "limit",
        /// The client's address held as many connections as one address may.
        ClientLimit => "client_limit",
        /// The TLS handshake did not finish in time.
        HandshakeTimeout => "handshake_timeout",
        /// A request's headers did not arrive in time (this includes an idle keep-alive
        /// connection).
        HeaderTimeout => "header_timeout",
        /// A request was not read and answered in time; it was answered 408.
        RequestTimeout => "request_timeout",
    }
);

vocabulary!(
    /// An OpenTelemetry signal Tailor exports over OTLP.
    Signal {
        /// Metric data points.
        Metrics => "metrics",
        /// Spans.
        Traces => "traces",
    }
);

vocabulary!(
    /// Why OTLP export dropped data (label `reason` of [`OTLP_DROPPED`]).
    DropReason {
        /// The collector refused or failed the export, or did not answer within the export
        /// timeout.
        ExportFailed => "export_failed",
        /// The bounded queue of spans waiting for export was full.
        QueueFull => "queue_full",
    }
);

use label as l;

macro_rules! metric {
    ($const:ident, $area:ident, $name:literal, $kind:ident, $unit:literal, [$($label:expr),*], $help:literal) => {
        #[doc = $help]
        pub const $const: MetricDef = MetricDef {
            name: $name,
            kind: MetricType::$kind,
            unit: $unit,
            labels: &[$($label),*],
            help: $help,
            area: Area::$area,
        };
    };
}

// Provisioning.
metric!(
    PODS_PENDING,
    Provisioning,
    "tailor_pods_pending",
    Gauge,
    "pods",
    [],
    "Pods waiting for a node"
);
metric!(
    PROVISIONING_BATCH_COST,
    Provisioning,
    "tailor_provisioning_batch_hourly_cost_dollars",
    Gauge,
    "dollars per hour",
    [l::REQUESTS],
    "USD per hour of the new nodes the last provisioning batch that bought nodes planned, and of those it would need with every actionable recommendation applied; the gap is what Auto mode would save on it"
);
metric!(
    PROVISIONING_DURATION,
    Provisioning,
    "tailor_provisioning_duration_seconds",
    Histogram,
    "seconds",
    [l::NODEPOOL],
    "Seconds from a pod becoming pending to the NodeClaim planned for it being created"
);
metric!(
    NODECLAIM_STAGE_DURATION,
    Provisioning,
    "tailor_nodeclaim_stage_duration_seconds",
    Histogram,
    "seconds",
    [l::NODEPOOL, l::STAGE],
    "Seconds a NodeClaim took to reach a lifecycle stage from the stage before"
);
metric!(
    POD_STARTUP_DURATION,
    Provisioning,
    "tailor_pod_startup_duration_seconds",
    Histogram,
    "seconds",
    [l::NODEPOOL],
    "Seconds from a pod becoming pending to it being bound to a node"
);
metric!(
    NODECLAIMS_LAUNCHED,
    Provisioning,
    "tailor_nodeclaims_launched",
    Counter,
    "nodeclaims",
    [l::NODEPOOL, l::INSTANCE_TYPE, l::CAPACITY_TYPE, l::ZONE],
    "NodeClaims launched, for pending pods and as disruption replacements"
);
metric!(
    NODECLAIMS_TERMINATED,
    Provisioning,
    "tailor_nodeclaims_terminated",
    Counter,
    "nodeclaims",
    [l::NODEPOOL, l::REASON],
    "NodeClaims deleted, by reason"
);
metric!(
    CLOUD_REQUESTS,
    Provisioning,
    "tailor_cloud_requests",
    Counter,
    "requests",
    [l::OPERATION],
    "Cloud calls made, by operation"
);
metric!(
    CLOUD_ERRORS,
    Provisioning,
    "tailor_cloud_errors",
    Counter,
    "requests",
    [l::OPERATION, l::ERROR_KIND],
    "Failed cloud calls, by operation and error kind"
);
metric!(
    CLOUD_REQUEST_DURATION,
    Provisioning,
    "tailor_cloud_request_duration_seconds",
    Histogram,
    "seconds",
    [l::OPERATION],
    "Seconds a cloud call took, by operation"
);
metric!(
    UNAVAILABLE_OFFERINGS,
    Provisioning,
    "tailor_unavailable_offerings",
    Gauge,
    "offerings",
    [],
    "Offerings (size, zone, capacity type) cached as unavailable after a capacity error"
);
metric!(
    CATALOG_INSTANCE_TYPES,
    Provisioning,
    "tailor_catalog_instance_types",
    Gauge,
    "instance types",
    [l::CAPACITY_TYPE],
    "Instance types the catalog offers"
);
metric!(
    CATALOG_UPDATED,
    Provisioning,
    "tailor_catalog_updated_timestamp_seconds",
    Gauge,
    "unix seconds",
    [],
    "When the catalog's sizes and prices were last loaded or refreshed"
);

// Cost.
metric!(
    NODE_HOURLY_COST,
    Cost,
    "tailor_node_hourly_cost_dollars",
    Gauge,
    "dollars per hour",
    [l::NODEPOOL, l::INSTANCE_TYPE, l::CAPACITY_TYPE, l::ZONE],
    "USD per hour of the nodes Tailor manages"
);
metric!(
    NODES,
    Cost,
    "tailor_nodes",
    Gauge,
    "nodes",
    [l::NODEPOOL, l::INSTANCE_TYPE, l::CAPACITY_TYPE, l::ZONE],
    "Nodes Tailor manages"
);
metric!(
    NAMESPACE_HOURLY_COST,
    Cost,
    "tailor_namespace_hourly_cost_dollars",
    Gauge,
    "dollars per hour",
    [l::NAMESPACE, l::USAGE],
    "USD per hour of what a namespace's pods request and of what they use, at the cluster's price per core and GiB; the difference is waste"
);
metric!(
    SAVINGS_AVAILABLE,
    Cost,
    "tailor_savings_available_dollars_per_hour",
    Gauge,
    "dollars per hour",
    [l::SOURCE],
    "USD per hour that the current recommendations and disruption decisions would save"
);
metric!(
    SAVINGS_REALISED,
    Cost,
    "tailor_savings_realised_dollars",
    Counter,
    "dollars",
    [l::SOURCE],
    "USD saved so far by changes Tailor carried out"
);

// Disruption.
metric!(
    DISRUPTION_DECISIONS,
    Disruption,
    "tailor_disruption_decisions",
    Counter,
    "decisions",
    [l::METHOD, l::MODE],
    "Disruption decisions, by method and mode (recommend: reported only)"
);
metric!(
    DISRUPTION_BLOCKED,
    Disruption,
    "tailor_disruption_blocked_nodes",
    Gauge,
    "nodes",
    [l::REASON],
    "Nodes the last disruption pass left alone, by reason"
);
metric!(
    EVICTIONS,
    Disruption,
    "tailor_evictions",
    Counter,
    "pods",
    [],
    "Pods evicted through the Eviction API while draining nodes"
);
metric!(
    DECISION_DURATION,
    Disruption,
    "tailor_decision_duration_seconds",
    Histogram,
    "seconds",
    [l::DECISION],
    "Seconds a decision (scheduling, consolidation, right-sizing, launch) took"
);

// Right-sizing.
metric!(
    RIGHTSIZING_CONTAINERS,
    Rightsizing,
    "tailor_rightsizing_containers",
    Gauge,
    "containers",
    [],
    "Containers covered by a recommendation"
);
metric!(
    RECOMMENDATIONS,
    Rightsizing,
    "tailor_recommendations",
    Gauge,
    "workloads",
    [l::STATE],
    "Workload recommendations, by state"
);
metric!(
    RECOMMENDATIONS_APPLIED,
    Rightsizing,
    "tailor_recommendations_applied",
    Counter,
    "changes",
    [l::NAMESPACE],
    "Recommendations applied to workloads"
);
metric!(
    RIGHTSIZING_EVICTIONS,
    Rightsizing,
    "tailor_rightsizing_evictions",
    Counter,
    "pods",
    [l::REASON],
    "Pods evicted (Eviction API) because they could not be resized in place, by why"
);
metric!(
    RIGHTSIZING_EVICTIONS_WAITING,
    Rightsizing,
    "tailor_rightsizing_evictions_waiting",
    Gauge,
    "pods",
    [l::REASON],
    "Pods that could not be resized in place and wait to be evicted, by what holds them (last round)"
);
metric!(
    NAMESPACE_CPU_REQUESTS,
    Rightsizing,
    "tailor_namespace_cpu_requests_cores",
    Gauge,
    "cores",
    [l::NAMESPACE, l::WHEN],
    "CPU requested by a namespace's running pods, before right-sizing and now"
);
metric!(
    NAMESPACE_MEMORY_REQUESTS,
    Rightsizing,
    "tailor_namespace_memory_requests_bytes",
    Gauge,
    "bytes",
    [l::NAMESPACE, l::WHEN],
    "Memory requested by a namespace's running pods, before right-sizing and now"
);
metric!(
    OOM_KILLS,
    Rightsizing,
    "tailor_oom_kills",
    Counter,
    "kills",
    [l::NAMESPACE],
    "Containers killed for running out of memory"
);
metric!(
    PROMETHEUS_QUERY_DURATION,
    Rightsizing,
    "tailor_prometheus_query_duration_seconds",
    Histogram,
    "seconds",
    [l::QUERY],
    "Seconds one request of a usage read to Prometheus took, answered or not"
);
metric!(
    PROMETHEUS_QUERY_ERRORS,
    Rightsizing,
    "tailor_prometheus_query_errors",
    Counter,
    "requests",
    [l::QUERY, l::ERROR_KIND],
    "Requests of a usage read to Prometheus that failed (each retry counts), by why"
);
metric!(
    USAGE_DATA_AGE,
    Rightsizing,
    "tailor_usage_data_age_seconds",
    Gauge,
    "seconds",
    [],
    "Age of the newest usage sample; autonomous right-sizing pauses when it is stale"
);
metric!(
    USAGE_QUERIES,
    Rightsizing,
    "tailor_usage_queries",
    Counter,
    "queries",
    [],
    "Prometheus queries the right-sizing controller issued"
);
metric!(
    USAGE_SAMPLES_READ,
    Rightsizing,
    "tailor_usage_samples_read",
    Counter,
    "samples",
    [],
    "Usage samples the right-sizing controller read (checkpoints keep this to what is new)"
);
metric!(
    USAGE_READ_FAILURES,
    Rightsizing,
    "tailor_usage_read_failures",
    Counter,
    "reads",
    [],
    "Right-sizing rounds whose usage read failed: their Recommendations are marked Stale"
);

metric!(
    WEBHOOK_REQUESTS,
    Rightsizing,
    "tailor_webhook_requests",
    Counter,
    "requests",
    [l::OUTCOME],
    "Pod admission reviews the webhook answered, by outcome; every pod is allowed"
);
metric!(
    WEBHOOK_DURATION,
    Rightsizing,
    "tailor_webhook_duration_seconds",
    Histogram,
    "seconds",
    [],
    "Seconds the webhook took from reading an admission review to its answer"
);

// The agent.
metric!(
    BUILD_INFO,
    Agent,
    "tailor_build_info",
    Gauge,
    "1",
    [l::VERSION],
    "Tailor build information; value 1"
);
metric!(
    LEADER,
    Agent,
    "tailor_leader",
    Gauge,
    "1",
    [],
    "1 while this replica holds the leader lease, else 0"
);
metric!(
    RECONCILE_DURATION,
    Agent,
    "tailor_reconcile_duration_seconds",
    Histogram,
    "seconds",
    [l::CONTROLLER],
    "Seconds one reconcile of a controller took"
);
metric!(
    RECONCILE_ERRORS,
    Agent,
    "tailor_reconcile_errors",
    Counter,
    "reconciles",
    [l::CONTROLLER],
    "Reconciles that ended in an error"
);
metric!(
    OTLP_DROPPED,
    Agent,
    "tailor_otlp_dropped",
    Counter,
    "points",
    [l::SIGNAL, l::REASON],
    "Metric data points and spans OTLP export dropped instead of holding the agent back: the collector failed or did not answer in time, or the span queue was full"
);
metric!(
    SNAPSHOT_OBJECTS,
    Agent,
    "tailor_snapshot_objects",
    Gauge,
    "objects",
    [l::KIND],
    "Objects in the agent's stores, by kind"
);

metric!(
    HTTP_CONNECTIONS,
    Agent,
    "tailor_http_connections",
    Gauge,
    "connections",
    [l::LISTENER],
    "Connections open on each of the agent's HTTP listeners"
);
metric!(
    HTTP_CONNECTIONS_SHED,
    Agent,
    "tailor_http_connections_shed",
    Counter,
    "connections",
    [l::LISTENER, l::REASON],
    "Connections a listener closed before they were done with: over its limits, or too slow to handshake, send headers or finish a request"
);

/// Every metric, in the order of the reference page.
pub const CATALOGUE: &[MetricDef] = &[
    PODS_PENDING,
    PROVISIONING_BATCH_COST,
    PROVISIONING_DURATION,
    NODECLAIM_STAGE_DURATION,
    POD_STARTUP_DURATION,
    NODECLAIMS_LAUNCHED,
    NODECLAIMS_TERMINATED,
    CLOUD_REQUESTS,
    CLOUD_ERRORS,
    CLOUD_REQUEST_DURATION,
    UNAVAILABLE_OFFERINGS,
    CATALOG_INSTANCE_TYPES,
    CATALOG_UPDATED,
    NODE_HOURLY_COST,
    NODES,
    NAMESPACE_HOURLY_COST,
    SAVINGS_AVAILABLE,
    SAVINGS_REALISED,
    DISRUPTION_DECISIONS,
    DISRUPTION_BLOCKED,
    EVICTIONS,
    DECISION_DURATION,
    RIGHTSIZING_CONTAINERS,
    RECOMMENDATIONS,
    RECOMMENDATIONS_APPLIED,
    RIGHTSIZING_EVICTIONS,
    RIGHTSIZING_EVICTIONS_WAITING,
    NAMESPACE_CPU_REQUESTS,
    NAMESPACE_MEMORY_REQUESTS,
    OOM_KILLS,
    PROMETHEUS_QUERY_DURATION,
    PROMETHEUS_QUERY_ERRORS,
    USAGE_DATA_AGE,
    USAGE_QUERIES,
    USAGE_SAMPLES_READ,
    USAGE_READ_FAILURES,
    WEBHOOK_REQUESTS,
    WEBHOOK_DURATION,
    BUILD_INFO,
    LEADER,
    RECONCILE_DURATION,
    RECONCILE_ERRORS,
    OTLP_DROPPED,
    SNAPSHOT_OBJECTS,
    HTTP_CONNECTIONS,
    HTTP_CONNECTIONS_SHED,
];

/// The bounded values of a label key, where Tailor fixes them (the others come from the
/// cluster's objects or the catalog).
pub fn label_values(key: &str, metric: &str) -> Option<Vec<&'static str>> {
    fn all<T: Copy>(xs: &[T], f: fn(T) -> &'static str) -> Option<Vec<&'static str>> {
        Some(xs.iter().copied().map(f).collect())
    }
    match key {
        l::STAGE => all(Stage::ALL, Stage::as_str),
        l::REASON if metric == DISRUPTION_BLOCKED.name => {
            all(BlockedReason::ALL, BlockedReason::as_str)
        }
        l::REASON if metric == RIGHTSIZING_EVICTIONS.name => {
            all(StuckResize::ALL, StuckResize::as_str)
        }
        l::REASON if metric == RIGHTSIZING_EVICTIONS_WAITING.name => {
            all(EvictionWait::ALL, EvictionWait::as_str)
        }
        l::REASON if metric == OTLP_DROPPED.name => all(DropReason::ALL, DropReason::as_str),
        l::REASON if metric == HTTP_CONNECTIONS_SHED.name => {
            all(ConnectionShed::ALL, ConnectionShed::as_str)
        }
        l::LISTENER => all(Listener::ALL, Listener::as_str),
        l::REASON => all(TerminationReason::ALL, TerminationReason::as_str),
        l::SIGNAL => all(Signal::ALL, Signal::as_str),
        l::OPERATION => all(CloudOperation::ALL, CloudOperation::as_str),
        l::DECISION => all(Decision::ALL, Decision::as_str),
        l::METHOD => Some(METHODS.to_vec()),
        l::MODE => Some(MODES.to_vec()),
        l::CAPACITY_TYPE => Some(vec!["spot", "on-demand"]),
        l::USAGE => all(Usage::ALL, Usage::as_str),
        l::SOURCE => all(SavingsSource::ALL, SavingsSource::as_str),
        l::STATE => all(RecommendationState::ALL, RecommendationState::as_str),
        l::WHEN => all(When::ALL, When::as_str),
        l::REQUESTS => all(PlanRequests::ALL, PlanRequests::as_str),
        l::CONTROLLER => all(Controller::ALL, Controller::as_str),
        l::ERROR_KIND if metric == CLOUD_ERRORS.name => Some(CLOUD_ERROR_KINDS.to_vec()),
        l::ERROR_KIND if metric == PROMETHEUS_QUERY_ERRORS.name => {
            all(QueryError::ALL, QueryError::as_str)
        }
        l::QUERY => all(PrometheusQuery::ALL, PrometheusQuery::as_str),
        l::OUTCOME => all(WebhookOutcome::ALL, WebhookOutcome::as_str),
        _ => None,
    }
}

/// Bucket boundaries for provisioning latency: VM launches take tens of seconds to a few
/// minutes, and batching adds up to ten seconds.
pub const PROVISIONING_BUCKETS: &[f64] = &[
    1.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
];

/// Bucket boundaries for decision and reconcile time: the target is well under a second
/// for 20k pods.
pub const DECISION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Bucket boundaries for admission reviews: the API server waits at most the webhook's
/// `timeoutSeconds` (2 s), and the target is 10 ms at p99.
pub const WEBHOOK_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0,
];

/// Bucket boundaries for calls to the cloud: milliseconds to a minute
/// (an Azure create is a long-running operation).
pub const CALL_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
