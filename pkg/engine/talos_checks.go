package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// This file is what gates the Talos upgrade's first install: per node the upgrade path,
// readiness, installer and staged config; for the cluster the Kubernetes pairing of the
// target (machinery's compatibility tables) and etcd.

// checkStage runs the checks that gate the stage's first upgrade, on the
// nodes it will upgrade: the upgrade path from each one's Talos to the
// target, the target's support of the Kubernetes the cluster runs, each
// node's installer image, each node Ready. Nothing has changed yet when it
// refuses.
func (r *talosRun) checkStage(ctx context.Context, pending []*osNode, facts map[string]startFacts) error {
	stage := r.stage.Name()

	var (
		installers, notReady, staged []string
		installerNodes, stagedNodes  []string
		visited                      = make([]compat.Node, 0, len(pending))
	)

	for _, n := range pending {
		f := facts[n.Name]

		switch {
		case f.stagedErr != nil:
			return r.e.pause(ctx, stage, n.Name, "checks: "+f.stagedErr.Error(), actionTalosAccess, f.stagedErr)
		case f.staged != "":
			staged = append(staged, fmt.Sprintf("%s (%s)", n.Name, f.staged))
			stagedNodes = append(stagedNodes, n.Name)
		}

		visited = append(visited, compat.Node{Name: n.Name, Talos: n.version})

		if f.installerErr != nil {
			installers = append(installers, f.installerErr.Error())
			installerNodes = append(installerNodes, n.Name)
		}

		if node, ok := r.cache.Node(n.Name); !ok || !nodeReady(node) {
			notReady = append(notReady, n.Name)
		}
	}

	// The version rules the plan's rows ask: the target installable from each node's
	// Talos, and supporting the Kubernetes the cluster runs (held nodes apart), as
	// the stage's start read it.
	target := compat.Version(r.target)
	for _, v := range []struct {
		check   string
		verdict compat.Verdict
	}{
		{compat.NameTalosUpgradeable, compat.TalosUpgradeable(visited, target)},
		{compat.NameTalosSupports, compat.TalosSupports(compat.FromNodes(r.nodes), target)},
	} {
		if !v.verdict.Allowed {
			reason, action, nodes := verdictPause(v.check, v.verdict)
			if v.check == compat.NameTalosUpgradeable && len(nodes) == 0 {
				// A target refused as such (a minor this build does not know)
				// refuses every node it would upgrade.
				for _, n := range visited {
					nodes = append(nodes, n.Name)
				}
			}

			return r.refuse(ctx, nodes, reason, action)
		}
	}

	switch {
	case len(installers) > 0:
		return r.refuse(ctx, installerNodes, "installer: "+text.Summarize(installers),
			installerAction(installerNodes, r.target))
	case len(staged) > 0:
		ip := ""
		if n := r.pendingNode(pending, stagedNodes[0]); n != nil {
			ip = n.InternalIP
		}

		return r.refuse(ctx, stagedNodes, "a machine config change is staged for the next reboot, which the upgrade's would activate: "+text.Summarize(staged),
			render.StagedAction(ip))
	}

	return r.checkReady(ctx, notReady)
}

// checkReady refuses the nodes not Ready, once those still starting had their
// bounded wait (waitStarting).
func (r *talosRun) checkReady(ctx context.Context, notReady []string) error {
	if len(notReady) == 0 {
		return nil
	}

	notReady, waited, err := r.e.waitStarting(ctx, r.cache, r.stage.Name(), notReady, r.opts.StartingTimeout)
	if err != nil || len(notReady) == 0 {
		return err
	}

	reason, action := notReadyRefusal(notReady, waited)

	return r.refuse(ctx, notReady, reason, action)
}

// startFacts is what the stage's start reads of a node it upgrades, for its
// line and its checks: the installer chosen from what it runs, and where a
// machine config change is staged for its next boot ("" when none).
type startFacts struct {
	installer    stages.Installer
	installerErr error
	staged       string
	stagedErr    error
}

// readStart reads, for each pending node, its installer (Talos' system
// extensions) and, when staged, its persistent machine config, Concurrency
// nodes at a time: each a Talos call or two, bounded; their errors are in the
// facts, for checkStage. It fails only when ctx ends before every node was
// read.
func (r *talosRun) readStart(ctx context.Context, pending []*osNode, staged bool) (map[string]startFacts, error) {
	facts := make(map[string]startFacts, len(pending))

	var mu sync.Mutex

	err := talos.ForEach(ctx, pending, (*osNode).Address, r.opts.Concurrency, func(ctx context.Context, n *osNode) error {
		var f startFacts

		f.installer, f.installerErr = r.installer(ctx, n.Node, n.cfg)
		if staged {
			f.staged, f.stagedErr = r.stagedConfig(ctx, n)
		}

		mu.Lock()
		defer mu.Unlock()

		facts[n.Name] = f

		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stage %s: read the nodes to upgrade: %w", r.stage.Name(), err)
	}

	return facts, nil
}

// pendingNode is the pending node named name, nil when none.
func (r *talosRun) pendingNode(pending []*osNode, name string) *osNode {
	for _, n := range pending {
		if n.Name == name {
			return n
		}
	}

	return nil
}

// refuse pauses the stage before it changes anything, naming the node when
// there is one.
func (r *talosRun) refuse(ctx context.Context, nodes []string, reason, action string) error {
	node := ""
	if len(nodes) == 1 {
		node = nodes[0]
	}

	return r.e.pause(ctx, r.stage.Name(), node, "checks: "+reason, action, errors.New(reason))
}
