package job

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// Problem is something wrong with an operation's Job that its state does not show.
type Problem struct {
	// Message is one line saying what and what to do.
	Message string
	// Final is true when the Job will not run the operation any further (it failed):
	// only `resume` or `abort` moves it on.
	Final bool
}

// Diagnose looks at the Job of an unfinished operation for what its state cannot tell:
// a Job that failed without pausing the operation, a pod that cannot start or is not
// scheduled. It returns nil when nothing is wrong.
func (c *Control) Diagnose(ctx context.Context, op *api.Operation) (*Problem, error) {
	if op.Status.Phase.Finished() || op.Status.Phase == api.PhasePaused || op.Status.Job == "" {
		return nil, nil
	}

	n := nsFlag(c.Namespace)

	j, err := c.Kube.BatchV1().Jobs(c.Namespace).Get(ctx, op.Status.Job, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if op.Status.UpdatedAt != nil && c.now().Sub(op.Status.UpdatedAt.Time) < launchGrace {
			return nil, nil
		}

		return &Problem{Final: true, Message: fmt.Sprintf("job %s/%s is gone while operation %s is %s: continue it with kubectl ichor resume%s",
			c.Namespace, op.Status.Job, op.Spec.ID, op.Status.Phase, n)}, nil
	}

	if err != nil {
		return nil, fmt.Errorf("read %s: %w", describe("job", c.Namespace, op.Status.Job), err)
	}

	if cond, finished := jobFinished(j); finished && cond.Type == batchv1.JobFailed {
		return &Problem{Final: true, Message: fmt.Sprintf("job %s/%s failed (%s: %s): read kubectl ichor logs%s, then continue with kubectl ichor resume%s",
			c.Namespace, j.Name, cond.Reason, text.OneLine(cond.Message), n, n)}, nil
	}

	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + j.Name})
	if err != nil {
		return nil, fmt.Errorf("list the pods of %s: %w", describe("job", c.Namespace, j.Name), err)
	}

	if p := newestPod(pods.Items); p != nil && p.Status.Phase == corev1.PodFailed && !hasDisruption(p) {
		why := ""

		for _, cs := range p.Status.ContainerStatuses {
			if t := cs.State.Terminated; t != nil {
				why = fmt.Sprintf(" (exit code %d)", t.ExitCode)
				if t.Message != "" {
					why = fmt.Sprintf(" (exit code %d: %s)", t.ExitCode, text.OneLine(t.Message))
				}
			}
		}

		return &Problem{Message: fmt.Sprintf("runner pod %s failed%s; the Job tries again (%d failures of %d allowed): read kubectl ichor logs%s",
			p.Name, why, j.Status.Failed, BackoffLimit, n)}, nil
	}

	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodPending {
			continue
		}

		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
				return &Problem{Message: fmt.Sprintf("pod %s cannot start: %s: %s (is --image %s right?)", p.Name, w.Reason, text.OneLine(w.Message), op.Spec.Image)}, nil
			}
		}

		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				return &Problem{Message: fmt.Sprintf("pod %s is not scheduled: %s", p.Name, text.OneLine(cond.Message))}, nil
			}
		}
	}

	return nil, nil
}

// newestPod is the most recently created pod, nil for none.
func newestPod(pods []corev1.Pod) *corev1.Pod {
	var newest *corev1.Pod

	for i := range pods {
		if newest == nil || newest.CreationTimestamp.Before(&pods[i].CreationTimestamp) {
			newest = &pods[i]
		}
	}

	return newest
}

// hasDisruption reports whether a pod was stopped by a disruption (an eviction): the
// Job replaces it without counting a failure.
func hasDisruption(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return true
		}
	}

	return false
}
