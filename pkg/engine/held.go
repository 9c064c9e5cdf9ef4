package engine

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// A held node is left alone by every upgrade, even one that ichor cordoned
// in an earlier run (it was held after a pause, say): ichor does not know
// what state it is in, so it does not uncordon it. It names it instead, at
// the stage's start (its node line) and at the end of a run that succeeded
// (the last step), so it is never left cordoned silently.

// heldStillCordoned returns one line naming the held nodes that still carry
// ichor's cordon and how to release them, "" when there are none. It looks at
// the run's watch of the Nodes, and confirms each it names with a read that
// shows at least the runner's own last cordon or uncordon of it (a node held
// while this run drained it, then uncordoned).
func (e *Engine) heldStillCordoned(ctx context.Context) (string, error) {
	var nodes []string

	for _, cached := range e.nodes.List() {
		if !heldCordoned(cached) {
			continue
		}

		n, err := e.nodes.Get(ctx, cached.Name)
		if apierrors.IsNotFound(err) {
			continue
		}

		if err != nil {
			return "", fmt.Errorf("read the held node %s: %w", cached.Name, err)
		}

		if heldCordoned(n) {
			nodes = append(nodes, n.Name)
		}
	}

	if len(nodes) == 0 {
		return "", nil
	}

	return fmt.Sprintf("%s held and still cordoned by ichor from an earlier run, not upgraded: kubectl uncordon %s once fit, "+
		"or remove the hold (kubectl annotate node %s %s-) and upgrade again", strings.Join(nodes, ", "), strings.Join(nodes, " "),
		nodes[0], discovery.HoldAnnotation), nil
}

func heldCordoned(n *corev1.Node) bool {
	_, held := n.Annotations[discovery.HoldAnnotation]

	return held && kube.CordonedByIchor(n)
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
