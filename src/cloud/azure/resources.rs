//! The ARM resources a launch creates, as Karpenter's Azure provider shapes them
//! (`pkg/providers/instance/vminstance.go` `newVMObject`, `newNetworkInterfaceForVM`):
//! names, IDs, provider IDs, tags, and the NIC and VM request bodies. Pure.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::apis::aksnodeclass::{ImageFamily, NodeImage};
use crate::cloud::NodeLaunch;
use crate::model::CapacityType;

/// Karpenter's public community galleries for AKS node images (`imagefamily/consts.go`).
pub const UBUNTU_GALLERY: &str = "AKSUbuntu-38d80f77-467a-481f-a8d4-09b6d4220bd2";
/// Azure Linux's community gallery.
pub const AZURE_LINUX_GALLERY: &str = "AKSAzureLinux-f7c7cda5-1c9a-4bdc-a222-9614c968580b";
/// Prefix of every VM and NIC name (`GenerateResourceName`).
pub const NAME_PREFIX: &str = "aks-";
/// Tag AKS bills Linux nodes by.
pub const BILLING_TAG: (&str, &str) = ("compute.aks.billing", "linux");
/// Provider ID scheme.
pub const PROVIDER_ID_PREFIX: &str = "azure://";

/// Hardware facts of a size that shape its VM, from Resource SKUs' capabilities.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SkuFacts {
    /// vCPUs.
    pub vcpus: u32,
    /// Quota family (`standardDSv5Family`).
    pub family: Option<String>,
    /// `AcceleratedNetworkingEnabled`.
    pub accelerated_networking: bool,
    /// `EphemeralOSDiskSupported`.
    pub ephemeral_os_disk: bool,
    /// `MaxResourceVolumeMB`: the temp disk an ephemeral OS disk may live on.
    pub max_resource_volume_mb: u64,
    /// `CachedDiskBytes`: the cache an ephemeral OS disk may live on.
    pub cached_disk_bytes: u64,
    /// `HyperVGenerations` includes V2.
    pub hyperv_gen2: bool,
    /// `CpuArchitectureType` is Arm64.
    pub arm64: bool,
}

/// Where the VMs go and what they carry besides the node's own settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// Subscription.
    pub subscription_id: String,
    /// Resource group of the node VMs (AKS's `MC_` group).
    pub resource_group: String,
    /// Region.
    pub location: String,
    /// The subnet used when the node class names none.
    pub default_subnet_id: String,
    /// Admin user of the VMs.
    pub admin_username: String,
    /// The only login: this SSH public key.
    pub ssh_public_key: String,
    /// User-assigned identities attached to every VM (the kubelet identity).
    pub node_identities: Vec<String>,
}

/// The VM and NIC name for a NodeClaim.
pub fn resource_name(claim: &str) -> String {
    format!("{NAME_PREFIX}{claim}")
}

/// The ARM ID of a VM.
pub fn vm_id(p: &Placement, name: &str) -> String {
    format!(
        "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{name}",
        p.subscription_id, p.resource_group
    )
}

/// The ARM ID of a NIC.
pub fn nic_id(p: &Placement, name: &str) -> String {
    format!(
        "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/networkInterfaces/{name}",
        p.subscription_id, p.resource_group
    )
}

/// A node's `spec.providerID` for a VM ID, the resource group lower-cased as the Azure
/// cloud provider writes it (`azure:///subscriptions/<s>/resourceGroups/mc_rg_c_eastus/...`).
pub fn provider_id(vm_id: &str) -> String {
    let mut parts: Vec<String> = vm_id.split('/').map(str::to_string).collect();
    if let Some(i) = parts
        .iter()
        .position(|p| p.eq_ignore_ascii_case("resourceGroups"))
    {
        parts[i] = "resourceGroups".to_string();
        if let Some(rg) = parts.get_mut(i + 1) {
            *rg = rg.to_ascii_lowercase();
        }
    }
    format!("{PROVIDER_ID_PREFIX}{}", parts.join("/"))
}

/// The VM name in a provider ID, if it names an Azure VM.
pub fn vm_name(provider_id: &str) -> Option<&str> {
    let id = provider_id.strip_prefix(PROVIDER_ID_PREFIX)?;
    let lower = id.to_ascii_lowercase();
    let marker = "/providers/microsoft.compute/virtualmachines/";
    let at = lower.find(marker)? + marker.len();
    let name = &id[at..];
    (!name.is_empty() && !name.contains('/')).then_some(name)
}

