package job

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// This file is the runner's hand-over to a successor pod before its own node's reboot
// (engine.HandOver), and the lock holder's return of its Job's parallelism to 1.
//
// Evicted, the runner's pod fails (ignored by the podFailurePolicy) and the Job creates
// its replacement only after its pod failure backoff, which counts ignored failures too
// (kube-controller-manager's DefaultJobPodFailureBackOff, 10 s): that wait was on the
// critical path of every Talos upgrade. Instead, once its node is cordoned, the runner
// raises its Job's parallelism to 2 (completions unset: the Job controller creates the
// second pod at once, no failure having happened yet, and the scheduler puts it on
// another node), waits for that pod to run, stops its engine, writes its last progress,
// releases the lock and exits with ExitHandedOver, which the Job ignores. The successor
// takes the lock and continues from the state with the drain of the runner's node.
//
// The runner never sets the parallelism back itself: while both pods are active, the
// Job controller would delete the most recently ready one, the successor. The lock's
// holder does, once it is the Job's only active pod (settleParallelism); until then a
// Job at 2 only keeps a second candidate waiting for the lock, and the Lease lets one
// act.

// Bounds and pace of a hand-over.
const (
	// SuccessorStartTimeout bounds the wait for the successor pod to run (scheduled on
	// another node, its image pulled, started); past it the runner is evicted as before.
	SuccessorStartTimeout = 90 * time.Second
	// SuccessorLockTimeout bounds the wait, once the lock is released, for the successor
	// to take it; the runner exits either way (the lock is free for any pod of the Job).
	SuccessorLockTimeout = 30 * time.Second
	// settleTimeout bounds the holder's wait for being its Job's only active pod.
	settleTimeout = 2 * time.Minute
	handOverPoll  = 250 * time.Millisecond
)

// errHandedOver stops the engine when the successor runs.
var errHandedOver = errors.New("handed over to a successor pod")

// handOver is the runner's engine.HandOver for one leading run; it also keeps the
// holder's settling of the parallelism from racing a hand-over.
type handOver struct {
	r *Runner
	// stop stops the engine with errHandedOver.
	stop func(error)

	mu sync.Mutex
	// job is the runner's Job, once Prepare raised its parallelism.
	job string
	// asked is when Prepare asked for a successor: settleParallelism stops.
	asked time.Time
	// successor is the pod handed over to; waited how long it took to run from the ask.
	successor *corev1.Pod
	waited    time.Duration
	// poll, startTimeout override the pace and bound (tests).
	poll, startTimeout time.Duration
}

func (h *handOver) pace() (poll, start time.Duration) {
	poll, start = handOverPoll, SuccessorStartTimeout
	if h.poll > 0 {
		poll = h.poll
	}

	if h.startTimeout > 0 {
		start = h.startTimeout
	}

	return poll, start
}

// Prepare raises the runner's Job's parallelism to 2, once: asked again (the drain
// before the reboot, after the drain that asked), it keeps the successor asked for.
func (h *handOver) Prepare(ctx context.Context) {
	h.mu.Lock()
	if h.job != "" {
		h.mu.Unlock()

		return
	}

	h.asked = time.Now()
	h.mu.Unlock()

	rctx, cancel := context.WithTimeout(ctx, LockRequestTimeout)
	defer cancel()

	job, err := h.r.ownJob(rctx)
	if err == nil {
		err = h.r.canHandOver(rctx, job)
	}

	if err == nil {
		err = h.r.setParallelism(rctx, job, 2)
	}

	if err != nil {
		h.r.logf("hand-over: cannot start a successor pod (%v): the drain evicts this runner, and the Job replaces it after its backoff", err)

		return
	}

	h.mu.Lock()
	h.job = job
	h.mu.Unlock()

	h.r.logf("hand-over: job %s/%s at parallelism 2: a successor pod starts on another node", h.r.Namespace, job)
}

// Complete waits for the successor to run; when it does, it stops the engine.
func (h *handOver) Complete(ctx context.Context) bool {
	h.mu.Lock()
	job := h.job
	h.mu.Unlock()

	if job == "" {
		return false
	}

	poll, bound := h.pace()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()

	var why string

wait:
	for {
		pod, reason, err := h.r.successor(wctx, job)

		switch {
		case pod != nil:
			h.mu.Lock()
			h.successor, h.waited = pod, time.Since(h.asked)
			h.mu.Unlock()

			h.r.logf("hand-over: successor %s runs on node %s (%s after the ask, %s after only this runner was left): this runner stops, writes its progress and releases the lock",
				pod.Name, pod.Spec.NodeName, h.waited.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
			h.stop(errHandedOver)

			return true
		case reason != "":
			why = reason

			break wait
		case err != nil:
			why = err.Error()
		}

		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return false
			}

			why = fmt.Sprintf("no successor ran within %s (%s)", bound, whyOr(why, "not started"))

			break wait
		case <-time.After(poll):
		}
	}

	// Back to 1: the Job controller deletes the successor pod that did not run (an
	// unscheduled or pending pod goes first).
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), LockRequestTimeout)
	defer rcancel()

	h.mu.Lock()
	h.job = ""
	h.mu.Unlock()

	if err := h.r.setParallelism(rctx, job, 1); err != nil {
		why += fmt.Sprintf("; the Job's parallelism stays at 2 (%v), the lock's next holder sets it back", err)
	}

	h.r.logf("hand-over: %s: the drain evicts this runner, and the Job replaces it after its backoff", why)

	return false
}

