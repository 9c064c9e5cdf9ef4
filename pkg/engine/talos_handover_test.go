package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// runnerPod puts a pod of the Job ichor-run on node, as the runner's own.
func runnerPod(t *testing.T, f *fakeCluster, node, name string) {
	t.Helper()

	_, err := f.cs.CoreV1().Pods("ichor-system").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ichor-system", Name: name,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "ichor-run", Controller: new(true)}},
		},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "run", Image: "ghcr.io/ichor-dev/kubectl-ichor"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// atInstall calls land once, at node's first Install call, once the run's watch
// shows the node cordoned (the fake has no resourceVersions for the run to catch
// up on), so that the list before its reboot finds what land put there.
func atInstall(t *testing.T, o *fakeOS, e *Engine, node string, land func()) {
	t.Helper()

	var once sync.Once

	o.onUpgrade = func(_ context.Context, name string) (bool, error) {
		if name == node {
			once.Do(func() {
				assert.Eventually(t, func() bool {
					n, ok := e.nodes.Cached(node)

					return ok && n.Spec.Unschedulable
				}, 5*time.Second, time.Millisecond)
				land()
			})
		}

		return false, nil
	}
}

// osHandOver is a HandOver that records what the runner's node had been through at
// each Prepare and Complete; Complete hands over (stops the run, as the Job's does).
type osHandOver struct {
	o    *fakeOS
	node string
	stop context.CancelFunc

	mu                  sync.Mutex
	prepared, completed []osMachine
}

func (h *osHandOver) Prepare(context.Context) {
	st := h.o.state(h.node)

	h.mu.Lock()
	defer h.mu.Unlock()

	h.prepared = append(h.prepared, st)
}

func (h *osHandOver) Complete(context.Context) bool {
	st := h.o.state(h.node)

	h.mu.Lock()
	h.completed = append(h.completed, st)
	h.mu.Unlock()

	h.stop()

	return true
}

// installsOn is how many Install calls took on node.
func installsOn(o *fakeOS, node string) int {
	o.mu.Lock()
	defer o.mu.Unlock()

	return len(slices.DeleteFunc(slices.Clone(o.upgrades), func(u string) bool { return !strings.HasPrefix(u, node+" ") }))
}

// TestTalosRunnerStaysThroughItsInstall: on a Talos with the lifecycle service the
// runner's own node is drained with the runner's pod left on it, the successor asked
// for then; the node installs with the runner still on it, and the runner hands over
// right before the reboot. The successor evicts what is left of the runner before it
// reboots the node, and installs nothing again. On a Talos before 1.13, whose one
// Upgrade call installs and reboots, the runner hands over before the install.
func TestTalosRunnerStaysThroughItsInstall(t *testing.T) {
	for _, tt := range []struct {
		name, target       string
		spec               clusterSpec
		installedAtHandOff bool
	}{
		{"lifecycle service", "v1.14.1", spec113(), true},
		{"before 1.13", "v1.13.9", talosSpec(), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := newFakeOS(t, tt.spec)
			memo := newMemo()
			runnerPod(t, o.f, "worker-1", "ichor-run-abcde")

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			h := &osHandOver{o: o, node: "worker-1", stop: cancel}
			e := o.engine(tt.target, memo, func(opts *Options) {
				opts.Self, opts.SelfPod, opts.HandOver = "worker-1", "ichor-system/ichor-run-abcde", h
			})

			require.ErrorIs(t, e.Run(ctx), context.Canceled)

			h.mu.Lock()
			require.NotEmpty(t, h.prepared)
			assert.Empty(t, h.prepared[0].staged, "the successor asked for before the install")
			require.Len(t, h.completed, 1)
			assert.Zero(t, h.completed[0].reboots, "handed over before the reboot")
			h.mu.Unlock()

			if tt.installedAtHandOff {
				assert.Equal(t, tt.target, h.completed[0].staged, "installed with the runner on the node")
				assert.Equal(t, 1, installsOn(o, "worker-1"))
			} else {
				assert.Empty(t, h.completed[0].staged, "handed over before the install")
				assert.Zero(t, installsOn(o, "worker-1"))
			}

			assert.Equal(t, []string{"worker-1"}, o.f.cordonedByIchor(), "the runner's node stays cordoned by ichor")

			_, err := o.f.cs.CoreV1().Pods("ichor-system").Get(context.Background(), "ichor-run-abcde", metav1.GetOptions{})
			require.NoError(t, err, "the runner's pod was not evicted")

			// The successor, on worker-2, finds the runner's pod still there (its
			// container ending): it goes before the reboot.
			var rebootsAtEviction []int

			o.f.mu.Lock()
			o.f.onEvict = func(_, name string) {
				if name == "ichor-run-abcde" {
					rebootsAtEviction = append(rebootsAtEviction, o.state("worker-1").reboots)
				}
			}
			o.f.mu.Unlock()

			next := o.engine(tt.target, memo, func(opts *Options) { opts.Self, opts.SelfPod = "worker-2", "ichor-system/ichor-run-fghij" })
			require.NoError(t, next.Run(context.Background()))
			requireTalosFinished(t, o, tt.target)

			assert.Equal(t, []int{0}, rebootsAtEviction, "the runner's pod evicted before its node's reboot")
			assert.Equal(t, 1, installsOn(o, "worker-1"), "one install")
		})
	}
}

