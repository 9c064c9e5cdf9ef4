package compat_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata, then fail so a re-record cannot pass silently")

// golden compares got with testdata/name; with -update it writes the file and fails.
func golden(t *testing.T, name, got string) {
	t.Helper()

	path := filepath.Join("testdata", name)

	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		t.Fatalf("updated %s: check the diff and run again without -update", path)
	}

	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file: run go test ./pkg/compat -run %s -update", t.Name())
	assert.Equal(t, string(want), got)
}

// fakeResolver serves releases by minor ("1.35" -> "v1.35.9"), as a registry would.
type fakeResolver struct {
	releases map[string]string
	err      error
	asked    []string
}

func (f *fakeResolver) NewestPatch(_ context.Context, m compat.Version) (compat.Resolved, error) {
	f.asked = append(f.asked, m.MinorString())

	if f.err != nil {
		return compat.Resolved{}, f.err
	}

	r, ok := f.releases[m.MinorString()]
	if !ok {
		return compat.Resolved{}, fmt.Errorf("no v%s.<patch> tag in registry.k8s.io/kube-apiserver", m.MinorString())
	}

	return compat.Resolved{
		Version: v(r), Source: api.SourceRegistry,
		Detail: fmt.Sprintf("newest %s patch tagged in registry.k8s.io/kube-apiserver and 4 more repositories", m.MinorString()),
	}, nil
}

// kubernetesReleases and talosReleases are what the fake registries serve.
func kubernetesReleases() *fakeResolver {
	return &fakeResolver{releases: map[string]string{
		"1.31": "v1.31.14", "1.32": "v1.32.11", "1.33": "v1.33.8", "1.34": "v1.34.5", "1.35": "v1.35.4", "1.36": "v1.36.3",
	}}
}

func talosReleases() *fakeResolver {
	return &fakeResolver{releases: map[string]string{"1.11": "v1.11.6", "1.12": "v1.12.6", "1.13": "v1.13.9"}}
}

// cluster is the 3+2 fixture on one Talos and one Kubernetes version.
func cluster(talos, kubernetes string) *discoverytest.Cluster {
	c := discoverytest.ThreePlusTwo()
	for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
		c.Node(n).Talos, c.Node(n).Kubernetes = talos, kubernetes
	}

	return c
}

