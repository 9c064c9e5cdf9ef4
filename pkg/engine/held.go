package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// A held node is left alone by every upgrade, even one that ichor cordoned
// in an earlier run (it was held after a pause, say): ichor does not know
// what state it is in, so it does not uncordon it. It names it instead, at
// the stage's start (its node line) and at the end of a run that succeeded
// (the last step), so it is never left cordoned silently.

// heldStillCordoned returns one line naming the held nodes that still carry
// ichor's cordon and how to release them, "" when there are none.
func (e *Engine) heldStillCordoned(ctx context.Context) (string, error) {
	var nodes []string

	err := kube.Retry(ctx, 0, func(ctx context.Context) error {
		list, err := e.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}

		nodes = nodes[:0]

		for i := range list.Items {
			n := &list.Items[i]
			if _, held := n.Annotations[discovery.HoldAnnotation]; held && kube.CordonedByIchor(n) {
				nodes = append(nodes, n.Name)
			}
		}

		return nil
	})
	if err != nil {
		return "", fmt.Errorf("list the held nodes: %w", err)
	}

	if len(nodes) == 0 {
		return "", nil
	}

	slices.Sort(nodes)

	return fmt.Sprintf("%s held and still cordoned by ichor from an earlier run, not upgraded: kubectl uncordon %s once fit, "+
		"or remove the hold (kubectl annotate node %s %s-) and upgrade again", strings.Join(nodes, ", "), strings.Join(nodes, " "),
		nodes[0], discovery.HoldAnnotation), nil
}

// reportHeldCordoned names, as the run's last step of stage, the held nodes
// ichor left cordoned. A failure to read them pauses: the run is not called
// done without knowing.
func (e *Engine) reportHeldCordoned(ctx context.Context, stage string) error {
	line, err := e.heldStillCordoned(ctx)
	if err != nil {
		return e.pause(ctx, stage, "", err.Error(), actionResume, err)
	}

	if line != "" {
		e.step(stage, "held", "%s", line)
	}

	return nil
}

// reportHeld says each held node of a stage as Held, and what to do for one
// that ichor left cordoned.
func (e *Engine) reportHeld(stage string, held []discovery.Node, cache *kube.Cache) {
	for _, n := range held {
		if node, ok := cache.Node(n.Name); ok && kube.CordonedByIchor(node) {
			e.node(stage, n.Name, PhaseHeld, "held (%s), still cordoned by ichor: remove the hold to finish it, or kubectl uncordon %s",
				holdText(n), n.Name)

			continue
		}

		e.node(stage, n.Name, PhaseHeld, "held (%s)", holdText(n))
	}
}

func holdText(n discovery.Node) string {
	if n.HoldReason == "" {
		return discovery.HoldAnnotation
	}

	return discovery.HoldAnnotation + ": " + n.HoldReason
}
