//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

// TestTalosInstallWhilePodsStop upgrades Talos 1.13 -> 1.14 on 3+3 through the
// Job, the workers' pods taking 5s to stop once evicted (the simulator's
// terminationTakes, as workloads that finish their work on SIGTERM). On a Talos
// whose install leaves the node's pods running, each worker's install starts
// once its evictions are accepted, while its evicted pods still stop, and its
// reboot waits until they are gone: no pod's work is cut short by a reboot.
func TestTalosInstallWhilePodsStop(t *testing.T) {
	t.Parallel()

	workers := []string{"worker-1", "worker-2", "worker-3"}
	faults := filepath.Join(t.TempDir(), "faults.yaml")
	spec := "nodes:\n"

	for _, w := range workers {
		spec += "  " + w + ":\n    terminationTakes: 5s\n"
	}

	require.NoError(t, os.WriteFile(faults, []byte(spec), 0o644))

	c := startJobCluster(t, "--workers", "3", "--talos", talos113, "--faults", faults)
	addWorkload(t, c, 3)

	tc := openTalos(t, c)

	start := time.Now()
	r := c.ichor(t, 10*time.Minute, "upgrade", "talos", "--to", talos114, "--yes")
	r.requireExit(t, 0)
	t.Logf("upgraded Talos 3+3 from %s to %s, pods taking 5s to stop, in %s", talos113, talos114, time.Since(start).Round(time.Millisecond))

	requireTalosAt(t, c, tc, talos114)
	requireNothingCordoned(t, c)

	// On each worker, the last of its evicted pods (a budget lets the
	// workload's go one at a time) stopped after the node's install started and
	// before it booted the target.
	evs := c.Events(t)
	lastStop := map[string]events.Event{}

	for _, e := range evs {
		assert.NotEqual(t, events.PodCut, e.Component, "%s: the work of %s cut short by a reboot", e.Node, e.Version)

		if e.Component == events.PodStopped {
			lastStop[e.Node] = e
		}
	}

	assert.NotEmpty(t, lastStop, "evicted pods finished their work")

	for node, e := range lastStop {
		installed, booted := eventTime(evs, node, events.TalosInstall, ""), eventTime(evs, node, events.Talos, talos114)
		require.False(t, installed.IsZero(), "%s installed", node)
		require.False(t, booted.IsZero(), "%s booted %s", node, talos114)
		assert.True(t, installed.Before(e.Time), "%s installed (%s) while %s stopped (%s)", node, installed.Format(stamp), e.Version, e.Time.Format(stamp))
		assert.True(t, booted.After(e.Time), "%s booted %s after %s stopped", node, talos114, e.Version)
	}
}

// stamp is how the test says an event's time.
const stamp = "15:04:05.000"

// eventTime is the time of the first event of component on node (at version,
// unless version is ""); zero when there is none.
func eventTime(evs []events.Event, node, component, version string) time.Time {
	for _, e := range evs {
		if e.Node == node && e.Component == component && (version == "" || e.Version == version) {
			return e.Time
		}
	}

	return time.Time{}
}
