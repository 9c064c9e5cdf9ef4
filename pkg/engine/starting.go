package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// waitStarting gives the nodes a stage's checks found not Ready a bounded wait
// when they are starting, and returns those still not Ready, with what it
// waited ("" when it did not). A node is starting when its kubelet says it is
// NotReady (kube.NodeStarting) and it turned so less than StartingTimeout ago:
// a node back from a boot is NotReady until its runtime and network are up, as
// after `talosctl rollback` and a resume at once. The wait ends when every
// starting node is Ready or no longer starting, or at the latest at its
// turn's StartingTimeout; each waiting node's line says what it waits for.
// When a node is NotReady for longer, or its kubelet posts nothing (Unknown),
// nothing is waited for: the checks refuse it at once, nothing changed.
func (e *Engine) waitStarting(ctx context.Context, cache *kube.Cache, stage string, notReady []string, timeout time.Duration) ([]string, string, error) {
	now := time.Now()
	deadline := now

	var starting []string

	for _, name := range notReady {
		n, ok := cache.Node(name)
		if !ok {
			continue
		}

		since, ok := kube.NodeStarting(n)
		if !ok || now.Sub(since) >= timeout {
			return notReady, "", nil
		}

		starting = append(starting, name)
		if end := since.Add(timeout); end.After(deadline) {
			deadline = end
		}
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

			if _, ok := kube.NodeStarting(n); ok {
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

	var still []string

	for _, name := range notReady {
		if !readyIn(cache, name) {
			still = append(still, name)
		}
	}

	return still, time.Since(start).Round(100 * time.Millisecond).String(), nil
}

// readyIn reports whether the cache's Node name is Ready.
func readyIn(cache *kube.Cache, name string) bool {
	n, ok := cache.Node(name)

	return ok && nodeReady(n)
}

// startingFor says, after a refusal's "not Ready: <nodes>", how long they were
// waited for as starting; "" when they were not.
func startingFor(waited string) string {
	if waited == "" {
		return ""
	}

	return " (still starting after a wait of " + waited + ")"
}
