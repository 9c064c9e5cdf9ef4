package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// TestEnginePrePullBounds: each node's pre-pull has its own bound and at most
// PullConcurrency nodes pull at once, so a stage takes as long as its nodes
// need and pauses only on a node that is slow, named.
func TestEnginePrePullBounds(t *testing.T) {
	t.Run("a node's pull past its bound pauses, naming the node, the image and the flag", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
		f.machine("cp-2").faults.pullDelay = 5 * time.Second

		start := time.Now()
		err := f.engine("v1.36.3", func(o *Options) { o.PullTimeout = 300 * time.Millisecond }).Run(context.Background())
		pause := pauseOf(t, err, "APIServers", "", "pre-pull: ",
			`node "cp-2": pull registry.k8s.io/kube-apiserver:v1.36.3: not done within 300ms`, "--pull-timeout")
		assert.Contains(t, pause.Action, "--pull-timeout")
		assert.Less(t, time.Since(start), 4*time.Second, "the bound cut the pull")
		assert.Empty(t, f.realApplies(), "nothing applied")
		assert.ElementsMatch(t, []string{
			"cp-1 cri registry.k8s.io/kube-apiserver:v1.36.3", "cp-3 cri registry.k8s.io/kube-apiserver:v1.36.3",
		}, f.pulls, "the other nodes pulled")
	})

	t.Run("a stage longer than one node's bound finishes when each node pulls within it", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
		for _, m := range f.machines {
			m.faults.pullDelay = 150 * time.Millisecond
		}

		rec := &recorder{}
		e := f.engine("v1.36.3", func(o *Options) {
			o.PullTimeout, o.PullConcurrency = 400*time.Millisecond, 1
			o.Concurrency = 1 // the reads' bound, the pull's own
		})
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()), "three nodes one at a time (450ms), each within its 400ms")
		assert.NotEmpty(t, rec.with("APIServers [pre-pull]", "3 node(s), 1 at a time, each within 400ms"))
		assert.Equal(t, 1, f.pullingMax)
		requireFinished(t, f, "v1.36.3")
	})

	t.Run("never more nodes pull at once than PullConcurrency", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 6, kubernetes: "v1.35.4"})
		for _, m := range f.machines {
			m.faults.pullDelay = 50 * time.Millisecond
		}

		require.NoError(t, f.engine("v1.36.3", func(o *Options) { o.PullConcurrency = 2 }).Run(context.Background()))
		assert.Equal(t, 2, f.pullingMax, "the limit, reached and never passed (7 nodes pull kube-proxy, then the kubelet)")
		requireFinished(t, f, "v1.36.3")
	})
}

// slowPuller is a Talos client whose pulls each take delay, counting the nodes
// pulling at once.
type slowPuller struct {
	TalosClient

	delay time.Duration

	mu            sync.Mutex
	pulling, most int
	pulled        int
}

func (s *slowPuller) PullImage(ctx context.Context, node string, _ talos.ImageNamespace, ref string) error {
	s.mu.Lock()
	s.pulling++
	s.most = max(s.most, s.pulling)
	s.mu.Unlock()

	defer func() {
		s.mu.Lock()
		s.pulling--
		s.mu.Unlock()
	}()

	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return fmt.Errorf("node %q: pull %s: %w", node, ref, ctx.Err())
	}

	s.mu.Lock()
	s.pulled++
	s.mu.Unlock()

	return nil
}

// TestPullNodesThousandNodes: a 1000-node pull, 50 at a time, takes twenty
// rounds, far longer than one node's bound, and finishes; never more than 50
// pull at once.
func TestPullNodesThousandNodes(t *testing.T) {
	puller := &slowPuller{delay: 20 * time.Millisecond}
	e := &Engine{Talos: puller}

	nodes := make([]nodePulls, 1000)
	for i := range nodes {
		nodes[i] = nodePulls{name: fmt.Sprintf("worker-%d", i), ip: fmt.Sprintf("10.0.%d.%d", i/250, i%250), pulls: []pull{{ref: "registry.k8s.io/kube-proxy:v1.36.3", ns: talos.NamespaceCRI}}}
	}

	start := time.Now()
	pulled, unsupported, err := e.pullNodes(context.Background(), nodes, 50, 200*time.Millisecond)
	took := time.Since(start)

	require.NoError(t, err)
	assert.Equal(t, 1000, pulled)
	assert.Zero(t, unsupported)
	assert.Equal(t, 1000, puller.pulled)
	assert.LessOrEqual(t, puller.most, 50)
	assert.Greater(t, took, 200*time.Millisecond, "the whole took longer than one node's bound")
	t.Logf("1000 nodes, 50 at a time: %s", took)
}

