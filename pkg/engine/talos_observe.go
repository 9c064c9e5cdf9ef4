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
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file is what the Talos upgrade reads of the cluster: the nodes in visiting order
// with their Talos version and active config, a node's Talos side read again (patiently
// while it may be rebooting).

// observe reads the cluster: the nodes to visit grouped in visiting order,
// each with its Talos version and active config (a node whose Talos API is
// unreachable is kept, to be read again at its turn: it may be rebooting),
// and the held nodes.
func (r *talosRun) observe(ctx context.Context) ([][]*osNode, []discovery.Node, error) {
	name := r.stage.Name()

	var snap *discovery.Snapshot

	err := kube.Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		snap, err = (&discovery.Discoverer{Kube: r.e.Kube}).Discover(ctx)

		return err
	})
	if err != nil {
		return nil, nil, r.e.pause(ctx, name, "", "read the cluster: "+err.Error(), actionResume, err)
	}

	var (
		candidates []discovery.Node
		held       []discovery.Node
	)

	r.nodes = snap.Nodes

	for _, n := range snap.Nodes {
		if n.ControlPlane {
			r.controlPlanes++
			r.etcdNodes = append(r.etcdNodes, stages.EtcdNode{Name: n.Name, IP: n.InternalIP})
		}

		if n.Held {
			held = append(held, n)

			continue
		}

		if !n.IsTalos() {
			err := fmt.Errorf("node %q runs %q, not Talos", n.Name, n.OSImage)

			return nil, nil, r.e.pause(ctx, name, n.Name, err.Error(),
				fmt.Sprintf("hold it (kubectl annotate node %s %s=not-talos), then resume", n.Name, discovery.HoldAnnotation), err)
		}

		if n.InternalIP == "" {
			err := fmt.Errorf("node %q has no InternalIP address to reach its Talos API", n.Name)

			return nil, nil, r.e.pause(ctx, name, n.Name, err.Error(), "check the Node's status.addresses, then resume", err)
		}

		candidates = append(candidates, n)
	}

	nodes := make([]*osNode, 0, len(candidates))
	byName := make(map[string]*osNode, len(candidates))

	for _, n := range candidates {
		on := &osNode{Node: n}
		nodes, byName[n.Name] = append(nodes, on), on
	}

	err = talos.ForEach(ctx, nodes, (*osNode).Address, r.opts.Concurrency, func(ctx context.Context, n *osNode) error {
		version, cfg, err := r.read(ctx, n.Name, n.InternalIP)

		switch {
		case talos.IsUnreachable(err):
			n.unreachable = err
		case err != nil:
			return err
		default:
			n.version, n.cfg = version, cfg
		}

		return nil
	})
	if err != nil {
		return nil, nil, r.e.pause(ctx, name, "", "read the nodes' Talos side: "+stages.FirstLine(err), actionTalosAccess, err)
	}

	order, err := stages.OrderNodes(candidates, stages.OrderOptions{Self: r.opts.Self, MaxUnavailable: r.opts.MaxUnavailable})
	if err != nil {
		return nil, nil, r.e.pause(ctx, name, "", err.Error(), actionResume, err)
	}

	return r.groups(order, byName), held, nil
}

// groups lays out the nodes in visiting order: each control plane alone,
// then the workers in batches of MaxUnavailable. A node whose upgrade is
// under way (ichor cordoned it, or its boot ID is recorded and it does not
// run the target yet) goes first in its group: it is finished before
// anything else is made unavailable. A node that runs the target and that
// ichor does not hold cordoned is done but for its verification, however
// its mark reads: counted under way, the nodes an earlier runner finished
// would share the first batch with those it left half done, and push some of
// those into a later batch.
func (r *talosRun) groups(order stages.Order, byName map[string]*osNode) [][]*osNode {
	inProgress := func(name string) bool {
		n, ok := r.cache.Node(name)
		if ok && kube.CordonedByIchor(n) {
			return true
		}

		on := byName[name]

		return r.mark(name).following() && (on.unreachable != nil || on.version != r.target.String())
	}

	firstInProgress := func(nodes []discovery.Node) []*osNode {
		out := make([]*osNode, 0, len(nodes))

		for _, n := range nodes {
			if inProgress(n.Name) {
				out = append(out, byName[n.Name])
			}
		}

		for _, n := range nodes {
			if !inProgress(n.Name) {
				out = append(out, byName[n.Name])
			}
		}

		return out
	}

	var groups [][]*osNode

	for _, n := range firstInProgress(order.ControlPlanes) {
		groups = append(groups, []*osNode{n})
	}

	workers := firstInProgress(slices.Concat(order.Workers...))
	for start := 0; start < len(workers); start += r.opts.MaxUnavailable {
		groups = append(groups, workers[start:min(start+r.opts.MaxUnavailable, len(workers))])
	}

	return groups
}

// read reads a node's Talos version and active config, under one deadline.
func (r *talosRun) read(ctx context.Context, name, ip string) (string, config.Provider, error) {
	ctx, cancel := context.WithTimeout(ctx, talosReadTimeout)
	defer cancel()

	version, err := r.e.Talos.Version(ctx, ip)
	if err != nil {
		return "", nil, fmt.Errorf("node %q: %w", name, err)
	}

	cfg, err := r.e.Talos.MachineConfig(ctx, ip)
	if err != nil {
		return "", nil, fmt.Errorf("node %q: %w", name, err)
	}

	return version, cfg, nil
}

// readPatiently is read, tried again while the node is unreachable, for at
// most talosReadTimeout (a node, or the endpoint that routes to it, still
// rebooting).
func (r *talosRun) readPatiently(ctx context.Context, name, ip string) (string, config.Provider, error) {
	var (
		version string
		cfg     config.Provider
		lastErr error
	)

	err := r.pollUntil(ctx, time.Now().Add(talosReadTimeout), talosReadTimeout, func(ctx context.Context) (bool, string, error) {
		var err error

		version, cfg, err = r.read(ctx, name, ip)

		switch {
		case err == nil:
			return true, "", nil
		case talos.IsUnreachable(err) || errors.Is(err, context.DeadlineExceeded):
			lastErr = err

			return false, "Talos API unreachable", nil
		}

		return false, "", err
	}, func(waiting string) {
		r.e.node(r.stage.Name(), name, PhasePending, "%s: reading it again", waiting)
	})

	var timeout *kube.WaitTimeoutError
	if errors.As(err, &timeout) && lastErr != nil {
		return "", nil, fmt.Errorf("%w (for %s)", lastErr, timeout.After)
	}

	return version, cfg, err
}
