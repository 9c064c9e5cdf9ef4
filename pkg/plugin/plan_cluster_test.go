package plugin

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// mirror starts a real OCI registry in-process (go-containerregistry's pkg/registry),
// tags each of the five Kubernetes repositories under host/mirror with tags, and
// points every node's images at it.
func mirror(t *testing.T, c *discoverytest.Cluster, tags ...string) string {
	t.Helper()
	t.Setenv("DOCKER_CONFIG", t.TempDir()) // hermetic: no credentials of the machine

	s := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(s.Close)

	host := strings.TrimPrefix(s.URL, "http://")

	img, err := random.Image(64, 1)
	require.NoError(t, err)

	for _, comp := range discovery.Components() {
		for _, tag := range tags {
			ref, err := name.NewTag(host + "/mirror/" + string(comp) + ":" + tag)
			require.NoError(t, err)
			require.NoError(t, remote.Write(ref, img))
		}
	}

	for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
		c.Node(n).Registry = host + "/mirror"
		c.Node(n).KubeletRepository = host + "/mirror/kubelet"
	}

	return host
}

func pathOf(t *testing.T, stdout string) api.UpgradePath {
	t.Helper()

	var doc api.UpgradePath
	require.NoError(t, json.Unmarshal([]byte(stdout), &doc), stdout)

	return doc
}

func hopsOf(doc api.UpgradePath) []string {
	var out []string
	for _, h := range doc.Hops {
		out = append(out, h.Upgrade+" "+h.To+" ("+h.Source+")")
	}

	return out
}

func TestPlanClusterPaths(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		kube     string
		tags     []string // the mirror's tags; none: no mirror
		hops     []string
		firstHop string // the first hop's plan kind
		stdout   []string
	}{
		{
			name: "kubernetes only", args: []string{"--kubernetes", "v1.36.3"},
			hops: []string{"kubernetes v1.36.3 (target)"}, firstHop: api.UpgradeKubernetes,
			stdout: []string{"1/1  kubernetes  v1.35.4 -> v1.36.3  (target)", "Stage 4/4 Kubelets", "version skew  "},
		},
		{
			name: "kubernetes through a minor found on the nodes' mirror", args: []string{"--kubernetes", "v1.36.3"}, kube: "v1.34.2",
			tags: []string{"v1.34.2", "v1.35.1", "v1.35.4", "v1.35.5-rc.0", "v1.36.3"},
			hops: []string{"kubernetes v1.35.4 (registry)", "kubernetes v1.36.3 (target)"}, firstHop: api.UpgradeKubernetes,
			stdout: []string{"1/2  kubernetes  v1.34.2 -> v1.35.4  (registry: newest 1.35 patch tagged in each of", "Hops 2-2: their stages and checks are planned when each starts"},
		},
		{
			name: "talos then kubernetes", args: []string{"--talos", "v1.14.1", "--kubernetes", "v1.37.2", "--via", "v1.36.3"},
			hops:     []string{"talos v1.14.1 (target)", "kubernetes v1.36.3 (via)", "kubernetes v1.37.2 (target)"},
			firstHop: api.UpgradeTalos,
			stdout:   []string{"1/3  talos       v1.13.9 -> v1.14.1  (target)", "2/3  kubernetes  v1.35.4 -> v1.36.3  (via)", "Hop 1/3, talos v1.14.1, planned from the cluster as it is"},
		},
		{
			name: "already there", args: []string{"--kubernetes", "v1.35.4"},
			stdout: []string{"No hop: the cluster runs the targets already.", "path   OK      the cluster runs the targets already"},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := discoverytest.ThreePlusTwo()
			if tt.kube != "" {
				for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
					c.Node(n).Kubernetes = tt.kube
				}
			}

			if tt.tags != nil {
				mirror(t, c, tt.tags...)
			}

			args := append([]string{"plan", "cluster"}, tt.args...)

			stdout, stderr, code := runWith(t, fakeDeps(c, nil), append(args, "-o", "json")...)
			require.Equal(t, ExitOK, code, stderr)

			doc := pathOf(t, stdout)
			assert.Equal(t, api.KindUpgradePath, doc.Kind)
			assert.True(t, doc.Runnable)
			assert.Equal(t, tt.hops, hopsOf(doc))

			for i, h := range doc.Hops {
				if i == 0 {
					require.NotNil(t, h.Plan, "the first hop is planned from the cluster as it is")
					assert.Equal(t, tt.firstHop, h.Plan.Upgrade)
					assert.Equal(t, h.To, h.Plan.Target)
					assert.NotEmpty(t, h.Plan.Stages)
					assert.NotEmpty(t, h.Plan.Checks)

					continue
				}

				assert.Nil(t, h.Plan, "hop %d starts from a cluster that does not exist yet", h.Number)
			}

			stdout, stderr, code = runWith(t, fakeDeps(c, nil), args...)
			require.Equal(t, ExitOK, code, stderr)

			for _, s := range tt.stdout {
				assert.Contains(t, stdout, s)
			}
		})
	}
}

