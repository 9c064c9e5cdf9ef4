package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// This file is what gates a Kubernetes stage's first apply: the checks on the nodes it
// will change, then the pre-pull of their images.

// checkStage runs the checks that gate a stage's first apply, on the nodes
// it will change: each Ready, the invariant judged now (every apiserver's
// version read), each change from a version that can be read, then the
// version rules of pkg/compat the plan's rows ask (one minor at a time and
// never back, judged for every component each node runs; the target
// supported by each node's Talos), so the engine pauses with the plan's words.
func (r *kubeRun) checkStage(ctx context.Context, s stages.KubernetesStage, pending []*stageNode) error {
	stage := s.Name()

	var (
		notReady, unreadable, unreadableNodes []string
		nodes                                 = make([]discovery.Node, 0, len(pending))
	)

	for _, n := range pending {
		nodes = append(nodes, n.Node)

		if !n.Ready {
			notReady = append(notReady, n.Name)
		}

		before := len(unreadable)

		for _, ch := range n.changes {
			if _, err := stages.ParseVersion(render.TagOf(ch.From)); err != nil {
				unreadable = append(unreadable, fmt.Sprintf("%s on %s: image %q has no vMAJOR.MINOR.PATCH tag (its machine config)", ch.Component, n.Name, ch.From))
			}
		}

		if len(unreadable) > before {
			unreadableNodes = append(unreadableNodes, n.Name)
		}
	}

	if len(notReady) > 0 {
		notReady, waited, err := r.e.waitStarting(ctx, r.cache, stage, notReady, r.opts.StartingTimeout)
		if err != nil {
			return err
		}

		if len(notReady) > 0 {
			reason, action := notReadyRefusal(notReady, waited)

			return r.refuse(ctx, stage, notReady, reason, action)
		}
	}

	// An apiserver whose version cannot be read is said as the invariant's (with
	// where to look), before the step checks would call its image a skew.
	if err := r.checkInvariant(ctx, stage, ""); err != nil {
		return err
	}

	if len(unreadable) > 0 {
		return r.refuse(ctx, stage, unreadableNodes, "version unknown: "+text.Summarize(unreadable), stages.UnreadableAction(unreadableNodes[0]))
	}

	cluster, target := compat.FromNodes(nodes), compat.Version(r.target)

	if err := r.refuseVerdict(ctx, stage, compat.NameKubernetesStep, compat.KubernetesStep(cluster, target)); err != nil {
		return err
	}

	return r.refuseVerdict(ctx, stage, compat.NameKubernetesSupported, compat.KubernetesSupported(cluster, target))
}

// verdictPause is the reason, action and nodes a pause gives for a refused version
// rule: the plan's row, named as the plan names it.
func verdictPause(check string, v compat.Verdict) (reason, action string, nodes []string) {
	return check + ": " + v.Detail, v.Action, v.Nodes
}

// refuseVerdict pauses the stage when a version rule refuses, with the plan's words.
func (r *kubeRun) refuseVerdict(ctx context.Context, stage, check string, v compat.Verdict) error {
	if v.Allowed {
		return nil
	}

	reason, action, nodes := verdictPause(check, v)

	return r.refuse(ctx, stage, nodes, reason, action)
}

// refuse pauses a stage before it changes anything, naming the node when
// there is one.
func (r *kubeRun) refuse(ctx context.Context, stage string, nodes []string, reason, action string) error {
	node := ""
	if len(nodes) == 1 {
		node = nodes[0]
	}

	return r.pause(ctx, stage, node, "checks: "+reason, action, errors.New(reason))
}

