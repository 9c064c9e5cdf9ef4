//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// factory114 is Talos 1.14.1's default installer on metal: the Image
// Factory's of the empty schematic.
const factory114 = "factory.talos.dev/metal-installer/" + emptySchematic + ":" + talos114

// A 3+2 cluster of vanilla Talos v1.13.9 nodes (their configs name the
// generic installer, as talosctl gen config 1.13 wrote them), upgraded to
// v1.14.1 through the Job as a new user would: the simulator serves no
// generic installer for 1.14, as ghcr.io does not, so every node must go on
// the factory installer of the empty schematic, which the plan names and
// says why.
func TestTalos113To114FactoryInstallers(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, "--kubernetes", kube136, "--talos", talos113)
	addWorkload(t, c, 2)
	tc := openTalos(t, c)
	ctx := context.Background()

	// The registry's rule, as ghcr.io has it.
	err := tc.PullImage(ctx, c.Machine(t, "worker-1").IP, talos.NamespaceSystem, "ghcr.io/siderolabs/installer:"+talos114)
	require.Error(t, err)
	assert.Equal(t, codes.NotFound, client.StatusCode(err), "%v", err)
	require.NoError(t, tc.PullImage(ctx, c.Machine(t, "worker-1").IP, talos.NamespaceSystem, "ghcr.io/siderolabs/installer:"+talos113),
		"1.13 tags exist")

	j := c.ichor(t, 2*time.Minute, "plan", "talos", "--to", talos114, "-o", "json")
	j.requireExit(t, 0)

	plan := decodePlan(t, j.stdout)
	require.True(t, plan.Runnable)
	require.Len(t, plan.Stages[0].Nodes, 5)

	for _, n := range plan.Stages[0].Nodes {
		assert.Equal(t, "ghcr.io/siderolabs/installer:"+talos113, n.Changes[1].From, n.Node)
		assert.Equal(t, factory114, n.Changes[1].To, n.Node)
		assert.Equal(t, "Talos 1.14 publishes no ghcr.io/siderolabs/installer: Talos' default, the Image Factory installer of the empty schematic",
			n.Changes[1].Reason, n.Node)
	}

	start := time.Now()
	r := c.ichor(t, 10*time.Minute, "upgrade", "talos", "--to", talos114, "--yes")
	r.requireExit(t, 0)
	t.Logf("upgraded 3+2 vanilla Talos %s -> %s through the Job in %s", talos113, talos114, time.Since(start).Round(time.Millisecond))

	requireTalosAt(t, c, tc, talos114)
	requireNothingCordoned(t, c)

	installs := map[string]int{}

	for _, e := range c.Events(t) {
		if e.Component == events.TalosInstall {
			installs[e.Node]++
		}
	}

	for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
		assert.Equal(t, 1, installs[n], "%s installed once", n)
		// Booted from the factory installer, a node runs its schematic (the
		// generic installer would have left it none).
		assert.Equal(t, []string{"schematic " + emptySchematic}, extensionsOf(t, tc, c, n), n)
	}
}

// An installer the registry does not serve (made unpublished) pauses the run
// before any node is cordoned: the simulator's events log shows no cordon
// and no install at all, the pause names the node, the image and what to
// pass; once the image is published again, resume finishes the upgrade.
func TestTalosUnpublishedInstallerPausesBeforeCordon(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, []byte("unpublished:\n  - "+factory114+"\n"), 0o644))

	c := startJobCluster(t, "--kubernetes", kube136, "--talos", talos113, "--faults", faults)
	addWorkload(t, c, 2)
	tc := openTalos(t, c)

	r := c.ichor(t, 5*time.Minute, "upgrade", "talos", "--to", talos114, "--yes")
	r.requireExit(t, job.ExitPaused)

	op := c.operation(t)
	assert.Equal(t, api.PhasePaused, op.Status.Phase)
	require.NotEmpty(t, op.Status.PausedNode)
	assert.Contains(t, op.Status.Reason, "pre-pull: node \""+op.Status.PausedNode+"\": pull its installer "+factory114)
	assert.Contains(t, op.Status.Reason, "not found")
	assert.Contains(t, op.Status.Reason, "nothing was cordoned or drained")
	assert.Contains(t, op.Status.Action, "image pull "+factory114)
	assert.Contains(t, op.Status.Action, "--installer-image "+op.Status.PausedNode+"=")

	for _, e := range c.Events(t) {
		assert.NotEqual(t, events.Cordon, e.Component, "a node was cordoned: %+v", e)
		assert.NotEqual(t, events.TalosInstall, e.Component, "a node was installed: %+v", e)
	}

	requireNothingCordoned(t, c)

	// Published again (a mirror set up, the registry back), resume finishes it.
	require.NoError(t, os.WriteFile(faults, nil, 0o644))

	r = c.ichor(t, 10*time.Minute, "resume")
	r.requireExit(t, 0)
	requireTalosAt(t, c, tc, talos114)
	requireNothingCordoned(t, c)

	cordons := 0

	for _, e := range c.Events(t) {
		if e.Component == events.Cordon && e.Version == events.Cordoned {
			cordons++
		}
	}

	assert.Equal(t, 5, cordons, "each node cordoned once, by the resumed run")
	assert.True(t, strings.Contains(r.stdout, "Succeeded"), r.stdout)
}
