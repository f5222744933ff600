//! The Azure provider against a fake Azure Resource Manager that speaks the real protocol
//! (tests/support/fake_arm.rs): the real azure_mgmt_compute / azure_core / azure_identity
//! clients send every call over HTTP on a loopback port.

#[path = "support/fake_arm.rs"]
mod fake_arm;
#[path = "support/prometheus.rs"]
mod prometheus_server;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use fake_arm::{Arm, FakeArm, Fault, FaultKind, Match, fixture};
use jiff::Timestamp;
use serde_json::{Value, json};
use tailor::apis::labels;
use tailor::catalog::{Catalog, CatalogOptions};
use tailor::clock::{Clock, VirtualClock};
use tailor::cloud::azure::arm::ArmSettings;
use tailor::cloud::azure::auth::{ManagedIdentity, UserAssigned, WorkloadIdentity};
use tailor::cloud::azure::bootstrap::{self, ClusterBootstrap};
use tailor::cloud::azure::resources::Placement;
use tailor::cloud::azure::{AzureCloud, AzureSettings};
use tailor::cloud::{CloudError, CloudProvider, LaunchCandidate, LaunchRequest, NodeLaunch};
use tailor::model::CapacityType;

const SUB: &str = "00000000-0000-0000-0000-000000000001";
const RG: &str = "MC_rg_Cluster_eastus";
const CLUSTER: &str = "prod";
/// A service-account token's shape (header.payload.signature).
const SA_TOKEN_A: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a3ViZS1zeXN0ZW06dGFpbG9yIn0.c2lnLWE";
const SA_TOKEN_B: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a3ViZS1zeXN0ZW06dGFpbG9yIn0.c2lnLWI";

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

struct Env {
    fake: FakeArm,
    cloud: AzureCloud,
    clock: Arc<VirtualClock>,
    _dir: tempfile::TempDir,
}

fn settings(url: &str) -> AzureSettings {
    let mut arm = ArmSettings::for_endpoint(url.parse().expect("url"));
    arm.scopes = vec!["https://management.azure.com/.default".to_string()];
    arm.max_retries = 3;
    arm.initial_delay = Duration::from_millis(10);
    arm.max_delay = Duration::from_secs(2);
    arm.max_total_elapsed = Duration::from_secs(30);
    arm.poll_interval = Duration::from_millis(20);
    arm.operation_timeout = Duration::from_secs(5);
    AzureSettings {
        placement: Placement {
            subscription_id: SUB.to_string(),
            resource_group: RG.to_string(),
            location: "eastus".to_string(),
            default_subnet_id: format!(
                "/subscriptions/{SUB}/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/aks-vnet/subnets/nodes"
            ),
            admin_username: "azureuser".to_string(),
            ssh_public_key: "ssh-rsa AAAAB3NzaC1yc2E tailor@test".to_string(),
            node_identities: vec![format!(
                "/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/kubelet"
            )],
        },
        cluster_name: CLUSTER.to_string(),
        bootstrap: ClusterBootstrap {
            api_server: "https://prod-dns.hcp.eastus.azmk8s.io:443".to_string(),
            ca_bundle_base64: "LS0tLS1CRUdJTi0tLS0t".to_string(),
            bootstrap_token: Some("abcdef.0123456789abcdef".to_string()),
            cluster_dns: "10.0.0.10".to_string(),
            default_max_pods: 250,
        },
        arm,
        prices_endpoint: url.to_string(),
        throttle_backoff: Duration::from_secs(60),
    }
}

async fn credential(fake: &FakeArm, dir: &tempfile::TempDir) -> Arc<WorkloadIdentity> {
    let file = dir.path().join("azure-identity-token");
    std::fs::write(&file, SA_TOKEN_A).expect("token file");
    Arc::new(
        WorkloadIdentity::new(
            azure_core::new_http_client(),
            "tenant",
            "client",
            file,
            &fake.url,
        )
        .expect("credential"),
    )
}

/// A fake ARM, and a cloud whose catalog was read from it.
async fn env(arm: Arm) -> Env {
    install_crypto();
    let fake = FakeArm::start(arm).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(VirtualClock::new(
        Timestamp::from_second(1_800_000_000).expect("ts"),
    ));
    let cloud = AzureCloud::new(
        credential(&fake, &dir).await,
        settings(&fake.url),
        clock.clone(),
        Arc::new(RwLock::new(Catalog::builtin().expect("built-in"))),
        CatalogOptions::for_region("eastus"),
    );
    cloud
        .refresh_catalog()
        .await
        .expect("live catalog from the fake");
    fake.arm().requests.clear();
    Env {
        fake,
        cloud,
        clock,
        _dir: dir,
    }
}

fn candidate(size: &str, zone: &str, ct: CapacityType) -> LaunchCandidate {
    LaunchCandidate {
        instance_type: size.to_string(),
        zone: zone.to_string(),
        capacity_type: ct,
        price_per_hour: 0.1,
    }
}

fn request(claim: &str, candidates: Vec<LaunchCandidate>) -> LaunchRequest {
    LaunchRequest {
        claim: claim.to_string(),
        node_pool: "default".to_string(),
        candidates,
        tags: BTreeMap::from([
            (labels::TAG_NODEPOOL.to_string(), "default".to_string()),
            (labels::TAG_NODECLAIM.to_string(), claim.to_string()),
            (labels::TAG_CLUSTER.to_string(), CLUSTER.to_string()),
            ("team/owner".to_string(), "payments".to_string()),
        ]),
        node: NodeLaunch {
            image_family: tailor::apis::aksnodeclass::ImageFamily::AzureLinux,
            max_pods: Some(110),
            os_disk_size_gb: Some(64),
            labels: BTreeMap::from([(labels::NODE_POOL.to_string(), "default".to_string())]),
            taints: vec!["dedicated=payments:NoSchedule".to_string()],
            ..NodeLaunch::default()
        },
    }
}

fn unavailable(
    types: &[tailor::model::InstanceType],
    size: &str,
    zone: &str,
    ct: CapacityType,
) -> bool {
    types
        .iter()
        .find(|t| t.name == size)
        .and_then(|t| {
            t.offerings
                .iter()
                .find(|o| o.zone == zone && o.capacity_type == ct)
        })
        .is_some_and(|o| !o.available)
}

