// Package manifests applies the bootstrap manifests of simulated Talos
// control planes (their Manifest resources) to a cluster, as Talos'
// ManifestApplyController does: the local cluster's and the kind e2e's.
package manifests
