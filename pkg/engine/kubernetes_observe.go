package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file is what a Kubernetes stage reads at its start: the cluster, each node's
// Talos version and active config, the visiting order in groups, and the render that
// says whether an earlier stage still has the node to move.

// observe reads the cluster for stage s: the snapshot, the nodes to visit
// grouped in visiting order (each with its Talos version and active config),
// and the held nodes of the stage.
func (r *kubeRun) observe(ctx context.Context, s stages.KubernetesStage) (*discovery.Snapshot, [][]*stageNode, []discovery.Node, error) {
	name := s.Name()

	var snap *discovery.Snapshot

	err := kube.Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		snap, err = (&discovery.Discoverer{Kube: r.e.Kube}).Discover(ctx)

		return err
	})
	if err != nil {
		return nil, nil, nil, r.pause(ctx, name, "", "read the cluster: "+err.Error(), actionResume, err)
	}

	var candidates, held []discovery.Node

	r.known = map[string]bool{}

	for _, n := range snap.Nodes {
		r.known[n.Name] = true

		if !n.ControlPlane && !s.VisitsWorkers() {
			continue
		}

		if n.Held {
			held = append(held, n)

			continue
		}

		if !n.IsTalos() {
			err := fmt.Errorf("node %q runs %q, not Talos", n.Name, n.OSImage)

			return nil, nil, nil, r.pause(ctx, name, n.Name, err.Error(),
				fmt.Sprintf("hold it (kubectl annotate node %s %s=not-talos), then resume", n.Name, discovery.HoldAnnotation), err)
		}

		if n.InternalIP == "" {
			err := fmt.Errorf("node %q has no InternalIP address to reach its Talos API", n.Name)

			return nil, nil, nil, r.pause(ctx, name, n.Name, err.Error(), "check the Node's status.addresses, then resume", err)
		}

		candidates = append(candidates, n)
	}

	reads := make([]*discovery.Node, len(candidates))
	for i := range candidates {
		reads[i] = &candidates[i]
	}

	// Read ahead while the kube-proxy rollout ran (readAhead), through the same address.
	ahead := r.takeAhead()

	err = talos.ForEach(ctx, reads, (*discovery.Node).Address, r.opts.Concurrency, func(ctx context.Context, n *discovery.Node) error {
		if got, ok := ahead[n.Name]; ok && got.ip == n.InternalIP {
			n.Talos = discovery.NewTalos(got.version, got.cfg)

			return nil
		}

		version, cfg, err := r.readTalos(ctx, n.Name, n.InternalIP)
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}

		n.Talos = discovery.NewTalos(version, cfg)

		return nil
	})
	if err != nil {
		return nil, nil, nil, r.pause(ctx, name, "", "read the nodes' Talos side: "+stages.FirstLine(err), actionTalosAccess, err)
	}

	order, err := stages.OrderNodes(candidates, stages.OrderOptions{Self: r.opts.Self, MaxUnavailable: r.opts.MaxUnavailable})
	if err != nil {
		return nil, nil, nil, r.pause(ctx, name, "", err.Error(), actionResume, err)
	}

	return snap, r.groups(s, order), held, nil
}

// groups lays out the nodes of a stage in visiting order: each control plane
// alone, then, in the Kubelets stage, the workers in batches of
// MaxUnavailable. In a stage that drains (Kubelets) a node ichor cordoned (a run that
// stopped mid-node, such as the runner evicted by its own drain) goes first
// in its group: it is finished before anything else is made unavailable.
// Next come the nodes behind the cluster (an earlier stage's render still
// changes them: a hold removed, a control plane added): a control plane whose
// apiserver is behind holds every other controller-manager back, so it
// catches up before any other node takes the stage.
func (r *kubeRun) groups(s stages.KubernetesStage, order stages.Order) [][]*stageNode {
	drains := s.Drains()

	rank := func(n discovery.Node) int {
		if node, ok := r.cache.Node(n.Name); drains && ok && kube.CordonedByIchor(node) {
			return 0
		}

		if n.Talos != nil {
			// An error here is the visit's to report.
			if earlier, err := r.earlierStage(s, n, n.Talos.Config); err == nil && earlier != nil {
				return 1
			}
		}

		return 2
	}

	inVisitOrder := func(nodes []discovery.Node) []*stageNode {
		out := make([]*stageNode, 0, len(nodes))
		ranks := map[*stageNode]int{}

		for _, n := range nodes {
			sn := &stageNode{Node: n}
			out = append(out, sn)
			ranks[sn] = rank(n)
		}

		slices.SortStableFunc(out, func(a, b *stageNode) int { return ranks[a] - ranks[b] })

		return out
	}

	var groups [][]*stageNode

	for _, n := range inVisitOrder(order.ControlPlanes) {
		groups = append(groups, []*stageNode{n})
	}

	if !s.VisitsWorkers() {
		return groups
	}

	workers := inVisitOrder(slices.Concat(order.Workers...))
	for start := 0; start < len(workers); start += r.opts.MaxUnavailable {
		groups = append(groups, workers[start:min(start+r.opts.MaxUnavailable, len(workers))])
	}

	return groups
}

