//go:build e2e

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// TestPathPlan drives `kubectl ichor plan cluster` against a 3+2 cluster on Talos
// v1.12.4 with Kubernetes v1.33.4 whose images are on the cluster's own mirror (a
// private registry that holds the releases below and nothing else): the path to Talos
// v1.14.1 and Kubernetes v1.37.2 takes the intermediate patches the mirror holds, one
// given by --via, and refuses a minor the mirror lacks.
func TestPathPlan(t *testing.T) {
	t.Parallel()

	faultsFile := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faultsFile, nil, 0o644))

	c := startCluster(t, "--control-planes", "3", "--workers", "2", "--kubernetes", "v1.33.4", "--talos", "v1.12.4",
		"--faults", faultsFile, "--mirror", "v1.34.3,v1.34.5,v1.35.4,v1.35.6,v1.36.1,v1.36.3,v1.37.2")
	mirror := c.Info.Mirror
	require.NotEmpty(t, mirror)
	// The operator's machine trusts the mirror's CA.
	trust := []string{"SSL_CERT_FILE=" + filepath.Join(c.Dir, cluster.MirrorCAFile)}

	args := []string{"plan", "cluster", "--talos", "v1.14.1", "--kubernetes", "v1.37.2", "--via", "v1.35.4"}
	want := []string{
		"talos v1.12.4 -> v1.14.1 (target)",
		"kubernetes v1.33.4 -> v1.34.5 (registry)",
		"kubernetes v1.34.5 -> v1.35.4 (via)",
		"kubernetes v1.35.4 -> v1.36.3 (registry)",
		"kubernetes v1.36.3 -> v1.37.2 (target)",
	}

	t.Run("text", func(t *testing.T) {
		r := c.pluginEnv(t, trust, args...)
		r.requireExit(t, 0)
		t.Logf("%s", r.stdout)
		require.Contains(t, r.stdout, "Path, 5 hops in this order, each legal when it starts:")
		require.Contains(t, r.stdout, "1/5  talos       v1.12.4 -> v1.14.1  (target)")
		require.Contains(t, r.stdout, "2/5  kubernetes  v1.33.4 -> v1.34.5  (registry: newest 1.34 patch tagged in each of "+mirror+"/kube-apiserver")
		require.Contains(t, r.stdout, "3/5  kubernetes  v1.34.5 -> v1.35.4  (via)")
		require.Contains(t, r.stdout, "4/5  kubernetes  v1.35.4 -> v1.36.3  (registry: ")
		require.Contains(t, r.stdout, "5/5  kubernetes  v1.36.3 -> v1.37.2  (target)")
		require.Contains(t, r.stdout, "Hop 1/5, talos v1.14.1, planned from the cluster as it is:")
		require.Contains(t, r.stdout, "Hops 2-5: their stages and checks are planned when each starts")
	})

	t.Run("json", func(t *testing.T) {
		r := c.pluginEnv(t, trust, append(args, "-o", "json")...)
		r.requireExit(t, 0)
		var doc api.UpgradePath
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
		require.Equal(t, api.KindUpgradePath, doc.Kind)
		require.True(t, doc.Runnable)
		var got []string
		for _, h := range doc.Hops {
			got = append(got, h.Upgrade+" "+strings.Join(h.From, ",")+" -> "+h.To+" ("+h.Source+")")
		}
		require.Equal(t, want, got)
		require.Contains(t, doc.Hops[1].SourceDetail, mirror+"/siderolabs/kubelet", "the nodes' own repositories are asked")
		require.NotContains(t, doc.Hops[1].SourceDetail, "registry.k8s.io")
		require.NotNil(t, doc.Hops[0].Plan)
		require.Equal(t, api.UpgradeTalos, doc.Hops[0].Plan.Upgrade)
	})

	t.Run("a minor the mirror lacks is refused", func(t *testing.T) {
		// The mirror loses its 1.36 kube-apiserver images: pulls and its tags list alike.
		require.NoError(t, os.WriteFile(faultsFile,
			[]byte("unpublished: ["+mirror+"/kube-apiserver:v1.36.1, "+mirror+"/kube-apiserver:v1.36.3]\n"), 0o644))
		r := c.pluginEnv(t, trust, args...)
		r.requireExit(t, 2)
		r.requireOneLineError(t, "path refused: Kubernetes 1.36: no v1.36.<patch> tag in "+mirror+"/kube-apiserver: pass the Kubernetes release to go through with --via v1.36.<patch>")
	})
}
