//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// TestTalosJobHandOver upgrades Talos on 3+5 through the Job, 1.13 -> 1.14, with no
// fault: every node reboots, the runner's own among them. Before its node's reboot
// the runner hands the operation to a successor pod the Job starts on another node
// (parallelism 2), rather than be evicted and replaced after the Job's pod failure
// backoff: each runner but the last ends with the hand-over's exit code, not an
// eviction; it installs its own node (an install leaves the pods running) and its
// successor holds the lock before the node reboots; the
// Job created no pod that did not take the lock, counted no failure and succeeded,
// its parallelism back at 1.
func TestTalosJobHandOver(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, "--workers", "5", "--talos", talos113)
	addWorkload(t, c, 2)

	tc := openTalos(t, c)
	pods := watchJobPods(t, c)

	start := time.Now()
	r := c.ichor(t, 10*time.Minute, "upgrade", "talos", "--to", talos114, "--yes")
	r.requireExit(t, 0)
	t.Logf("upgraded Talos 3+5 from %s to %s through the Job in %s", talos113, talos114, time.Since(start).Round(time.Millisecond))

	requireHandOvers(t, c, tc, pods, 2)

	// The last runner's log (in the test's log): how it took over.
	r = c.ichor(t, time.Minute, "logs")
	r.requireExit(t, 0)
	assert.Contains(t, r.stdout, "took the lock")
}

// TestTalosJobHandsOverTwice: the first runner runs on a control plane, and its
// successor can only land on a worker not upgraded yet (the other control planes
// take no runner: a taint it does not tolerate), so the successor hands over again
// when its own node's turn comes. The second successor is the Job's third pod: the
// first runner's ignored exit may hold it back for the Job's failure backoff, said in
// the log with the time it took.
func TestTalosJobHandsOverTwice(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, "--workers", "3", "--talos", talos113)
	addWorkload(t, c, 2)

	ctx := context.Background()
	noRunner := corev1.Taint{Key: "e2e.ichor.dev/no-runner", Effect: corev1.TaintEffectNoSchedule}
	workers := []string{"worker-1", "worker-2", "worker-3"}

	for _, w := range workers {
		require.NoError(t, setTaint(ctx, c, w, noRunner, true))
	}

	tc := openTalos(t, c)
	pods := watchJobPods(t, c)

	start := time.Now()
	r := c.ichor(t, 3*time.Minute, "upgrade", "talos", "--to", talos114, "--yes", "--detach")
	r.requireExit(t, 0)

	first := waitForRunner(t, c)
	require.NotEmpty(t, first)

	p, err := c.Client.CoreV1().Pods(jobNamespace).Get(ctx, first, metav1.GetOptions{})
	require.NoError(t, err)
	require.Contains(t, controlPlanes, p.Spec.NodeName, "the workers take no runner")

	// From now on only the workers take a runner.
	for _, n := range append(slices.Clone(controlPlanes), workers...) {
		require.NoError(t, setTaint(ctx, c, n, noRunner, n != p.Spec.NodeName && slices.Contains(controlPlanes, n)))
	}

	t.Cleanup(func() {
		for _, n := range controlPlanes {
			_ = setTaint(context.Background(), c, n, noRunner, false)
		}
	})

	r = c.ichor(t, 10*time.Minute, "status", "--watch")
	r.requireExit(t, 0)
	t.Logf("upgraded Talos 3+3 from %s to %s through the Job in %s", talos113, talos114, time.Since(start).Round(time.Millisecond))

	requireHandOvers(t, c, tc, pods, 3)
}

