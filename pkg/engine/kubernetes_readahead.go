package engine

import (
	"context"
	"sync"

	"github.com/siderolabs/talos/pkg/machinery/config"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// talosRead is one node's Talos side as read ahead: its version and active config,
// read through ip.
type talosRead struct {
	ip, version string
	cfg         config.Provider
}

// readingAhead is the next stage's Talos reads made while the kube-proxy rollout
// runs: every node's version and active config, the reads a stage's start makes
// for each node it visits (observe), and the longest part of it on a large
// cluster (a config read and decoded per node). The rollout waits on the
// DaemonSet controller, which replaces one pod at a time; the reads made
// meanwhile cost the Kubelets stage's start nothing.
//
// A config read ahead is as good as one read at the stage's start: either is
// only the stage's plan. Each visit reads the node's active config again right
// before its apply and renders again when it changed (stageNode.plannedFrom).
type readingAhead struct {
	stop func()
	done chan struct{}

	mu   sync.Mutex
	read map[string]talosRead
}

// readAhead starts reading the Talos side of snap's nodes that the next stage
// may visit (Talos nodes with an address, not held). A read that fails is left
// to the stage's start, which reads it again with its grace for an unreachable
// node.
func (r *kubeRun) readAhead(ctx context.Context, snap *discovery.Snapshot) *readingAhead {
	ctx, cancel := context.WithCancel(ctx)
	a := &readingAhead{stop: cancel, done: make(chan struct{}), read: map[string]talosRead{}}

	var nodes []discovery.Node

	for _, n := range snap.Nodes {
		if n.IsTalos() && !n.Held && n.InternalIP != "" {
			nodes = append(nodes, n)
		}
	}

	go func() {
		defer close(a.done)

		_ = talos.ForEach(ctx, nodes, discovery.Node.Address, r.opts.Concurrency,
			func(ctx context.Context, n discovery.Node) error {
				version, cfg, err := r.readTalosOnce(ctx, n.InternalIP)
				if err == nil {
					a.mu.Lock()
					a.read[n.Name] = talosRead{ip: n.InternalIP, version: version, cfg: cfg}
					a.mu.Unlock()
				}

				return nil
			})
	}()

	return a
}

// wait returns the reads once all are made, by node name: none takes longer
// than the stage's start would take to make it again, and each is bounded
// (talosReadTimeout).
func (a *readingAhead) wait() map[string]talosRead {
	<-a.done

	a.mu.Lock()
	defer a.mu.Unlock()

	return a.read
}

// takeAhead returns the nodes' Talos sides read ahead and forgets them: the
// one stage start that follows the rollout uses them, and no later one.
func (r *kubeRun) takeAhead() map[string]talosRead {
	read := r.readAheadTalos
	r.readAheadTalos = nil

	return read
}
