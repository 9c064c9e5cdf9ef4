// Package stages owns the shape of an upgrade: the stages as an ordered list of small
// types (APIServers, ControlPlaneComponents, KubeProxy, Kubelets for Kubernetes; TalosOS
// for the OS), the order nodes are visited in, what each stage changes on each node, and
// the version rules (strict vX.Y.Z, one minor at a time, no downgrade).
//
// Everything here is pure: it reads a discovery.Snapshot and returns the plan's stages as
// the api/v1alpha1 types, so the plan command and the in-cluster engine derive the same
// answer from the same observed state.
package stages
