package engine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKubernetesRidesOutUnreachableTalos: a node whose Talos API refuses connections for
// a moment (apid restarting) is read again and the upgrade goes on; one that stays
// unreachable past UnreachableGrace pauses the stage, naming the node and how long it
// was tried.
func TestKubernetesRidesOutUnreachableTalos(t *testing.T) {
	t.Run("for a moment", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})
		f.machine("cp-2").faults.unreachable = 2

		require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
		requireFinished(t, f, "v1.36.3")
	})

	t.Run("for good", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})
		f.machine("cp-2").faults.unreachable = -1

		start := time.Now()
		err := f.engine("v1.36.3", func(o *Options) { o.UnreachableGrace = 1500 * time.Millisecond }).Run(context.Background())
		_ = pauseOf(t, err, "APIServers", "", "read the nodes' Talos side: ", "cp-2: rpc error: code = Unavailable", "connection refused", "(unreachable for 1.5s)")
		assert.GreaterOrEqual(t, time.Since(start), 1500*time.Millisecond, "tried for the grace")
		assert.Empty(t, f.realApplies(), "nothing applied")
	})
}

// TestKubernetesVisitRidesOutUnreachableTalos: a node whose Talos API goes away between the
// stage's first look and its apply (a power cycle, apid restarting) is read again there
// too: its active config, its persistent config and the dry run are each tried again
// within UnreachableGrace, and the upgrade goes on without a pause (soak seeds 1012 and
// 1016 paused at the active config's read).
func TestKubernetesVisitRidesOutUnreachableTalos(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})

	calls := map[string]int{}
	f.refuseTalos = func(node, call string) bool {
		if node != "cp-2" {
			return false
		}
		calls[call]++
		switch call {
		case "MachineConfig":
			// The first look of the first stage reads it once; its visit is the next.
			return calls[call] >= 2 && calls[call] <= 4
		default:
			return calls[call] <= 2
		}
	}

	require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
	requireFinished(t, f, "v1.36.3")
	assert.Greater(t, calls["PersistentMachineConfig"], 2, "the persistent config was read again")
	assert.Greater(t, calls["Apply (dry run)"], 2, "the dry run was tried again")

	t.Run("for good, at the visit", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})
		reads := 0
		f.refuseTalos = func(node, call string) bool {
			if node != "cp-2" || call != "MachineConfig" {
				return false
			}
			reads++
			return reads >= 2
		}

		err := f.engine("v1.36.3", func(o *Options) { o.UnreachableGrace = 1500 * time.Millisecond }).Run(context.Background())
		_ = pauseOf(t, err, "APIServers", "cp-2", "read machine config", "connection refused", "(unreachable for 1.5s)")
	})
}

// TestTalosRidesOutUnreachableReads: a Talos upgrade reads what a node runs (its
// extensions, at the checks) and its boot ID (after its drain, before its Upgrade call)
// again while its Talos API refuses connections, within UnreachableGrace: a blip there
// no longer pauses the upgrade (soak seeds 1002 and 1005 paused at those two reads).
func TestTalosRidesOutUnreachableReads(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.setFaults("worker-1", func(f *osFaults) { f.refusals = map[string]int{"Installed": 2, "BootID": 2} })
	o.setFaults("cp-2", func(f *osFaults) { f.refusals = map[string]int{"BootID": 3} })

	require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")

	t.Run("for good", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.setFaults("cp-2", func(f *osFaults) { f.refusals = map[string]int{"BootID": 1 << 30} })

		err := o.engine("v1.13.9", newMemo(), func(o *Options) { o.UnreachableGrace = 1500 * time.Millisecond }).Run(context.Background())
		_ = pauseOf(t, err, "TalosOS", "cp-2", "before its upgrade", "connection refused", "(unreachable for 1.5s)")
		assert.NotContains(t, o.f.cordonedByIchor(), "cp-2", "nothing changed on the node: it is uncordoned")
	})
}
