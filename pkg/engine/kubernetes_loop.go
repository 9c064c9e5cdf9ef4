package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// This file is the Kubernetes upgrade's loop: the four stages in order, each read from
// the cluster, checked and pre-pulled when a node needs an apply, then its nodes visited
// group by group (a worker batch at once); the last stage then takes the nodes whose
// hold was removed while it ran.

// kubeRun is one Run of a Kubernetes upgrade.
type kubeRun struct {
	e       *Engine
	opts    Options
	target  stages.Version
	cache   *kube.Cache
	applier *kube.ManifestApplier
	// observer reads what the cluster runs now, one read shared by the nodes of a batch
	// that check at the same time.
	observer *kube.Observer
	// base is the invariant as judged at the stage's start: no apply may make it worse.
	base stages.Invariant
	// known are the nodes the stage read at its start: a control plane not among
	// them joined the cluster since (see joinedError).
	known map[string]bool
	// restarts counts the times the stage started again because control planes
	// joined, and joins how often each did (see runJoined).
	restarts int
	joins    map[string]int
	// pulled are the images this run pulled, "node ref": a later stage does not pull
	// them again (with PullOnly every stage's render holds the earlier stages' images).
	pulled map[string]bool
	// ahead is the next stage's pull under way while a stage runs (pullAhead), next
	// that stage (nil in the last).
	ahead *kubePullingAhead
	next  stages.KubernetesStage
	// readAheadTalos are the nodes' Talos sides read while the kube-proxy rollout
	// ran, for the next stage's start (readAhead, takeAhead).
	readAheadTalos map[string]talosRead
}

// stageNode is a node a stage visits, as read at the stage's start.
type stageNode struct {
	discovery.Node
	// changes are what the stage's render changes on the node, as read at
	// the stage's start.
	changes []render.Change
	// planned is that render, from the active config whose hash is
	// plannedFrom; a visit that finds the same config and kubelet version
	// uses it rather than render again.
	planned     *render.Result
	plannedFrom string
}

// runKubernetes drives the four stages in order. A stage whose nodes are all
// done only verifies them, so a Run always walks every stage and picks up
// where the cluster is.
func (e *Engine) runKubernetes(ctx context.Context, opts Options) error {
	target, err := stages.ParseVersion(opts.Target)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}

	if e.Kube == nil || e.Dynamic == nil || e.Talos == nil {
		return errors.New("the engine needs Kube, Dynamic and Talos clients")
	}

	c, err := e.startCache(ctx)
	if err != nil {
		return err
	}
	defer c.Stop()

	r := &kubeRun{
		e: e, opts: opts, target: target, cache: c, applier: kube.NewManifestApplier(e.Dynamic, e.Kube.Discovery()),
		observer: kube.NewObserver(ctx, e.Kube),
	}

	defer func() { r.ahead.stop() }()

	all := stages.KubernetesStages()
	for i, s := range all {
		if i+1 < len(all) {
			r.next = all[i+1]
		} else {
			r.next = nil
		}

		if err := r.runStage(ctx, i+1, len(all), s); err != nil {
			return err
		}
	}

	if opts.PullOnly {
		return nil
	}

	return e.leftBehind(ctx, all[len(all)-1].Name(), target, kubeletBehind(target),
		"the next run takes it through every stage from APIServers")
}

// runStage runs one stage: read the stage's nodes, plan each one's render,
// and when any needs an apply run the checks and the pre-pull first; then
// visit the nodes in order, and for KubeProxy wait for the rollout.
//
// The last stage, which visits every node, then takes the nodes whose hold was
// removed while it ran: they are not left behind by a run that says it
// succeeded. (A node released during an earlier stage is visited by the
// next, which takes it through the stages it missed first.)
func (r *kubeRun) runStage(ctx context.Context, index, total int, s stages.KubernetesStage) error {
	name := s.Name()
	r.e.stage(index, total, name)
	r.restarts, r.joins = 0, map[string]int{}

	held, err := r.runJoined(ctx, s, nil)

	for err == nil && s.VisitsWorkers() && len(held) > 0 {
		var released map[string]bool

		if released, err = r.released(ctx, name, held); err != nil || len(released) == 0 {
			break
		}

		names := slices.Sorted(maps.Keys(released))
		r.e.step(name, "released", "hold removed during the stage: %s, taken now", strings.Join(names, ", "))

		held, err = r.runJoined(ctx, s, released)
	}

	return err
}