/// Tag keys may not hold `/`: Karpenter writes `_` instead (`launchtemplate/tags.go`).
pub fn tags(request_tags: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = request_tags
        .iter()
        .map(|(k, v)| (k.replace('/', "_"), v.clone()))
        .collect();
    out.insert(BILLING_TAG.0.to_string(), BILLING_TAG.1.to_string());
    out
}

/// The image a VM of this size boots: the first resolved image whose architecture
/// requirement the size meets, else the family's community gallery image.
pub fn image_id(node: &NodeLaunch, facts: &SkuFacts) -> String {
    let arch = if facts.arm64 { "arm64" } else { "amd64" };
    let fits = |img: &NodeImage| {
        img.requirements.iter().all(|r| {
            r.key != crate::apis::labels::ARCH
                || r.values
                    .as_ref()
                    .is_none_or(|v| v.iter().any(|a| a == arch))
        })
    };
    if let Some(img) = node.images.iter().find(|i| fits(i)) {
        return img.id.clone();
    }
    let gen1 = !facts.hyperv_gen2;
    let (gallery, definition) = match (node.image_family, facts.arm64, gen1) {
        (ImageFamily::AzureLinux, true, _) => (AZURE_LINUX_GALLERY, "V2gen2arm64"),
        (ImageFamily::AzureLinux, false, true) => (AZURE_LINUX_GALLERY, "V2"),
        (ImageFamily::AzureLinux, false, false) => (AZURE_LINUX_GALLERY, "V2gen2"),
        (ImageFamily::Ubuntu2404, true, _) => (UBUNTU_GALLERY, "2404gen2arm64containerd"),
        (ImageFamily::Ubuntu2404, false, true) => (UBUNTU_GALLERY, "2404containerd"),
        (ImageFamily::Ubuntu2404, false, false) => (UBUNTU_GALLERY, "2404gen2containerd"),
        (_, true, _) => (UBUNTU_GALLERY, "2204gen2arm64containerd"),
        (_, false, true) => (UBUNTU_GALLERY, "2204containerd"),
        (_, false, false) => (UBUNTU_GALLERY, "2204gen2containerd"),
    };
    let version = node.image_version.as_deref().unwrap_or("latest");
    format!("/CommunityGalleries/{gallery}/images/{definition}/versions/{version}")
}

/// The NIC body: one primary dynamic IP configuration in the subnet.
pub fn nic_body(
    p: &Placement,
    node: &NodeLaunch,
    facts: &SkuFacts,
    tags: &BTreeMap<String, String>,
) -> Value {
    let subnet = node.subnet_id.as_deref().unwrap_or(&p.default_subnet_id);
    json!({
        "location": p.location,
        "tags": tags,
        "properties": {
            "enableAcceleratedNetworking": facts.accelerated_networking,
            "enableIPForwarding": false,
            "ipConfigurations": [{
                "name": "ipconfig1",
                "properties": {
                    "primary": true,
                    "privateIPAllocationMethod": "Dynamic",
                    "subnet": { "id": subnet }
                }
            }]
        }
    })
}

/// The zone number ARM wants (`"2"`) for a zone label (`eastus-2`); `None` for regional.
pub fn zone_number(zone: &str) -> Option<String> {
    zone.rsplit('-')
        .next()
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_string)
}

/// Everything a VM body needs beyond the placement.
#[derive(Debug, Clone)]
pub struct VmSpec<'a> {
    /// VM and OS disk name.
    pub name: &'a str,
    /// Size.
    pub size: &'a str,
    /// Zone label.
    pub zone: &'a str,
    /// Spot or on-demand.
    pub capacity_type: CapacityType,
    /// The node's settings.
    pub node: &'a NodeLaunch,
    /// The size's facts.
    pub facts: &'a SkuFacts,
    /// Image ID.
    pub image_id: &'a str,
    /// Base64 custom data.
    pub custom_data: &'a str,
    /// Tags.
    pub tags: &'a BTreeMap<String, String>,
    /// The NIC's ID.
    pub nic_id: &'a str,
}

