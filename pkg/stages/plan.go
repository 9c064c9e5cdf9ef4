package stages

import (
	"fmt"
	"maps"
	"sort"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// Options are the plan inputs besides the snapshot and the target.
type Options struct {
	// Self is the node that runs the Job (last in its group); may be empty.
	Self string
	// MaxUnavailable is how many workers move at once; below 1 means 1.
	MaxUnavailable int
}

// PlanKubernetes returns the plan of a Kubernetes upgrade to target: the summary, the four
// stages with every node's changes in execution order, held nodes and nodes already at
// the target. Checks are not run here; Checks and Runnable are left empty.
//
// Nodes whose Talos side was not read (nodes that are not Talos) are left out of the
// stages; the checks refuse them by name.
func PlanKubernetes(snap *discovery.Snapshot, target Version, opts Options) (*api.Plan, error) {
	order, err := OrderNodes(planNodes(snap), OrderOptions{
		Self:           opts.Self,
		MaxUnavailable: opts.MaxUnavailable,
		Done:           func(n discovery.Node) bool { return KubernetesDone(n, target) },
	})
	if err != nil {
		return nil, err
	}

	plan := newPlan(snap, api.UpgradeKubernetes, target, opts, order)
	plan.Components = kubernetesSummary(snap, target)

	// Each stage is shown against the images the previous stages leave, as it will run.
	after := imagesAfter{}

	for _, s := range KubernetesStages() {
		stage := api.Stage{Name: s.Name(), Description: s.Description(), After: s.After(), Nodes: []api.NodeStep{}}

		if reason := s.SkipReason(snap); reason != "" {
			stage.Skipped, stage.SkipReason, stage.After = true, reason, ""
			plan.Stages = append(plan.Stages, stage)

			continue
		}

		steps, err := nodeSteps(order, opts.Self, s.VisitsWorkers(), func(n discovery.Node) ([]api.Change, error) {
			changes, err := KubernetesChanges(s, after.of(n), target)
			after.apply(n.Name, changes)

			return changes, err
		})
		if err != nil {
			return nil, err
		}

		stage.Nodes = steps
		stage.Rollout = rolloutOf(s, snap, steps)
		plan.Stages = append(plan.Stages, stage)
	}

	return plan, nil
}

// rolloutOf is the kube-proxy DaemonSet's rollout after the KubeProxy stage
// when some node's config moves kube-proxy (its sync changes the DaemonSet),
// nil otherwise.
func rolloutOf(s KubernetesStage, snap *discovery.Snapshot, steps []api.NodeStep) *api.Rollout {
	if s.Rollout() != RolloutKubeProxy || !snap.KubeProxy.Present {
		return nil
	}

	for _, n := range steps {
		for _, c := range n.Changes {
			if c.Component == string(discovery.KubeProxy) {
				return &api.Rollout{
					DaemonSet:      discovery.StaticPodNamespace + "/" + discovery.KubeProxyDaemonSet,
					Pods:           int(snap.KubeProxy.Desired),
					MaxUnavailable: max(1, snap.KubeProxy.MaxUnavailable),
				}
			}
		}
	}

	return nil
}

// imagesAfter tracks each node's images as the earlier stages of a plan leave them.
type imagesAfter map[string]map[discovery.Component]string

// of returns n with its images as the earlier stages leave them.
func (a imagesAfter) of(n discovery.Node) discovery.Node {
	changed, found := a[n.Name]
	if !found || n.Talos == nil {
		return n
	}

	t := *n.Talos
	t.Images = maps.Clone(n.Talos.Images)
	maps.Copy(t.Images, changed)
	n.Talos = &t

	return n
}

// apply records a stage's changes on a node.
func (a imagesAfter) apply(node string, changes []api.Change) {
	if len(changes) == 0 {
		return
	}

	images := a[node]
	if images == nil {
		images = map[discovery.Component]string{}
		a[node] = images
	}

	for _, c := range changes {
		images[discovery.Component(c.Component)] = c.To
	}
}

// PlanTalos returns the plan of a Talos OS upgrade to target with the TalosOS stage.
// installers are the operator's explicit installers; a node without one gets the
// installer ChooseInstaller derives from what it runs.
func PlanTalos(snap *discovery.Snapshot, target Version, installers InstallerFlags, opts Options) (*api.Plan, error) {
	if err := installers.CheckNodes(snap); err != nil {
		return nil, err
	}

	stage := TalosOS{Target: target, Installers: installers}

	order, err := OrderNodes(planNodes(snap), OrderOptions{
		Self:           opts.Self,
		MaxUnavailable: opts.MaxUnavailable,
		Done:           stage.Done,
	})
	if err != nil {
		return nil, err
	}

	plan := newPlan(snap, api.UpgradeTalos, target, opts, order)
	plan.Components = []api.Component{{Name: "talos", Current: plan.Cluster.Talos, Target: target.String()}}

	steps, err := nodeSteps(order, opts.Self, true, stage.Changes)
	if err != nil {
		return nil, err
	}

	for i := range steps {
		if n, ok := snap.Node(steps[i].Node); ok {
			steps[i].Installed = InstalledOf(n)
		}
	}

	plan.Stages = []api.Stage{{Name: stage.Name(), Description: stage.Description(), Nodes: steps}}

	return plan, nil
}

// planNodes are the nodes that can be planned: Talos nodes, and held nodes of any kind
// (shown as held).
func planNodes(snap *discovery.Snapshot) []discovery.Node {
	var out []discovery.Node

	for _, n := range snap.Nodes {
		if n.Held || n.Talos != nil {
			out = append(out, n)
		}
	}

	return out
}

func newPlan(snap *discovery.Snapshot, kind string, target Version, opts Options, order Order) *api.Plan {
	plan := &api.Plan{
		APIVersion:     api.APIVersion,
		Kind:           api.KindPlan,
		Upgrade:        kind,
		Target:         target.String(),
		MaxUnavailable: max(opts.MaxUnavailable, 1),
		Cluster:        api.Cluster{Endpoint: snap.Endpoint},
		Checks:         []api.Check{},
	}

	var talos []string

	for _, n := range snap.Nodes {
		if n.ControlPlane {
			plan.Cluster.ControlPlanes++
		} else {
			plan.Cluster.Workers++
		}

		if n.Talos != nil {
			talos = append(talos, n.Talos.Version)
		}
	}

	plan.Cluster.Talos = CountVersions(talos)

	for _, n := range order.Held {
		reason := discovery.HoldAnnotation
		if n.HoldReason != "" {
			reason += ": " + n.HoldReason
		}

		plan.Held = append(plan.Held, api.NodeNote{Node: n.Name, Reason: reason})
	}

	for _, n := range order.Done {
		plan.AtTarget = append(plan.AtTarget, n.Name)
	}

	return plan
}

// nodeSteps lays out a stage's nodes: control planes one per batch, then (when workers
// is set) the worker batches.
func nodeSteps(order Order, self string, workers bool, changes func(discovery.Node) ([]api.Change, error)) ([]api.NodeStep, error) {
	steps := []api.NodeStep{}
	batch := 0

	add := func(n discovery.Node) error {
		c, err := changes(n)
		if err != nil {
			return err
		}

		if c == nil {
			c = []api.Change{}
		}

		steps = append(steps, api.NodeStep{
			Node: n.Name, Role: n.Role(), Batch: batch, Self: self != "" && n.Name == self,
			ConfigLayout: ConfigLayout(n), Changes: c,
		})

		return nil
	}

	for _, n := range order.ControlPlanes {
		batch++

		if err := add(n); err != nil {
			return nil, err
		}
	}

	if !workers {
		return steps, nil
	}

	for _, b := range order.Workers {
		batch++

		for _, n := range b {
			if err := add(n); err != nil {
				return nil, err
			}
		}
	}

	return steps, nil
}

// ConfigLayout says where node n's machine config keeps its Kubernetes
// images: api.LayoutV1Alpha1, api.LayoutMultiDoc, api.LayoutMixed, or ""
// when its config was not read.
func ConfigLayout(n discovery.Node) string {
	if n.Talos == nil || len(n.Talos.Layouts) == 0 {
		return ""
	}

	seen := map[render.Layout]bool{}
	for _, l := range n.Talos.Layouts {
		seen[l] = true
	}

	switch {
	case len(seen) > 1:
		return api.LayoutMixed
	case seen[render.Document]:
		return api.LayoutMultiDoc
	default:
		return api.LayoutV1Alpha1
	}
}

// kubernetesSummary counts, per component, the versions the nodes run now: static pods
// from their mirror pods (or the machine config when no mirror pod was found), kube-proxy
// from its DaemonSet (one per scheduled node), the kubelet from the Node.
func kubernetesSummary(snap *discovery.Snapshot, target Version) []api.Component {
	var out []api.Component

	for _, c := range discovery.Components() {
		var versions []string

		for _, n := range snap.Nodes {
			switch {
			case c == discovery.KubeProxy && snap.KubeProxy.Present:
				// kube-proxy runs from the DaemonSet on every node, counted below.
			case c == discovery.Kubelet:
				versions = append(versions, n.KubeletVersion)
			case n.StaticPods[c].Image != "":
				versions = append(versions, versionOrUnknown(n.StaticPods[c].Image))
			case n.Talos != nil && n.Talos.Images[c] != "":
				versions = append(versions, versionOrUnknown(n.Talos.Images[c]))
			}
		}

		if c == discovery.KubeProxy && snap.KubeProxy.Present {
			for range snap.KubeProxy.Desired {
				versions = append(versions, versionOrUnknown(snap.KubeProxy.Image))
			}
		}

		if len(versions) == 0 {
			continue
		}

		out = append(out, api.Component{Name: string(c), Current: CountVersions(versions), Target: target.String()})
	}

	return out
}

func versionOrUnknown(image string) string {
	if v := render.TagOf(image); v != "" {
		return v
	}

	return "unknown"
}

// CountVersions counts distinct versions, oldest first (by Version; unparsable ones last, by text).
func CountVersions(versions []string) []api.VersionCount {
	counts := map[string]int{}

	for _, v := range versions {
		if v == "" {
			v = "unknown"
		}

		counts[v]++
	}

	out := make([]api.VersionCount, 0, len(counts))
	for v, c := range counts {
		out = append(out, api.VersionCount{Version: v, Count: c})
	}

	sort.Slice(out, func(i, j int) bool {
		a, errA := ParseVersion(out[i].Version)
		b, errB := ParseVersion(out[j].Version)

		switch {
		case errA == nil && errB == nil:
			return a.Compare(b) < 0
		case errA == nil || errB == nil:
			return errA == nil
		}

		return out[i].Version < out[j].Version
	})

	return out
}

// RunningVersion parses the version of the image a node's component runs.
func RunningVersion(image string) (Version, error) {
	v, err := imageVersion(image)
	if err != nil {
		return Version{}, fmt.Errorf("running version: %w", err)
	}

	return v, nil
}