// requireHandOvers checks a Talos upgrade through the Job that succeeded with at least
// runners runners, each but the last of which handed over.
func requireHandOvers(t *testing.T, c *Cluster, tc *countingTalos, pods *jobPods, runners int) {
	t.Helper()

	requireTalosAt(t, c, tc, talos114)
	requireNothingCordoned(t, c)

	op := c.operation(t)
	require.Equal(t, api.PhaseSucceeded, op.Status.Phase)

	require.GreaterOrEqual(t, len(op.Status.Runners), runners, "every runner's node reboots: it hands over")

	evs := c.Events(t)

	for i, run := range op.Status.Runners[:len(op.Status.Runners)-1] {
		next := op.Status.Runners[i+1]

		p := pods.last(run.Pod)
		require.NotNil(t, p, "runner pod %s seen", run.Pod)
		assert.Equal(t, corev1.PodFailed, p.Status.Phase, "%s", run.Pod)
		assert.Equal(t, int32(job.ExitHandedOver), exitCode(p), "runner %s handed over, not evicted: %+v", run.Pod, p.Status)
		assert.NotEqual(t, run.Node, next.Node, "the successor runs elsewhere")

		// On Talos 1.13 and later the runner stays on its node through the node's
		// install, which leaves its pods running, and hands over before the reboot.
		cordoned, installed := cordonToInstall(evs, run.Node)
		require.False(t, installed.IsZero(), "%s installed", run.Node)
		booted := bootedOn(evs, run.Node, talos114)
		require.False(t, booted.IsZero(), "%s booted %s", run.Node, talos114)
		assert.True(t, installed.Before(next.Started.Time), "%s installed (%s) by runner %s, before its successor %s took the lock (%s)",
			run.Node, installed.Format(time.StampMilli), run.Pod, next.Pod, next.Started.Format(time.StampMilli))
		assert.True(t, next.Started.Time.Before(booted), "successor %s took the lock (%s) before %s booted %s (%s)",
			next.Pod, next.Started.Format(time.StampMilli), run.Node, talos114, booted.Format(time.StampMilli))
		t.Logf("hand-over %d: %s on %s -> %s on %s; %s's install %s after its cordon, the lock taken %s after the install, the boot %s after the lock",
			i+1, run.Pod, run.Node, next.Pod, next.Node, run.Node, installed.Sub(cordoned).Round(time.Millisecond),
			next.Started.Sub(installed).Round(time.Millisecond), booted.Sub(next.Started.Time).Round(time.Millisecond))
	}

	last := pods.last(op.Status.Runners[len(op.Status.Runners)-1].Pod)
	require.NotNil(t, last)
	assert.Equal(t, corev1.PodSucceeded, last.Status.Phase)

	// Every pod the Job created took the lock: none was a replacement of a failure.
	names := make([]string, 0, len(op.Status.Runners))
	for _, run := range op.Status.Runners {
		names = append(names, run.Pod)
	}

	assert.ElementsMatch(t, names, pods.names(), "the Job's pods are the runners")

	// The plugin returns once the state says Succeeded; the Job completes once the
	// last runner's pod ended.
	var j *batchv1.Job

	eventually(t, time.Minute, "the Job complete", func(ctx context.Context) error {
		var err error

		j, err = c.Client.BatchV1().Jobs(jobNamespace).Get(ctx, op.Status.Job, metav1.GetOptions{})
		if err == nil && !jobCondition(j, batchv1.JobComplete) && !jobCondition(j, batchv1.JobFailed) {
			err = fmt.Errorf("job %s: %+v", j.Name, j.Status)
		}

		return err
	})

	assert.True(t, jobCondition(j, batchv1.JobComplete), "the Job completed: %+v", j.Status.Conditions)
	assert.Equal(t, int32(0), j.Status.Failed, "a hand-over is ignored by the podFailurePolicy: no failure counted")
	assert.Equal(t, int32(1), j.Status.Succeeded)
	assert.Equal(t, int32(1), *j.Spec.Parallelism, "the holder set the parallelism back to 1")

	handed, err := c.Client.CoreV1().Events(jobNamespace).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=HandedOver"})
	require.NoError(t, err)
	assert.Len(t, handed.Items, len(op.Status.Runners)-1, "one HandedOver event per hand-over")

	for _, e := range handed.Items {
		t.Logf("%s: %s", e.Reason, e.Message)
	}

	for _, e := range evs {
		if e.Component == events.TalosInstall {
			cordoned, installed := cordonToInstall(evs, e.Node)
			t.Logf("%s: cordon to install %s", e.Node, installed.Sub(cordoned).Round(time.Millisecond))
		}
	}
}

// cordonToInstall is when node was last cordoned before its first install, and that
// install; zero times when not found.
func cordonToInstall(evs []events.Event, node string) (cordoned, installed time.Time) {
	for _, e := range evs {
		if e.Node != node {
			continue
		}

		switch {
		case e.Component == events.Cordon && e.Version == events.Cordoned && installed.IsZero():
			cordoned = e.Time
		case e.Component == events.TalosInstall && installed.IsZero():
			installed = e.Time
		}
	}

	return cordoned, installed
}

// bootedOn is node's first boot on Talos version; zero when not found.
func bootedOn(evs []events.Event, node, version string) time.Time {
	for _, e := range evs {
		if e.Node == node && e.Component == events.Talos && e.Version == version {
			return e.Time
		}
	}

	return time.Time{}
}

func exitCode(p *corev1.Pod) int32 {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Terminated != nil {
			return cs.State.Terminated.ExitCode
		}
	}

	return -1
}

func jobCondition(j *batchv1.Job, typ batchv1.JobConditionType) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}

	return false
}

// jobPods keeps the last state seen of every runner pod, from a watch: a pod that
// ends and is deleted soon after (a drain removes finished pods) is still seen.
type jobPods struct {
	mu sync.Mutex
	by map[string]*corev1.Pod
}

func watchJobPods(t *testing.T, c *Cluster) *jobPods {
	t.Helper()

	jp := &jobPods{by: map[string]*corev1.Pod{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	go func() {
		rv := ""

		for ctx.Err() == nil {
			w, err := c.Client.CoreV1().Pods(jobNamespace).Watch(ctx, metav1.ListOptions{LabelSelector: job.LabelOperation, ResourceVersion: rv})
			if err != nil {
				rv = ""

				time.Sleep(100 * time.Millisecond)

				continue
			}

			for ev := range w.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					rv = ""

					continue
				}

				rv = p.ResourceVersion

				if ev.Type == watch.Added || ev.Type == watch.Modified {
					jp.mu.Lock()
					jp.by[p.Name] = p
					jp.mu.Unlock()
				}
			}
		}
	}()

	return jp
}

func (jp *jobPods) last(name string) *corev1.Pod {
	jp.mu.Lock()
	defer jp.mu.Unlock()

	return jp.by[name]
}

func (jp *jobPods) names() []string {
	jp.mu.Lock()
	defer jp.mu.Unlock()

	out := make([]string, 0, len(jp.by))
	for n := range jp.by {
		out = append(out, n)
	}

	return out
}