#[tokio::test]
async fn a_spot_launch_in_a_zone_sends_what_karpenter_sends() {
    let e = env(Arm {
        polls_in_progress: 1,
        retry_after: None,
        ..Arm::default()
    })
    .await;
    let calls_before = e.cloud.arm_calls();
    let instance = e
        .cloud
        .create(&request(
            "default-x1",
            vec![candidate("Standard_D4s_v3", "eastus-2", CapacityType::Spot)],
        ))
        .await
        .expect("launch");
    assert_eq!(
        instance.provider_id,
        format!(
            "azure:///subscriptions/{SUB}/resourceGroups/mc_rg_cluster_eastus/providers/Microsoft.Compute/virtualMachines/aks-default-x1"
        )
    );
    assert_eq!(
        (instance.zone.as_str(), instance.capacity_type),
        ("eastus-2", CapacityType::Spot)
    );

    let arm = e.fake.arm();
    let nic_put = arm
        .requests
        .iter()
        .find(|r| r.method == "PUT" && r.path.ends_with("/networkInterfaces/aks-default-x1"))
        .expect("NIC PUT");
    assert_eq!(
        nic_put.body["properties"]["enableAcceleratedNetworking"],
        true
    );
    assert!(
        nic_put
            .body
            .pointer("/properties/ipConfigurations/0/properties/subnet/id")
            .and_then(Value::as_str)
            .is_some_and(|s| s.ends_with("/subnets/nodes"))
    );
    let puts = arm.vm_puts();
    assert_eq!(puts.len(), 1);
    let vm = &puts[0];
    let p = &vm["properties"];
    assert_eq!(vm["location"], "eastus");
    assert_eq!(vm["zones"], json!(["2"]));
    assert_eq!(p["hardwareProfile"]["vmSize"], "Standard_D4s_v3");
    assert_eq!(p["priority"], "Spot");
    assert_eq!(p["evictionPolicy"], "Delete");
    assert_eq!(p["billingProfile"]["maxPrice"], -1.0);
    assert_eq!(
        p["storageProfile"]["imageReference"]["communityGalleryImageId"],
        "/CommunityGalleries/AKSAzureLinux-f7c7cda5-1c9a-4bdc-a222-9614c968580b/images/V2gen2/versions/latest"
    );
    assert_eq!(p["storageProfile"]["osDisk"]["diskSizeGB"], 64);
    assert_eq!(p["storageProfile"]["osDisk"]["deleteOption"], "Delete");
    assert!(
        p["networkProfile"]["networkInterfaces"][0]["id"]
            .as_str()
            .is_some_and(|id| id.ends_with("/networkInterfaces/aks-default-x1"))
    );
    assert_eq!(
        p["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"],
        "Delete"
    );
    assert_eq!(
        p["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"],
        true
    );
    assert_eq!(p["osProfile"]["computerName"], "aks-default-x1");
    assert_eq!(vm["identity"]["type"], "UserAssigned");
    let tags = &vm["tags"];
    assert_eq!(tags["tailor.sh_nodepool"], "default");
    assert_eq!(tags["tailor.sh_nodeclaim"], "default-x1");
    assert_eq!(tags["tailor.sh_cluster"], CLUSTER);
    assert_eq!(
        tags["team_owner"], "payments",
        "a '/' in a tag key becomes '_'"
    );
    assert_eq!(tags["compute.aks.billing"], "linux");

    let script = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(p["osProfile"]["customData"].as_str().expect("customData"))
            .expect("base64"),
    )
    .expect("utf-8");
    let kubeconfig: serde_yaml::Value =
        serde_yaml::from_str(bootstrap::embedded_kubeconfig(&script).expect("kubeconfig"))
            .expect("yaml");
    assert_eq!(
        kubeconfig["clusters"][0]["cluster"]["server"],
        "https://prod-dns.hcp.eastus.azmk8s.io:443"
    );
    assert_eq!(
        kubeconfig["users"][0]["user"]["token"],
        "abcdef.0123456789abcdef"
    );
    let flags = bootstrap::embedded_flags(&script).expect("flags");
    for f in [
        "--max-pods=110",
        "--register-with-taints=dedicated=payments:NoSchedule",
        "--node-labels=tailor.sh/nodepool=default",
    ] {
        assert!(flags.contains(&f), "{f} in {flags:?}");
    }
    assert!(
        flags
            .iter()
            .any(|f| f.starts_with("--provider-id=azure:///subscriptions/"))
    );

    // The operation was followed: PUT, then the Azure-AsyncOperation URL until Succeeded.
    assert_eq!(arm.count("GET", "/operations/"), 2);
    let calls = arm.requests.len();
    println!(
        "ARM calls per launch: {calls} ({:?})",
        arm.requests
            .iter()
            .map(|r| format!(
                "{} {}",
                r.method,
                r.path.rsplit('/').next().unwrap_or_default()
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(calls as u64, e.cloud.arm_calls() - calls_before);
}

#[tokio::test]
async fn launch_latency_added_over_the_fakes_own_delays_is_reported() {
    // The fake asks for Retry-After: 1 on the PUT and on each InProgress poll.
    let e = env(Arm {
        polls_in_progress: 1,
        retry_after: Some(1),
        ..Arm::default()
    })
    .await;
    let started = Instant::now();
    e.cloud
        .create(&request(
            "lat",
            vec![candidate(
                "Standard_D2s_v3",
                "eastus-1",
                CapacityType::OnDemand,
            )],
        ))
        .await
        .expect("launch");
    let elapsed = started.elapsed();
    let arm = e.fake.arm();
    let polls: Vec<Instant> = arm
        .requests
        .iter()
        .filter(|r| r.path.contains("/operations/"))
        .map(|r| r.at)
        .collect();
    let put = arm
        .requests
        .iter()
        .find(|r| r.method == "PUT" && r.path.contains("/virtualMachines/"))
        .expect("put")
        .at;
    // Retry-After honoured: each poll comes at least a second after the answer before it.
    assert!(polls[0].duration_since(put) >= Duration::from_secs(1));
    assert!(polls[1].duration_since(polls[0]) >= Duration::from_secs(1));
    let prescribed = Duration::from_secs(2);
    println!(
        "launch latency: {:.3}s total, {:.3}s asked by the fake (Retry-After), {:.1} ms added by Tailor over {} ARM calls",
        elapsed.as_secs_f64(),
        prescribed.as_secs_f64(),
        (elapsed.saturating_sub(prescribed)).as_secs_f64() * 1000.0,
        arm.requests.len()
    );
}

#[tokio::test]
async fn zonal_allocation_failure_falls_to_the_next_offering_and_caches_the_zone() {
    let mut arm = Arm {
        retry_after: None,
        ..Arm::default()
    };
    arm.faults.push(Fault {
        on: Match {
            method: "PUT".into(),
            kind: "virtualMachines".into(),
            size: Some("Standard_D4s_v3".into()),
            zone: Some("1".into()),
            ..Match::default()
        },
        kind: FaultKind::AsyncFailure {
            body: fixture("observed/asyncop-failed-ZonalAllocationFailed.body.json"),
        },
        times: u32::MAX,
    });
    let e = env(arm).await;
    let candidates = vec![
        candidate("Standard_D4s_v3", "eastus-1", CapacityType::OnDemand),
        candidate("Standard_D4s_v3", "eastus-2", CapacityType::OnDemand),
    ];
    let first = e
        .cloud
        .create(&request("a", candidates.clone()))
        .await
        .expect("launch");
    assert_eq!(first.zone, "eastus-2");
    let types = e.cloud.instance_types().await.expect("types");
    for ct in [CapacityType::OnDemand, CapacityType::Spot] {
        assert!(
            unavailable(&types, "Standard_D4s_v3", "eastus-1", ct),
            "zone 1 {ct} cached"
        );
    }
    assert!(!unavailable(
        &types,
        "Standard_D4s_v3",
        "eastus-2",
        CapacityType::OnDemand
    ));
    // The failed VM was deleted; its NIC serves the next attempt.
    assert_eq!(e.fake.arm().count("DELETE", "/virtualMachines/aks-a"), 1);

    e.fake.arm().requests.clear();
    let second = e
        .cloud
        .create(&request("b", candidates.clone()))
        .await
        .expect("launch");
    assert_eq!(second.zone, "eastus-2");
    assert!(
        e.fake
            .arm()
            .vm_puts()
            .iter()
            .all(|b| b["zones"] != json!(["1"])),
        "zone 1 skipped"
    );

    e.clock.advance(Duration::from_secs(3600));
    let types = e.cloud.instance_types().await.expect("types");
    assert!(
        !unavailable(
            &types,
            "Standard_D4s_v3",
            "eastus-1",
            CapacityType::OnDemand
        ),
        "TTL is one hour"
    );
}

#[tokio::test]
async fn a_family_quota_error_skips_the_family_for_ten_minutes_or_an_hour_at_limit_zero() {
    let quota = fixture("observed/vm-put-409-OperationNotAllowed-family-quota.body.json");
    let mut arm = Arm {
        retry_after: None,
        ..Arm::default()
    };
    arm.faults.push(Fault {
        on: Match {
            method: "PUT".into(),
            kind: "virtualMachines".into(),
            size: Some("Standard_D8s_v3".into()),
            ..Match::default()
        },
        kind: FaultKind::Status {
            status: 409,
            body: quota.clone(),
            headers: vec![],
        },
        times: 1,
    });
    let e = env(arm).await;
    let got = e
        .cloud
        .create(&request(
            "q",
            vec![
                candidate("Standard_D8s_v3", "eastus-1", CapacityType::OnDemand),
                candidate("Standard_D4s_v3", "eastus-1", CapacityType::OnDemand),
            ],
        ))
        .await
        .expect("a smaller size of the family still fits the quota");
    assert_eq!(got.instance_type, "Standard_D4s_v3");
    let types = e.cloud.instance_types().await.expect("types");
    for zone in ["eastus-1", "eastus-2", "eastus-3"] {
        assert!(
            unavailable(&types, "Standard_D8s_v3", zone, CapacityType::OnDemand),
            "{zone}"
        );
    }
    assert!(!unavailable(
        &types,
        "Standard_D8s_v3",
        "eastus-1",
        CapacityType::Spot
    ));
    assert!(!unavailable(
        &types,
        "Standard_D4s_v3",
        "eastus-1",
        CapacityType::OnDemand
    ));
    e.clock.advance(Duration::from_secs(600));
    let types = e.cloud.instance_types().await.expect("types");
    assert!(
        !unavailable(
            &types,
            "Standard_D8s_v3",
            "eastus-1",
            CapacityType::OnDemand
        ),
        "10 min when the limit is not 0"
    );

    // At limit 0 the whole family goes for an hour, and the launch leaves no NIC behind.
    let mut zero = quota.clone();
    zero["error"]["message"] = json!(
        quota["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .replace("Current Limit: 100,", "Current Limit: 0,")
    );
    e.fake.arm().faults.push(Fault {
        on: Match {
            method: "PUT".into(),
            kind: "virtualMachines".into(),
            ..Match::default()
        },
        kind: FaultKind::Status {
            status: 409,
            body: zero,
            headers: vec![],
        },
        times: 1,
    });
    let err = e
        .cloud
        .create(&request(
            "z",
            vec![
                candidate("Standard_D2s_v3", "eastus-1", CapacityType::OnDemand),
                candidate("Standard_D4s_v3", "eastus-1", CapacityType::OnDemand),
            ],
        ))
        .await
        .expect_err("the family has no quota");
    assert!(matches!(err, CloudError::Quota { .. }), "{err}");
    assert!(!e.fake.arm().nics.contains_key("aks-z"), "no orphan NIC");
    let types = e.cloud.instance_types().await.expect("types");
    assert!(unavailable(
        &types,
        "Standard_D2s_v3",
        "eastus-2",
        CapacityType::OnDemand
    ));
    e.clock.advance(Duration::from_secs(3599));
    assert!(unavailable(
        &e.cloud.instance_types().await.expect("types"),
        "Standard_D2s_v3",
        "eastus-2",
        CapacityType::OnDemand
    ));
    e.clock.advance(Duration::from_secs(1));
    assert!(!unavailable(
        &e.cloud.instance_types().await.expect("types"),
        "Standard_D2s_v3",
        "eastus-2",
        CapacityType::OnDemand
    ));
}

fn throttled(retry_after: &str, times: u32) -> Fault {
    let mut headers = vec![("Retry-After".to_string(), retry_after.to_string())];
    headers.push((
        "x-ms-ratelimit-remaining-resource".to_string(),
        "Microsoft.Compute/HighCostGet3Min;0".to_string(),
    ));
    Fault {
        on: Match {
            method: "GET".into(),
            kind: "virtualMachines".into(),
            ..Match::default()
        },
        kind: FaultKind::Status {
            status: 429,
            body: fixture("observed/error-429-compute-throttled.assembled.body.json"),
            headers,
        },
        times,
    }
}

#[tokio::test]
async fn throttling_waits_retry_after_and_gives_up_after_the_allowed_retries() {
    let mut arm = Arm {
        retry_after: None,
        ..Arm::default()
    };
    arm.faults.push(throttled("1", 2));
    let e = env(arm).await;
    e.cloud
        .create(&request(
            "t",
            vec![candidate(
                "Standard_D2s_v3",
                "eastus-1",
                CapacityType::OnDemand,
            )],
        ))
        .await
        .expect("launch after two throttled reads");
    {
        let arm = e.fake.arm();
        let gets: Vec<&fake_arm::Logged> = arm
            .requests
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/virtualMachines/aks-t"))
            .collect();
        assert_eq!(
            gets.iter().map(|r| r.status).collect::<Vec<_>>(),
            [429, 429, 404]
        );
        assert!(
            gets[1].at.duration_since(gets[0].at) >= Duration::from_secs(1),
            "Retry-After honoured"
        );
        assert!(
            gets[2].at.duration_since(gets[1].at) >= Duration::from_secs(1),
            "Retry-After honoured"
        );
    }
    // Always throttled, with a Retry-After far beyond the budget: capped waits, 1 + 3 tries.
    e.fake.arm().requests.clear();
    e.fake.arm().faults.push(throttled("1200", u32::MAX));
    let err = e
        .cloud
        .get(&format!("azure:///subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/aks-t"))
        .await
        .expect_err("throttled");
    assert!(matches!(err, CloudError::Throttled { .. }), "{err}");
    assert_eq!(
        e.fake.arm().count("GET", "/virtualMachines/aks-t"),
        4,
        "max_retries 3"
    );
}

#[tokio::test]
async fn a_crash_between_nic_and_vm_leaves_a_nic_the_next_start_deletes_and_gc_deletes_vms_without_claims()
 {
    let e = env(Arm {
        retry_after: None,
        ..Arm::default()
    })
    .await;
    // A launch that died after its NIC: the NIC exists, tagged, no VM.
    let ours = json!({"name": "aks-crashed", "location": "eastus", "tags": {"tailor.sh_cluster": CLUSTER}, "properties": {}});
    let foreign = json!({"name": "other", "location": "eastus", "tags": {"tailor.sh_cluster": "someone-else"}, "properties": {}});
    e.fake.arm().nics.insert("aks-crashed".into(), ours);
    e.fake.arm().nics.insert("other".into(), foreign);
    let live = e
        .cloud
        .create(&request(
            "live",
            vec![candidate(
                "Standard_D2s_v3",
                "eastus-1",
                CapacityType::OnDemand,
            )],
        ))
        .await
        .expect("launch");

    // The next start.
    let dir = tempfile::tempdir().expect("tempdir");
    let restarted = AzureCloud::new(
        credential(&e.fake, &dir).await,
        settings(&e.fake.url),
        e.clock.clone(),
        Arc::new(RwLock::new(Catalog::builtin().expect("built-in"))),
        CatalogOptions::for_region("eastus"),
    );
    assert_eq!(restarted.collect_leaked().await.expect("collect"), 1);
    let nics: BTreeSet<String> = e.fake.arm().nics.keys().cloned().collect();
    assert_eq!(
        nics,
        BTreeSet::from(["aks-live".to_string(), "other".to_string()]),
        "the VM's NIC and a foreign NIC stay"
    );

    // A crash after the VM: no NodeClaim owns it; garbage collection deletes it.
    let instances = restarted.list().await.expect("list");
    let listed: Vec<&str> = instances.iter().map(|i| i.provider_id.as_str()).collect();
    assert_eq!(listed, [live.provider_id.as_str()]);
    let later = e
        .clock
        .now()
        .checked_add(jiff::SignedDuration::from_mins(10))
        .expect("ts");
    let orphans = tailor::controllers::garbage_collection::orphans(
        &instances,
        &BTreeSet::new(),
        CLUSTER,
        later,
        jiff::SignedDuration::from_secs(30),
    );
    assert_eq!(orphans.len(), 1);
    for o in orphans {
        restarted.delete(&o.provider_id).await.expect("delete");
    }
    assert!(e.fake.arm().vms.is_empty());
    assert!(!e.fake.arm().nics.contains_key("aks-live"));
}

#[tokio::test]
async fn deleting_a_vm_that_is_gone_succeeds_and_a_delete_takes_the_nic_along() {
    let e = env(Arm {
        retry_after: None,
        ..Arm::default()
    })
    .await;
    let gone = format!(
        "azure:///subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/aks-never"
    );
    e.cloud.delete(&gone).await.expect("404 is success");
    assert!(matches!(
        e.cloud.get(&gone).await,
        Err(CloudError::NotFound { .. })
    ));

    let i = e
        .cloud
        .create(&request(
            "d",
            vec![candidate(
                "Standard_D2s_v3",
                "eastus-3",
                CapacityType::OnDemand,
            )],
        ))
        .await
        .expect("launch");
    e.fake.arm().requests.clear();
    e.cloud.delete(&i.provider_id).await.expect("delete");
    let arm = e.fake.arm();
    assert!(arm.vms.is_empty() && arm.nics.is_empty());
    let del = arm
        .requests
        .iter()
        .find(|r| r.method == "DELETE" && r.path.contains("/virtualMachines/"))
        .expect("delete");
    assert!(del.query.contains("forceDeletion=true"), "{}", del.query);
    println!(
        "ARM calls per delete: {} ({:?})",
        arm.requests.len(),
        arm.requests
            .iter()
            .map(|r| format!(
                "{} {} -> {}",
                r.method,
                r.path.rsplit('/').next().unwrap_or_default(),
                r.status
            ))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn the_live_catalog_pages_drops_restricted_and_unpriced_sizes_and_prices_spot() {
    install_crypto();
    let fake = FakeArm::start(Arm {
        page_size: 2,
        ..Arm::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(VirtualClock::new(
        Timestamp::from_second(1_800_000_000).expect("ts"),
    ));
    let cloud = AzureCloud::new(
        credential(&fake, &dir).await,
        settings(&fake.url),
        clock,
        Arc::new(RwLock::new(Catalog::builtin().expect("built-in"))),
        CatalogOptions::for_region("eastus"),
    );
    cloud.refresh_catalog().await.expect("refresh");
    assert_eq!(
        fake.arm().count("GET", "/Microsoft.Compute/skus"),
        3,
        "6 SKUs, 2 a page"
    );
    assert_eq!(
        fake.arm().count("GET", "/api/retail/prices"),
        6,
        "12 prices, 2 a page"
    );
    let types = cloud.instance_types().await.expect("types");
    let names: BTreeSet<&str> = types.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["Standard_D2s_v3", "Standard_D4s_v3", "Standard_D8s_v3"]),
        "D13_v2_Promo and NV6 restricted, D2_v2 unpriced"
    );
    let d4 = types
        .iter()
        .find(|t| t.name == "Standard_D4s_v3")
        .expect("D4s_v3");
    let spot = d4
        .offerings
        .iter()
        .find(|o| o.capacity_type == CapacityType::Spot)
        .expect("spot");
    assert_eq!(
        (spot.price_per_hour, spot.price_is_estimate),
        (0.0384, false)
    );
    let od = d4
        .offerings
        .iter()
        .find(|o| o.capacity_type == CapacityType::OnDemand)
        .expect("od");
    assert_eq!(
        od.price_per_hour, 0.192,
        "the Windows row is not the Linux price"
    );

    // A claim any size could hold is never offered the unpriced one.
    let claim: tailor::apis::NodeClaim = serde_yaml::from_str(
        "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata: {name: c}\nspec:\n  requirements: []\n  resources: {requests: {cpu: 100m}}\n  nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n",
    )
    .expect("claim");
    let req = tailor::controllers::nodeclaim::launch::launch_request(&claim, &types, CLUSTER)
        .expect("request");
    assert!(!req.candidates.is_empty());
    assert!(
        req.candidates
            .iter()
            .all(|c| c.instance_type != "Standard_D2_v2")
    );

    // A failed refresh keeps the last good catalog.
    fake.arm().faults.push(Fault {
        on: Match {
            kind: "skus".into(),
            ..Match::default()
        },
        kind: FaultKind::Status {
            status: 400,
            body: json!({"error": {"code": "BadRequest", "message": "nope"}}),
            headers: vec![],
        },
        times: u32::MAX,
    });
    assert!(cloud.refresh_catalog().await.is_err());
    assert_eq!(cloud.instance_types().await.expect("types").len(), 3);
}

#[tokio::test]
async fn workload_identity_rereads_the_token_file_and_names_a_bad_one() {
    use azure_core::auth::TokenCredential;
    install_crypto();
    // Tokens that expire at once: every call exchanges.
    let fake = FakeArm::start(Arm {
        token_lifetime: 0,
        ..Arm::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cred = credential(&fake, &dir).await;
    let scope = ["https://management.azure.com/.default"];
    cred.get_token(&scope).await.expect("token");
    std::fs::write(dir.path().join("azure-identity-token"), SA_TOKEN_B).expect("rotate");
    cred.get_token(&scope).await.expect("token");
    assert_eq!(fake.arm().assertions, [SA_TOKEN_A, SA_TOKEN_B]);

    let missing = dir.path().join("no-such-token");
    let bad = WorkloadIdentity::new(
        azure_core::new_http_client(),
        "tenant",
        "client",
        missing.clone(),
        &fake.url,
    )
    .expect("credential");
    let err = bad
        .get_token(&scope)
        .await
        .expect_err("missing file")
        .to_string();
    assert!(err.contains(&missing.display().to_string()), "{err}");
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "not a token\n").expect("write");
    let bad = WorkloadIdentity::new(
        azure_core::new_http_client(),
        "tenant",
        "client",
        garbage.clone(),
        &fake.url,
    )
    .expect("credential");
    let err = bad
        .get_token(&scope)
        .await
        .expect_err("not a JWT")
        .to_string();
    assert!(
        err.contains(&garbage.display().to_string()) && err.contains("JWT"),
        "{err}"
    );
    assert_eq!(fake.arm().assertions.len(), 2, "bad files never reach AAD");
}

#[tokio::test]
async fn a_vm_that_never_finishes_times_out_and_leaves_nothing_behind() {
    let mut arm = Arm {
        retry_after: None,
        ..Arm::default()
    };
    arm.faults.push(Fault {
        on: Match {
            method: "PUT".into(),
            kind: "virtualMachines".into(),
            ..Match::default()
        },
        kind: FaultKind::NeverFinish,
        times: 1,
    });
    let e = env(arm).await;
    let err = e
        .cloud
        .create(&request(
            "slow",
            vec![candidate(
                "Standard_D2s_v3",
                "eastus-1",
                CapacityType::OnDemand,
            )],
        ))
        .await
        .expect_err("timeout");
    assert!(err.to_string().contains("not finished"), "{err}");
    let arm = e.fake.arm();
    assert!(
        arm.vms.is_empty() && arm.nics.is_empty(),
        "VM and NIC removed"
    );
}

fn tailor_catalog(fake_url: &str, token: &std::path::Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tailor"))
        .args([
            "catalog", "--source", "azure", "--region", "eastus", "-o", "json",
        ])
        .args([
            "--azure-resource-manager-endpoint",
            fake_url,
            "--azure-prices-endpoint",
            fake_url,
        ])
        .args(extra)
        .env("AZURE_TENANT_ID", "tenant")
        .env("AZURE_CLIENT_ID", "client")
        .env("AZURE_FEDERATED_TOKEN_FILE", token)
        .env("AZURE_AUTHORITY_HOST", fake_url)
        .env_remove("AZURE_SUBSCRIPTION_ID")
        .output()
        .expect("tailor runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tailor_catalog_with_the_azure_source_prints_the_live_catalog() {
    install_crypto();
    let fake = FakeArm::start(Arm::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, SA_TOKEN_A).expect("token");
    let (url, t) = (fake.url.clone(), token.clone());
    let out =
        tokio::task::spawn_blocking(move || tailor_catalog(&url, &t, &["--subscription-id", SUB]))
            .await
            .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["source"], "azure");
    assert_eq!(report["spotPricesAreEstimates"], false);
    let names: BTreeSet<&str> = report["instanceTypes"]
        .as_array()
        .expect("types")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["Standard_D2s_v3", "Standard_D4s_v3", "Standard_D8s_v3"])
    );
    let d2 = report["instanceTypes"]
        .as_array()
        .expect("types")
        .iter()
        .find(|t| t["name"] == "Standard_D2s_v3")
        .expect("d2");
    let spot = d2["offerings"]
        .as_array()
        .expect("offerings")
        .iter()
        .find(|o| o["capacityType"] == "spot")
        .expect("spot");
    assert_eq!(
        (
            spot["pricePerHour"].as_f64(),
            spot["priceIsEstimate"].as_bool()
        ),
        (Some(0.0192), Some(false))
    );
    assert!(
        fake.arm()
            .requests
            .iter()
            .any(|r| r.path.ends_with("/Microsoft.Compute/skus") && r.path.contains(SUB))
    );

    let (url, t) = (fake.url.clone(), token.clone());
    let out = tokio::task::spawn_blocking(move || tailor_catalog(&url, &t, &[]))
        .await
        .expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--subscription-id"), "{err}");
}

const CLIENT_GUID: &str = "7c9f2a4e-1b3d-4e5f-8a6b-0c1d2e3f4a5b";
const OBJECT_GUID: &str = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0";
const UNKNOWN_GUID: &str = "11111111-2222-4333-8444-555555555555";

fn kubelet_identity_id() -> String {
    format!(
        "/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/kubelet"
    )
}

/// A fake whose IMDS knows the system-assigned identity and one user-assigned identity.
async fn fake_with_identities() -> FakeArm {
    FakeArm::start(Arm {
        imds_user_assigned: vec![fake_arm::UserIdentity {
            client_id: CLIENT_GUID.to_string(),
            object_id: OBJECT_GUID.to_string(),
            resource_id: kubelet_identity_id(),
        }],
        ..Arm::default()
    })
    .await
}

fn quick(mut c: ManagedIdentity) -> ManagedIdentity {
    c.retry_delay = Duration::from_millis(10);
    c
}

#[tokio::test]
async fn managed_identity_tokens_come_from_imds_for_system_and_user_assigned_identities() {
    use azure_core::auth::TokenCredential;
    install_crypto();
    let fake = fake_with_identities().await;
    let arm_scope = ["https://management.azure.com/.default"];

    // System-assigned: the live catalog is read from ARM with an IMDS token, which is
    // cached across calls.
    let system = Arc::new(quick(
        ManagedIdentity::new(&fake.url, None).expect("credential"),
    ));
    let cloud = AzureCloud::new(
        system.clone(),
        settings(&fake.url),
        Arc::new(VirtualClock::new(
            Timestamp::from_second(1_800_000_000).expect("ts"),
        )),
        Arc::new(RwLock::new(Catalog::builtin().expect("built-in"))),
        CatalogOptions::for_region("eastus"),
    );
    cloud
        .refresh_catalog()
        .await
        .expect("catalog read with an IMDS token");
    system.get_token(&arm_scope).await.expect("cached token");
    {
        let arm = fake.arm();
        let vias: Vec<(&str, &str)> = arm
            .issued
            .iter()
            .map(|i| (i.via.as_str(), i.audience.as_str()))
            .collect();
        assert_eq!(vias, [("imds:system", "https://management.azure.com")]);
        let imds: Vec<&fake_arm::Logged> = arm
            .requests
            .iter()
            .filter(|r| r.path == "/metadata/identity/oauth2/token")
            .collect();
        assert_eq!(imds.len(), 1, "one token, then the cache");
        assert!(
            imds[0].query.contains("api-version=2018-02-01")
                && imds[0]
                    .query
                    .contains("resource=https%3A%2F%2Fmanagement.azure.com"),
            "{}",
            imds[0].query
        );
        assert!(
            arm.count("GET", "/Microsoft.Compute/skus") > 0,
            "ARM accepted the IMDS token"
        );
    }

    // User-assigned, by each of IMDS's three selectors.
    for (id, via) in [
        (
            UserAssigned::ClientId(CLIENT_GUID.to_string()),
            format!("imds:client_id={CLIENT_GUID}"),
        ),
        (
            UserAssigned::ObjectId(OBJECT_GUID.to_string()),
            format!("imds:object_id={OBJECT_GUID}"),
        ),
        (
            UserAssigned::ResourceId(kubelet_identity_id()),
            format!("imds:msi_res_id={}", kubelet_identity_id()),
        ),
    ] {
        let c = quick(ManagedIdentity::new(&fake.url, Some(id)).expect("credential"));
        let token = c
            .get_token(&[tailor::cloud::azure::auth::PROMETHEUS_SCOPE])
            .await
            .expect("user-assigned token");
        let arm = fake.arm();
        let last = arm.issued.last().expect("issued");
        assert_eq!(
            (
                token.token.secret(),
                last.via.as_str(),
                last.audience.as_str()
            ),
            (
                last.token.as_str(),
                via.as_str(),
                "https://prometheus.monitor.azure.com"
            )
        );
    }

    // An identity the VM does not have: IMDS's 400 body, the endpoint and the ID named.
    let unknown = quick(
        ManagedIdentity::new(
            &fake.url,
            Some(UserAssigned::ClientId(UNKNOWN_GUID.to_string())),
        )
        .expect("credential"),
    );
    let err = unknown
        .get_token(&arm_scope)
        .await
        .expect_err("unknown identity")
        .to_string();
    for part in [
        "400",
        "Identity not found",
        UNKNOWN_GUID,
        &format!("{}/metadata/identity/oauth2/token", fake.url),
    ] {
        assert!(err.contains(part), "{part:?} in {err}");
    }
    // A VM without a system-assigned identity.
    fake.arm().imds_system_assigned = false;
    system.clear_cache().await.expect("clear");
    let err = system
        .get_token(&arm_scope)
        .await
        .expect_err("no system identity")
        .to_string();
    assert!(
        err.contains("system-assigned") && err.contains("Identity not found"),
        "{err}"
    );
    // It says which chart values set the identity, and where the docs explain them.
    assert!(
        err.contains("managedIdentity.clientId")
            && err.contains("docs/install.md#an-azure-identity"),
        "{err}"
    );
    // A transient 500 is retried; a 400 is not.
    fake.arm().imds_system_assigned = true;
    fake.arm().faults.push(Fault {
        on: Match {
            kind: "imds".into(),
            ..Match::default()
        },
        kind: FaultKind::Status {
            status: 500,
            body: json!({"error": "unknown", "error_description": "IMDS is restarting"}),
            headers: Vec::new(),
        },
        times: 2,
    });
    let before = fake.arm().count("GET", "/metadata/identity");
    system.get_token(&arm_scope).await.expect("after two 500s");
    assert_eq!(fake.arm().count("GET", "/metadata/identity") - before, 3);
    let before = fake.arm().count("GET", "/metadata/identity");
    let _ = unknown
        .get_token(&arm_scope)
        .await
        .expect_err("still unknown");
    assert_eq!(fake.arm().count("GET", "/metadata/identity") - before, 1);

    // No IMDS at all (not an Azure VM): the endpoint is named.
    let nowhere = format!("http://127.0.0.1:{}", prometheus_server::free_port());
    let mut absent = quick(ManagedIdentity::new(&nowhere, None).expect("credential"));
    absent.retries = 1;
    let err = absent
        .get_token(&arm_scope)
        .await
        .expect_err("no IMDS")
        .to_string();
    assert!(
        err.contains(&nowhere) && err.contains("did not answer"),
        "{err}"
    );
}

/// `tailor catalog --source azure` with managed identity only (no workload identity).
fn tailor_catalog_with_managed_identity(fake_url: &str, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tailor"))
        .args([
            "catalog", "--source", "azure", "--region", "eastus", "-o", "json",
        ])
        .args([
            "--subscription-id",
            SUB,
            "--azure-resource-manager-endpoint",
            fake_url,
            "--azure-prices-endpoint",
            fake_url,
            "--azure-imds-endpoint",
            fake_url,
        ])
        .args(extra)
        .env_remove("AZURE_TENANT_ID")
        .env_remove("AZURE_CLIENT_ID")
        .env_remove("AZURE_FEDERATED_TOKEN_FILE")
        .env_remove("AZURE_POD_IDENTITY_AUTHORITY_HOST")
        .output()
        .expect("tailor runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tailor_catalog_uses_the_managed_identity_the_flags_name() {
    install_crypto();
    let fake = fake_with_identities().await;
    let run = |extra: Vec<&'static str>| {
        let url = fake.url.clone();
        tokio::task::spawn_blocking(move || tailor_catalog_with_managed_identity(&url, &extra))
    };
    let out = run(vec![]).await.expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(vec!["--azure-client-id", CLIENT_GUID])
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vias: Vec<String> = fake.arm().issued.iter().map(|i| i.via.clone()).collect();
    assert_eq!(
        vias,
        [
            "imds:system".to_string(),
            format!("imds:client_id={CLIENT_GUID}")
        ]
    );

    let out = run(vec!["--azure-client-id", UNKNOWN_GUID])
        .await
        .expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Identity not found") && err.contains(UNKNOWN_GUID),
        "{err}"
    );
    let out = run(vec!["--azure-client-id", "kubelet"])
        .await
        .expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--azure-client-id") && err.contains("\"kubelet\"") && err.contains("GUID"),
        "{err}"
    );
    assert_eq!(fake.arm().issued.len(), 2, "bad settings never reach IMDS");
}

const RECOMMEND_SNAPSHOT: &str = "
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop}
spec:
  containers:
  - name: app
    image: shop/web
    resources:
      requests: {cpu: '2', memory: 2Gi}