func TestPlanClusterGolden(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Node("worker-2").Hold = discoverytest.Ptr("RMA ticket 4411")

	stdout, stderr, code := runWith(t, fakeDeps(c, nil), "plan", "cluster", "--talos", "v1.14.1", "--kubernetes", "v1.37.2", "--via", "v1.36.3", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	golden(t, "plan-cluster-json.golden", stdout)
}

func TestPlanClusterRefusals(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		tags   []string
		stderr string
	}{
		{
			name: "talos newer than this build knows", args: []string{"--talos", "v1.15.0"},
			stderr: "error: path refused: Talos target: ",
		},
		{
			name: "kubernetes downgrade", args: []string{"--kubernetes", "v1.34.9"},
			stderr: "error: path refused: Kubernetes target v1.34.9 is older than ",
		},
		{
			name: "kubernetes target that needs a talos target", args: []string{"--kubernetes", "v1.37.2"},
			stderr: "add a Talos target",
		},
		{
			name: "no release of an intermediate minor on the mirror", args: []string{"--talos", "v1.14.1", "--kubernetes", "v1.37.2"},
			tags:   []string{"v1.35.4", "v1.37.2"},
			stderr: "Kubernetes 1.36: no v1.36.<patch> tag in ",
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := discoverytest.ThreePlusTwo()
			if tt.tags != nil {
				mirror(t, c, tt.tags...)
			}

			args := append([]string{"plan", "cluster"}, tt.args...)

			stdout, stderr, code := runWith(t, fakeDeps(c, nil), args...)
			assert.Equal(t, ExitRefused, code)
			assert.Contains(t, stderr, tt.stderr)
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %s", stderr)
			assert.Regexp(t, `\npath +REFUSED +`, stdout)

			stdout, _, code = runWith(t, fakeDeps(c, nil), append(args, "-o", "json")...)
			assert.Equal(t, ExitRefused, code)

			doc := pathOf(t, stdout)
			assert.False(t, doc.Runnable)
			assert.Empty(t, doc.Hops)
			require.Len(t, doc.Checks, 1)
			assert.Equal(t, api.ResultRefused, doc.Checks[0].Result)
			assert.NotEmpty(t, doc.Checks[0].Action)
		})
	}
}

func TestPlanClusterFlags(t *testing.T) {
	c := discoverytest.ThreePlusTwo()

	for _, tt := range []struct {
		args   []string
		stderr string
	}{
		{args: nil, stderr: "pass --talos, --kubernetes or both"},
		{args: []string{"--kubernetes", "1.36"}, stderr: `--kubernetes "1.36": `},
		{args: []string{"--kubernetes", "v1.36.3", "--via", "v1.35"}, stderr: `--via "v1.35": `},
		{args: []string{"--kubernetes", "v1.36.3", "-o", "wide"}, stderr: `-o "wide": pass -o json or -o yaml`},
		{
			args:   []string{"--talos", "v1.14.1", "--installer-image", "ghcr.io/siderolabs/installer:v1.13.9"},
			stderr: `--installer-image "ghcr.io/siderolabs/installer:v1.13.9" is tagged v1.13.9 but --talos is v1.14.1: make them agree`,
		},
	} {
		_, stderr, code := runWith(t, fakeDeps(c, nil), append([]string{"plan", "cluster"}, tt.args...)...)
		assert.Equal(t, ExitError, code, tt.args)
		assert.Contains(t, stderr, tt.stderr)
	}
}