// prePull pulls every image the stage changes on the nodes that will take
// it, PullConcurrency nodes at a time, each node's images at once under that
// node's own PullTimeout (pullNodes). In the KubeProxy stage the new
// kube-proxy image is also pulled on the workers, which run it once the
// DaemonSet rolls. A node that cannot pre-pull is skipped; any other failure
// pauses before the first apply, naming the node and the image. What the run
// pulled already (an earlier stage, or this one's pull ahead) is not pulled again.
func (r *kubeRun) prePull(ctx context.Context, s stages.KubernetesStage, snap *discovery.Snapshot, pending []*stageNode) error {
	stage := s.Name()

	if r.pulled == nil {
		r.pulled = map[string]bool{}
	}

	from := r.ahead.from()
	ahead := r.ahead.wait()
	r.ahead = nil

	for key := range ahead {
		r.pulled[key] = true
	}

	nodes := stagePulls(s, snap, pending, r.pulled)
	for _, n := range nodes {
		for _, p := range n.pulls {
			r.pulled[n.name+" "+p.ref] = true
		}
	}

	if len(nodes) == 0 {
		if len(ahead) > 0 {
			r.e.stepTime(stage, StepPrePull, StepTiming{})
			r.e.stepTime(stage, StepPrePull, StepTiming{Done: true})
			r.e.step(stage, StepPrePull, "pulled ahead: %d image(s), while %s ran", len(ahead), from)
		}

		return nil
	}

	r.e.stepTime(stage, StepPrePull, StepTiming{})
	r.e.step(stage, StepPrePull, "pulling the stage's images on %d node(s), %d at a time, each within %s",
		len(nodes), min(r.opts.PullConcurrency, len(nodes)), r.opts.PullTimeout)

	pulled, unsupported, err := r.e.pullNodes(ctx, nodes, r.opts.PullConcurrency, r.opts.PullTimeout)
	if err != nil {
		return r.pause(ctx, stage, "", "pre-pull: "+stages.FirstLine(err), pullAction(err), err)
	}

	msg := fmt.Sprintf("pulled %d image(s) on %d node(s)", pulled, len(nodes))
	if len(ahead) > 0 {
		msg += fmt.Sprintf("; %d pulled ahead, while %s ran", len(ahead), from)
	}

	if unsupported > 0 {
		msg += fmt.Sprintf("; %d node(s) cannot pre-pull: skipped", unsupported)
	}

	r.e.stepTime(stage, StepPrePull, StepTiming{Done: true})
	r.e.step(stage, StepPrePull, "%s", msg)

	return nil
}

// stagePulls are the images stage s pulls on each node: every image it changes on
// the pending nodes, and in the KubeProxy stage the new kube-proxy image on every
// worker of snap too; none that done ("node ref") holds.
func stagePulls(s stages.KubernetesStage, snap *discovery.Snapshot, pending []*stageNode, done map[string]bool) []nodePulls {
	index := map[string]int{}

	var nodes []nodePulls

	add := func(n discovery.Node, p pull) {
		key := n.Name + " " + p.ref
		if done[key] {
			return
		}

		i, seen := index[n.Name]
		if !seen {
			i = len(nodes)
			index[n.Name] = i
			nodes = append(nodes, nodePulls{name: n.Name, ip: n.InternalIP})
		}

		if !slices.Contains(nodes[i].pulls, p) {
			nodes[i].pulls = append(nodes[i].pulls, p)
		}
	}

	proxyImage := ""

	for _, n := range pending {
		for _, ch := range n.changes {
			ns := talos.NamespaceCRI
			if ch.Component == discovery.Kubelet {
				ns = talos.NamespaceSystem
			}

			add(n.Node, pull{ref: ch.To, ns: ns})

			if ch.Component == discovery.KubeProxy && proxyImage == "" {
				proxyImage = ch.To
			}
		}
	}

	if s.Rollout() == stages.RolloutKubeProxy && proxyImage != "" {
		for _, n := range snap.Nodes {
			if !n.ControlPlane && !n.Held && n.IsTalos() && n.InternalIP != "" {
				add(n, pull{ref: proxyImage, ns: talos.NamespaceCRI})
			}
		}
	}

	return nodes
}

