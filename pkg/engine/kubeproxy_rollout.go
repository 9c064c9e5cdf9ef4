package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// This file is the KubeProxy stage's last step: the wait for the kube-proxy DaemonSet's
// rollout after the manifests' sync, paused early when NotReady nodes hold it.

// rollout waits for the kube-proxy DaemonSet to run the target everywhere,
// timing it as it advances (StepTimer). A rollout that NotReady nodes keep from
// progressing (kube.DaemonSetBlocked) for RolloutStuckAfter pauses with that cause,
// rather than wait out the verify timeout.
func (r *kubeRun) rollout(ctx context.Context, stage string) error {
	tag := r.target.String()
	r.e.stepTime(stage, StepRollout, r.rolloutTiming(false))
	r.e.step(stage, StepRollout, "waiting for DaemonSet %s/%s on %s", discovery.StaticPodNamespace, discovery.KubeProxyDaemonSet, tag)

	start := time.Now()
	rolledOut := r.cache.DaemonSetRolledOut(discovery.KubeProxyDaemonSet, discovery.KubeProxyDaemonSet, tag)

	var (
		blockedSince time.Time
		stuck        *kube.RolloutBlock
	)

	err := r.cache.Wait(ctx, r.opts.VerifyTimeout, func() (bool, string) {
		done, waiting := rolledOut()
		if done {
			return true, waiting
		}

		b, blocked := r.rolloutBlocked(tag)

		switch {
		case !blocked:
			blockedSince = time.Time{}
		case blockedSince.IsZero():
			blockedSince = time.Now()
			r.cache.WakeAfter(r.opts.RolloutStuckAfter)
		}

		if blocked && time.Since(blockedSince) >= r.opts.RolloutStuckAfter {
			stuck = &b

			return true, ""
		}

		if blocked {
			waiting += "; blocked: " + b.String()
		}

		return false, waiting
	}, func(waiting string) {
		r.e.stepTime(stage, StepRollout, r.rolloutTiming(false))
		r.e.step(stage, StepRollout, "%s (waited %s)", waiting, time.Since(start).Round(time.Second))
	})

	switch {
	case err != nil:
		reason := "kube-proxy rollout: " + err.Error()

		return r.pause(ctx, stage, "", reason, fmt.Sprintf("check the kube-proxy pods (kubectl -n %s get pods -l %s=%s -o wide), then resume",
			discovery.StaticPodNamespace, discovery.ComponentLabel, discovery.KubeProxyDaemonSet), fmt.Errorf("stage %s: %s", stage, reason))
	case stuck != nil:
		reason := fmt.Sprintf("kube-proxy rollout cannot progress, blocked for %s: %s", r.opts.RolloutStuckAfter, stuck)

		return r.pause(ctx, stage, "", reason, blockedAction(stuck), fmt.Errorf("stage %s: %s", stage, reason))
	}

	r.e.stepTime(stage, StepRollout, r.rolloutTiming(true))

	running, err := kube.Observe(ctx, r.e.Kube)
	if err != nil {
		return r.pause(ctx, stage, "", "invariant check: "+err.Error(), actionResume, err)
	}

	if err := r.notWorse(ctx, stage, "", running, brokenAction); err != nil {
		return err
	}

	r.e.step(stage, StepRollout, "DaemonSet %s rolled out on %s", discovery.KubeProxyDaemonSet, tag)

	return nil
}

// rolloutBlocked judges the kube-proxy rollout from the cache.
func (r *kubeRun) rolloutBlocked(tag string) (kube.RolloutBlock, bool) {
	ds, ok := r.cache.DaemonSet(discovery.KubeProxyDaemonSet)
	if !ok {
		return kube.RolloutBlock{}, false
	}

	return kube.DaemonSetBlocked(ds, discovery.KubeProxyDaemonSet, tag, r.cache.DaemonSetPods(discovery.KubeProxyDaemonSet), r.cache.Node)
}

// blockedAction says what unblocks a kube-proxy rollout that NotReady nodes hold.
func blockedAction(b *kube.RolloutBlock) string {
	node := b.Blocked[0].Node

	return fmt.Sprintf("bring %s back (its kubelet Ready) or, if it is gone for good, delete its Node (kubectl delete node %s): "+
		"its pods go with it and the rollout moves; then resume", nodeList(b), node)
}

func nodeList(b *kube.RolloutBlock) string {
	names := make([]string, 0, len(b.Blocked))
	for _, n := range b.Blocked {
		names = append(names, n.Node)
	}

	return strings.Join(names, ", ")
}

// rolloutTiming is how far the kube-proxy DaemonSet's rollout has come, as
// the cache has it.
func (r *kubeRun) rolloutTiming(done bool) StepTiming {
	t := StepTiming{Done: done}

	if ds, ok := r.cache.DaemonSet(discovery.KubeProxyDaemonSet); ok {
		t.Pods, t.Updated = int(ds.Status.DesiredNumberScheduled), int(ds.Status.UpdatedNumberScheduled)
		t.MaxUnavailable = discovery.DaemonSetMaxUnavailable(ds)
	}

	return t
}
