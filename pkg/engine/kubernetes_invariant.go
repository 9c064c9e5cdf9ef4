package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// This file is the invariant as a Kubernetes run keeps it (no kube-controller-manager,
// kube-scheduler, kube-proxy or kubelet newer than any kube-apiserver): read at a
// stage's start as its baseline, predicted before each apply and manifest sync, checked
// after each; no step may make it worse.

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
		r.e.step(stage, "invariant", "skew already there, kept from growing: %s", text.Summarize(lines))
	}

	return nil
}

// observeNow reads what the cluster runs now (two LISTs started after the call, shared
// with the nodes that read at the same time: kube.Observer).
func (r *kubeRun) observeNow(ctx context.Context) ([]kube.Running, error) {
	return r.observer.Observe(ctx)
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

	reason := "invariant check: apiserver version unknown: " + text.Summarize(inv.UnknownLines())

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
		reason := "invariant broken: " + text.Summarize(v)

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
		reason := "applying " + describeChanges(res.Changed) + " would break the invariant: " + text.Summarize(v)

		return r.pause(ctx, stage, sn.Name, reason, r.behindAction(running), errors.New(reason))
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
		reason := "syncing the bootstrap manifests would break the invariant: " + text.Summarize(v)

		return r.pause(ctx, stage, node, reason, r.behindAction(running), errors.New(reason))
	}

	return nil
}

const heldAction = "an apiserver is behind (a held control plane?): move every apiserver to the target first (remove the hold), then resume"

// behindAction says what to do about an apiserver behind the target: the plan's words
// (its invariant row) when a held control plane keeps it there, else heldAction.
func (r *kubeRun) behindAction(running []kube.Running) string {
	for _, run := range running {
		if run.Component != discovery.APIServer {
			continue
		}

		v, err := stages.ParseVersion(run.Version)
		if err != nil || v.Compare(r.target) >= 0 {
			continue
		}

		if n, ok := r.cache.Node(run.Node); ok {
			if _, held := n.Annotations[discovery.HoldAnnotation]; held {
				return stages.HeldBehindAction(run.Node)
			}
		}
	}

	return heldAction
}
