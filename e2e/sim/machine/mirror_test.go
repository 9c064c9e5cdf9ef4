package machine

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
)

func TestMirrorListsWhatAPullFinds(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	file := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	fs, err := faults.Load(file)
	require.NoError(t, err)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m := &Mirror{Host: l.Addr().String(), Releases: []string{"v1.34.5", "v1.35.4", "v1.35.6"}, Faults: fs}
	require.NoError(t, m.Serve(ctx, l, nil))

	require.Equal(t, m.Host+"/kube-apiserver:v1.35.4", m.Image("registry.k8s.io/kube-apiserver:v1.35.4"))
	require.Equal(t, m.Host+"/siderolabs/kubelet:v1.35.4", m.Image("ghcr.io/siderolabs/kubelet:v1.35.4"))
	require.Equal(t, "registry.k8s.io/pause:3.10", m.Image("registry.k8s.io/pause:3.10"))

	list := func(path string) []string {
		repo, err := name.NewRepository(m.Host + "/" + path)
		require.NoError(t, err)
		tags, err := remote.List(repo, remote.WithContext(ctx))
		require.NoError(t, err)
		return tags
	}
	pull := func(ref string) error {
		r, err := parseImageRef(ref)
		require.NoError(t, err)
		return published(r, fs.Unpublished(), m)
	}

	require.Equal(t, []string{"v1.34.5", "v1.35.4", "v1.35.6"}, list("siderolabs/kubelet"))
	require.NoError(t, pull(m.Host+"/kube-proxy:v1.35.6"))
	require.EqualError(t, pull(m.Host+"/kube-proxy:v1.36.3"), (&imageNotFoundError{ref: m.Host + "/kube-proxy:v1.36.3"}).Error(),
		"a release the mirror does not hold is not found, though registry.k8s.io has it")
	require.NoError(t, pull("registry.k8s.io/kube-proxy:v1.36.3"))
	require.Error(t, pull(m.Host+"/pause:3.10"), "the mirror holds only what was copied")

	// A fault takes a tag away from pulls and from the list alike.
	require.NoError(t, os.WriteFile(file, []byte("unpublished: ["+m.Host+"/kube-apiserver:v1.35.6]\n"), 0o644))
	require.Equal(t, []string{"v1.34.5", "v1.35.4"}, list("kube-apiserver"))
	require.Error(t, pull(m.Host+"/kube-apiserver:v1.35.6"))
	require.Equal(t, []string{"v1.34.5", "v1.35.4", "v1.35.6"}, list("kube-scheduler"))
}
