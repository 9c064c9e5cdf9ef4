package job

import (
	"context"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	nodeutil "k8s.io/component-helpers/node/util"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
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

	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: jobPods(j.Name)})
	if err != nil {
		return nil, fmt.Errorf("list the pods of %s: %w", describe("job", c.Namespace, j.Name), err)
	}

	if p := newestPod(pods.Items); p != nil && p.Status.Phase == corev1.PodFailed && !hasDisruption(p) && !handedOver(p) {
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

	if p := c.runnerOnLostNode(ctx, op, pods.Items); p != nil {
		return p, nil
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

// runnerOnLostNode tells of a runner pod, not finished, on a node whose kubelet
// stopped posting its status (Ready Unknown): the runner is likely gone with its
// node, and the Job, which replaces only a failed pod, starts another once that pod
// is gone, which takes the node's kubelet back, or the node marked out of service
// (the pod garbage collector then fails and deletes it). A node the upgrade itself is
// rebooting is said so. It is nil when no such pod is found or a node cannot be read
// (status says what it can).
func (c *Control) runnerOnLostNode(ctx context.Context, op *api.Operation, pods []corev1.Pod) *Problem {
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}

		node, err := c.Kube.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			continue
		}

		// Unknown is a kubelet that stopped posting; one that posts NotReady (a
		// restart, a shutdown) still runs or ends its pods itself.
		_, ready := nodeutil.GetNodeCondition(&node.Status, corev1.NodeReady)
		if ready == nil || ready.Status != corev1.ConditionUnknown {
			continue
		}

		why := fmt.Sprintf("for %s", c.now().Sub(ready.LastTransitionTime.Time).Round(time.Second))
		if ready.Reason != "" {
			why += ": " + ready.Reason
		}

		if upgrading(op, node.Name) {
			why += ", in its upgrade"
		}

		return &Problem{Message: fmt.Sprintf("runner pod %s is on node %s, not Ready (%s): the Job starts another runner once that pod is gone, "+
			"which takes %s back; if %s is down for good, mark it out of service: kubectl taint node %s %s=nodeshutdown:NoExecute",
			p.Name, node.Name, why, node.Name, node.Name, node.Name, corev1.TaintNodeOutOfService)}
	}

	return nil
}

// upgrading tells whether the operation's last step on node is one that takes the
// node away a while (a Talos install and its reboot, a kubelet restart).
func upgrading(op *api.Operation, node string) bool {
	for _, n := range op.Status.Nodes {
		if n.Name == node {
			switch engine.NodePhase(n.Phase) {
			case engine.PhaseApplying, engine.PhaseUpgrading, engine.PhaseVerifying:
				return true
			}

			return false
		}
	}

	return false
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

// handedOver reports whether a runner pod ended by handing the operation over to a
// successor pod of its Job (ExitHandedOver): the Job ignores it, and the successor runs
// on.
func handedOver(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && cs.Name == ContainerName && t.ExitCode == ExitHandedOver {
			return true
		}
	}

	return false
}
