package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// settleInterval is how often a settle looks at the cache again besides on each change
// it sees (at most; five times in a shorter settle window): for the time its pods stay
// Ready.
const settleInterval = time.Second

// mirrorUIDs are the UIDs of node's control-plane mirror pods as the cache last saw
// them, by component: what a kubelet that restarts on a new version replaces when it
// hashes its static pods anew.
func (r *kubeRun) mirrorUIDs(node string) map[discovery.Component]types.UID {
	out := map[discovery.Component]types.UID{}

	for _, c := range discovery.StaticPodComponents() {
		if pods := r.cache.MirrorPods(node, c); len(pods) > 0 {
			out[c] = pods[0].UID
		}
	}

	return out
}

// settleStaticPods waits, once a control plane's kubelet runs the new version, for the
// static pods that kubelet may restart: a kubelet that starts on a new version hashes
// its static pods anew and, when the hash changed, restarts each one under a new
// mirror pod, a few seconds after the Node already says the new version. Moving on at
// once would restart the next control plane's apiserver while this one's restarts (on
// kind all three went down together: the kubernetes Service had no endpoint). Settled
// is every mirror pod Ready and either replaced since before the apply (before: the
// UIDs then; the restart happened) or Ready for StaticPodSettle without a break. It is
// bounded by VerifyTimeout.
func (r *kubeRun) settleStaticPods(ctx context.Context, stage, node string, before map[discovery.Component]types.UID) error {
	start := time.Now()
	since := start // since when every mirror pod is Ready without a break

	var (
		last     string
		reported time.Time
	)

	tick := time.NewTicker(min(settleInterval, max(r.opts.StaticPodSettle/5, 10*time.Millisecond)))
	defer tick.Stop()

	// A change is looked at when the cache sees it: the replaced mirror pods Ready end
	// the wait at once, not at the next tick.
	changed, stop := r.cache.Changes()
	defer stop()

	for {
		now := time.Now()

		waiting, replaced := r.staticPodsSettling(node, before)

		switch {
		case waiting != "":
			since = now
		case replaced:
			return nil
		case now.Sub(since) >= r.opts.StaticPodSettle:
			return nil
		default:
			waiting = fmt.Sprintf("its static pods to stay Ready for %s (a kubelet on a new version may restart them)", r.opts.StaticPodSettle)
		}

		// Said when what it waits for changes, and every 10 s: not at every look.
		if waiting != last || now.Sub(reported) >= 10*time.Second {
			r.e.node(stage, node, PhaseVerifying, "kubelet restarted: waiting for %s (waited %s)", waiting, now.Sub(start).Round(time.Second))
			last, reported = waiting, now
		}

		if now.Sub(start) >= r.opts.VerifyTimeout {
			reason := fmt.Sprintf("verify: static pods after the kubelet's restart: %s after %s (the node stays cordoned)", waiting, r.opts.VerifyTimeout)

			return r.pause(ctx, stage, node, reason, verifyAction(node), fmt.Errorf("node %q: %s", node, reason))
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		case <-changed:
		}
	}
}

// staticPodsSettling says what node's control-plane mirror pods still wait for ("" when
// every one is Ready), and whether every one was replaced since before.
func (r *kubeRun) staticPodsSettling(node string, before map[discovery.Component]types.UID) (string, bool) {
	var waiting []string

	replaced := len(before) > 0

	for c, uid := range before {
		pods := r.cache.MirrorPods(node, c)

		switch {
		case len(pods) == 0:
			waiting = append(waiting, fmt.Sprintf("no %s mirror pod", c))
			replaced = false
		case !kube.PodReady(pods[0]):
			waiting = append(waiting, fmt.Sprintf("%s not Ready", pods[0].Name))
			replaced = false
		case pods[0].UID == uid:
			replaced = false
		}
	}

	slices.Sort(waiting)

	return strings.Join(waiting, ", "), replaced
}
