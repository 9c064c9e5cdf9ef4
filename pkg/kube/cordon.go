package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// CordonState is how a Node stands with respect to ichor's cordon.
type CordonState int

// The cordon states.
const (
	// NotCordonedByIchor: the Node has no CordonedAnnotation (it may be
	// cordoned by someone else).
	NotCordonedByIchor CordonState = iota
	// CordonedByUs: the Node has the mark and is unschedulable.
	CordonedByUs
	// MarkedButSchedulable: the Node has the mark but is schedulable again:
	// someone ran kubectl uncordon, which leaves annotations alone.
	MarkedButSchedulable
)

// CordonOf says how n stands with respect to ichor's cordon.
func CordonOf(n *corev1.Node) CordonState {
	switch {
	case !CordonedByIchor(n):
		return NotCordonedByIchor
	case !n.Spec.Unschedulable:
		return MarkedButSchedulable
	default:
		return CordonedByUs
	}
}

// ReadCordon reads the Node from the API server (not a cache: a kubectl
// uncordon a moment ago counts) and says how it stands.
func ReadCordon(ctx context.Context, client kubernetes.Interface, node string) (CordonState, error) {
	var state CordonState

	err := Retry(ctx, 0, func(ctx context.Context) error {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}

		state = CordonOf(n)

		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("node %q: read its cordon: %w", node, err)
	}

	return state, nil
}

// Recordon marks a Node that carries CordonedAnnotation unschedulable again,
// keeping the mark (and when it was first set).
func Recordon(ctx context.Context, client kubernetes.Interface, node string) error {
	err := Retry(ctx, 0, func(ctx context.Context) error {
		_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})

		return err
	})
	if err != nil {
		return fmt.Errorf("node %q: cordon again: %w", node, err)
	}

	return nil
}
