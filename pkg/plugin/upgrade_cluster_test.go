package plugin

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// TestUpgradeClusterLaunchesThePath: upgrade cluster prints the path as plan cluster
// does and launches one operation that holds every hop; its state keeps the path with
// its first hop's plan; status says where the path is.
func TestUpgradeClusterLaunchesThePath(t *testing.T) {
	c := newJobCluster(talosSecret())

	stdout, stderr, code := runWith(t, c.with(fakeDeps(fixture(), nil)),
		"upgrade", "cluster", "--talos", "v1.14.1", "--kubernetes", "v1.37.2", "--via", "v1.36.3", "--pause-between-hops", "--yes", "--detach")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "1/3  talos       v1.13.9 -> v1.14.1  (target)")
	assert.Contains(t, stdout, "3/3  kubernetes  v1.36.3 -> v1.37.2  (target)")
	assert.Contains(t, stdout, "Launched operation path-v1-37-2-")

	ctx := context.Background()
	ctl := &job.Control{Kube: c.kube, Namespace: job.DefaultNamespace}
	op, err := ctl.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, api.UpgradeCluster, op.Spec.Upgrade)
	assert.Equal(t, "talos v1.14.1, kubernetes v1.37.2", op.Spec.Target)
	assert.Equal(t, []api.HopSpec{
		{Upgrade: api.UpgradeTalos, To: "v1.14.1", Source: api.SourceTarget},
		{Upgrade: api.UpgradeKubernetes, To: "v1.36.3", Source: api.SourceVia},
		{Upgrade: api.UpgradeKubernetes, To: "v1.37.2", Source: api.SourceTarget},
	}, op.Spec.Hops)
	assert.True(t, op.Spec.PauseBetweenHops)

	raw, err := ctl.Store().Plan(ctx)
	require.NoError(t, err)

	var doc api.UpgradePath
	require.NoError(t, json.Unmarshal(raw, &doc))
	assert.Equal(t, api.KindUpgradePath, doc.Kind)
	require.Len(t, doc.Hops, 3)
	require.NotNil(t, doc.Hops[0].Plan, "the first hop's plan is kept")
	assert.NotEmpty(t, doc.Hops[0].Plan.Stages)
	assert.Nil(t, doc.Hops[0].Plan.Drains, "without the drain preview")

	stdout, stderr, code = runWith(t, c.with(deps{}), "status")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Path to talos v1.14.1, kubernetes v1.37.2  Pending")
	assert.Contains(t, stdout, "Hop 1/3 talos v1.14.1 (not started)")
}

// TestUpgradeClusterNothingOrRefused: a cluster at the targets launches nothing; a path
// that cannot be found is refused with its reason; neither writes a state.
func TestUpgradeClusterNothingOrRefused(t *testing.T) {
	c := newJobCluster(talosSecret())

	stdout, stderr, code := runWith(t, c.with(fakeDeps(fixture(), nil)), "upgrade", "cluster", "--kubernetes", "v1.35.4", "--yes")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Nothing to do: the cluster runs the targets already.")

	_, stderr, code = runWith(t, c.with(fakeDeps(fixture(), nil)), "upgrade", "cluster", "--kubernetes", "v1.34.1", "--yes")
	assert.Equal(t, ExitRefused, code)
	assert.Contains(t, stderr, "error: path refused: ")

	_, err := (&job.Control{Kube: c.kube, Namespace: job.DefaultNamespace}).Get(context.Background())
	require.ErrorIs(t, err, job.ErrNoOperation)
}