// pullAhead pulls, in the background, what stage s will pull at its start (see
// prePull), while the stage before it runs: its nodes as snap has them, each one's
// changes read from its active config now. On a real cluster the images of a large
// cluster's stage take a while to pull and the stage before waits minutes on the
// cluster (the kube-proxy rollout, a node at a time), so the next stage starts with
// its images on its nodes. It changes nothing but the nodes' image caches and decides
// nothing: the stage's own start reads every node again, and its prePull pulls what
// this did not (a node that failed or was unreachable here, a change made since) and
// pauses on a failure, as before. Pulls ahead are PullConcurrency nodes at a time
// too, and never beside a stage's own pre-pull, which waits for them.
func (r *kubeRun) pullAhead(ctx context.Context, during string, s stages.KubernetesStage, snap *discovery.Snapshot) {
	a := &kubePullingAhead{pulled: map[string]bool{}, during: during}
	r.ahead = a

	done := maps.Clone(r.pulled)

	a.pulling = startPullAhead(ctx, func(ctx context.Context) {
		var (
			mu      sync.Mutex
			pending []*stageNode
			visits  []discovery.Node
		)

		for _, n := range snap.Nodes {
			if (n.ControlPlane || s.VisitsWorkers()) && !n.Held && n.IsTalos() && n.InternalIP != "" {
				visits = append(visits, n)
			}
		}

		_ = talos.ForEach(ctx, visits, discovery.Node.Address, r.opts.Concurrency, func(ctx context.Context, n discovery.Node) error {
			rctx, cancel := context.WithTimeout(ctx, talosReadTimeout)
			defer cancel()

			cfg, err := r.e.Talos.MachineConfig(rctx, n.InternalIP)
			if err != nil {
				return nil // the stage's own start reads it again
			}

			changes, err := stages.StageChanges(s, n, cfg, r.target)
			if err != nil || len(changes) == 0 {
				return nil
			}

			mu.Lock()
			pending = append(pending, &stageNode{Node: n, changes: changes})
			mu.Unlock()

			return nil
		})

		_ = talos.ForEach(ctx, stagePulls(s, snap, pending, done), nodePulls.node, r.opts.PullConcurrency, func(ctx context.Context, n nodePulls) error {
			if pulled, unsupported, err := r.e.pullOnNode(ctx, n, r.opts.PullTimeout); err == nil && !unsupported && pulled > 0 {
				mu.Lock()
				for _, p := range n.pulls {
					a.pulled[n.name+" "+p.ref] = true
				}
				mu.Unlock()
			}

			return nil
		})
	})
}

// kubePullingAhead is a pullAhead under way; nil is none.
type kubePullingAhead struct {
	pulling *pullingAhead
	// pulled are the images pulled ahead, "node ref"; read once done is closed.
	pulled map[string]bool
	// during is the stage that ran while they were pulled.
	during string
}

// from is the stage that ran while the pulls ahead were made; "" for none.
func (a *kubePullingAhead) from() string {
	if a == nil {
		return ""
	}

	return a.during
}

// wait waits for the pulls ahead to end and returns what they pulled.
func (a *kubePullingAhead) wait() map[string]bool {
	if a == nil {
		return nil
	}

	a.pulling.wait()

	return a.pulled
}

// stop ends the pulls ahead (the run stops) and waits for them.
func (a *kubePullingAhead) stop() {
	if a != nil {
		a.pulling.stop()
	}
}

// pullAction says what to do about a failed pre-pull: a pull cut by its bound
// is slow, not missing.
func pullAction(err error) string {
	const reachable = "make the images reachable from the nodes (registry, mirrors: talosctl -n <node> image pull <image>)"

	if _, slow := errors.AsType[*PullTimeoutError](err); slow {
		return "a node's pull took longer than --pull-timeout: " + reachable + ", then resume (what was pulled stays on the nodes); " +
			"or abort and upgrade again with a longer --pull-timeout"
	}

	return reachable + ", then resume"
}
