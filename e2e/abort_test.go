//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// TestJobAbortWithoutState: an upgrade pauses in the Kubelets stage with a worker
// cordoned and drained (its apply blocks), then its state ConfigMap is deleted (as a
// GitOps prune would). abort finds what the operation left by its labels: it says the
// state was missing, deletes the Job, uncordons the worker and removes the runner's
// credentials (the talos.dev ServiceAccount and its os:admin Secret, the ClusterRole ...).
func TestJobAbortWithoutState(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, []byte("nodes:\n  worker-1:\n    applyBlocks: true\n  worker-2:\n    applyBlocks: true\n"), 0o644))

	c := startJobCluster(t, "--faults", faults)
	ctx := context.Background()

	r := c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--apply-timeout", "10s")
	r.requireExit(t, job.ExitPaused)
	r.requireOneLineError(t, "paused: Kubelets worker-")

	op := c.operation(t)
	require.Equal(t, api.PhasePaused, op.Status.Phase)
	require.NotEmpty(t, operationJobs(t, c, op.Spec.ID))

	worker, err := c.Client.CoreV1().Nodes().Get(ctx, op.Status.PausedNode, metav1.GetOptions{})
	require.NoError(t, err)
	require.True(t, worker.Spec.Unschedulable, "the paused worker stays cordoned")
	require.True(t, kube.CordonedByIchor(worker))

	left, err := runnerCredentials(ctx, t, c, false)
	require.NoError(t, err)
	require.Contains(t, left, "serviceaccount.talos.dev "+jobNamespace+"/"+job.TalosAccountName, "the os:admin credentials are there")

	require.NoError(t, c.Client.CoreV1().ConfigMaps(jobNamespace).Delete(ctx, job.StateName, metav1.DeleteOptions{}))

	r = c.ichor(t, 3*time.Minute, "abort")
	r.requireExit(t, 0)
	require.Contains(t, r.stdout, "The state of namespace ichor-system was missing (configmap ichor-system/ichor-state deleted, or pruned by a GitOps tool): "+
		"cleaned up what operation "+op.Spec.ID+" left, found by its labels\n")
	require.Contains(t, r.stdout, "  stopped job ichor-system/"+op.Status.Job+"\n")
	require.Contains(t, r.stdout, "  uncordoned "+op.Status.PausedNode+"\n")
	// Its os:admin Secret is deleted by abort or, owned by the talos.dev ServiceAccount,
	// by Talos as it goes: below, nothing of either is left.
	require.Contains(t, r.stdout, "  removed the Job's credentials: serviceaccount.talos.dev ichor-system/ichor-talos, ")
	require.Contains(t, r.stdout, ", clusterrole ichor-runner:ichor-system")
	assert.NotContains(t, r.stdout, "the state stays")

	requireNothingCordoned(t, c)
	assert.Empty(t, operationJobs(t, c, op.Spec.ID), "the Job is gone")
	assert.Equal(t, "", lockHolder(t, c))

	// The garbage collector deletes what the runner's ClusterRole owned.
	eventually(t, time.Minute, "no credential of the runner left", func(ctx context.Context) error {
		left, err := runnerCredentials(ctx, t, c, false)
		if err != nil {
			return err
		}

		if len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, ", "))
		}

		return nil
	})

	_, err = c.Client.CoreV1().ConfigMaps(jobNamespace).Get(ctx, job.StateName, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "abort writes no state")

	// Nothing left: nothing to abort.
	r = c.ichor(t, time.Minute, "abort")
	r.requireExit(t, 1)
	r.requireOneLineError(t, "error: no operation in namespace ichor-system (no configmap ichor-state) and nothing of one is left: nothing to abort")
}
