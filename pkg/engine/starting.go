package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// waitStarting gives the nodes a stage's checks found not Ready a bounded wait
// when they are starting, and returns those still not Ready, with what it
// waited ("" when it did not). A node is starting when its kubelet says it is
// NotReady (discovery.NotReadySince) and it turned so less than StartingTimeout ago:
// a node back from a boot is NotReady until its runtime and network are up, as
// after `talosctl rollback` and a resume at once. The wait ends when every
// starting node is Ready or no longer starting, or at the latest at its
// turn's StartingTimeout; each waiting node's line says what it waits for.
// When a node is NotReady for longer, its kubelet posts nothing (Unknown) or it
// is gone, nothing is waited for: the checks refuse it at once, nothing
// changed. A node Ready again since the stage read it is not waited for.
func (e *Engine) waitStarting(ctx context.Context, cache *kube.Cache, stage string, notReady []string, timeout time.Duration) ([]string, string, error) {
	now := time.Now()
	deadline := now

	var starting []string

	for _, name := range notReady {
		n, ok := cache.Node(name)

		switch {
		case !ok:
			return notReady, "", nil
		case nodeReady(n):
			continue
		}

		since := discovery.NotReadySince(n)
		if since.IsZero() || now.Sub(since) >= timeout {
			return notReady, "", nil
		}

		starting = append(starting, name)
		if end := since.Add(timeout); end.After(deadline) {
			deadline = end
		}
	}

	// still are the nodes of notReady not Ready now.
	still := func() []string {
		var out []string

		for _, name := range notReady {
			if !readyIn(cache, name) {
				out = append(out, name)
			}
		}

		return out
	}

	if len(starting) == 0 {
		return still(), "", nil
	}

	start := time.Now()

	// waiting is each starting node's reason, those still starting.
	waiting := func() map[string]string {
		left := map[string]string{}

		for _, name := range starting {
			n, ok := cache.Node(name)
			if !ok {
				continue
			}

			if !discovery.NotReadySince(n).IsZero() {
				_, why := kube.NodeReady(n)
				left[name] = why
			}
		}

		return left
	}

	ready := map[string]bool{}

	report := func(string) {
		left := waiting()

		for _, name := range starting {
			why, ok := left[name]

			switch {
			case ok:
				e.node(stage, name, PhasePending, "starting: NotReady%s; the checks wait until %s UTC for it to come Ready (waited %s)",
					why, deadline.UTC().Format(time.TimeOnly), time.Since(start).Round(time.Second))
			case !ready[name] && readyIn(cache, name):
				ready[name] = true
				e.node(stage, name, PhasePending, "started: Ready after %s", time.Since(start).Round(100*time.Millisecond))
			}
		}
	}

	err := cache.Wait(ctx, time.Until(deadline), func() (bool, string) {
		left := waiting()

		return len(left) == 0, fmt.Sprint(len(left))
	}, report)
	if err != nil && ctx.Err() != nil {
		return nil, "", ctx.Err()
	}

	report("")

	return still(), time.Since(start).Round(100 * time.Millisecond).String(), nil
}

// readyIn reports whether the cache's Node name is Ready.
func readyIn(cache *kube.Cache, name string) bool {
	n, ok := cache.Node(name)

	return ok && nodeReady(n)
}

// notReadyRefusal is a stage's refusal of the nodes not Ready, saying how long
// they were waited for as starting (waited, "" when they were not): its reason
// and what to do.
func notReadyRefusal(notReady []string, waited string) (reason, action string) {
	reason = "not Ready: " + strings.Join(notReady, ", ")
	if waited != "" {
		reason += " (still starting after a wait of " + waited + ")"
	}

	return reason, fmt.Sprintf("fix them, or hold them (kubectl annotate node %s %s=<reason>), then resume", notReady[0], discovery.HoldAnnotation)
}
