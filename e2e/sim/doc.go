// Package sim is the root of the local simulated Talos cluster: a real
// Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler built from module sources) with simulated Talos machines and
// kubelets. It imports nothing from the product's pkg/ tree, so a bug in the
// product cannot be mirrored here and cancel out.
//
// Sub-packages:
//   - events: the events.jsonl log of every component start, the independent
//     record of what ran at which version.
//   - faults: per-node faults, read from a file that may change while the
//     cluster runs.
//   - machine: one simulated Talos machine (config, version, boot ID, COSI
//     resources) and its Talos 1.13 and 1.14 semantics.
//   - talosapi: the real Talos gRPC API over mTLS in front of the machines.
//   - kubelet: the simulated kubelets (Nodes, Leases, mirror pods, pods).
//   - manifests: the bootstrap manifests applied as Talos applies them.
//   - talosaccess: Talos API access from Kubernetes (talos.dev ServiceAccounts).
//   - cluster: the control-plane processes and the whole cluster's lifecycle.
package sim
