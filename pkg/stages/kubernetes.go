package stages

import (
	"fmt"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// KubernetesStage is one of the four passes of a Kubernetes upgrade. A stage sets some
// components to the target and pins the others to the version the node's kubelet runs.
type KubernetesStage interface {
	// Name is the stage's name as plans and state show it.
	Name() string
	// Description says what the stage does, in one line.
	Description() string
	// VisitsWorkers reports whether workers follow the control planes in this stage.
	VisitsWorkers() bool
	// AtTarget reports whether the stage sets component c to the target; the others are
	// pinned to the node's kubelet version.
	AtTarget(c discovery.Component) bool
	// After says what runs once the stage's nodes are done; "" for nothing.
	After() string
	// Work is what one of the stage's batches waits for, which sets its pace.
	Work() Work
	// Drains reports whether each node is cordoned and drained before its apply, and
	// uncordoned once verified.
	Drains() bool
	// Rollout is what the stage rolls out across the cluster besides its nodes' configs.
	Rollout() Rollout
	// SkipReason says why the stage does not run on this cluster; "" when it runs.
	SkipReason(snap *discovery.Snapshot) string
}

// Rollout is what a Kubernetes stage rolls out across the cluster besides its nodes'
// configs.
type Rollout string

const (
	// NoRollout: the stage changes its nodes' configs alone.
	NoRollout Rollout = ""
	// RolloutKubeProxy: each control plane's config moves kube-proxy; the run syncs the
	// bootstrap manifests Talos re-renders from it (the kube-proxy DaemonSet changes)
	// and waits for the DaemonSet's rollout, which replaces kube-proxy on every node,
	// workers too.
	RolloutKubeProxy Rollout = "kube-proxy"
)

// APIServers moves kube-apiserver on every control plane, one at a time; everything else
// stays pinned, so no component is ever newer than an apiserver.
type APIServers struct{}

// Name implements KubernetesStage.
func (APIServers) Name() string { return "APIServers" }

// Description implements KubernetesStage.
func (APIServers) Description() string {
	return "kube-apiserver at the target on each control plane; everything else pinned to the node's kubelet"
}

// VisitsWorkers implements KubernetesStage.
func (APIServers) VisitsWorkers() bool { return false }

// AtTarget implements KubernetesStage.
func (APIServers) AtTarget(c discovery.Component) bool { return c == discovery.APIServer }

// After implements KubernetesStage.
func (APIServers) After() string { return "" }

// Work implements KubernetesStage.
func (APIServers) Work() Work { return WorkStaticPods }

// Drains implements KubernetesStage.
func (APIServers) Drains() bool { return false }

// Rollout implements KubernetesStage.
func (APIServers) Rollout() Rollout { return NoRollout }

// SkipReason implements KubernetesStage.
func (APIServers) SkipReason(*discovery.Snapshot) string { return "" }

// ControlPlaneComponents moves kube-controller-manager and kube-scheduler on every control
// plane, one at a time, once every apiserver is at the target.
type ControlPlaneComponents struct{}

// Name implements KubernetesStage.
func (ControlPlaneComponents) Name() string { return "ControlPlaneComponents" }

// Description implements KubernetesStage.
func (ControlPlaneComponents) Description() string {
	return "kube-controller-manager and kube-scheduler at the target on each control plane; kubelet and kube-proxy pinned"
}

// VisitsWorkers implements KubernetesStage.
func (ControlPlaneComponents) VisitsWorkers() bool { return false }

// AtTarget implements KubernetesStage.
func (ControlPlaneComponents) AtTarget(c discovery.Component) bool {
	return c == discovery.APIServer || c == discovery.ControllerManager || c == discovery.Scheduler
}

// After implements KubernetesStage.
func (ControlPlaneComponents) After() string { return "" }

// Work implements KubernetesStage.
func (ControlPlaneComponents) Work() Work { return WorkStaticPods }

// Drains implements KubernetesStage.
func (ControlPlaneComponents) Drains() bool { return false }

// Rollout implements KubernetesStage.
func (ControlPlaneComponents) Rollout() Rollout { return NoRollout }

// SkipReason implements KubernetesStage.
func (ControlPlaneComponents) SkipReason(*discovery.Snapshot) string { return "" }

// KubeProxy moves kube-proxy in each control plane's config, then syncs the bootstrap
// manifests and waits for the kube-proxy DaemonSet's rollout.
type KubeProxy struct{}

// Name implements KubernetesStage.
func (KubeProxy) Name() string { return "KubeProxy" }

// Description implements KubernetesStage.
func (KubeProxy) Description() string {
	return "kube-proxy at the target in each control plane's config; kubelet pinned"
}

// VisitsWorkers implements KubernetesStage.
func (KubeProxy) VisitsWorkers() bool { return false }

// AtTarget implements KubernetesStage.
func (KubeProxy) AtTarget(c discovery.Component) bool { return c != discovery.Kubelet }

// After implements KubernetesStage.
func (KubeProxy) After() string { return "bootstrap manifests, kube-proxy rollout" }

// Work implements KubernetesStage.
func (KubeProxy) Work() Work { return WorkConfig }

// Drains implements KubernetesStage.
func (KubeProxy) Drains() bool { return false }

// Rollout implements KubernetesStage.
func (KubeProxy) Rollout() Rollout { return RolloutKubeProxy }

// SkipReason implements KubernetesStage.
func (KubeProxy) SkipReason(snap *discovery.Snapshot) string {
	if !snap.KubeProxy.Present {
		return "kube-proxy is disabled (no kube-system/kube-proxy DaemonSet)"
	}

	return ""
}

// Kubelets gives every node the full target: control planes one at a time, then workers a
// batch at a time, each cordoned and drained first.
type Kubelets struct{}

// Name implements KubernetesStage.
func (Kubelets) Name() string { return "Kubelets" }

// Description implements KubernetesStage.
func (Kubelets) Description() string {
	return "everything at the target: cordon, drain, kubelet, uncordon"
}

// VisitsWorkers implements KubernetesStage.
func (Kubelets) VisitsWorkers() bool { return true }

// AtTarget implements KubernetesStage.
func (Kubelets) AtTarget(discovery.Component) bool { return true }

// After implements KubernetesStage.
func (Kubelets) After() string { return "" }

// Work implements KubernetesStage.
func (Kubelets) Work() Work { return WorkDrain }

// Drains implements KubernetesStage.
func (Kubelets) Drains() bool { return true }

// Rollout implements KubernetesStage.
func (Kubelets) Rollout() Rollout { return NoRollout }

// SkipReason implements KubernetesStage.
func (Kubelets) SkipReason(*discovery.Snapshot) string { return "" }

// KubernetesStages returns the stages of a Kubernetes upgrade in execution order.
func KubernetesStages() []KubernetesStage {
	return []KubernetesStage{APIServers{}, ControlPlaneComponents{}, KubeProxy{}, Kubelets{}}
}

// DesiredVersion is the version component c (whose image is image) runs on node n once
// stage s has run: the target when the stage sets it, otherwise the node's kubelet version.
// A pin never moves a component backwards: one already newer than the kubelet (a partly
// upgraded node) keeps what it runs.
func DesiredVersion(s KubernetesStage, n discovery.Node, c discovery.Component, image string, target Version) (Version, error) {
	if s.AtTarget(c) {
		return target, nil
	}

	pin, err := ParseVersion(n.KubeletVersion)
	if err != nil {
		return Version{}, fmt.Errorf("node %q: kubelet version: %w", n.Name, err)
	}

	current, err := imageVersion(image)
	if err != nil {
		return Version{}, fmt.Errorf("node %q: %s: %w", n.Name, c, err)
	}

	if current.Compare(pin) > 0 {
		return current, nil
	}

	return pin, nil
}

// KubernetesChanges returns what stage s changes on node n: for every component the node's
// machine config runs, its image from -> to, with the repository kept. Empty means the node
// only needs verifying in this stage.
func KubernetesChanges(s KubernetesStage, n discovery.Node, target Version) ([]api.Change, error) {
	if n.Talos == nil {
		return nil, fmt.Errorf("node %q: stage %s: no Talos machine config was read", n.Name, s.Name())
	}

	var changes []api.Change

	for _, c := range discovery.Components() {
		image, ok := n.Talos.Images[c]
		if !ok {
			continue
		}

		want, err := DesiredVersion(s, n, c, image, target)
		if err != nil {
			return nil, fmt.Errorf("stage %s: %w", s.Name(), err)
		}

		if render.TagOf(image) == want.String() {
			continue
		}

		to, err := render.WithTag(image, want.String())
		if err != nil {
			return nil, fmt.Errorf("node %q: stage %s: %s: %w", n.Name, s.Name(), c, err)
		}

		changes = append(changes, api.Change{
			Component: string(c), From: image, To: to, Path: c.PathIn(n.Talos.Layouts[c]), DroppedDigest: render.DigestOf(image),
		})
	}

	return changes, nil
}

// KubernetesDone reports whether node n already runs target everywhere: its kubelet and
// every image in its machine config.
func KubernetesDone(n discovery.Node, target Version) bool {
	if n.Talos == nil || n.KubeletVersion != target.String() {
		return false
	}

	for _, image := range n.Talos.Images {
		if render.TagOf(image) != target.String() {
			return false
		}
	}

	return true
}
