package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"
)

// CordonedAnnotation marks a Node that ichor cordoned; its value is when.
// A resumed engine finishes such a node first and uncordons it; abort
// uncordons every node that has it.
const CordonedAnnotation = "ichor.dev/cordoned"

// DefaultEvictRetryDelay is how long a drain waits before evicting a pod
// again when a PodDisruptionBudget refused it (kubectl drain's own default).
const DefaultEvictRetryDelay = 5 * time.Second

// CordonedByIchor reports whether n carries CordonedAnnotation.
func CordonedByIchor(n *corev1.Node) bool {
	_, ok := n.Annotations[CordonedAnnotation]

	return ok
}

// Cordon marks the node unschedulable and sets CordonedAnnotation to now, in
// one patch. A node the user had cordoned is marked too: the upgrade
// uncordons every node it drains (the plan says so).
func Cordon(ctx context.Context, client kubernetes.Interface, node string, now time.Time) error {
	return patchNode(ctx, client, node, true, now.UTC().Format(time.RFC3339))
}

// Uncordon marks the node schedulable and removes CordonedAnnotation, in one
// patch.
func Uncordon(ctx context.Context, client kubernetes.Interface, node string) error {
	return patchNode(ctx, client, node, false, "")
}

func patchNode(ctx context.Context, client kubernetes.Interface, node string, unschedulable bool, mark string) error {
	var annotation any // JSON null removes it
	if mark != "" {
		annotation = mark
	}

	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{CordonedAnnotation: annotation}},
		"spec":     map[string]any{"unschedulable": unschedulable},
	})
	if err != nil {
		return err
	}

	op := "cordon"
	if !unschedulable {
		op = "uncordon"
	}

	err = Retry(ctx, 0, func(ctx context.Context) error {
		_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})

		return err
	})
	if err != nil {
		return fmt.Errorf("node %q: %s: %w", node, op, err)
	}

	return nil
}

// Drainer evicts the pods of a node the way `kubectl drain
// --ignore-daemonsets --delete-emptydir-data` does: DaemonSet and mirror pods
// stay, every other pod is evicted (so PodDisruptionBudgets are respected,
// a refused eviction retried), and the drain waits until they are gone. A
// pod with no controller is not deleted: the drain fails naming it.
type Drainer struct {
	// Client is the Kubernetes client.
	Client kubernetes.Interface
	// Timeout bounds the whole drain (required).
	Timeout time.Duration
	// EvictRetryDelay is the wait before retrying an eviction a budget
	// refused; 0 means DefaultEvictRetryDelay.
	EvictRetryDelay time.Duration
	// OnEvicted, when not nil, is called for every pod gone ("ns/name").
	OnEvicted func(pod string)
}

// Drain drains node and returns how many pods it evicted. Its error says
// which pods could not be evicted and, for a budget, the last refusal.
func (d Drainer) Drain(ctx context.Context, node string) (int, error) {
	retry := d.EvictRetryDelay
	if retry <= 0 {
		retry = DefaultEvictRetryDelay
	}

	var (
		mu      sync.Mutex
		evicted int
		out     lastLines
	)

	h := &drain.Helper{
		Ctx:                  ctx,
		Client:               d.Client,
		GracePeriodSeconds:   -1,
		IgnoreAllDaemonSets:  true,
		DeleteEmptyDirData:   true,
		Timeout:              d.Timeout,
		EvictErrorRetryDelay: retry,
		Out:                  &out,
		ErrOut:               &out,
		OnPodDeletionOrEvictionFinished: func(pod *corev1.Pod, _ bool, err error) {
			if err != nil {
				return
			}

			mu.Lock()
			evicted++
			mu.Unlock()

			if d.OnEvicted != nil {
				d.OnEvicted(pod.Namespace + "/" + pod.Name)
			}
		},
	}

	list, errs := h.GetPodsForDeletion(node)
	if len(errs) > 0 {
		return 0, fmt.Errorf("node %q: drain: %s", node, joinErrors(errs))
	}

	if err := h.DeleteOrEvictPods(list.Pods()); err != nil {
		mu.Lock()
		n := evicted
		mu.Unlock()

		if ctx.Err() != nil {
			return n, fmt.Errorf("node %q: drain: %w", node, ctx.Err())
		}

		if last := out.last(); last != "" {
			return n, fmt.Errorf("node %q: drain: %v (last: %s)", node, err, last)
		}

		return n, fmt.Errorf("node %q: drain: %w", node, err)
	}

	mu.Lock()
	defer mu.Unlock()

	return evicted, nil
}

func joinErrors(errs []error) string {
	msgs := make([]string, 0, len(errs))
	for _, err := range errs {
		msgs = append(msgs, strings.TrimSpace(err.Error()))
	}

	return strings.Join(msgs, "; ")
}

// lastLines keeps the last refusal the drain helper printed, so an error
// that says only "global timeout reached" can say why.
type lastLines struct {
	mu   sync.Mutex
	line string
}

func (l *lastLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()

	for _, line := range bytes.Split(bytes.TrimSpace(p), []byte("\n")) {
		if s := strings.TrimSpace(string(line)); strings.HasPrefix(s, "error when evicting") {
			l.line = s
		}
	}

	return len(p), nil
}

func (l *lastLines) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()

	return l.line
}