func TestPlanClusterYAMLIsTheSameDocument(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	args := []string{"plan", "cluster", "--talos", "v1.14.1", "--kubernetes", "v1.37.2", "--via", "v1.36.3"}

	j, stderr, code := runWith(t, fakeDeps(c, nil), append(args, "-o", "json")...)
	require.Equal(t, ExitOK, code, stderr)

	y, stderr, code := runWith(t, fakeDeps(c, nil), append(args, "-o", "yaml")...)
	require.Equal(t, ExitOK, code, stderr)

	var fromYAML api.UpgradePath
	require.NoError(t, yaml.Unmarshal([]byte(y), &fromYAML))
	assert.Equal(t, pathOf(t, j), fromYAML)
}

// TestPlanClusterEstimates: with upgrades of both kinds in the namespace's history, each
// hop is estimated at the median of its kind and the path at their sum; with none of a
// kind, the path says there is no estimate and why.
func TestPlanClusterEstimates(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	cs := c.Clientset()
	store := &job.Store{Client: cs.CoreV1(), Namespace: job.DefaultNamespace}

	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	archive := func(id, kind string, secs int) {
		start, end := metav1.NewTime(t0), metav1.NewTime(t0.Add(time.Duration(secs)*time.Second))
		op := api.NewOperation(api.OperationSpec{ID: id, Upgrade: kind, Target: "v1.0.0"})
		op.Status.Phase, op.Status.StartedAt, op.Status.FinishedAt = api.PhaseSucceeded, &start, &end
		require.NoError(t, store.Archive(context.Background(), job.Record{Operation: op}))
	}

	d := fakeDeps(c, nil)
	d.kube = func(*genericclioptions.ConfigFlags) (*kubeTarget, error) {
		return &kubeTarget{client: cs, endpoint: discoverytest.Endpoint, cluster: "lab", metrics: fakeMetrics{body: removedAPIMetrics}}, nil
	}

	args := []string{"plan", "cluster", "--talos", "v1.14.1", "--kubernetes", "v1.37.2", "--via", "v1.36.3"}

	archive("kubernetes-a", api.UpgradeKubernetes, 60)
	stdout, stderr, code := runWith(t, d, args...)
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Estimate: none for the whole path (measured in this cluster's history: kubernetes 1m0s (median of 1); "+
		"no talos upgrade in the history to measure)")

	archive("kubernetes-b", api.UpgradeKubernetes, 80)
	archive("kubernetes-c", api.UpgradeKubernetes, 100)
	archive("talos-a", api.UpgradeTalos, 300)

	stdout, stderr, code = runWith(t, d, append(args, "-o", "json")...)
	require.Equal(t, ExitOK, code, stderr)

	doc := pathOf(t, stdout)
	require.Len(t, doc.Hops, 3)

	for i, want := range []int64{300, 80, 80} {
		require.NotNil(t, doc.Hops[i].EstimateSeconds, "hop %d", i+1)
		assert.Equal(t, want, *doc.Hops[i].EstimateSeconds, "hop %d", i+1)
	}

	require.NotNil(t, doc.EstimateSeconds)
	assert.Equal(t, int64(460), *doc.EstimateSeconds)

	stdout, _, _ = runWith(t, d, args...)
	assert.Contains(t, stdout, "        estimate: about 5m00s\n")
	assert.Contains(t, stdout, "Estimate: about 7m40s for the path (measured in this cluster's history: talos 5m0s (median of 1), kubernetes 1m20s (median of 3))")
}
