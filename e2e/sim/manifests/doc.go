// Package manifests applies the bootstrap manifests of simulated Talos
// control planes (their Manifest resources) to a cluster, as Talos'
// ManifestApplyController does, the local cluster's and the kind e2e's: as
// the Talos version that runs it (a plain Create before 1.13, server-side
// apply with the inventory ConfigMap from 1.13), so that a cluster born on
// an older Talos keeps the managed fields that version gave its objects. It
// also syncs them as talosctl upgrade-k8s does (SyncAsUpgradeK8s: every field
// taken over, the inventory written, what the manifests dropped pruned).
package manifests
