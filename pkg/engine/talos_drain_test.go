package engine

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// On a Talos whose install leaves the node's pods running, a node's install
// starts once every eviction of its drain is accepted, while the evicted pods
// still stop, and its reboot waits until they are gone.
func TestTalosInstallsWhileEvictedPodsStop(t *testing.T) {
	o := newFakeOS(t, spec113())
	o.f.evictGraceful = true

	rec := &recorder{}
	e := o.engine("v1.14.1", newMemo())
	e.Progress = rec

	var (
		mu        sync.Mutex
		atInstall = map[string]int{}
	)

	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		mu.Lock()
		atInstall[node] = o.f.workloadsOn(node)
		mu.Unlock()

		// The pods stop a moment after the install: the reboot waits for them.
		time.AfterFunc(50*time.Millisecond, func() { o.f.releaseEvicted(node) })

		return false, nil
	}

	require.NoError(t, e.Run(context.Background()))
	requireTalosFinished(t, o, "v1.14.1")

	mu.Lock()
	defer mu.Unlock()

	for _, w := range []string{"worker-1", "worker-2"} {
		assert.Equal(t, 1, atInstall[w], "%s: installed while its evicted pod stopped", w)
		assert.Zero(t, o.state(w).rebootedWithPods, "%s: rebooted with no pod left", w)
		assert.NotEmpty(t, rec.with(w, string(PhaseDraining), "every eviction accepted: going on while the pods stop"))
		assert.NotEmpty(t, rec.with(w, string(PhaseUpgrading), "evicted default/web-"+w+"-0 (its drain goes on beside the upgrade)"),
			"%s", strings.Join(rec.with(w), "\n"))
		assert.NotEmpty(t, rec.with(w, string(PhaseDone), "drained 1 pod(s)"), "%s", strings.Join(rec.with(w), "\n"))
		assert.Empty(t, rec.with(w, "since its drain"), "the pods the drain waits for are not drained again")
	}
}

// A drain whose evicted pods outlast its bound while the node installs pauses
// before the reboot: the node is uncordoned, not rebooted, and the pause says
// the install stays for its next boot.
func TestTalosDrainRunsOutBesideTheInstall(t *testing.T) {
	o := newFakeOS(t, spec113())
	o.f.evictGraceful = true

	rec := &recorder{}
	e := o.engine("v1.14.1", newMemo(), func(opts *Options) { opts.DrainTimeout = 300 * time.Millisecond })
	e.Progress = rec

	err := e.Run(context.Background())
	pause := pauseOf(t, err, "TalosOS", "worker-1", "global timeout reached: 300ms")
	assert.Contains(t, pause.Reason, "(uncordoned again); Talos v1.14.1 stays installed for its next boot")

	st := o.state("worker-1")
	assert.Equal(t, "v1.14.1", st.staged, "installed")
	assert.Zero(t, st.reboots, "not rebooted with its pod")

	node, err := o.f.cs.CoreV1().Nodes().Get(context.Background(), "worker-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.False(t, node.Spec.Unschedulable, "uncordoned again")
}

// On a Talos whose one Upgrade call installs and reboots, the drain ends
// before the call.
func TestTalosLegacyUpgradeDrainsFirst(t *testing.T) {
	o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4", talos: "v1.12.4", workloads: 1})
	o.f.evictGraceful = true
	o.setFaults("worker-1", func(f *osFaults) { f.legacy = true })

	pods := -1

	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		if node == "worker-1" {
			pods = o.f.workloadsOn(node)
		}

		return false, nil
	}

	// The evicted pod stops a moment after its eviction.
	o.f.onTerminating = func() { time.AfterFunc(50*time.Millisecond, func() { o.f.releaseEvicted("") }) }

	require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")
	assert.Zero(t, pods, "the pod was gone before the Upgrade call")
}

// A run stopped after a node's install, its evicted pods still stopping (the
// drain beside the install not joined yet): the next run finds the install
// made, says the pods still stop, and reboots the node only once they are gone.
func TestTalosResumeWaitsForPodsStillStopping(t *testing.T) {
	o := newFakeOS(t, spec113())
	o.f.evictGraceful = true
	memo := newMemo()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		if node == "worker-1" {
			cancel() // the runner stopped as the install ran
		}

		return false, nil
	}

	require.ErrorIs(t, o.engine("v1.14.1", memo).Run(ctx), context.Canceled)
	require.Equal(t, 1, o.f.workloadsOn("worker-1"), "its evicted pod still stops")
	require.Equal(t, "v1.14.1", o.state("worker-1").staged, "installed")

	o.onUpgrade = nil
	// worker-2's pod, evicted by the next run, stops a moment after.
	o.f.onTerminating = func() { time.AfterFunc(50*time.Millisecond, func() { o.f.releaseEvicted("worker-2") }) }

	// worker-1's stops once the next run says it waits for it.
	next := &recorder{onLine: func(line string) {
		if strings.Contains(line, "worker-1 Draining: 1 evicted pod(s) still stopping: waiting for them before its reboot") {
			o.f.releaseEvicted("worker-1")
		}
	}}
	e := o.engine("v1.14.1", memo)
	e.Progress = next

	require.NoError(t, e.Run(context.Background()))
	requireTalosFinished(t, o, "v1.14.1")
	assert.NotEmpty(t, next.with("worker-1 Draining: 1 evicted pod(s) still stopping"), "%s", strings.Join(next.with("worker-1"), "\n"))
	assert.Empty(t, next.with("worker-1", "since its drain"))
	assert.Zero(t, o.state("worker-1").rebootedWithPods, "rebooted once its pod was gone")
	assert.Zero(t, o.state("worker-2").rebootedWithPods)
	upgrades := o.upgradeNodes()
	assert.Len(t, slices.DeleteFunc(slices.Clone(upgrades), func(n string) bool { return n != "worker-1" }), 1, "installed once: %v", upgrades)
}
