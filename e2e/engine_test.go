//go:build e2e

package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

var (
	controlPlanes = []string{"cp-1", "cp-2", "cp-3"}
	allNodes      = []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"}
)

// TestEngineMinorUpgrade drives the engine directly against a 3+2 cluster
// from v1.35.4 to v1.36.3, with a Deployment behind a budget on the workers.
func TestEngineMinorUpgrade(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "3", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", "v1.13.9")
	addWorkload(t, c, 2)

	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)
	progress := &lines{}

	start := time.Now()
	require.NoError(t, engineFor(t, c, tc, "v1.36.3", progress).Run(context.Background()))
	t.Logf("upgraded 3+2 from v1.35.4 to v1.36.3 in %s", time.Since(start).Round(time.Millisecond))

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireEventOrder(t, c.Events(t), "v1.36.3", controlPlanes, allNodes)
	assert.Len(t, tc.applies(), 3*4+2, "one apply per control plane and stage, one per worker")

	// The workload survived its drains: every replica Ready again.
	d, err := c.Client.AppsV1().Deployments("default").Get(context.Background(), "web", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, int32(2), d.Status.ReadyReplicas)

	// A second run finds nothing to do and applies nothing.
	require.NoError(t, engineFor(t, c, tc, "v1.36.3", &lines{}).Run(context.Background()))
	assert.Len(t, tc.applies(), 3*4+2)
}

// TestEnginePatchUpgrade takes the same path for a patch.
func TestEnginePatchUpgrade(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "3", "--workers", "2", "--kubernetes", "v1.36.1", "--talos", "v1.13.9")

	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	start := time.Now()
	require.NoError(t, engineFor(t, c, tc, "v1.36.3", &lines{}).Run(context.Background()))
	t.Logf("upgraded 3+2 from v1.36.1 to v1.36.3 in %s", time.Since(start).Round(time.Millisecond))

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireEventOrder(t, c.Events(t), "v1.36.3", controlPlanes, allNodes)
}

// TestEngineResumes stops the engine twice mid-way (once in the
// ControlPlaneComponents stage right after an apply, once in the Kubelets
// stage with a worker cordoned and draining); each time a fresh engine
// carries on, and no node is ever given the same config twice.
func TestEngineResumes(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "3", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", "v1.13.9")
	addWorkload(t, c, 2)

	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	for _, stopAt := range []string{
		"ControlPlaneComponents cp-2 Applying: applied",
		"Kubelets worker-1 Draining:",
	} {
		ctx, cancel := context.WithCancel(context.Background())
		progress := &lines{onLine: func(line string) {
			if strings.HasPrefix(line, stopAt) {
				cancel()
			}
		}}

		err := engineFor(t, c, tc, "v1.36.3", progress).Run(ctx)
		cancel()
		require.ErrorIs(t, err, context.Canceled, "stopped at %q", stopAt)

		var pause *engine.PauseError
		require.False(t, errors.As(err, &pause), "a stop is not a pause")
		t.Logf("stopped at %q: %v", stopAt, err)
	}

	// The second stop left worker-1 cordoned by ichor.
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), "worker-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, kube.CordonedByIchor(n))

	require.NoError(t, engineFor(t, c, tc, "v1.36.3", &lines{}).Run(context.Background()))

	applies := tc.applies()
	assert.Len(t, applies, 3*4+2, "no apply repeated across the three engines")

	seen := map[string]bool{}
	for _, a := range applies {
		assert.False(t, seen[a], "a config applied twice")
		seen[a] = true
	}

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireEventOrder(t, c.Events(t), "v1.36.3", controlPlanes, allNodes)
}

// TestEngineFaults: an apply that blocks on cp-2 pauses under its own
// deadline with nothing changed; once it is cleared, a scheduler that never
// gets Ready on cp-2 pauses the next run there, with a message naming it,
// and nothing moves further.
func TestEngineFaults(t *testing.T) {
	t.Parallel()

	// Written once the cluster is up: a neverReady fault holds from a
	// component's first start, which would keep the cluster from being Ready.
	faults := filepath.Join(t.TempDir(), "faults.yaml")
	setFaults := func(doc string) {
		t.Helper()
		require.NoError(t, os.WriteFile(faults, []byte(doc), 0o644))
	}

	c := startCluster(t, "--control-planes", "3", "--workers", "1", "--kubernetes", "v1.35.4", "--talos", "v1.13.9", "--faults", faults)
	tc := openTalos(t, c)

	t.Run("an apply that blocks", func(t *testing.T) {
		setFaults("nodes:\n  cp-2:\n    applyBlocks: true\n")

		e := engineFor(t, c, tc, "v1.36.3", &lines{})
		e.Options.ApplyTimeout = 3 * time.Second

		err := e.Run(context.Background())

		var pause *engine.PauseError
		require.ErrorAs(t, err, &pause)
		t.Logf("paused: %v", err)
		assert.Equal(t, "APIServers", pause.Stage)
		assert.Equal(t, "cp-2", pause.Node)
		assert.Contains(t, pause.Reason, `node "cp-2": apply:`)
		assert.Contains(t, pause.Reason, "DeadlineExceeded")

		cfgs := machineConfigs(t, c, tc)
		assert.Equal(t, "v1.36.3", render.TagOf(render.Images(cfgs["cp-1"])[render.APIServer]))
		assert.Equal(t, "v1.35.4", render.TagOf(render.Images(cfgs["cp-2"])[render.APIServer]), "nothing applied")
		assert.Equal(t, "v1.35.4", render.TagOf(render.Images(cfgs["cp-3"])[render.APIServer]), "nothing after cp-2")
	})

	t.Run("a scheduler that never gets Ready", func(t *testing.T) {
		setFaults("nodes:\n  cp-2:\n    neverReady: [kube-scheduler]\n")

		e := engineFor(t, c, tc, "v1.36.3", &lines{})
		e.Options.VerifyTimeout = 10 * time.Second

		err := e.Run(context.Background())

		var pause *engine.PauseError
		require.ErrorAs(t, err, &pause)
		t.Logf("paused: %v", err)
		assert.Equal(t, "ControlPlaneComponents", pause.Stage)
		assert.Equal(t, "cp-2", pause.Node)
		assert.Contains(t, pause.Reason, "verify: kube-scheduler-cp-2 on v1.36.3 not Ready after 10s")
		assert.Contains(t, pause.Action, "kubectl describe node cp-2")

		// cp-3 kept its controller-manager and scheduler; no kubelet moved.
		cfgs := machineConfigs(t, c, tc)
		assert.Equal(t, "v1.35.4", render.TagOf(render.Images(cfgs["cp-3"])[render.Scheduler]))
		assert.Equal(t, "v1.36.3", render.TagOf(render.Images(cfgs["cp-3"])[render.APIServer]))

		for _, name := range []string{"cp-1", "cp-2", "cp-3", "worker-1"} {
			assert.Equal(t, "v1.35.4", render.TagOf(render.Images(cfgs[name])[render.Kubelet]), name)
		}
	})

	assert.Empty(t, invariantBreaks(c.Events(t)))
	assert.Len(t, tc.applies(), 3+2, "cp-1 to cp-3 in APIServers (cp-2 once the fault was cleared); cp-1, cp-2 in ControlPlaneComponents")
}