";

/// A day of one-minute samples of `shop/web-1/app` ending at `end`.
fn usage_history(end: i64) -> String {
    use std::fmt::Write as _;
    let start = end - 86_400;
    let mut om = String::from("# TYPE container_cpu_usage_seconds counter\n");
    for (i, t) in (start..=end).step_by(60).enumerate() {
        let _ = writeln!(
            om,
            "container_cpu_usage_seconds_total{{namespace=\"shop\",pod=\"web-1\",container=\"app\"}} {} {t}",
            i as f64 * 60.0 * 0.3
        );
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for t in (start..=end).step_by(60) {
        let _ = writeln!(
            om,
            "container_memory_working_set_bytes{{namespace=\"shop\",pod=\"web-1\",container=\"app\"}} {} {t}",
            400 * 1_048_576
        );
    }
    om.push_str("# EOF\n");
    om
}

/// Azure Managed Prometheus in front of a real Prometheus: answers 401 unless the
/// request carries a valid token the fake AAD/IMDS issued for the Prometheus audience.
struct Gate {
    prometheus: String,
    fake: Arc<std::sync::Mutex<Arm>>,
    client: reqwest::Client,
    /// Each request's bearer token and whether it was let through.
    seen: std::sync::Mutex<Vec<(Option<String>, bool)>>,
}

async fn gate(
    axum::extract::State(g): axum::extract::State<Arc<Gate>>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let ok = token.as_ref().is_some_and(|t| {
        g.fake.lock().expect("fake").issued.iter().any(|i| {
            &i.token == t
                && i.audience
                    .starts_with("https://prometheus.monitor.azure.com")
                && i.valid()
        })
    });
    g.seen.lock().expect("seen").push((token, ok));
    if !ok {
        return (
            axum::http::StatusCode::UNAUTHORIZED,
            [("content-type", "application/json")],
            r#"{"error":{"code":"InvalidAuthenticationToken","message":"The access token is missing, invalid or expired."}}"#,
        )
            .into_response();
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = g
        .client
        .request(method, format!("{}{path}", g.prometheus))
        .body(body);
    if let Some(ct) = headers.get("content-type") {
        request = request.header("content-type", ct);
    }
    let answer = request.send().await.expect("prometheus answers");
    let status = answer.status();
    let ct = answer
        .headers()
        .get("content-type")
        .cloned()
        .unwrap_or(axum::http::HeaderValue::from_static("application/json"));
    let bytes = answer.bytes().await.expect("body");
    (status, [("content-type", ct)], bytes).into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recommend_reads_azure_managed_prometheus_with_an_entra_token_refreshed_before_expiry() {
    install_crypto();
    let end = (Timestamp::now().as_second() / 3600) * 3600 - 3600;
    let prometheus = prometheus_server::start_prometheus(&usage_history(end)).await;
    let fake = fake_with_identities().await;
    let g = Arc::new(Gate {
        prometheus: prometheus.url.clone(),
        fake: fake.state.clone(),
        client: reqwest::Client::new(),
        seen: std::sync::Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let gate_url = format!("http://{}", listener.local_addr().expect("addr"));
    let app = axum::Router::new().fallback(gate).with_state(g.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let dir = tempfile::tempdir().expect("tempdir");
    let snapshot = dir.path().join("cluster.yaml");
    std::fs::write(&snapshot, RECOMMEND_SNAPSHOT).expect("snapshot");
    let sa_token = dir.path().join("sa-token");
    std::fs::write(&sa_token, SA_TOKEN_A).expect("sa token");
    let now = Timestamp::from_second(end).expect("ts").to_string();
    let run = |extra: Vec<String>, workload: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tailor"));
        command
            .args(["recommend", "--prometheus-url", &gate_url, "--snapshot"])
            .arg(&snapshot)
            .args(["--history", "1d", "--now", &now, "-o", "json"])
            .args(["--azure-imds-endpoint", &fake.url])
            .args(&extra)
            .env_remove("AZURE_POD_IDENTITY_AUTHORITY_HOST")
            .env_remove("TAILOR_PROMETHEUS_AZURE_AUTH");
        if workload {
            command
                .env("AZURE_TENANT_ID", "tenant")
                .env("AZURE_CLIENT_ID", "client")
                .env("AZURE_FEDERATED_TOKEN_FILE", &sa_token)
                .env("AZURE_AUTHORITY_HOST", &fake.url);
        } else {
            command
                .env_remove("AZURE_TENANT_ID")
                .env_remove("AZURE_CLIENT_ID")
                .env_remove("AZURE_FEDERATED_TOKEN_FILE");
        }
        tokio::task::spawn_blocking(move || command.output().expect("tailor runs"))
    };

    // Without the flag the workspace refuses, and the error says where and why.
    let out = run(vec![], true).await.expect("join");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("401") && err.contains(&gate_url) && err.contains("--prometheus-azure-auth"),
        "{err}"
    );
    assert!(fake.arm().issued.is_empty());

    // Workload identity with one-second tokens: the credential exchanges again before a
    // token expires, so every query is let through with a fresh one.
    fake.arm().token_lifetime = 1;
    g.seen.lock().expect("seen").clear();
    let out = run(vec!["--prometheus-azure-auth".to_string()], true)
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    let recs = report["recommendations"]
        .as_array()
        .expect("recommendations");
    assert_eq!(recs.len(), 1, "{report}");
    let queries = report["summary"]["prometheusQueries"]
        .as_u64()
        .expect("queries") as usize;
    let seen = g.seen.lock().expect("seen").clone();
    assert!(seen.iter().all(|(_, ok)| *ok), "{seen:?}");
    assert_eq!(seen.len(), queries);
    let distinct: BTreeSet<&String> = seen.iter().filter_map(|(t, _)| t.as_ref()).collect();
    {
        let arm = fake.arm();
        let prometheus_tokens: Vec<&fake_arm::Issued> =
            arm.issued.iter().filter(|i| i.via == "workload").collect();
        assert!(
            prometheus_tokens
                .iter()
                .all(|i| i.audience == tailor::cloud::azure::auth::PROMETHEUS_SCOPE),
            "{prometheus_tokens:?}"
        );
        assert!(
            queries >= 2 && distinct.len() == queries && prometheus_tokens.len() == queries,
            "a short-lived token is fetched again for every query: {} queries, {} tokens used, {} issued",
            queries,
            distinct.len(),
            prometheus_tokens.len()
        );
        eprintln!(
            "1 s workload-identity tokens: {queries} queries, {} distinct tokens used, {} exchanged",
            distinct.len(),
            prometheus_tokens.len()
        );
    }

    // The user-assigned managed identity with hour-long tokens: one token serves every
    // query.
    fake.arm().token_lifetime = 3600;
    fake.arm().issued.clear();
    g.seen.lock().expect("seen").clear();
    let out = run(
        vec![
            "--prometheus-azure-auth".to_string(),
            "--azure-client-id".to_string(),
            CLIENT_GUID.to_string(),
        ],
        false,
    )
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vias: Vec<(String, String)> = fake
        .arm()
        .issued
        .iter()
        .map(|i| (i.via.clone(), i.audience.clone()))
        .collect();
    assert_eq!(
        vias,
        [(
            format!("imds:client_id={CLIENT_GUID}"),
            "https://prometheus.monitor.azure.com".to_string()
        )]
    );
    let seen = g.seen.lock().expect("seen").clone();
    assert!(
        seen.len() >= 2 && seen.iter().all(|(_, ok)| *ok),
        "{seen:?}"
    );
    eprintln!(
        "1 h managed-identity token: {} queries served by 1 IMDS token",
        seen.len()
    );

    // An identity that cannot get a token: a clear error, no query sent.
    g.seen.lock().expect("seen").clear();
    let out = run(
        vec![
            "--prometheus-azure-auth".to_string(),
            "--azure-client-id".to_string(),
            UNKNOWN_GUID.to_string(),
        ],
        false,
    )
    .await
    .expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Identity not found")
            && err.contains(UNKNOWN_GUID)
            && err.contains("prometheus.monitor.azure.com"),
        "{err}"
    );
    assert!(g.seen.lock().expect("seen").is_empty());

    // Other Prometheus auth alongside is refused, naming both flags.
    let out = run(
        vec![
            "--prometheus-azure-auth".to_string(),
            "--prometheus-bearer-token-file".to_string(),
            sa_token.display().to_string(),
        ],
        true,
    )
    .await
    .expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--prometheus-azure-auth") && err.contains("--prometheus-bearer-token-file"),
        "{err}"
    );
    let out = run(
        vec![
            "--prometheus-azure-auth".to_string(),
            "--prometheus-header".to_string(),
            "Authorization=Bearer x".to_string(),
        ],
        true,
    )
    .await
    .expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Authorization header"), "{err}");
    let out = run(
        vec![
            "--prometheus-azure-auth".to_string(),
            "--prometheus-azure-scope".to_string(),
            "prometheus.monitor.azure.com".to_string(),
        ],
        true,
    )
    .await
    .expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--prometheus-azure-scope")
            && err.contains("\"prometheus.monitor.azure.com\""),
        "{err}"
    );
    server.abort();
}