// TestPullOnNode: one node's images at once under one bound; a node that cannot
// pre-pull is skipped; a failure names the node by name once.
func TestPullOnNode(t *testing.T) {
	n := nodePulls{name: "worker-1", ip: "10.0.0.1", pulls: []pull{
		{ref: "registry.k8s.io/kube-proxy:v1.36.3", ns: talos.NamespaceCRI}, {ref: "ghcr.io/siderolabs/kubelet:v1.36.3", ns: talos.NamespaceSystem},
	}}

	t.Run("images at once, within the bound", func(t *testing.T) {
		puller := &slowPuller{delay: 100 * time.Millisecond}

		pulled, unsupported, err := (&Engine{Talos: puller}).pullOnNode(context.Background(), n, 150*time.Millisecond)
		require.NoError(t, err)
		assert.Equal(t, 2, pulled)
		assert.False(t, unsupported)
		assert.Equal(t, 2, puller.most, "both at once: their sum (200ms) would pass the bound")
	})

	t.Run("past the bound", func(t *testing.T) {
		_, _, err := (&Engine{Talos: &slowPuller{delay: time.Second}}).pullOnNode(context.Background(), n, 50*time.Millisecond)
		require.Error(t, err)
		assert.Regexp(t, `^node "worker-1": pull (registry.k8s.io/kube-proxy|ghcr.io/siderolabs/kubelet):v1.36.3: not done within 50ms `+
			`\(the bound of one node's pull: --pull-timeout\)$`, err.Error())

		var timeout *PullTimeoutError
		assert.ErrorAs(t, err, &timeout)
	})

	t.Run("the caller's end is not the node's bound", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()

		_, _, err := (&Engine{Talos: &slowPuller{delay: time.Second}}).pullOnNode(ctx, n, time.Minute)

		var timeout *PullTimeoutError
		assert.NotErrorAs(t, err, &timeout)
		assert.ErrorIs(t, err, context.Canceled)
	})
}

// TestKubernetesPullAhead: the next stage's images are pulled while a stage runs
// (the kubelets' while KubeProxy applies and rolls out), each once; a pull ahead
// that fails is the stage's own pre-pull's to retry, and it pauses as before.
func TestKubernetesPullAhead(t *testing.T) {
	t.Run("the kubelets' images pull while KubeProxy runs, each once", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 2, kubernetes: "v1.35.4"})

		rec := &recorder{}
		kubeletPull := make(chan struct{})

		var (
			once sync.Once
			late bool
		)

		f.onPull = func(node, ref string) {
			if strings.HasPrefix(node, "worker") && strings.Contains(ref, "kubelet") {
				once.Do(func() { close(kubeletPull) })
			}
		}

		// cp-3's KubeProxy apply waits for a worker's kubelet pull: it goes on at once
		// only if that pull runs beside the KubeProxy stage, not after it.
		f.beforeApply = func(_ context.Context, m *fakeMachine) {
			if m.name != "cp-3" || len(rec.with("KubeProxy cp-3 Applying: applying")) == 0 {
				return
			}

			select {
			case <-kubeletPull:
			case <-time.After(10 * time.Second):
				late = true
			}
		}

		e := f.engine("v1.36.3")
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		requireFinished(t, f, "v1.36.3")
		assert.False(t, late, "the kubelets' images were pulled while KubeProxy ran")

		f.mu.Lock()
		defer f.mu.Unlock()

		seen := map[string]int{}
		for _, p := range f.pulls {
			seen[p]++
		}

		for p, n := range seen {
			assert.Equal(t, 1, n, "%s pulled once: a stage does not pull again what was pulled ahead", p)
		}

		assert.Contains(t, f.pulls, "worker-1 system ghcr.io/siderolabs/kubelet:v1.36.3")
		assert.NotEmpty(t, rec.with("Kubelets [pre-pull] pulled ahead: 5 image(s), while KubeProxy ran"))
	})

	t.Run("a pull ahead that fails is the stage's own pre-pull's to retry: it pauses before the stage applies", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})

		var (
			mu          sync.Mutex
			proxyPulls  int
			kubeletPull bool
		)

		f.onPull = func(node, ref string) {
			mu.Lock()
			defer mu.Unlock()

			switch {
			case node == "worker-2" && strings.Contains(ref, "kube-proxy"):
				proxyPulls++
			case strings.Contains(ref, "kubelet"):
				kubeletPull = true
			}
		}

		f.machine("worker-2").faults.pullFails = true

		err := f.engine("v1.36.3").Run(context.Background())
		pause := pauseOf(t, err, "KubeProxy", "", "pre-pull: ", `node "worker-2": pull registry.k8s.io/kube-proxy:v1.36.3`)
		assert.Contains(t, pause.Action, "make the images reachable from the nodes")
		assert.Len(t, f.realApplies(), 2, "the APIServers and ControlPlaneComponents applies on cp-1; none of KubeProxy")

		mu.Lock()
		assert.Equal(t, 2, proxyPulls, "worker-2's kube-proxy: pulled ahead while ControlPlaneComponents ran, then by KubeProxy's own pre-pull")
		assert.False(t, kubeletPull, "nothing pulled ahead past the stage that paused")
		mu.Unlock()

		f.machine("worker-2").faults.pullFails = false
		require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
		requireFinished(t, f, "v1.36.3")
	})
}
