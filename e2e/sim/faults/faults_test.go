package faults

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		doc     string
		want    Node
		wantErr string
	}{
		{name: "every fault", doc: `
nodes:
  cp-2:
    applyBlocks: true
    neverReady: [kube-scheduler]
    stayNotReady: true
    pullFails: true
    unreachableAfterApply: 20s
    unreachable: true
    abFallback: true
    neverBoots: true
    poweredOff: true
    installTakes: 20s
    logSlow: 30s
    etcdStalled: true
    etcdStatusLatency: 2s
`, want: Node{ApplyBlocks: true, NeverReady: []string{"kube-scheduler"}, StayNotReady: true, PullFails: true,
			UnreachableAfterApply: Duration{20 * time.Second}, Unreachable: true, ABFallback: true, NeverBoots: true, PoweredOff: true,
			InstallTakes: Duration{20 * time.Second}, LogSlow: Duration{30 * time.Second}, EtcdStalled: true,
			EtcdStatusLatency: Duration{2 * time.Second}}},
		{name: "powered off", doc: "nodes:\n  cp-2:\n    poweredOff: true\n    neverReady: [kube-scheduler]\n",
			want: Node{PoweredOff: true, NeverReady: []string{"kube-scheduler"}}},
		{name: "unknown field", doc: "nodes:\n  cp-1:\n    applyBlock: true\n", wantErr: "unknown field"},
		{name: "bad duration", doc: "nodes:\n  cp-1:\n    unreachableAfterApply: soon\n", wantErr: "write it like 20s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse([]byte(tc.doc))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, f.Nodes["cp-2"])
			require.True(t, f.Nodes["cp-2"].NeverReadyComponent("kube-scheduler"))
			require.False(t, f.Nodes["cp-2"].NeverReadyComponent("kube-apiserver"))
		})
	}
}

func TestStoreFollowsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults.yaml")
	s, err := Load(path)
	require.NoError(t, err, "a file that does not exist yet is allowed")
	require.Equal(t, Node{}, s.For("cp-1"))

	require.NoError(t, os.WriteFile(path, []byte("nodes:\n  cp-1:\n    pullFails: true\n"), 0o644))
	require.True(t, s.For("cp-1").PullFails)

	require.NoError(t, os.WriteFile(path, []byte("nodes: {cp-1: {pullFails: nope}}"), 0o644))
	require.True(t, s.For("cp-1").PullFails, "a file that no longer parses keeps the last good faults")

	require.NoError(t, os.Remove(path))
	require.Equal(t, Node{}, s.For("cp-1"), "a removed file clears the faults")

	var none *Store
	require.Equal(t, Node{}, none.For("cp-1"))
}

func TestLoadRefusesABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(path, []byte("nodes: [1, 2]"), 0o644))
	_, err := Load(path)
	require.ErrorContains(t, err, path)
}

func TestUnpublishedFollowsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults.yaml")
	s, err := Load(path)
	require.NoError(t, err)
	require.Empty(t, s.Unpublished())

	doc := "unpublished:\n  - factory.talos.dev/metal-installer/abc:v1.14.1\n  - registry.k8s.io/kube-proxy\nnodes: {}\n"
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
	require.Equal(t, []string{"factory.talos.dev/metal-installer/abc:v1.14.1", "registry.k8s.io/kube-proxy"}, s.Unpublished())
	require.Equal(t, Node{}, s.For("cp-1"), "the registries' fault is nobody's node fault")

	var none *Store
	require.Empty(t, none.Unpublished())
}

func TestAPIServerDownFollowsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults.yaml")
	s, err := Load(path)
	require.NoError(t, err)
	require.False(t, s.APIServerDown())

	require.NoError(t, os.WriteFile(path, []byte("apiServerDown: true\n"), 0o644))
	require.True(t, s.APIServerDown())
	require.Equal(t, Node{}, s.For("cp-1"), "the cluster's fault is nobody's node fault")

	require.NoError(t, os.WriteFile(path, []byte("nodes: {}\n"), 0o644))
	require.False(t, s.APIServerDown(), "cleared: the apiserver starts again")

	var none *Store
	require.False(t, none.APIServerDown())
}