// skipReason says why a stage does not run: only the stage of the kube-proxy
// rollout (KubeProxy) can be skipped, when there is no kube-proxy DaemonSet or
// no control plane's config enables kube-proxy.
func (r *kubeRun) skipReason(s stages.KubernetesStage, snap *discovery.Snapshot, visit [][]*stageNode) string {
	if s.Rollout() != stages.RolloutKubeProxy {
		return ""
	}

	if reason := s.SkipReason(snap); reason != "" {
		return reason
	}

	for _, group := range visit {
		for _, n := range group {
			if n.Talos.KubeProxyEnabled {
				return ""
			}
		}
	}

	return "kube-proxy is disabled in the control planes' machine config (cluster.proxy.disabled)"
}

// earlierStage returns the first stage before s whose render changes node n's active
// config cfg, nil when every earlier stage is done on it.
func (r *kubeRun) earlierStage(s stages.KubernetesStage, n discovery.Node, cfg config.Provider) (stages.KubernetesStage, error) {
	for _, st := range stages.KubernetesStages() {
		if st.Name() == s.Name() {
			return nil, nil
		}

		changed, err := stages.StageChanges(st, n, cfg, r.target)
		if err != nil {
			return nil, err
		}

		if len(changed) > 0 {
			return st, nil
		}
	}

	return nil, nil
}

// render returns the stage's config for node n (its kubelet version read
// from its Node) from its active config cfg.
func (r *kubeRun) render(s stages.KubernetesStage, n discovery.Node, cfg config.Provider) (*render.Result, error) {
	return stages.RenderStage(s, n, cfg, r.target)
}

// renderAction says what to do about a render of node that failed: an image
// whose tag says no version wants a tag.
func renderAction(node string, err error) string {
	if errors.Is(err, stages.ErrNoVersionTag) {
		return stages.UnreadableAction(node)
	}

	return actionResume
}

// unreachableRetry is the wait between two reads of a node whose Talos API is
// unreachable (readTalos).
const unreachableRetry = time.Second

// readTalos reads a node's Talos version and active config, again while its Talos API is
// unreachable (whileUnreachable).
func (r *kubeRun) readTalos(ctx context.Context, name, ip string) (version string, cfg config.Provider, err error) {
	err = r.whileUnreachable(ctx, name, func(ctx context.Context) error {
		var err error

		version, cfg, err = r.readTalosOnce(ctx, ip)

		return err
	})

	return version, cfg, err
}

// whileUnreachable is the engine's whileUnreachable for a Kubernetes stage's reads: the
// first look at the node, its active and its persistent config before an apply, the dry
// run.
func (r *kubeRun) whileUnreachable(ctx context.Context, name string, read func(ctx context.Context) error) error {
	return r.e.whileUnreachable(ctx, r.opts.UnreachableGrace, name, read)
}

// whileUnreachable calls read, a call that changes nothing on the node, again while the
// node's Talos API is unreachable, for up to grace: a Talos that restarts its API, a
// link that flaps or a machine power-cycled within the grace does not pause the
// operation; one that stays unreachable does, with how long it was tried.
func (e *Engine) whileUnreachable(ctx context.Context, grace time.Duration, name string, read func(ctx context.Context) error) error {
	deadline := time.Now().Add(grace)

	for attempt := 0; ; attempt++ {
		err := read(ctx)

		switch {
		case err == nil || !talos.IsUnreachable(err) || ctx.Err() != nil:
			return err
		case !time.Now().Before(deadline):
			return fmt.Errorf("%w (unreachable for %s)", err, grace)
		case attempt == 0:
			e.line("  %s: Talos API unreachable (%s): reading it again for up to %s", name, stages.FirstLine(err), grace)
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(unreachableRetry):
		}
	}
}

// readTalosOnce reads a node's Talos version and active config, under talosReadTimeout.
func (r *kubeRun) readTalosOnce(ctx context.Context, ip string) (string, config.Provider, error) {
	ctx, cancel := context.WithTimeout(ctx, talosReadTimeout)
	defer cancel()

	version, err := r.e.Talos.Version(ctx, ip)
	if err != nil {
		return "", nil, err
	}

	cfg, err := r.e.Talos.MachineConfig(ctx, ip)
	if err != nil {
		return "", nil, err
	}

	return version, cfg, nil
}
