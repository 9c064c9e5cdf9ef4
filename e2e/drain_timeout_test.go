//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// TestJobDrainTimeout: the workers' pods finish their work on SIGTERM, taking
// 20s to stop once evicted (the simulator's terminationTakes), and the drain
// may take 3s (--drain-timeout). One replica (behind a budget that allows one
// disruption) runs on a worker. That worker's drain runs out its bound
// with its pods still Terminating: the upgrade pauses saying so, with the node
// uncordoned again and its kubelet not restarted. Once the pods stop at once
// and the evicted ones are gone, resume (the same bound) finishes.
func TestJobDrainTimeout(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, []byte("nodes:\n  worker-1:\n    terminationTakes: 20s\n  worker-2:\n    terminationTakes: 20s\n"), 0o644))

	c := startJobCluster(t, "--faults", faults)
	ctx := context.Background()
	addWorkload(t, c, 1)

	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	r := c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--drain-timeout", "3s")
	r.requireExit(t, job.ExitPaused)
	r.requireOneLineError(t, "global timeout reached: 3s")

	op := c.operation(t)
	require.Equal(t, api.PhasePaused, op.Status.Phase)
	paused := op.Status.PausedNode
	require.Contains(t, []string{"worker-1", "worker-2"}, paused)
	assert.Contains(t, op.Status.Reason, "(uncordoned again)")
	assert.Contains(t, op.Status.Action, "make the pods evictable")

	// The pause came while an evicted pod still ran, Terminating, and before the
	// node's kubelet restarted.
	pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + paused})
	require.NoError(t, err)

	terminating := 0

	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			terminating++
		}
	}

	assert.Positive(t, terminating, "an evicted pod of %s still Terminating at the pause", paused)

	node, err := c.Client.CoreV1().Nodes().Get(ctx, paused, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "v1.35.4", node.Status.NodeInfo.KubeletVersion, "no kubelet restarted under a pod still running")
	requireNothingCordoned(t, c)

	// The cause fixed (the pods stop at once on SIGTERM) and the pods evicted
	// before it gone: resume, with the operation's same bound, finishes.
	require.NoError(t, os.WriteFile(faults, []byte("nodes: {}\n"), 0o644))
	eventually(t, time.Minute, "no pod Terminating, the web pod Ready", func(ctx context.Context) error {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}

		ready := 0

		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s Terminating", p.Name)
			}

			if isReady(&p) {
				ready++
			}
		}

		if ready < 1 {
			return fmt.Errorf("%d web pod Ready", ready)
		}

		return nil
	})

	r = c.ichor(t, 10*time.Minute, "resume")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}