func ptr(s string) *compat.Version {
	if s == "" {
		return nil
	}

	x := v(s)

	return &x
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name               string
		cluster            *discoverytest.Cluster
		talos, kubernetes  string
		via                []string
		noResolvers        bool
		kubernetesRegistry *fakeResolver
		want               []string
		// refused is a part of the refusal's reason; action a part of its action.
		refused, action string
	}{
		// Kubernetes only
		{
			name: "kubernetes one minor", cluster: cluster("v1.13.9", "v1.35.4"), kubernetes: "v1.36.3",
			want: []string{"kubernetes v1.35.4 -> v1.36.3 (target)"},
		},
		{
			name: "kubernetes a patch", cluster: cluster("v1.13.9", "v1.35.4"), kubernetes: "v1.35.6",
			want: []string{"kubernetes v1.35.4 -> v1.35.6 (target)"},
		},
		{
			name: "kubernetes minor by minor, the patches from the registry", cluster: cluster("v1.14.1", "v1.34.2"), kubernetes: "v1.37.2",
			want: []string{
				"kubernetes v1.34.2 -> v1.35.4 (registry)",
				"kubernetes v1.35.4 -> v1.36.3 (registry)",
				"kubernetes v1.36.3 -> v1.37.2 (target)",
			},
		},
		{
			name: "kubernetes minor by minor, the patches from --via", cluster: cluster("v1.14.1", "v1.34.2"), kubernetes: "v1.37.2",
			via: []string{"v1.35.1", "v1.36.2"},
			want: []string{
				"kubernetes v1.34.2 -> v1.35.1 (via)",
				"kubernetes v1.35.1 -> v1.36.2 (via)",
				"kubernetes v1.36.2 -> v1.37.2 (target)",
			},
		},
		{
			name: "kubernetes: a registry without the minor and no --via refuses", cluster: cluster("v1.14.1", "v1.34.2"), kubernetes: "v1.36.3",
			kubernetesRegistry: &fakeResolver{releases: map[string]string{}},
			refused:            "Kubernetes 1.35: no v1.35.<patch> tag in registry.k8s.io/kube-apiserver",
			action:             "pass the Kubernetes release to go through with --via v1.35.<patch>",
		},
		{
			name: "kubernetes: nothing to look a patch up with and no --via refuses", cluster: cluster("v1.14.1", "v1.34.2"), kubernetes: "v1.36.3",
			noResolvers: true,
			refused:     "Kubernetes 1.35: no release of that minor named, and none to look one up", action: "--via v1.35.<patch>",
		},
		// Talos only
		{
			name: "talos direct along the upgrade table", cluster: cluster("v1.12.5", "v1.33.4"), talos: "v1.14.1",
			want: []string{"talos v1.12.5 -> v1.14.1 (target)"},
		},
		{
			name: "talos through an intermediate minor the upgrade table needs", cluster: cluster("v1.11.6", "v1.33.4"), talos: "v1.14.1",
			want: []string{"talos v1.11.6 -> v1.13.9 (registry)", "talos v1.13.9 -> v1.14.1 (target)"},
		},
		{
			name: "talos intermediate from --via", cluster: cluster("v1.11.6", "v1.33.4"), talos: "v1.14.1", via: []string{"v1.12.6"},
			want: []string{"talos v1.11.6 -> v1.12.6 (via)", "talos v1.12.6 -> v1.14.1 (target)"},
		},
		// both
		{
			name: "both: Talos first, then Kubernetes minor by minor", cluster: cluster("v1.12.5", "v1.33.4"), talos: "v1.14.1", kubernetes: "v1.37.2",
			want: []string{
				"talos v1.12.5 -> v1.14.1 (target)",
				"kubernetes v1.33.4 -> v1.34.5 (registry)",
				"kubernetes v1.34.5 -> v1.35.4 (registry)",
				"kubernetes v1.35.4 -> v1.36.3 (registry)",
				"kubernetes v1.36.3 -> v1.37.2 (target)",
			},
		},
		{
			name: "both: Kubernetes into the range the next Talos supports first", cluster: cluster("v1.12.5", "v1.30.9"), talos: "v1.14.1", kubernetes: "v1.36.3",
			want: []string{
				"kubernetes v1.30.9 -> v1.31.14 (registry)",
				"kubernetes v1.31.14 -> v1.32.11 (registry)",
				"talos v1.12.5 -> v1.14.1 (target)",
				"kubernetes v1.32.11 -> v1.33.8 (registry)",
				"kubernetes v1.33.8 -> v1.34.5 (registry)",
				"kubernetes v1.34.5 -> v1.35.4 (registry)",
				"kubernetes v1.35.4 -> v1.36.3 (target)",
			},
		},
		// already there
		{name: "already there", cluster: cluster("v1.14.1", "v1.37.2"), talos: "v1.14.1", kubernetes: "v1.37.2", want: []string{}},
		{name: "already there, Kubernetes only", cluster: cluster("v1.13.9", "v1.35.4"), kubernetes: "v1.35.4", want: []string{}},
		// mixed node versions
		{
			name: "mixed: one Talos hop from both versions, then Kubernetes to one minor and on", talos: "v1.14.1", kubernetes: "v1.36.3",
			cluster: func() *discoverytest.Cluster {
				c := cluster("v1.13.9", "v1.35.4")
				c.Node("worker-1").Talos, c.Node("worker-2").Talos = "v1.12.5", "v1.12.5"
				c.Node("worker-2").Kubernetes = "v1.34.7"

				return c
			}(),
			want: []string{
				"talos v1.12.5, v1.13.9 -> v1.14.1 (target)",
				"kubernetes v1.34.7, v1.35.4 -> v1.35.4 (registry)",
				"kubernetes v1.35.4 -> v1.36.3 (target)",
			},
		},
		{
			name: "mixed: a node too old for the target goes through the newest minor it may", talos: "v1.14.1",
			cluster: func() *discoverytest.Cluster {
				c := cluster("v1.13.2", "v1.34.2")
				c.Node("worker-2").Talos = "v1.11.6"

				return c
			}(),
			want: []string{"talos v1.11.6, v1.13.2 -> v1.13.9 (registry)", "talos v1.13.9 -> v1.14.1 (target)"},
		},
		{
			name: "mixed: a release found older than what a node runs refuses", kubernetes: "v1.36.3",
			kubernetesRegistry: &fakeResolver{releases: map[string]string{"1.35": "v1.35.2"}},
			cluster: func() *discoverytest.Cluster {
				c := cluster("v1.14.1", "v1.35.4")
				c.Node("worker-2").Kubernetes = "v1.34.7"

				return c
			}(),
			refused: "hop 1, Kubernetes v1.35.2 (registry): v1.35.2 is older than the running v1.35.4: downgrades are not supported",
			action:  "--via v1.35.<patch>",
		},
		{
			name: "held nodes are left where they are", talos: "v1.14.1", kubernetes: "v1.36.3",
			cluster: func() *discoverytest.Cluster {
				c := cluster("v1.13.9", "v1.35.4")
				c.Node("worker-2").Talos, c.Node("worker-2").Kubernetes = "v1.10.3", "v1.29.1"
				c.Node("worker-2").Hold = discoverytest.Ptr("RMA")

				return c
			}(),
			want: []string{"talos v1.13.9 -> v1.14.1 (target)", "kubernetes v1.35.4 -> v1.36.3 (target)"},
		},
		// impossible targets
		{
			name: "kubernetes downgrade", cluster: cluster("v1.13.9", "v1.35.4"), kubernetes: "v1.35.1",
			refused: "Kubernetes target v1.35.1 is older than kubelet v1.35.4 on cp-1", action: "at or above what every node runs",
		},
		{
			name: "talos downgrade", cluster: cluster("v1.13.9", "v1.35.4"), talos: "v1.13.2",
			refused: "Talos target v1.13.2 is older than v1.13.9 on cp-1, cp-2, cp-3, worker-1, worker-2: downgrades are not supported",
		},
		{
			name: "talos newer than this build knows", cluster: cluster("v1.13.9", "v1.35.4"), talos: "v1.15.0",
			refused: "Talos target: Talos 1.15 is newer than this build knows (Talos up to 1.14)", action: "upgrade kubectl-ichor",
		},
		{
			name: "kubernetes no Talos this build knows supports", cluster: cluster("v1.14.1", "v1.37.2"), kubernetes: "v1.38.0",
			refused: "no Talos release this build knows supports Kubernetes v1.38.0 (Talos 1.14 supports up to 1.37)", action: "upgrade kubectl-ichor",
		},
		{
			name: "targets that do not go together", cluster: cluster("v1.13.9", "v1.35.4"), talos: "v1.13.9", kubernetes: "v1.37.2",
			refused: "the targets do not go together: Talos v1.13.9 supports Kubernetes 1.31-1.36, not v1.37.2",
			action:  "Kubernetes v1.37.2 needs Talos 1.14 or newer: choose a Talos target of it (v1.14.1)",
		},
		{
			name: "kubernetes that needs another Talos, with no Talos target", cluster: cluster("v1.13.9", "v1.36.3"), kubernetes: "v1.37.2",
			refused: "no Talos target, and the nodes' Talos does not support Kubernetes v1.37.2: Talos v1.13.9 supports Kubernetes 1.31-1.36, not v1.37.2",
			action:  "add a Talos target: Kubernetes v1.37.2 needs Talos 1.14 or newer (v1.14.1)",
		},
		{
			name: "talos that does not support the Kubernetes kept, with no Kubernetes target", cluster: cluster("v1.12.5", "v1.31.4"), talos: "v1.14.1",
			refused: "no Kubernetes target, and Talos v1.14.1 supports Kubernetes 1.32-1.37: Kubernetes v1.31.4 (kubelet on cp-1) is outside 1.32-1.37",
			action:  "add a Kubernetes target in 1.32-1.37",
		},
		{
			name: "no legal sequence", cluster: cluster("v1.9.5", "v1.35.0"), talos: "v1.14.1",
			refused: "no legal sequence of hops reaches Talos v1.14.1: from here no hop is legal: " +
				"Talos v1.14.1: host version 1.9.5 is too old to upgrade to Talos 1.14.1; " +
				"Talos 1.13: host version 1.9.5 is too old to upgrade to Talos 1.13.0; " +
				"Talos 1.12: host version 1.9.5 is too old to upgrade to Talos 1.12.0; and 3 more",
		},
		{
			name: "no legal sequence: Kubernetes minors more than one apart", kubernetes: "v1.36.3",
			cluster: func() *discoverytest.Cluster {
				c := cluster("v1.14.1", "v1.35.4")
				c.Node("worker-2").Kubernetes = "v1.33.2"

				return c
			}(),
			refused: "no legal sequence of hops reaches Kubernetes v1.36.3: from here no hop is legal: " +
				"Kubernetes: v1.33.2, v1.35.4 are more than one minor apart, and no one hop moves them all",
		},
		{
			name: "no legal sequence: an intermediate minor the nodes' Talos does not support", cluster: cluster("v1.14.1", "v1.30.9"), kubernetes: "v1.32.11",
			refused: "no legal sequence of hops reaches Kubernetes v1.32.11: from here no hop is legal: " +
				"Kubernetes 1.31: Talos v1.14.1 supports Kubernetes 1.32-1.37, not v1.31.0",
		},
		{
			name: "a pre-release Talos is refused", cluster: cluster("v1.13.0-beta.1", "v1.35.4"), kubernetes: "v1.36.3",
			refused: `node "cp-1": Talos version: malformed version "v1.13.0-beta.1"`,
		},
		{
			name: "a Kubernetes version that cannot be read is refused", kubernetes: "v1.36.3",
			cluster: func() *discoverytest.Cluster {
				c := cluster("v1.13.9", "v1.35.4")
				c.Node("cp-2").Versions = map[discovery.Component]string{discovery.KubeProxy: "v1.35.4-eks"}

				return c
			}(),
			refused: `node "cp-2": kube-proxy: malformed version "v1.35.4-eks"`,
		},
		{name: "no target", cluster: cluster("v1.13.9", "v1.35.4"), refused: "no target"},
		// --via
		{
			name: "a --via the path does not go through", cluster: cluster("v1.14.1", "v1.35.4"), kubernetes: "v1.36.3", via: []string{"v1.20.1"},
			refused: "--via v1.20.1: the path does not go through that minor (it goes Kubernetes v1.36.3)",
		},
		{
			name: "two --via of one minor", cluster: cluster("v1.14.1", "v1.34.4"), kubernetes: "v1.36.3", via: []string{"v1.35.1", "v1.35.4"},
			refused: "--via v1.35.1 and v1.35.4 name the same minor 1.35",
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := compat.FromSnapshot(tt.cluster.Snapshot(t))
			req := compat.Request{Nodes: nodes, Targets: compat.Targets{Talos: ptr(tt.talos), Kubernetes: ptr(tt.kubernetes)}}

			for _, s := range tt.via {
				req.Via = append(req.Via, v(s))
			}

			var planner compat.Planner
			if !tt.noResolvers {
				planner.Kubernetes, planner.Talos = kubernetesReleases(), talosReleases()
				if tt.kubernetesRegistry != nil {
					planner.Kubernetes = tt.kubernetesRegistry
				}
			}

			path, err := planner.Plan(context.Background(), req)

			if tt.refused != "" {
				var refusal *compat.Refusal
				require.ErrorAs(t, err, &refusal)
				assert.Contains(t, refusal.Reason, tt.refused)
				assert.NotContains(t, refusal.Reason, "\n")
				assert.NotEmpty(t, refusal.Action)
				assert.Contains(t, refusal.Action, tt.action)

				doc := compat.Document(req, nil, err)
				assert.False(t, doc.Runnable)
				assert.Equal(t, []api.Check{{Name: compat.PathCheck, Result: api.ResultRefused, Detail: refusal.Reason, Action: refusal.Action}}, doc.Checks)

				return
			}

			require.NoError(t, err)

			got := []string{}
			for _, h := range path.Hops {
				got = append(got, fmt.Sprintf("%s %s -> %s (%s)", h.Kind, joinVersions(h.From), h.To, h.Source))
				assert.NotEmpty(t, h.Reason)
				assert.NotContains(t, h.Reason, "\n")
			}

			assert.Equal(t, tt.want, got)
			assertEveryHopLegal(t, nodes, path)

			doc := compat.Document(req, path, nil)
			assert.True(t, doc.Runnable)
			assert.Len(t, doc.Hops, len(path.Hops))
		})
	}
}

