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

// recordon marks a Node that carries CordonedAnnotation unschedulable again,
// keeping the mark (and when it was first set), and returns it as patched; only
// the Node at resourceVersion, when it is not "".
func recordon(ctx context.Context, client kubernetes.Interface, node, resourceVersion string) (*corev1.Node, error) {
	patch := []byte(`{"spec":{"unschedulable":true}}`)
	if resourceVersion != "" {
		patch = fmt.Appendf(nil, `{"metadata":{"resourceVersion":%q},"spec":{"unschedulable":true}}`, resourceVersion)
	}

	var patched *corev1.Node

	err := Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		patched, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})

		return err
	})
	if err != nil {
		return nil, fmt.Errorf("node %q: cordon again: %w", node, err)
	}

	return patched, nil
}
