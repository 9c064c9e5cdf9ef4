package engine

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEngineNodeReads counts the engine's Node requests through a whole Kubernetes
// upgrade: a Node is read from the run's watch, but for the fresh reads of each drained
// node's cordon (before its cordon, as this fake's Nodes carry no resourceVersion to
// write on the condition of, and before its restart once drained: pkg/kube's tests
// count the cordon on a watch with versions); the Nodes are listed only where what the
// cluster runs is read fresh (a stage's start, an apply's check) and once for the watch.
func TestEngineNodeReads(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 4, kubernetes: "v1.36.1", workloads: 2})
	f.cs.ClearActions()

	require.NoError(t, f.engine("v1.36.3", func(o *Options) { o.MaxUnavailable = 2 }).Run(context.Background()))

	verbs := map[string]int{}

	for _, a := range f.cs.Actions() {
		if a.GetResource().Resource == "nodes" && a.GetSubresource() == "" {
			verbs[a.GetVerb()]++
		}
	}

	drained := 3 + 4
	assert.Equal(t, 2*drained, verbs["get"], "Node GETs: the cordon's fresh reads only")
	assert.Equal(t, 2*drained, verbs["patch"], "a cordon and an uncordon per drained node")
	assert.Equal(t, 1, verbs["watch"], "one watch of the Nodes")

	// The watch's LIST, a Discover and an invariant check per stage, one per apply
	// (3 control planes in each of 4 stages, 4 workers) and the kube-proxy rollout's:
	// no LIST for the run's last looks (held nodes, nodes left behind).
	applies := len(f.realApplies())
	assert.Equal(t, 1+4+4+applies+1, verbs["list"], "Node LISTs")
}