// assertEveryHopLegal runs the path over the nodes and judges each hop at its start
// with the cluster rules the plan's checks and the engine ask: the planner's own
// judgement is not trusted.
func assertEveryHopLegal(t *testing.T, nodes []compat.Node, path *compat.Path) {
	t.Helper()

	nodes = cloneNodes(nodes)

	for i, h := range path.Hops {
		var verdicts []compat.Verdict

		if h.Kind == api.UpgradeTalos {
			verdicts = []compat.Verdict{compat.TalosUpgradeable(nodes, h.To), compat.TalosSupports(nodes, h.To)}
		} else {
			verdicts = []compat.Verdict{compat.KubernetesStep(nodes, h.To), compat.KubernetesSupported(nodes, h.To)}
		}

		for _, verdict := range verdicts {
			assert.True(t, verdict.Allowed, "hop %d (%s %s): %s", i+1, h.Kind, h.To, verdict.Detail)
		}

		for n := range nodes {
			if nodes[n].Held {
				continue
			}

			if h.Kind == api.UpgradeTalos {
				nodes[n].Talos = h.To.String()

				continue
			}

			for c := range nodes[n].Kubernetes {
				nodes[n].Kubernetes[c].Version = h.To.String()
			}
		}
	}
}

func cloneNodes(nodes []compat.Node) []compat.Node {
	out := make([]compat.Node, len(nodes))
	for i, n := range nodes {
		out[i] = n
		out[i].Kubernetes = append([]compat.Component(nil), n.Kubernetes...)
	}

	return out
}