/// The VM body (Karpenter's `newVMObject`).
pub fn vm_body(p: &Placement, vm: &VmSpec<'_>) -> Value {
    let disk_gb = vm
        .node
        .os_disk_size_gb
        .unwrap_or(crate::apis::aksnodeclass::DEFAULT_OS_DISK_SIZE_GB);
    let disk_mb = u64::try_from(disk_gb).unwrap_or(0) * 1024;
    let mut os_disk = json!({
        "name": vm.name,
        "diskSizeGB": disk_gb,
        "createOption": "FromImage",
        "deleteOption": "Delete",
    });
    // An ephemeral OS disk where the size supports it and the disk fits its cache or temp
    // disk (Karpenter prefers the cache, as AKS does).
    if vm.facts.ephemeral_os_disk {
        let placement = if vm.facts.cached_disk_bytes >= disk_mb * 1024 * 1024 {
            Some("CacheDisk")
        } else if vm.facts.max_resource_volume_mb >= disk_mb {
            Some("ResourceDisk")
        } else {
            None
        };
        if let Some(placement) = placement {
            os_disk["caching"] = json!("ReadOnly");
            os_disk["diffDiskSettings"] = json!({"option": "Local", "placement": placement});
        }
    }
    let image = if vm.image_id.starts_with("/CommunityGalleries/") {
        json!({ "communityGalleryImageId": vm.image_id })
    } else {
        json!({ "id": vm.image_id })
    };
    let mut properties = json!({
        "hardwareProfile": { "vmSize": vm.size },
        "storageProfile": { "osDisk": os_disk, "imageReference": image },
        "networkProfile": {
            "networkInterfaces": [{
                "id": vm.nic_id,
                "properties": { "primary": true, "deleteOption": "Delete" }
            }]
        },
        "osProfile": {
            "adminUsername": p.admin_username,
            "computerName": vm.name,
            "customData": vm.custom_data,
            "linuxConfiguration": {
                "disablePasswordAuthentication": true,
                "ssh": { "publicKeys": [{
                    "keyData": p.ssh_public_key,
                    "path": format!("/home/{}/.ssh/authorized_keys", p.admin_username),
                }]}
            }
        },
        "priority": match vm.capacity_type {
            CapacityType::Spot => "Spot",
            CapacityType::OnDemand => "Regular",
        },
    });
    if vm.capacity_type == CapacityType::Spot {
        properties["evictionPolicy"] = json!("Delete");
        properties["billingProfile"] = json!({ "maxPrice": -1 });
    }
    let mut body = json!({
        "location": p.location,
        "tags": vm.tags,
        "properties": properties,
    });
    if let Some(z) = zone_number(vm.zone) {
        body["zones"] = json!([z]);
    }
    if !p.node_identities.is_empty() {
        let ids: serde_json::Map<String, Value> = p
            .node_identities
            .iter()
            .map(|id| (id.clone(), json!({})))
            .collect();
        body["identity"] = json!({ "type": "UserAssigned", "userAssignedIdentities": ids });
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_lower_case_the_resource_group_and_name_the_vm() {
        let id = "/subscriptions/s/resourceGroups/MC_rg_C_eastus/providers/Microsoft.Compute/virtualMachines/aks-a";
        let pid = provider_id(id);
        assert_eq!(
            pid,
            "azure:///subscriptions/s/resourceGroups/mc_rg_c_eastus/providers/Microsoft.Compute/virtualMachines/aks-a"
        );
        assert_eq!(vm_name(&pid), Some("aks-a"));
        assert_eq!(vm_name(&pid.to_ascii_lowercase()), Some("aks-a"));
        assert_eq!(vm_name("kwok://x"), None);
    }

    #[test]
    fn zone_labels_become_arm_zone_numbers() {
        assert_eq!(zone_number("eastus-2").as_deref(), Some("2"));
        assert_eq!(zone_number("eastus"), None);
    }

    #[test]
    fn tag_keys_lose_their_slashes_and_gain_the_billing_tag() {
        let t = tags(&BTreeMap::from([(
            "tailor.sh/x".to_string(),
            "1".to_string(),
        )]));
        assert_eq!(t.get("tailor.sh_x").map(String::as_str), Some("1"));
        assert_eq!(
            t.get("compute.aks.billing").map(String::as_str),
            Some("linux")
        );
    }

    #[test]
    fn arm64_gen2_ubuntu_gets_the_arm64_image_definition() {
        let facts = SkuFacts {
            arm64: true,
            hyperv_gen2: true,
            ..Default::default()
        };
        let id = image_id(&NodeLaunch::default(), &facts);
        assert_eq!(
            id,
            format!(
                "/CommunityGalleries/{UBUNTU_GALLERY}/images/2204gen2arm64containerd/versions/latest"
            )
        );
    }
}