// released returns the nodes of held that no longer carry the hold annotation, as
// the run's watch of the Nodes has them (getNode; a Node it does not have is read
// from the apiserver). A hold removed a moment before that the watch has not seen
// yet is caught by the run's last look (leftBehind).
func (r *kubeRun) released(ctx context.Context, stage string, held []discovery.Node) (map[string]bool, error) {
	out := map[string]bool{}

	for _, n := range held {
		node, err := r.getNode(ctx, n.Name)
		if apierrors.IsNotFound(err) {
			continue
		}

		if err != nil {
			return nil, r.pause(ctx, stage, n.Name, "read the Node: "+err.Error(), actionResume, err)
		}

		if _, still := node.Annotations[discovery.HoldAnnotation]; !still {
			out[n.Name] = true
		}
	}

	return out, nil
}

// runNodes runs stage s on its nodes (only those named in only, when it is not
// nil) and returns the nodes it left alone because they are held.
func (r *kubeRun) runNodes(ctx context.Context, s stages.KubernetesStage, only map[string]bool) ([]discovery.Node, error) {
	name := s.Name()

	snap, visit, held, err := r.observe(ctx, s)
	if err != nil {
		return nil, err
	}

	if only != nil {
		visit = onlyNodes(visit, only)
	}

	if reason := r.skipReason(s, snap, visit); reason != "" {
		r.e.step(name, "skipped", "%s", reason)

		return held, nil
	}

	if only == nil {
		r.e.reportHeld(name, held, r.cache)
	}

	var pending []*stageNode

	for _, group := range visit {
		for _, n := range group {
			res, err := r.render(s, n.Node, n.Talos.Config)
			if err == nil {
				n.plannedFrom, err = render.Hash(n.Talos.Config)
			}

			if err != nil {
				return nil, r.pause(ctx, name, n.Name, err.Error(), renderAction(n.Name, err), err)
			}

			n.changes, n.planned = res.Changed, res
			if len(n.changes) == 0 {
				r.e.node(name, n.Name, PhasePending, "nothing to apply: to verify")

				continue
			}

			pending = append(pending, n)
			r.e.node(name, n.Name, PhasePending, "to apply: %s", describeChanges(n.changes))
		}
	}

	if r.opts.PullOnly {
		if len(pending) == 0 {
			return held, nil
		}

		return held, r.prePull(ctx, s, snap, pending)
	}

	if len(pending) > 0 {
		if err := r.checkStage(ctx, s, pending); err != nil {
			return nil, err
		}

		if err := r.prePull(ctx, s, snap, pending); err != nil {
			return nil, err
		}
	} else if err := r.checkInvariant(ctx, name, ""); err != nil {
		return nil, err
	}

	// While this stage's nodes are visited, the next stage's images are pulled.
	if r.next != nil && r.ahead == nil {
		r.pullAhead(ctx, name, r.next, snap)
	}

	var synced bool

	for _, group := range visit {
		ok, err := r.runGroup(ctx, s, group)
		if err != nil {
			return nil, err
		}

		synced = synced || ok
	}

	if s.Rollout() == stages.RolloutKubeProxy && synced {
		// The next stage's reads of the nodes' Talos side are made while the
		// DaemonSet controller rolls kube-proxy out.
		var ahead *readingAhead
		if r.next != nil {
			ahead = r.readAhead(ctx, snap)
		}

		err := r.rollout(ctx, name)

		if ahead != nil {
			if err != nil {
				ahead.stop()
			}

			r.readAheadTalos = ahead.wait()
		}

		return held, err
	}

	return held, nil
}

// onlyNodes keeps the nodes of visit named in only, in their groups.
func onlyNodes(visit [][]*stageNode, only map[string]bool) [][]*stageNode {
	var out [][]*stageNode

	for _, group := range visit {
		var kept []*stageNode

		for _, n := range group {
			if only[n.Name] {
				kept = append(kept, n)
			}
		}

		if len(kept) > 0 {
			out = append(out, kept)
		}
	}

	return out
}

// runGroup visits a group's nodes (several at once for a worker batch) and
// returns whether any synced the bootstrap manifests. Every node of a batch
// finishes its step; the first failure, in the batch's order, is returned.
func (r *kubeRun) runGroup(ctx context.Context, s stages.KubernetesStage, group []*stageNode) (bool, error) {
	synced := make([]bool, len(group))
	errs := make([]error, len(group))

	var wg sync.WaitGroup

	for i, n := range group {
		wg.Go(func() { synced[i], errs[i] = r.visit(ctx, s, n) })
	}

	wg.Wait()

	for _, err := range errs {
		if err != nil {
			return false, err
		}
	}

	return slices.Contains(synced, true), nil
}

// pause is Engine.pause for this run.
func (r *kubeRun) pause(ctx context.Context, stage, node, reason, action string, err error) error {
	return r.e.pause(ctx, stage, node, reason, action, err)
}