func joinVersions(vs []compat.Version) string {
	s := ""
	for i, x := range vs {
		if i > 0 {
			s += ", "
		}

		s += x.String()
	}

	return s
}

// TestPlanAsksOnlyForTheMinorsOnThePath: the registry is asked for the path's
// intermediate minors, each once, and nothing else.
func TestPlanAsksOnlyForTheMinorsOnThePath(t *testing.T) {
	k8s, talos := kubernetesReleases(), talosReleases()
	nodes := compat.FromSnapshot(cluster("v1.11.6", "v1.33.4").Snapshot(t))

	_, err := compat.Planner{Kubernetes: k8s, Talos: talos}.Plan(context.Background(), compat.Request{
		Nodes: nodes, Targets: compat.Targets{Talos: ptr("v1.14.1"), Kubernetes: ptr("v1.36.3")}, Via: []compat.Version{v("v1.35.1")},
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"1.34"}, k8s.asked)
	assert.Equal(t, []string{"1.13"}, talos.asked)
}

// TestPlanStopsWithTheContext: a lookup cut short by the context is the context's error,
// not a refusal of the path.
func TestPlanStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	nodes := compat.FromSnapshot(cluster("v1.14.1", "v1.34.2").Snapshot(t))

	_, err := compat.Planner{Kubernetes: &fakeResolver{err: context.Canceled}}.Plan(ctx, compat.Request{
		Nodes: nodes, Targets: compat.Targets{Kubernetes: ptr("v1.36.3")},
	})
	require.ErrorIs(t, err, context.Canceled)

	var refusal *compat.Refusal
	assert.False(t, errors.As(err, &refusal))
}

