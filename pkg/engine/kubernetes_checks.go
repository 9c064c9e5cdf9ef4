package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// checkStage runs the checks that gate a stage's first apply, on the nodes
// it will change: each Ready, the invariant judged now (every apiserver's
// version read), each change from a version that can be read, at most one
// minor forward and never back (judged per node against what it runs), and
// the target supported by each node's Talos.
func (r *kubeRun) checkStage(ctx context.Context, s stages.KubernetesStage, pending []*stageNode) error {
	stage := s.Name()

	var (
		notReady, unreadable, skew, pairing      []string
		unreadableNodes, skewNodes, pairingNodes []string
	)

	for _, n := range pending {
		if !n.Ready {
			notReady = append(notReady, n.Name)
		}

		before, beforeUnreadable := len(skew), len(unreadable)

		for _, ch := range n.changes {
			from, errFrom := stages.ParseVersion(render.TagOf(ch.From))
			to, errTo := stages.ParseVersion(render.TagOf(ch.To))

			switch {
			case errFrom != nil:
				unreadable = append(unreadable, fmt.Sprintf("%s on %s: image %q has no vMAJOR.MINOR.PATCH tag (its machine config)", ch.Component, n.Name, ch.From))
			case errTo != nil:
				skew = append(skew, fmt.Sprintf("%s %s: %v", n.Name, ch.Component, errTo))
			default:
				if err := stages.CheckStep(from, to); err != nil {
					skew = append(skew, fmt.Sprintf("%s %s: %v", n.Name, ch.Component, err))
				}
			}
		}

		if len(skew) > before {
			skewNodes = append(skewNodes, n.Name)
		}

		if len(unreadable) > beforeUnreadable {
			unreadableNodes = append(unreadableNodes, n.Name)
		}

		if err := supportedBy(r.target, n.Talos.Version); err != nil {
			pairing = append(pairing, fmt.Sprintf("%s: %v", n.Name, err))
			pairingNodes = append(pairingNodes, n.Name)
		}
	}

	if len(notReady) > 0 {
		return r.refuse(ctx, stage, notReady, "not Ready: "+strings.Join(notReady, ", "),
			fmt.Sprintf("fix them, or hold them (kubectl annotate node %s %s=<reason>), then resume", notReady[0], discovery.HoldAnnotation))
	}

	// An apiserver whose version cannot be read is said as the invariant's (with
	// where to look), before the step checks would call its image a skew.
	if err := r.checkInvariant(ctx, stage, ""); err != nil {
		return err
	}

	switch {
	case len(unreadable) > 0:
		return r.refuse(ctx, stage, unreadableNodes, "version unknown: "+summarize(unreadable), stages.UnreadableAction(unreadableNodes[0]))
	case len(skew) > 0:
		return r.refuse(ctx, stage, skewNodes, "version skew: "+summarize(skew),
			"choose a target at most one minor above what every node runs, or hold the nodes behind")
	case len(pairing) > 0:
		return r.refuse(ctx, stage, pairingNodes, "talos pairing: "+summarize(pairing),
			"upgrade Talos first (kubectl ichor plan talos --to <a release that supports the target>)")
	}

	return nil
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

// supportedBy reports whether a node's Talos version supports Kubernetes
// target, per machinery's compatibility tables (a Talos minor they do not
// know is not supported).
func supportedBy(target stages.Version, talosVersion string) error {
	kv, err := compatibility.ParseKubernetesVersion(strings.TrimPrefix(target.String(), "v"))
	if err != nil {
		return fmt.Errorf("kubernetes %s: %w", target, err)
	}

	tv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: talosVersion})
	if err != nil {
		return fmt.Errorf("talos %q: %w", talosVersion, err)
	}

	if err := kv.SupportedWith(tv); err != nil {
		return fmt.Errorf("talos %s does not support kubernetes %s: %w", talosVersion, target, err)
	}

	return nil
}

func summarize(problems []string) string {
	const shown = 3

	if len(problems) <= shown {
		return strings.Join(problems, "; ")
	}

	return fmt.Sprintf("%s; and %d more", strings.Join(problems[:shown], "; "), len(problems)-shown)
}

