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