// TestPathDocument pins the -o json document of a path found (the operator's example:
// Talos 1.12 with Kubernetes 1.33 to Talos 1.14.1 with Kubernetes 1.37.2, a --via for
// one minor, the registry for the others, a held node) and of a path refused.
func TestPathDocument(t *testing.T) {
	tests := []struct {
		name, golden      string
		cluster           *discoverytest.Cluster
		talos, kubernetes string
		via               []string
	}{
		{
			name: "found", golden: "path-found-json.golden", talos: "v1.14.1", kubernetes: "v1.37.2", via: []string{"v1.35.6"},
			cluster: func() *discoverytest.Cluster {
				c := cluster("v1.12.5", "v1.33.4")
				c.Node("worker-1").Talos = "v1.12.3"
				c.Node("worker-2").Hold = discoverytest.Ptr("RMA ticket 4411")

				return c
			}(),
		},
		{
			name: "refused", golden: "path-refused-json.golden", cluster: cluster("v1.9.5", "v1.35.0"), talos: "v1.14.1",
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := compat.Request{
				Nodes:   compat.FromSnapshot(tt.cluster.Snapshot(t)),
				Targets: compat.Targets{Talos: ptr(tt.talos), Kubernetes: ptr(tt.kubernetes)},
			}

			for _, s := range tt.via {
				req.Via = append(req.Via, v(s))
			}

			path, err := compat.Planner{Kubernetes: kubernetesReleases(), Talos: talosReleases()}.Plan(context.Background(), req)

			b, merr := json.MarshalIndent(compat.Document(req, path, err), "", "  ")
			require.NoError(t, merr)
			golden(t, tt.golden, string(b)+"\n")
		})
	}
}
