package engine

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// annotateNode sets annotations on a fake cluster's Node and its
// unschedulable flag.
func annotateNode(t *testing.T, f *fakeCluster, name string, unschedulable bool, annotations map[string]string) {
	t.Helper()

	n, err := f.cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)

	for k, v := range annotations {
		n.Annotations[k] = v
	}

	n.Spec.Unschedulable = unschedulable
	_, err = f.cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// schedulableAt records, by node, whether the Node was schedulable at the
// moment of its change (an Upgrade call, an apply).
type schedulableAt struct {
	mu sync.Mutex
	m  map[string][]bool
}

func (s *schedulableAt) record(t *testing.T, f *fakeCluster, name string) {
	n, err := f.cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)

	s.mu.Lock()
	defer s.mu.Unlock()

	if s.m == nil {
		s.m = map[string][]bool{}
	}

	s.m[name] = append(s.m[name], !n.Spec.Unschedulable)
}

func (s *schedulableAt) of(name string) []bool {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.m[name]
}

// TestRecordonTalos: a node that carries ichor's cordon mark but was
// uncordoned by hand (kubectl uncordon, after a pause) is cordoned again
// before its drain and reboot.
func TestRecordonTalos(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	annotateNode(t, o.f, "worker-1", false, map[string]string{kube.CordonedAnnotation: "2026-11-30T10:00:00Z"})

	at := &schedulableAt{}
	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		at.record(t, o.f, o.f.machine(node).name)

		return false, nil
	}

	rec := &recorder{}
	e := o.engine("v1.13.9", newMemo())
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.Equal(t, []bool{false}, at.of("worker-1"), "worker-1 was cordoned at its Upgrade call")
	assert.NotEmpty(t, rec.with("TalosOS worker-1 Cordoned: cordoned again: it carried ichor.dev/cordoned but was schedulable"))
	requireTalosFinished(t, o, "v1.13.9")
}

// TestRecordonKubelets: the same in the Kubernetes upgrade's Kubelets stage:
// cordoned again before its drain and kubelet restart.
func TestRecordonKubelets(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4", workloads: 1})
	annotateNode(t, f, "worker-1", false, map[string]string{kube.CordonedAnnotation: "2026-11-30T10:00:00Z"})

	at := &schedulableAt{}
	f.beforeApply = func(_ context.Context, m *fakeMachine) {
		if m.name == "worker-1" {
			at.record(t, f, m.name)
		}
	}

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.Equal(t, []bool{false}, at.of("worker-1"), "worker-1 was cordoned at its kubelet's apply")
	assert.NotEmpty(t, rec.with("Kubelets worker-1 Cordoned: cordoned again: it carried ichor.dev/cordoned but was schedulable"))
	assert.Empty(t, f.cordonedByIchor())
}

// TestHeldStillCordonedIsNamed: a held node that ichor cordoned in an
// earlier run is left alone, and the run that succeeds names it with what to
// do.
func TestHeldStillCordonedIsNamed(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	annotateNode(t, o.f, "worker-2", true, map[string]string{
		kube.CordonedAnnotation: "2026-11-30T10:00:00Z", discovery.HoldAnnotation: "disk",
	})

	rec := &recorder{}
	e := o.engine("v1.13.9", newMemo())
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.NotEmpty(t, rec.with("TalosOS worker-2 Held: held (ichor.dev/hold: disk), still cordoned by ichor"))
	assert.NotEmpty(t, rec.with("TalosOS [held] worker-2 held and still cordoned by ichor from an earlier run, not upgraded: kubectl uncordon worker-2 once fit"))
	assert.Equal(t, []string{"worker-2"}, o.f.cordonedByIchor(), "not uncordoned behind the operator's back")

	// Nothing held and cordoned: no such line.
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
	rec = &recorder{}
	e = f.engine("v1.36.3")
	e.Progress = rec
	require.NoError(t, e.Run(context.Background()))
	assert.Empty(t, rec.with("[held]"))
}