// TestTalosRebootsNoNodeWithPods: a pod that lands on a drained node before its
// reboot (one that tolerates the cordon) is evicted before the reboot.
func TestTalosRebootsNoNodeWithPods(t *testing.T) {
	o := newFakeOS(t, spec113())
	rec := &recorder{}
	e := o.engine("v1.14.1", newMemo())
	e.Progress = rec

	// At its install (a drain and an install take minutes in the field), a pod
	// lands on it.
	atInstall(t, o, e, "worker-2", func() { runnerPod(t, o.f, "worker-2", "came-late") })

	var rebootsAtEviction []int

	o.f.onEvict = func(_, name string) {
		if name == "came-late" {
			rebootsAtEviction = append(rebootsAtEviction, o.state("worker-2").reboots)
		}
	}

	require.NoError(t, e.Run(context.Background()))
	requireTalosFinished(t, o, "v1.14.1")

	assert.Equal(t, []int{0}, rebootsAtEviction, "evicted before the reboot")
	assert.NotEmpty(t, rec.with("worker-2", "since its drain: draining it again before its reboot"), strings.Join(rec.with("worker-2"), "\n"))
}

// TestTalosPausesOnAPodItCannotEvict: a pod with no controller lands on a drained
// node during its install. The list before the reboot finds it, and the drain
// again pauses saying what to do (move it by hand), not "resume", which would
// find it again; the node is not rebooted with it.
func TestTalosPausesOnAPodItCannotEvict(t *testing.T) {
	o := newFakeOS(t, spec113())
	rec := &recorder{}
	e := o.engine("v1.14.1", newMemo())
	e.Progress = rec

	atInstall(t, o, e, "worker-2", func() {
		_, err := o.f.cs.CoreV1().Pods("default").Create(context.Background(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bare"},
			Spec:       corev1.PodSpec{NodeName: "worker-2", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	})

	err := e.Run(context.Background())
	pause, ok := errors.AsType[*PauseError](err)
	require.True(t, ok, "%v", err)
	assert.Contains(t, pause.Error(), "default/bare")
	assert.Contains(t, pause.Action, "a pod with no controller must be moved by hand")
	assert.Contains(t, pause.Reason, "Talos v1.14.1 stays installed for its next boot")
	assert.NotEmpty(t, rec.with("worker-2", string(PhaseFailed), "(uncordoned again); Talos v1.14.1 stays installed for its next boot"),
		"the node's failed line says it too: %s", strings.Join(rec.with("worker-2"), "\n"))
	assert.Zero(t, o.state("worker-2").reboots, "not rebooted with the pod")
}

// TestTalosEtcdPassesBeforeHandOver: etcd is read a pass a gap while the runner's
// own node's group runs, and while the worker batch before it does, so that the
// passes left for the successor hold one a gap old; not while a control plane
// reboots, nor when the runner does not hand over.
func TestTalosEtcdPassesBeforeHandOver(t *testing.T) {
	cp := func(name string) []*osNode { return []*osNode{{Node: discovery.Node{ControlPlane: true, Name: name}}} }
	workers := func(names ...string) []*osNode {
		var g []*osNode
		for _, n := range names {
			g = append(g, &osNode{Node: discovery.Node{Name: n}})
		}

		return g
	}
	visit := [][]*osNode{cp("cp-1"), cp("cp-2"), cp("cp-3"), workers("w-1", "w-2"), workers("w-3", "w-4"), workers("w-5", "w-6")}

	for _, tt := range []struct {
		name    string
		self    string
		handOff bool
		stay    bool
		want    []bool
	}{
		{"a worker in the middle batch", "w-3", true, false, []bool{false, false, false, true, true, false}},
		{"a worker in the first batch: cp-3 reboots before", "w-1", true, false, []bool{false, false, false, true, false, false}},
		{"a control plane", "cp-2", true, false, []bool{false, true, false, false, false, false}},
		{"no hand-over", "w-3", false, false, make([]bool, 6)},
		{"stays on its node", "w-3", true, true, make([]bool, 6)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &talosRun{opts: Options{Self: tt.self, StayOnNode: tt.stay}, etcdNodes: []stages.EtcdNode{{Name: "cp-1"}}, etcd: &stages.EtcdChain{}}
			if tt.handOff {
				r.opts.HandOver = &passHandOver{}
			}

			got := make([]bool, len(visit))
			for i := range visit {
				got[i] = r.passesBeforeHandOver(visit, i)
			}

			assert.Equal(t, tt.want, got)
		})
	}
}
