// Package stages owns the shape of an upgrade: the stages as an ordered list of small
// types (APIServers, ControlPlaneComponents, KubeProxy, Kubelets for Kubernetes; TalosOS
// for the OS), the order nodes are visited in, what each stage changes on each node, and
// the version rules (strict vX.Y.Z, one minor at a time, no downgrade).
//
// The plan side is pure: it reads a discovery.Snapshot and returns the plan's stages as
// the api/v1alpha1 types, so the plan command and the in-cluster engine derive the same
// answer from the same observed state.
//
// The Engine (engine.go is its contract with the runner; one file per upgrade kind,
// engine_kubernetes.go for Kubernetes) drives an upgrade against the cluster. It keeps
// no state of its own: every Run re-reads each node's active machine config and compares
// it with the render for the current stage; a node that differs is checked, dry-run and
// applied (NO_REBOOT, under its own deadline), one that is equal is only verified, so a
// fresh Engine on a half-done cluster finishes it without applying anything twice. After
// every apply it checks the invariant against what the cluster runs: no
// kube-controller-manager, kube-scheduler, kube-proxy or kubelet newer than any
// kube-apiserver. The Kubernetes side of each step (verification by informers, cordon
// and drain, the bootstrap manifests' server-side apply) is pkg/kube.
package stages
