package engine

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// joinLate removes node's Node before a Talos run (its machine powered off, not yet
// in the cluster) and registers it again, as its machine has it then (its osImage
// the machine's osImage, unless osImage is given), at the first Install on at.
func joinLate(t *testing.T, o *fakeOS, node, at, osImage string) {
	t.Helper()

	ctx := context.Background()
	require.NoError(t, o.f.cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}))

	var once sync.Once

	o.onUpgrade = func(_ context.Context, name string) (bool, error) {
		if name != at {
			return false, nil
		}

		once.Do(func() {
			n := o.f.nodeObject(o.f.machine(node), "v1.35.4")
			if osImage != "" {
				n.Status.NodeInfo.OSImage = osImage
			}

			_, err := o.f.cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
			assert.NoError(t, err)
		})

		return false, nil
	}
}

// TestTalosNodeJoinedAfterTheLastLookPauses: a worker's machine powers on and joins
// while another worker is upgraded, after the run read the cluster. The run does not
// say it succeeded with it on the old Talos: it pauses naming it, and the next run
// upgrades it.
func TestTalosNodeJoinedAfterTheLastLookPauses(t *testing.T) {
	o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4", talos: "v1.12.4"})
	joinLate(t, o, "worker-2", "worker-1", "")

	err := o.engine("v1.13.9", newMemo()).Run(context.Background())

	pause := pauseOf(t, err, "TalosOS", "worker-2",
		"worker-2 (Talos v1.12.4) joined after the stages had read the cluster: behind the target v1.13.9")
	assert.Contains(t, pause.Action, "let it finish joining (kubectl get node), then resume (kubectl ichor resume): the next run upgrades it")
	assert.Equal(t, []string{"cp-1", "worker-1"}, o.upgradeNodes(), "the joined node is not touched by the run that missed it")

	o.onUpgrade = nil
	require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()), "the next run takes it")
	assert.Equal(t, []string{"cp-1", "worker-1", "worker-2"}, o.upgradeNodes())
	requireTalosFinished(t, o, "v1.13.9")
}

// TestTalosLastLookAsksTheNode: the last look names a node behind by its osImage only
// when its Talos API does not say it runs the target: a node that joined on the
// target with its Node not yet updated is not behind, one whose API does not answer
// is, and a held node is never named.
func TestTalosLastLookAsksTheNode(t *testing.T) {
	t.Run("on the target, Node not updated yet", func(t *testing.T) {
		o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4", talos: "v1.12.4"})
		o.setOS("worker-2", "v1.13.9")
		joinLate(t, o, "worker-2", "worker-1", "Talos (v1.12.4)")

		require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()))
		assert.Equal(t, []string{"cp-1", "worker-1"}, o.upgradeNodes())
	})

	t.Run("API unreachable", func(t *testing.T) {
		o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4", talos: "v1.12.4"})
		o.setFaults("worker-2", func(f *osFaults) { f.unreachable = true })
		joinLate(t, o, "worker-2", "worker-1", "")

		err := o.engine("v1.13.9", newMemo()).Run(context.Background())
		requirePause(t, err, "TalosOS", "worker-2", "worker-2 (Talos v1.12.4) joined after the stages had read the cluster")
	})

	t.Run("held", func(t *testing.T) {
		o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4", talos: "v1.12.4"})
		setHold(t, o.f, "worker-2", "disk")

		require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()))
		assert.Equal(t, []string{"cp-1", "worker-1"}, o.upgradeNodes())
		assert.Equal(t, "v1.12.4", o.state("worker-2").version)
	})
}
