package releases_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
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

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/releases"
)

// serve starts a real OCI registry (go-containerregistry's pkg/registry) in-process and
// returns its host:port; wrap, when set, stands before it.
func serve(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()

	// Hermetic: no docker config of the machine is read for credentials.
	t.Setenv("DOCKER_CONFIG", t.TempDir())

	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}

	s := httptest.NewServer(h)
	t.Cleanup(s.Close)

	return strings.TrimPrefix(s.URL, "http://")
}

// push tags one small random image as repo:tag for each tag.
func push(t *testing.T, repo string, tags ...string) {
	t.Helper()

	img, err := random.Image(64, 1)
	require.NoError(t, err)

	for _, tag := range tags {
		ref, err := name.NewTag(repo + ":" + tag)
		require.NoError(t, err)
		require.NoError(t, remote.Write(ref, img))
	}
}

var v = compat.MustParseVersion

func TestRegistryNewestPatch(t *testing.T) {
	host := serve(t, nil)

	// The mirror: the control-plane images copied up to v1.35.4, the kubelet only to
	// v1.35.3; a pre-release and another minor's tags besides.
	cp := []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"}
	for _, c := range cp {
		push(t, host+"/mirror/"+c, "v1.34.7", "v1.35.1", "v1.35.3", "v1.35.4", "v1.35.10-rc.0", "v1.36.0", "latest")
	}

	push(t, host+"/mirror/kubelet", "v1.35.1", "v1.35.3", "v1.36.0")

	repos := func(names ...string) []string {
		out := make([]string, 0, len(names))
		for _, n := range names {
			out = append(out, host+"/mirror/"+n)
		}

		return out
	}

	t.Run("the newest patch every repository carries", func(t *testing.T) {
		got, err := releases.Registry{Repositories: repos(append(cp, "kubelet")...)}.NewestPatch(context.Background(), v("v1.35.0"))
		require.NoError(t, err)
		assert.Equal(t, "v1.35.3", got.Version.String())
		assert.Equal(t, api.SourceRegistry, got.Source)
		assert.Contains(t, got.Detail, "newest 1.35 patch tagged in each of "+host+"/mirror/kube-apiserver")
		assert.Contains(t, got.Detail, host+"/mirror/kubelet")
	})

	t.Run("a -rc tag is not a release", func(t *testing.T) {
		got, err := releases.Registry{Repositories: repos("kube-apiserver")}.NewestPatch(context.Background(), v("v1.35.0"))
		require.NoError(t, err)
		assert.Equal(t, "v1.35.4", got.Version.String())
	})

	t.Run("a repository without the minor refuses, naming it", func(t *testing.T) {
		_, err := releases.Registry{Repositories: repos("kube-apiserver", "kubelet")}.NewestPatch(context.Background(), v("v1.34.0"))
		require.EqualError(t, err, fmt.Sprintf("no v1.34.<patch> tag in %s/mirror/kubelet", host))
	})

	t.Run("a repository the mirror does not have refuses", func(t *testing.T) {
		_, err := releases.Registry{Repositories: repos("kube-apiserver", "etcd")}.NewestPatch(context.Background(), v("v1.35.0"))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "list the tags of "+host+"/mirror/etcd: ")
		assert.NotContains(t, err.Error(), "\n")
	})

	t.Run("no repository", func(t *testing.T) {
		_, err := releases.Registry{}.NewestPatch(context.Background(), v("v1.35.0"))
		require.ErrorContains(t, err, "no repository to look v1.35.<patch> up in")
	})
}

// TestRegistryTimeout: a registry that does not answer is given up on at Timeout.
func TestRegistryTimeout(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })

	host := serve(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/tags/list") {
				select {
				case <-release:
				case <-r.Context().Done():
				}

				return
			}

			h.ServeHTTP(w, r)
		})
	})

	start := time.Now()
	_, err := releases.Registry{Repositories: []string{host + "/kube-apiserver"}, Timeout: 200 * time.Millisecond}.
		NewestPatch(context.Background(), v("v1.35.0"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "list the tags of "+host+"/kube-apiserver")
	assert.Less(t, time.Since(start), 10*time.Second)
}

// TestKubernetesRepositories: the nodes' own repositories, a mirror kept, held nodes
// apart.
func TestKubernetesRepositories(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Node("cp-2").Registry = "registry.example.com:5000/mirror"
	c.Node("worker-2").Registry = "held.example.com"
	c.Node("worker-2").Hold = discoverytest.Ptr("")

	assert.Equal(t, []string{
		"ghcr.io/siderolabs/kubelet",
		"registry.example.com:5000/mirror/kube-apiserver",
		"registry.example.com:5000/mirror/kube-controller-manager",
		"registry.example.com:5000/mirror/kube-proxy",
		"registry.example.com:5000/mirror/kube-scheduler",
		"registry.k8s.io/kube-apiserver",
		"registry.k8s.io/kube-controller-manager",
		"registry.k8s.io/kube-proxy",
		"registry.k8s.io/kube-scheduler",
	}, releases.KubernetesRepositories(c.Snapshot(t)))
}

// TestRegistryInThePlanner: the planner's intermediate minors found in the mirror.
func TestRegistryInThePlanner(t *testing.T) {
	host := serve(t, nil)

	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet"} {
		push(t, host+"/mirror/"+c, "v1.35.2", "v1.35.6", "v1.36.3")
	}

	c := discoverytest.ThreePlusTwo()
	for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
		c.Node(n).Talos, c.Node(n).Kubernetes, c.Node(n).Registry = "v1.14.1", "v1.34.2", host+"/mirror"
	}

	snap := c.Snapshot(t)
	repos := releases.KubernetesRepositories(snap)
	// The fixture's kubelet image is Talos' own; the test's mirror serves it too.
	for i, r := range repos {
		if r == "ghcr.io/siderolabs/kubelet" {
			repos[i] = host + "/mirror/kubelet"
		}
	}

	target := v("v1.36.3")

	path, err := compat.Planner{Kubernetes: releases.Registry{Repositories: repos}}.Plan(context.Background(), compat.Request{
		Nodes: compat.FromSnapshot(snap), Targets: compat.Targets{Kubernetes: &target},
	})
	require.NoError(t, err)
	require.Len(t, path.Hops, 2)
	assert.Equal(t, "v1.35.6", path.Hops[0].To.String())
	assert.Equal(t, api.SourceRegistry, path.Hops[0].Source)
	assert.Contains(t, path.Hops[0].SourceDetail, host+"/mirror/kube-apiserver")
	assert.NotContains(t, path.Hops[0].SourceDetail, "registry.k8s.io")
}
