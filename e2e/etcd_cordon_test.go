//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// TestTalosEtcdGateAndRecordon upgrades Talos on a 3+2 cluster, from v1.12.4
// to v1.13.9 and from v1.13.9 to v1.14.1, whose cp-3 etcd member is stopped but still listed (fault
// etcdStopped), and whose worker-1 carries ichor's cordon mark but was
// uncordoned by hand (kubectl uncordon after a pause of an earlier run):
//   - plan refuses with the etcd quorum check, naming cp-3;
//   - the upgrade pauses before cp-1 is cordoned, naming cp-3 and how to look;
//   - once cp-3's etcd runs again the upgrade completes, and worker-1 is
//     cordoned again before its drain.
func TestTalosEtcdGateAndRecordon(t *testing.T) {
	t.Parallel()

	for _, v := range []struct{ from, to string }{{talosFrom, talosTo}, {talos113, talos114}} {
		t.Run(v.from+" to "+v.to, func(t *testing.T) {
			t.Parallel()
			testEtcdGateAndRecordon(t, v.from, v.to)
		})
	}
}

func testEtcdGateAndRecordon(t *testing.T, from, to string) {
	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, []byte("nodes:\n  cp-3:\n    etcdStopped: true\n"), 0o644))

	c := startCluster(t, "--control-planes", "3", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", from, "--faults", faults)
	addWorkload(t, c, 2)

	ctx := context.Background()
	tc := openTalos(t, c)
	cp3 := c.Machine(t, "cp-3").IP

	// worker-1: ichor's mark, but schedulable.
	out, err := c.kubectl(t, "annotate", "node", "worker-1", kube.CordonedAnnotation+"=2026-11-30T10:00:00Z")
	require.NoError(t, err, out)

	t.Run("plan refuses, naming cp-3", func(t *testing.T) {
		r := c.plugin(t, "plan", "talos", "--to", to, "-o", "json")
		r.requireExit(t, 2)
		etcd := planCheck(t, decodePlan(t, r.stdout), "etcd quorum")
		assert.Equal(t, api.ResultRefused, etcd.Result)
		assert.Contains(t, etcd.Detail, "etcd is not healthy: member cp-3 does not answer etcd status")
		assert.Contains(t, etcd.Action, "talosctl -n "+cp3+" etcd status")
	})

	memo := &memoMap{}

	t.Run("the upgrade pauses before cp-1 is cordoned, naming cp-3", func(t *testing.T) {
		err := talosEngineFor(t, c, tc, to, memo, &lines{}).Run(ctx)

		var pause *engine.PauseError
		require.ErrorAs(t, err, &pause)
		t.Logf("paused: %v", err)
		assert.Equal(t, "cp-1", pause.Node)
		assert.Contains(t, pause.Reason, "checks: etcd is not healthy: member cp-3 does not answer etcd status")
		assert.Contains(t, pause.Reason, "cp-1 is not rebooted while it is")
		assert.Contains(t, pause.Action, "talosctl -n "+cp3+" etcd status")

		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		require.NoError(t, err)

		for _, n := range nodes.Items {
			assert.False(t, n.Spec.Unschedulable, "%s not cordoned", n.Name)
		}

		assert.Empty(t, talosStarts(c.Events(t), to), "nothing rebooted")
	})

	t.Run("cleared, it completes; worker-1 is cordoned again before its drain", func(t *testing.T) {
		require.NoError(t, os.WriteFile(faults, []byte("nodes: {}\n"), 0o644))

		var (
			mu            sync.Mutex
			atDrain       []bool // worker-1 unschedulable when its drain began
			progressLines []string
		)

		progress := &lines{onLine: func(line string) {
			mu.Lock()
			progressLines = append(progressLines, line)
			mu.Unlock()

			if !strings.HasPrefix(line, "TalosOS worker-1 Draining: draining") {
				return
			}

			n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			if err == nil {
				mu.Lock()
				atDrain = append(atDrain, n.Spec.Unschedulable)
				mu.Unlock()
			}
		}}

		require.NoError(t, talosEngineFor(t, c, tc, to, memo, progress).Run(ctx))
		requireTalosAt(t, c, tc, to)
		assert.Len(t, talosStarts(c.Events(t), to), 5)

		mu.Lock()
		defer mu.Unlock()

		assert.Equal(t, []bool{true}, atDrain, "worker-1 unschedulable when its drain began")

		again := slices.IndexFunc(progressLines, func(l string) bool {
			return strings.HasPrefix(l, "TalosOS worker-1 Cordoned: cordoned again: it carried ichor.dev/cordoned but was schedulable")
		})
		drain := slices.IndexFunc(progressLines, func(l string) bool { return strings.HasPrefix(l, "TalosOS worker-1 Draining") })
		require.GreaterOrEqual(t, again, 0, "worker-1 cordoned again")
		assert.Less(t, again, drain, "cordoned again before its drain")

		healthy := slices.IndexFunc(progressLines, func(l string) bool {
			return strings.HasPrefix(l, "TalosOS cp-1 Pending: etcd healthy: 3 voter(s), 2 left while cp-1 reboots (quorum 2)")
		})
		assert.GreaterOrEqual(t, healthy, 0, "the gate passed for cp-1")
	})
}
