// Test infrastructure: Karpenter's KWOK provider, the live provisioning and consolidation baseline.
// scripts/karpenter adds a `replace` to a copy of the module whose listeners bind to loopback.
module tailor.sh/test/karpenter

go 1.26.9

require sigs.k8s.io/karpenter v1.15.0