func whyOr(why, or string) string {
	if why == "" {
		return or
	}

	return why
}

// handedTo is the successor handed over to, nil when none, and how long it took to run
// from the ask.
func (h *handOver) handedTo() (*corev1.Pod, time.Duration) {
	if h == nil {
		return nil, 0
	}

	h.mu.Lock()
	defer h.mu.Unlock()

	return h.successor, h.waited
}

// ownJob is the name of the Job that owns the runner's pod.
func (r *Runner) ownJob(ctx context.Context) (string, error) {
	pod, err := r.Kube.CoreV1().Pods(r.Namespace).Get(ctx, r.Identity, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the runner's own %s: %w", describe("pod", r.Namespace, r.Identity), err)
	}

	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "Job" {
		return ref.Name, nil
	}

	return "", fmt.Errorf("%s is not a Job's pod", describe("pod", r.Namespace, r.Identity))
}

// canHandOver checks that the Job can run a second pod: one whose completions is set (a
// Job launched before hand-overs, which left both unset and got completions 1 from the
// API server) never starts more than that.
func (r *Runner) canHandOver(ctx context.Context, job string) error {
	j, err := r.Kube.BatchV1().Jobs(r.Namespace).Get(ctx, job, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read %s: %w", describe("job", r.Namespace, job), err)
	}

	if j.Spec.Completions != nil {
		return fmt.Errorf("%s has completions %d: it runs no second pod", describe("job", r.Namespace, job), *j.Spec.Completions)
	}

	return nil
}

// setParallelism sets the Job's parallelism.
func (r *Runner) setParallelism(ctx context.Context, job string, n int) error {
	patch := fmt.Appendf(nil, `{"spec":{"parallelism":%d}}`, n)

	_, err := r.Kube.BatchV1().Jobs(r.Namespace).Patch(ctx, job, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("set the parallelism of %s to %d: %w", describe("job", r.Namespace, job), n, err)
	}

	return nil
}

// successor is a pod of the Job other than the runner's that runs on another node; when
// there is none, reason says why none will (the pod cannot be scheduled), or is "".
func (r *Runner) successor(ctx context.Context, job string) (*corev1.Pod, string, error) {
	pods, err := r.Kube.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: jobPods(job)})
	if err != nil {
		return nil, "", fmt.Errorf("list the pods of %s: %w", describe("job", r.Namespace, job), err)
	}

	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Name == r.Identity || p.DeletionTimestamp != nil || p.Spec.NodeName == r.Node {
			continue
		}

		if p.Status.Phase == corev1.PodRunning {
			return p, "", nil
		}

		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return nil, fmt.Sprintf("successor %s cannot be scheduled: %s", p.Name, c.Message), nil
			}
		}
	}

	return nil, "", nil
}

// awaitSuccessor waits, bounded, for another runner to hold the lock once this one
// released it after a hand-over.
func (r *Runner) awaitSuccessor(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SuccessorLockTimeout)
	defer cancel()

	start := time.Now()
	self := HolderIdentity(r.Namespace, r.Identity)

	for {
		lock, err := ReadLock(ctx, r.Kube)
		if err == nil && lock.HeldAt(time.Now()) && lock.Holder != self {
			r.logf("hand-over: %s took the lock %s after its release", lock.Holder, time.Since(start).Round(time.Millisecond))

			return
		}

		select {
		case <-ctx.Done():
			r.logf("hand-over: no successor took the lock within %s: it, or the Job's next pod, takes it when it can", SuccessorLockTimeout)

			return
		case <-time.After(handOverPoll / 5):
		}
	}
}

// settleParallelism sets the runner's Job's parallelism back to 1 once this runner,
// which holds the lock, is its only active pod: a hand-over left it at 2. A runner that
// hands over itself meanwhile (h.asked) leaves it; past settleTimeout (another pod waits
// for the lock) it is left at 2, which only keeps that pod waiting.
func (r *Runner) settleParallelism(ctx context.Context, h *handOver) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()

	job, err := r.ownJob(ctx)
	if err != nil {
		return
	}

	j, err := r.Kube.BatchV1().Jobs(r.Namespace).Get(ctx, job, metav1.GetOptions{})
	if err != nil || j.Spec.Parallelism == nil || *j.Spec.Parallelism <= 1 {
		return
	}

	for {
		if alone, err := r.onlyActive(ctx, job); err == nil && alone {
			h.mu.Lock()

			if h.asked.IsZero() {
				if err := r.setParallelism(ctx, job, 1); err != nil {
					r.logf("could not set the parallelism of job %s back to 1: %v", job, err)
				} else {
					r.logf("job %s/%s back at parallelism 1 (a hand-over raised it)", r.Namespace, job)
				}
			}

			h.mu.Unlock()

			return
		}

		select {
		case <-ctx.Done():
			return
		case <-time.After(4 * handOverPoll):
		}
	}
}

// onlyActive reports whether the runner's pod is the only active pod of job (none other
// is neither finished nor being deleted).
func (r *Runner) onlyActive(ctx context.Context, job string) (bool, error) {
	pods, err := r.Kube.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: jobPods(job)})
	if err != nil {
		return false, err
	}

	for _, p := range pods.Items {
		if p.Name == r.Identity || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}

		return false, nil
	}

	return true, nil
}
