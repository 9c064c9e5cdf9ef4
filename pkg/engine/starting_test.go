package engine

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// starting sets the Node's Ready condition to status since the moment given,
// as a kubelet reports a node back from a boot (False: "the node is starting")
// or a node controller one whose kubelet posts nothing (Unknown).
func starting(status corev1.ConditionStatus, since time.Time) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: status, Reason: "KubeletNotReady",
			Message: "container runtime network not ready: the node is starting", LastTransitionTime: metav1.NewTime(since),
		}}
	}
}

// TestTalosChecksWaitForAStartingNode: a resume right after a node's reboot (a
// rollback, a repair) finds it NotReady while its runtime and network come up.
// The checks wait for it, bounded and saying so on its line, and go on once it
// is Ready; one that stays NotReady past the bound, or whose kubelet posts
// nothing, is refused as before, nothing changed.
func TestTalosChecksWaitForAStartingNode(t *testing.T) {
	t.Run("Ready during the wait", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.setNode("worker-2", starting(corev1.ConditionFalse, time.Now()))

		go func() {
			time.Sleep(300 * time.Millisecond)
			o.setNode("worker-2", func(n *corev1.Node) {
				n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
			})
		}()

		rec := &recorder{}
		e := o.engine("v1.13.9", newMemo())
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		requireTalosFinished(t, o, "v1.13.9")
		assert.NotEmpty(t, rec.with("TalosOS worker-2 Pending: starting: NotReady (KubeletNotReady: container runtime network not ready: the node is starting)",
			"the checks wait until", "for it to come Ready"))
		assert.NotEmpty(t, rec.with("TalosOS worker-2 Pending: started: Ready after"))
	})

	t.Run("still starting at the bound", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.setNode("worker-2", starting(corev1.ConditionFalse, time.Now()))

		err := o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.StartingTimeout = 300 * time.Millisecond }).Run(context.Background())
		requirePause(t, err, "TalosOS", "worker-2", "checks: not Ready: worker-2 (still starting after a wait of")
		assert.Empty(t, o.upgradeNodes())
		assert.Empty(t, o.f.cordonedByIchor())
	})

	for name, setup := range map[string]func(*corev1.Node){
		"NotReady for longer than the bound": starting(corev1.ConditionFalse, time.Now().Add(-time.Hour)),
		"its kubelet silent":                 starting(corev1.ConditionUnknown, time.Now()),
	} {
		t.Run(name, func(t *testing.T) {
			o := newFakeOS(t, talosSpec())
			o.setNode("worker-2", setup)

			start := time.Now()
			err := o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.StartingTimeout = time.Hour }).Run(context.Background())
			p := pauseOf(t, err, "TalosOS", "worker-2", "checks: not Ready: worker-2")
			assert.NotContains(t, p.Reason, "starting")
			assert.Less(t, time.Since(start), time.Minute, "no wait")
			assert.Empty(t, o.upgradeNodes())
		})
	}
}

// TestKubernetesChecksWaitForAStartingNode: the Kubernetes stages' checks wait
// for a starting node as the Talos stage's do.
func TestKubernetesChecksWaitForAStartingNode(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
	setStatus := func(fn func(*corev1.Node)) error {
		n, err := f.cs.CoreV1().Nodes().Get(context.Background(), "worker-2", metav1.GetOptions{})
		if err != nil {
			return err
		}

		fn(n)
		_, err = f.cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})

		return err
	}

	require.NoError(t, setStatus(starting(corev1.ConditionFalse, time.Now())))

	// worker-2 gets Ready once the run said it waits for it: never before the
	// run looked, however slow the machine.
	var ready sync.Once

	rec := &recorder{onLine: func(line string) {
		if strings.Contains(line, "worker-2 Pending: starting: NotReady") {
			ready.Do(func() {
				go func() {
					assert.NoError(t, setStatus(func(n *corev1.Node) {
						n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
					}))
				}()
			})
		}
	}}
	e := f.engine("v1.36.3")
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	requireFinished(t, f, "v1.36.3")
	assert.NotEmpty(t, rec.with("worker-2 Pending: starting: NotReady"))
	assert.NotEmpty(t, rec.with("worker-2 Pending: started: Ready after"))
}

// TestWaitStartingWaitsForNothingElse: a node Ready again since the stage read it
// is neither waited for nor refused; with a node gone from the cluster among
// them, nothing is waited for and every one is refused at once.
func TestWaitStartingWaitsForNothingElse(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
	setStatus := func(name string, fn func(*corev1.Node)) {
		n, err := f.cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(t, err)

		fn(n)
		_, err = f.cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		require.NoError(t, err)
	}

	setStatus("worker-2", starting(corev1.ConditionFalse, time.Now()))

	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	e := f.engine("v1.36.3")
	cache, err := e.startCache(ctx)
	require.NoError(t, err)

	defer cache.Stop()

	still, waited, err := e.waitStarting(ctx, cache, "Kubelets", []string{"worker-1"}, time.Hour)
	require.NoError(t, err)
	assert.Empty(t, still, "worker-1 is Ready")
	assert.Empty(t, waited)

	start := time.Now()
	still, waited, err = e.waitStarting(ctx, cache, "Kubelets", []string{"worker-2", "worker-9"}, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, []string{"worker-2", "worker-9"}, still)
	assert.Empty(t, waited, "no wait: worker-9 is gone")
	assert.Less(t, time.Since(start), time.Minute)
}
