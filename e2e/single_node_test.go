//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// upgradeSmallCluster upgrades a cluster of cps control planes and no worker
// through the Job and requires it Succeeded: the Job's pod has no other node
// to go to (1 node), or its node's drain moves it to another control plane.
func upgradeSmallCluster(t *testing.T, cps int, upgrade, to, note string, args ...string) {
	t.Helper()

	c := startJobCluster(t, "--control-planes", fmt.Sprint(cps), "--workers", "0")

	start := time.Now()
	r := c.ichor(t, 10*time.Minute, append([]string{"upgrade", upgrade, "--to", to, "--yes"}, args...)...)
	r.requireExit(t, 0)
	t.Logf("upgraded %s of %d control plane(s), 0 workers, to %s through the Job in %s", upgrade, cps, to, time.Since(start).Round(time.Millisecond))

	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	assert.Contains(t, r.stdout, note, "the plan says how the runner runs")

	if cps > 1 {
		assert.NotContains(t, r.stdout, singleNodeNote)
	}

	op, _ := c.statusDocument(t)
	assert.Equal(t, api.PhaseSucceeded, op.Status.Phase)

	eventually(t, time.Minute, "the Job Complete", func(context.Context) error {
		jobs := operationJobs(t, c, op.Spec.ID)
		if len(jobs) != 1 || jobs[0].Status.Succeeded != 1 {
			return fmt.Errorf("jobs %d", len(jobs))
		}

		return nil
	})

	requireNothingCordoned(t, c)

	nodes, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, nodes.Items, cps)

	for _, n := range nodes.Items {
		switch upgrade {
		case "kubernetes":
			assert.Equal(t, to, n.Status.NodeInfo.KubeletVersion, n.Name)
		case "talos":
			assert.True(t, strings.Contains(n.Status.NodeInfo.OSImage, to), "%s runs %q", n.Name, n.Status.NodeInfo.OSImage)
		}
	}
}

const (
	singleNodeNote    = "single node cp-1: the runner stays on it through its own drain and reboot"
	controlPlanesNote = "3 nodes can host the Job (cp-1, cp-2, cp-3): the runner stays on its node through a kubelet restart and moves off it before a reboot"
)

func TestSingleNodeKubernetesUpgrade(t *testing.T) {
	t.Parallel()
	upgradeSmallCluster(t, 1, "kubernetes", "v1.36.3", singleNodeNote)
}

func TestSingleNodeTalosUpgrade(t *testing.T) {
	t.Parallel()
	// One etcd member: its reboot is an outage of the API, accepted.
	upgradeSmallCluster(t, 1, "talos", "v1.14.1", singleNodeNote, "--allow-etcd-outage")
}

func TestControlPlanesOnlyKubernetesUpgrade(t *testing.T) {
	t.Parallel()
	upgradeSmallCluster(t, 3, "kubernetes", "v1.36.3", controlPlanesNote)
}

func TestControlPlanesOnlyTalosUpgrade(t *testing.T) {
	t.Parallel()
	upgradeSmallCluster(t, 3, "talos", "v1.14.1", controlPlanesNote)
}