// prePull pulls every image the stage changes on the nodes that will take
// it, PullConcurrency nodes at a time, each node's images at once under that
// node's own PullTimeout (pullNodes). In the KubeProxy stage the new
// kube-proxy image is also pulled on the workers, which run it once the
// DaemonSet rolls. A node that cannot pre-pull is skipped; any other failure
// pauses before the first apply, naming the node and the image.
func (r *kubeRun) prePull(ctx context.Context, s stages.KubernetesStage, snap *discovery.Snapshot, pending []*stageNode) error {
	stage := s.Name()
	index := map[string]int{}

	var nodes []nodePulls

	add := func(n discovery.Node, p pull) {
		i, seen := index[n.Name]
		if !seen {
			i = len(nodes)
			index[n.Name] = i
			nodes = append(nodes, nodePulls{name: n.Name, ip: n.InternalIP})
		}

		nodes[i].pulls = append(nodes[i].pulls, p)
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

	if _, isProxy := s.(stages.KubeProxy); isProxy && proxyImage != "" {
		for _, n := range snap.Nodes {
			if !n.ControlPlane && !n.Held && n.IsTalos() && n.InternalIP != "" {
				add(n, pull{ref: proxyImage, ns: talos.NamespaceCRI})
			}
		}
	}

	r.e.stepTime(stage, StepPrePull, StepTiming{})
	r.e.step(stage, StepPrePull, "pulling the stage's images on %d node(s), %d at a time, each within %s",
		len(nodes), min(r.opts.PullConcurrency, len(nodes)), r.opts.PullTimeout)

	pulled, unsupported, err := r.e.pullNodes(ctx, nodes, r.opts.PullConcurrency, r.opts.PullTimeout)
	if err != nil {
		return r.pause(ctx, stage, "", "pre-pull: "+stages.FirstLine(err), pullAction(err), err)
	}

	msg := fmt.Sprintf("pulled %d image(s) on %d node(s)", pulled, len(nodes))
	if unsupported > 0 {
		msg += fmt.Sprintf("; %d node(s) cannot pre-pull: skipped", unsupported)
	}

	r.e.stepTime(stage, StepPrePull, StepTiming{Done: true})
	r.e.step(stage, StepPrePull, "%s", msg)

	return nil
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

// checkInvariant reads what the cluster runs at a stage's start: it pauses when an
// apiserver's version cannot be read (the invariant is never judged blind), and takes
// what it reads as the stage's baseline. Skew already there (a worker whose kubelet is
// newer than the apiservers) is reported, not refused: the rule is that no apply makes
// the invariant worse, so the upgrade that fixes it can run.
func (r *kubeRun) checkInvariant(ctx context.Context, stage, node string) error {
	running, err := r.settled(ctx, stage, "", r.observeNow)
	if err != nil {
		return r.pause(ctx, stage, node, "invariant check: "+err.Error(), actionResume, err)
	}

	if err := r.joined(running); err != nil {
		return err
	}

	inv := stages.JudgeInvariant(running)
	if err := r.unknownApiservers(ctx, stage, node, inv); err != nil {
		return err
	}

	r.base = inv

	if lines := inv.SkewLines(); len(lines) > 0 {
		r.e.step(stage, "invariant", "skew already there, kept from growing: %s", summarize(lines))
	}

	return nil
}

// observeNow reads what the cluster runs now (two LISTs).
func (r *kubeRun) observeNow(ctx context.Context) ([]kube.Running, error) {
	return kube.Observe(ctx, r.e.Kube)
}

// cached is what the cache's watches last saw, with no request.
func (r *kubeRun) cached(context.Context) ([]kube.Running, error) { return r.cache.Running(), nil }

// settled reads what the cluster runs with read, and when the kube-apiserver mirror
// pod of a control plane the stage knows is missing (but on node except, whose
// components the caller takes from its render), waits for the cache to show it,
// bounded by MirrorPodTimeout, and reads again: a kubelet that restarted on a new
// version deletes its mirror pods and creates them anew, and the invariant is not
// judged on that moment. One still missing at the bound is left to the caller's
// judgement, which pauses on it.
func (r *kubeRun) settled(ctx context.Context, stage, except string, read func(context.Context) ([]kube.Running, error)) ([]kube.Running, error) {
	running, err := read(ctx)
	if err != nil || len(r.missingApiservers(running, except)) == 0 {
		return running, err
	}

	start := time.Now()

	err = r.cache.Wait(ctx, r.opts.MirrorPodTimeout, func() (bool, string) {
		missing := r.missingApiservers(r.cache.Running(), except)
		if len(missing) == 0 {
			return true, ""
		}

		return false, fmt.Sprintf("the kube-apiserver mirror pod of %s (a kubelet that restarted recreates it)", strings.Join(missing, ", "))
	}, func(waiting string) {
		r.e.step(stage, "invariant", "waiting for %s (waited %s)", waiting, time.Since(start).Round(time.Second))
	})

	var timeout *kube.WaitTimeoutError

	switch {
	case errors.As(err, &timeout):
		return running, nil
	case err != nil:
		return nil, err
	}

	return read(ctx)
}

// missingApiservers are the control planes the stage knows (all of them when it knows
// none yet), but except, that running shows with no kube-apiserver mirror pod.
func (r *kubeRun) missingApiservers(running []kube.Running, except string) []string {
	var out []string

	for _, run := range running {
		if run.Component != discovery.APIServer || run.Image != "" || run.Node == except {
			continue
		}

		if r.known == nil || r.known[run.Node] {
			out = append(out, run.Node)
		}
	}

	return out
}

// unknownApiservers pauses when an apiserver's version cannot be read.
func (r *kubeRun) unknownApiservers(ctx context.Context, stage, node string, inv stages.Invariant) error {
	if len(inv.Unknown) == 0 {
		return nil
	}

	if node == "" && len(inv.Unknown) == 1 {
		node = inv.Unknown[0].Node
	}

	reason := "invariant check: apiserver version unknown: " + summarize(inv.UnknownLines())

	return r.pause(ctx, stage, node, reason, stages.UnknownAction(inv), errors.New(reason))
}

// checkApplied reads what the cluster runs right after node's apply of res and pauses
// when the invariant is worse than at the stage's start. The node's own components
// whose version cannot be read yet (a static pod restarting) count at the render's.
func (r *kubeRun) checkApplied(ctx context.Context, stage string, sn *stageNode, res *render.Result) error {
	running, err := r.settled(ctx, stage, sn.Name, r.observeNow)
	if err != nil {
		return r.pause(ctx, stage, sn.Name, "invariant check: "+err.Error(), actionResume, err)
	}

	return r.notWorse(ctx, stage, sn.Name, withRender(running, sn.Name, res, false), brokenAction)
}

// recheckInvariant is the check once a node is verified, on what the watches last
// saw, with no request: it follows the fresh one after its apply (a read of the whole
// cluster at every step of every node would grow with the square of the cluster).
func (r *kubeRun) recheckInvariant(ctx context.Context, stage, node string) error {
	running, err := r.settled(ctx, stage, "", r.cached)
	if err != nil {
		return err
	}

	return r.notWorse(ctx, stage, node, running, brokenAction)
}

// notWorse pauses when running cannot be judged, or is worse than the stage's start.
func (r *kubeRun) notWorse(ctx context.Context, stage, node string, running []kube.Running, action string) error {
	if err := r.joined(running); err != nil {
		return err
	}

	inv := stages.JudgeInvariant(running)
	if err := r.unknownApiservers(ctx, stage, node, inv); err != nil {
		return err
	}

	if v := inv.WorseThan(r.base); len(v) > 0 {
		reason := "invariant broken: " + summarize(v)

		return r.pause(ctx, stage, node, reason, action, errors.New(reason))
	}

	return nil
}

const brokenAction = "it became newer than an apiserver during the stage, by something other than ichor: bring it back to what it ran " +
	"(or every apiserver to that version), then resume"

// withRender is running with node's components replaced by the render's: every one
// (predict) or only those whose version cannot be read or are not seen (after an
// apply, a static pod restarting). kube-proxy follows the DaemonSet, not the node's
// config.
func withRender(running []kube.Running, node string, res *render.Result, all bool) []kube.Running {
	images := render.Images(res.Config)
	after := running[:0:0]
	seen := map[discovery.Component]bool{}

	for _, run := range running {
		if image, ok := images[run.Component]; ok && run.Node == node && run.Component != discovery.KubeProxy {
			if _, err := stages.ParseVersion(run.Version); all || err != nil {
				run.Version, run.Source = render.TagOf(image), "the render"
			}

			seen[run.Component] = true
		}

		after = append(after, run)
	}

	for _, c := range []discovery.Component{discovery.APIServer, discovery.ControllerManager, discovery.Scheduler, discovery.Kubelet} {
		if image, ok := images[c]; ok && !seen[c] {
			after = append(after, kube.Running{Node: node, Component: c, Version: render.TagOf(image), Source: "the render"})
		}
	}

	return after
}

// predictApply pauses before an apply that would make the invariant worse than at the
// stage's start: what the cluster runs (as the watches last saw it), with the node's
// components replaced by the render's (such as a held control plane whose apiserver
// stays behind).
func (r *kubeRun) predictApply(ctx context.Context, stage string, sn *stageNode, res *render.Result) error {
	running, err := r.settled(ctx, stage, sn.Name, r.cached)
	if err != nil {
		return err
	}

	if err := r.joined(running); err != nil {
		return err
	}

	after := stages.JudgeInvariant(withRender(running, sn.Name, res, true))
	if err := r.unknownApiservers(ctx, stage, sn.Name, after); err != nil {
		return err
	}

	if v := after.WorseThan(r.base); len(v) > 0 {
		reason := "applying " + describeChanges(res.Changed) + " would break the invariant: " + summarize(v)

		return r.pause(ctx, stage, sn.Name, reason, heldAction, errors.New(reason))
	}

	return nil
}

// predictKubeProxy pauses before a manifest sync would run kube-proxy at the target
// while some apiserver is older (as the watches last saw them), unless that skew was
// there at the stage's start already.
func (r *kubeRun) predictKubeProxy(ctx context.Context, stage, node string) error {
	running, err := r.settled(ctx, stage, "", r.cached)
	if err != nil {
		return err
	}

	if err := r.joined(running); err != nil {
		return err
	}

	running = append(running,
		kube.Running{Node: "every node", Component: discovery.KubeProxy, Version: r.target.String(), Source: "the bootstrap manifests"})

	after := stages.JudgeInvariant(running)
	if err := r.unknownApiservers(ctx, stage, node, after); err != nil {
		return err
	}

	if v := after.WorseThan(r.base); len(v) > 0 {
		reason := "syncing the bootstrap manifests would break the invariant: " + summarize(v)

		return r.pause(ctx, stage, node, reason, heldAction, errors.New(reason))
	}

	return nil
}

const heldAction = "an apiserver is behind (a held control plane?): move every apiserver to the target first (remove the hold), then resume"
