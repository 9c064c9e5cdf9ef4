package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// This file is one node's visit in a Kubernetes stage, from its render to its line
// "Done": checks, drain, apply, verification, uncordon, manifest sync.

// visit takes one node through the stage: read its Node and active config,
// render; if the render differs, refuse a staged config, check the
// invariant would hold, cordon and drain (a stage that Drains: Kubelets), dry run
// and apply, check the invariant; then verify, uncordon (Drains), sync the bootstrap
// manifests (the kube-proxy Rollout: KubeProxy). It reports whether it synced them.
func (r *kubeRun) visit(ctx context.Context, s stages.KubernetesStage, sn *stageNode) (bool, error) {
	stage, name, ip := s.Name(), sn.Name, sn.InternalIP
	drains, syncs := s.Drains(), s.Rollout() == stages.RolloutKubeProxy

	node, err := r.getNode(ctx, name)
	if err != nil {
		return false, r.pause(ctx, stage, name, "read the Node: "+err.Error(), actionResume, err)
	}

	cfg, activeHash, err := r.activeConfig(ctx, name, ip)
	if err != nil {
		return false, r.pause(ctx, stage, name, err.Error(), actionTalosAccess, err)
	}

	current := sn.Node
	current.KubeletVersion = node.Status.NodeInfo.KubeletVersion

	// One stage's worth of change per apply: a node an earlier stage did not visit (a
	// hold removed mid-upgrade, a control plane added) takes the earlier stages first,
	// from APIServers, one apply each, then this one.
	earlier, err := r.earlierStage(s, current, cfg)
	if err != nil {
		return false, r.pause(ctx, stage, name, err.Error(), renderAction(name, err), err)
	}

	if earlier != nil {
		r.e.node(stage, name, PhasePending, "behind the cluster: takes stage %s first", earlier.Name())

		if _, err := r.visit(ctx, earlier, &stageNode{Node: sn.Node}); err != nil {
			return false, err
		}

		return r.visit(ctx, s, &stageNode{Node: sn.Node})
	}

	// The pins come from the Node: render again unless the config and the
	// kubelet version are those the stage's start rendered from.
	res := sn.planned
	if res == nil || activeHash != sn.plannedFrom || current.KubeletVersion != sn.KubeletVersion {
		if res, err = r.render(s, current, cfg); err != nil {
			return false, r.pause(ctx, stage, name, err.Error(), renderAction(name, err), err)
		}
	}

	ours := kube.CordonedByIchor(node)
	applied := res.Hash != activeHash

	var (
		drained string
		// settle: a control plane's kubelet moves, and may restart its static pods.
		settle  = applied && s.AtTarget(discovery.Kubelet) && sn.ControlPlane
		mirrors map[discovery.Component]types.UID
	)

	if applied {
		if err := r.refuseStaged(ctx, stage, name, ip, cfg); err != nil {
			return false, err
		}

		if err := r.predictApply(ctx, stage, sn, res); err != nil {
			return false, err
		}

		if drains {
			evicted, err := r.e.cordonAndDrain(ctx, r.opts, stage, name, ownPodByStage, "")
			if err != nil {
				return false, err
			}

			drained = drainedSummary(evicted)

			ours = true
		}

		if settle {
			mirrors = r.mirrorUIDs(name)
		}

		if err := r.apply(ctx, stage, name, ip, res); err != nil {
			return false, err
		}

		if err := r.checkApplied(ctx, stage, sn, res); err != nil {
			return false, err
		}
	}

	expect := r.expect(s, sn, res)
	r.e.node(stage, name, PhaseVerifying, "waiting for %s", describeExpect(expect))

	start := time.Now()

	err = r.cache.Wait(ctx, r.opts.VerifyTimeout, r.cache.NodeVerified(expect), func(waiting string) {
		r.e.node(stage, name, PhaseVerifying, "%s (waited %s)", waiting, time.Since(start).Round(time.Second))
	})
	if err != nil {
		var timeout *kube.WaitTimeoutError
		if errors.As(err, &timeout) {
			reason := fmt.Sprintf("verify: %s", timeout.Waiting)
			if drains && ours {
				reason += " (the node stays cordoned)"
			}

			return false, r.pause(ctx, stage, name, fmt.Sprintf("%s after %s", reason, timeout.After),
				verifyAction(name), fmt.Errorf("node %q: verify: %w", name, err))
		}

		return false, r.pause(ctx, stage, name, "verify: "+err.Error(), actionResume, fmt.Errorf("node %q: verify: %w", name, err))
	}

	if settle {
		if err := r.settleStaticPods(ctx, stage, name, mirrors); err != nil {
			return false, err
		}
	}

	if drains && ours {
		if err := r.e.nodes.Uncordon(ctx, name); err != nil {
			return false, r.pause(ctx, stage, name, err.Error(), actionResume, err)
		}
	}

	if applied {
		if err := r.recheckInvariant(ctx, stage, name); err != nil {
			return false, err
		}
	}

	synced := false

	if syncs {
		if synced, err = r.syncManifests(ctx, stage, sn, res); err != nil {
			return false, err
		}
	}

	done := describeExpect(expect)

	switch {
	case applied && drained != "":
		done = drained + ", " + done
	case !applied:
		done = "already applied; " + done
	}

	if drains && ours {
		done += ", uncordoned"
	}

	if synced {
		done += ", bootstrap manifests synced"
	}

	r.e.node(stage, name, PhaseDone, "%s", done)

	return synced, nil
}

// expect is what verifies node sn in stage s with render res: Ready, the
// stage's static pods on their rendered tags and Ready, and in a stage that sets
// the kubelet to the target (Kubelets) the kubelet on its rendered version.
func (r *kubeRun) expect(s stages.KubernetesStage, sn *stageNode, res *render.Result) kube.NodeExpect {
	images := render.Images(res.Config)
	e := kube.NodeExpect{Node: sn.Name, StaticPods: map[discovery.Component]string{}}

	if s.AtTarget(discovery.Kubelet) {
		e.KubeletVersion = render.TagOf(images[discovery.Kubelet])
	}

	if sn.ControlPlane {
		for _, c := range discovery.StaticPodComponents() {
			if image, ok := images[c]; ok && s.AtTarget(c) {
				e.StaticPods[c] = render.TagOf(image)
			}
		}
	}

	return e
}

// describeExpect says what verification waits for: "node Ready, kubelet
// v1.36.3, kube-apiserver v1.36.3 Ready".
func describeExpect(e kube.NodeExpect) string {
	parts := []string{"node Ready"}

	if e.KubeletVersion != "" {
		parts = append(parts, "kubelet "+e.KubeletVersion)
	}

	for _, c := range discovery.StaticPodComponents() {
		if tag, ok := e.StaticPods[c]; ok {
			parts = append(parts, fmt.Sprintf("%s %s Ready", c, tag))
		}
	}

	return strings.Join(parts, ", ")
}

// describeChanges says what a render changes: "kube-apiserver v1.35.4 ->
// v1.36.3, kubelet v1.35.4 -> v1.36.3".
func describeChanges(changes []render.Change) string {
	parts := make([]string, 0, len(changes))
	for _, c := range changes {
		part := fmt.Sprintf("%s %s -> %s", c.Component, orUnknownTag(render.TagOf(c.From)), render.TagOf(c.To))
		if c.DroppedDigest != "" {
			part += fmt.Sprintf(" (digest %s dropped)", c.DroppedDigest)
		}

		parts = append(parts, part)
	}

	return strings.Join(parts, ", ")
}

func orUnknownTag(tag string) string {
	if tag == "" {
		return "(default)"
	}

	return tag
}
