package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPullOnlyKubernetes: PullOnly pulls every image each stage would change on the
// nodes that take it, even at a target more than one minor ahead (a later hop of a
// path), and changes nothing; an image that does not pull pauses, naming the node, and
// still nothing was changed.
func TestPullOnlyKubernetes(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 2, kubernetes: "v1.35.4"})

	require.NoError(t, f.engine("v1.37.2", func(o *Options) { o.PullOnly = true }).Run(context.Background()))

	assert.Empty(t, f.realApplies(), "nothing applied")
	assert.Empty(t, f.cordonedByIchor(), "nothing cordoned")

	images := map[string]int{}
	for _, p := range f.pulls {
		fields := strings.Fields(p)
		images[fields[2]]++
	}

	assert.Equal(t, map[string]int{
		"registry.k8s.io/kube-apiserver:v1.37.2":          3,
		"registry.k8s.io/kube-controller-manager:v1.37.2": 3,
		"registry.k8s.io/kube-scheduler:v1.37.2":          3,
		"registry.k8s.io/kube-proxy:v1.37.2":              5,
		"ghcr.io/siderolabs/kubelet:v1.37.2":              5,
	}, images, "each stage's images on the nodes that run them")

	f.machine("worker-2").faults.pullFails = true

	err := f.engine("v1.37.2", func(o *Options) { o.PullOnly = true }).Run(context.Background())
	_ = pauseOf(t, err, "KubeProxy", "", "pre-pull: ", `worker-2`, "kube-proxy:v1.37.2")
	assert.Empty(t, f.realApplies(), "still nothing applied")
}

// TestPullOnlyTalos: PullOnly pulls each node's installer for the target and upgrades,
// cordons and reboots nothing.
func TestPullOnlyTalos(t *testing.T) {
	o := newFakeOS(t, talosSpec())

	require.NoError(t, o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.PullOnly = true }).Run(context.Background()))

	assert.Empty(t, o.upgradeNodes(), "no upgrade")
	assert.Empty(t, o.rebootNodes(), "no reboot")
	assert.Empty(t, o.f.cordonedByIchor(), "nothing cordoned")

	o.f.mu.Lock()
	pulls := append([]string(nil), o.f.pulls...)
	o.f.mu.Unlock()

	require.Len(t, pulls, 5, "one installer per node")

	for _, p := range pulls {
		node := strings.Fields(p)[0]
		assert.Equal(t, node+" system "+installerOf(t, o, node, "v1.13.9"), p)
	}
}
