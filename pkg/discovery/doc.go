// Package discovery reads a cluster into a typed Snapshot: its Nodes, the mirror pods of
// the control-plane static pods, the kube-proxy DaemonSet, the PodDisruptionBudgets and,
// from the Talos API, each node's Talos version and active machine config.
//
// Discovery only reads. It makes a fixed number of Kubernetes requests (one LIST per
// resource type, whatever the node count) and one Version and one MachineConfig call per
// Talos node, fanned out with a bound. Its errors say which API failed and what to check.
package discovery
