package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// This file is a control plane that joins the cluster during a stage: the stage reads
// the cluster again and takes it first, at most maxJoinRestarts times.

// joinedError stops a stage when a control plane joined the cluster after the stage
// read it: its components run its own config's versions, behind the cluster, so the
// stage reads the cluster again and takes it first (from the APIServers stage) rather
// than pause on the skew the join brought.
type joinedError struct{ nodes []string }

func (e *joinedError) Error() string {
	return "control plane joined during the stage: " + strings.Join(e.nodes, ", ")
}

// joined returns the control planes of running (an apiserver, its version read or
// not) that the stage did not read at its start, or a joinedError naming them.
func (r *kubeRun) joined(running []kube.Running) error {
	if r.known == nil {
		return nil
	}

	var nodes []string

	for _, run := range running {
		if run.Component == discovery.APIServer && !r.known[run.Node] && !slices.Contains(nodes, run.Node) {
			nodes = append(nodes, run.Node)
		}
	}

	if len(nodes) == 0 {
		return nil
	}

	slices.Sort(nodes)

	return &joinedError{nodes: nodes}
}

// waitJoined waits, bounded by the verify timeout, until each joined control plane's
// Node is Ready and its apiserver shows its version (a control plane that just registered its
// Node starts its static pods next). At the bound the stage goes on, and its
// invariant check says what it cannot read.
func (r *kubeRun) waitJoined(ctx context.Context, stage string, nodes []string) error {
	err := r.cache.Wait(ctx, r.opts.VerifyTimeout, func() (bool, string) {
		for _, name := range nodes {
			if node, ok := r.cache.Node(name); !ok || !nodeReady(node) {
				return false, fmt.Sprintf("Node %s to be Ready", name)
			}
		}

		for _, run := range r.cache.Running() {
			if run.Component != discovery.APIServer || !slices.Contains(nodes, run.Node) {
				continue
			}

			if _, err := stages.ParseVersion(run.Version); err != nil {
				return false, fmt.Sprintf("kube-apiserver on %s to show its version", run.Node)
			}
		}

		return true, ""
	}, func(waiting string) { r.e.step(stage, "joined", "waiting for %s", waiting) })

	var timeout *kube.WaitTimeoutError
	if errors.As(err, &timeout) {
		return nil
	}

	return err
}

// maxJoinRestarts caps how often one stage starts again because a control plane
// joined: more joins than that in one stage are a node flapping in and out of the
// cluster (its Node deleted and registered again), not machines being added.
const maxJoinRestarts = 5

// runJoined is runNodes, started again on the whole stage whenever a control plane
// joins the cluster while it runs (a joinedError): the joined node, behind the
// cluster, goes first. Past maxJoinRestarts in the stage it pauses instead.
func (r *kubeRun) runJoined(ctx context.Context, s stages.KubernetesStage, only map[string]bool) ([]discovery.Node, error) {
	for {
		held, err := r.runNodes(ctx, s, only)

		var joined *joinedError
		if !errors.As(err, &joined) {
			return held, err
		}

		for _, n := range joined.nodes {
			r.joins[n]++
		}

		if r.restarts++; r.restarts > maxJoinRestarts {
			return nil, r.tooManyJoins(ctx, s.Name())
		}

		r.e.step(s.Name(), "joined", "control plane %s joined during the stage: reading the cluster again, it goes first",
			strings.Join(joined.nodes, ", "))

		if err := r.waitJoined(ctx, s.Name(), joined.nodes); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name(), err)
		}

		only = nil
	}
}

// tooManyJoins pauses a stage that control planes joined more than maxJoinRestarts
// times, naming them, the most frequent first.
func (r *kubeRun) tooManyJoins(ctx context.Context, stage string) error {
	names := slices.Collect(maps.Keys(r.joins))
	slices.SortFunc(names, func(a, b string) int {
		if c := r.joins[b] - r.joins[a]; c != 0 {
			return c
		}

		return strings.Compare(a, b)
	})

	seen := make([]string, 0, len(names))
	for _, n := range names {
		seen = append(seen, fmt.Sprintf("%s %d time(s)", n, r.joins[n]))
	}

	reason := fmt.Sprintf("control planes joined the cluster %d times during the stage (%s), more than the %d restarts a stage takes: "+
		"a node flapping in and out of the cluster?", r.restarts, text.Summarize(seen), maxJoinRestarts)

	return r.pause(ctx, stage, names[0], reason,
		fmt.Sprintf("find why it comes and goes (kubectl get node %s -w; talosctl -n <its IP> logs kubelet), fix it "+
			"or hold it (kubectl annotate node %s %s=flapping), then resume", names[0], names[0], discovery.HoldAnnotation), errors.New(reason))
}

// nodeReady reports the Node's Ready condition.
func nodeReady(n *corev1.Node) bool {
	ready, _ := kube.NodeReady(n)

	return ready
}