// TestStatusAndAbortOfAPath: status says which hop runs and how many are done; abort
// ends the whole path and says which hops were done.
func TestStatusAndAbortOfAPath(t *testing.T) {
	op := operation(api.PhaseRunning)
	op.Spec.ID, op.Spec.Upgrade, op.Spec.Target = "path-v1-37-2-abcde", api.UpgradeCluster, "talos v1.14.1, kubernetes v1.37.2"
	op.Spec.Hops = []api.HopSpec{
		{Upgrade: api.UpgradeTalos, To: "v1.14.1"}, {Upgrade: api.UpgradeKubernetes, To: "v1.36.3"}, {Upgrade: api.UpgradeKubernetes, To: "v1.37.2"},
	}
	op.Status.Job = job.JobName(op.Spec.ID, 1)
	at := metav1.NewMicroTime(now0.Add(time.Minute))
	op.Status.Hop = 2
	op.Status.Hops = []api.HopStatus{
		{Number: 1, Upgrade: api.UpgradeTalos, To: "v1.14.1", Started: at, Done: &at},
		{Number: 2, Upgrade: api.UpgradeKubernetes, To: "v1.36.3", Started: at},
	}

	c := newJobCluster(stateOf(t, op, nil), talosSecret())

	stdout, stderr, code := runWith(t, c.with(deps{}), "status")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Hop 2/3 kubernetes v1.36.3  (1 done)")

	stdout, stderr, code = runWith(t, c.with(deps{}), "abort")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Aborted operation path-v1-37-2-abcde (it was Running)\n"+
		"  hops done: 1/3 talos v1.14.1; not done: 2/3 kubernetes v1.36.3, 3/3 kubernetes v1.37.2\n")
}

// TestHopLine: where a path is, in one line, at each point of its life.
func TestHopLine(t *testing.T) {
	at := metav1.NewMicroTime(now0)
	op := &api.Operation{Spec: api.OperationSpec{Upgrade: api.UpgradeCluster, Hops: []api.HopSpec{
		{Upgrade: api.UpgradeTalos, To: "v1.14.1"}, {Upgrade: api.UpgradeKubernetes, To: "v1.37.2"},
	}}}

	assert.Equal(t, "Hop 1/2 talos v1.14.1 (not started)", hopLine(op))

	op.Status.Hop = 1
	op.Status.Hops = []api.HopStatus{{Number: 1, Started: at}}
	assert.Equal(t, "Hop 1/2 talos v1.14.1  (0 done)", hopLine(op))

	op.Status.Hops[0].Done = &at
	assert.Equal(t, "Hop 1/2 talos v1.14.1 done; next: hop 2/2 kubernetes v1.37.2", hopLine(op))

	op.Status.Hop = 2
	op.Status.Hops = append(op.Status.Hops, api.HopStatus{Number: 2, Started: at, Done: &at})
	assert.Equal(t, "Hops 2/2 done", hopLine(op))

	assert.Empty(t, hopLine(&api.Operation{Spec: api.OperationSpec{Upgrade: api.UpgradeKubernetes, Target: "v1.37.2"}}), "not a path")
}

// TestPathInstallers: --installer-image goes with --talos, tagged with it; the first
// hop's plan and the launched hop carry it; without --talos it is refused before the
// cluster is read.
func TestPathInstallers(t *testing.T) {
	const image = "factory.talos.dev/metal-installer/abc123:v1.14.1"

	_, stderr, code := runWith(t, fakeDeps(fixture(), nil), "plan", "cluster", "--kubernetes", "v1.36.3", "--installer-image", image)
	assert.Equal(t, ExitError, code)
	assert.Equal(t, "error: --installer-image and --drop-extensions are for the path's Talos hops: pass --talos too\n", stderr)

	stdout, stderr, code := runWith(t, fakeDeps(fixture(), nil), "plan", "cluster", "--talos", "v1.14.1", "--installer-image", image, "-o", "json")
	require.Equal(t, ExitOK, code, stderr)

	doc := pathOf(t, stdout)
	require.NotNil(t, doc.Hops[0].Plan)
	assert.Contains(t, stdout, `"to": "`+image+`"`, "the first hop's plan installs it")

	c := newJobCluster(talosSecret())
	_, stderr, code = runWith(t, c.with(fakeDeps(fixture(), nil)), "upgrade", "cluster", "--talos", "v1.14.1", "--installer-image", image, "--yes", "--detach")
	require.Equal(t, ExitOK, code, stderr)

	op, err := (&job.Control{Kube: c.kube, Namespace: job.DefaultNamespace}).Get(context.Background())
	require.NoError(t, err)
	require.Len(t, op.Spec.Hops, 1)
	assert.Equal(t, api.Installers{Image: image}, op.Spec.Hops[0].Installers)
}
