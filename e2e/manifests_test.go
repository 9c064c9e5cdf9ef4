//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// TestJobManifestsKeepAnotherManagersChange changes a bootstrap manifest object live
// with another field manager (as Helm would), then upgrades through the Job: the sync,
// a dry run first and no force, skips that object and says so, applies the others and
// the upgrade succeeds with the change kept. A --manifests-force that names no object is
// refused up front.
func TestJobManifestsKeepAnotherManagersChange(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	cms := c.Client.CoreV1().ConfigMaps("kube-system")

	cm, err := cms.Get(ctx, "coredns", metav1.GetOptions{})
	require.NoError(t, err)

	const mark = "# changed by helm"

	cm.Data["Corefile"] += "\n" + mark + "\n"
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: "helm"})
	require.NoError(t, err)

	// The plan says it, as a check, before anything runs.
	r := c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.36.3")
	r.requireExit(t, 0)
	check := tableChecks(r.stdout)["bootstrap manifests"]
	require.Equal(t, api.ResultWarn, check.result)
	require.Contains(t, check.detail, "changed by another field manager, the sync skips them: ConfigMap kube-system/coredns")
	require.Contains(t, check.detail, `conflict with "helm"`)

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	require.Contains(t, r.stdout, "skipped 1 changed by another field manager: ConfigMap kube-system/coredns")

	op := c.operation(t)
	assert.Equal(t, job.PhaseSucceeded, op.Status.Phase)

	cm, err = cms.Get(ctx, "coredns", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, cm.Data["Corefile"], mark, "the other manager's change is kept")

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))

	// A bad name is refused up front.
	r = c.ichor(t, time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--manifests-force", "coredns")
	r.requireExit(t, 1)
	r.requireOneLineError(t, `--manifests-force "coredns": name an object as "Kind namespace/name"`)
}
