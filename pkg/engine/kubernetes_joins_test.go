package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// A control plane that joins the cluster mid-upgrade (an operator adds it from its
// saved machine config, at the cluster's original versions) after the APIServers
// stage: its Node registers while the ControlPlaneComponents stage applies, its
// mirror pods a moment later. The stage reads the cluster again rather than pause
// on the skew the join brought, and takes the new node first, from the APIServers
// stage, one stage's worth per apply; nothing else is applied before its apiserver
// is on the target, and the run ends with every node there.
func TestEngineControlPlaneJoinsMidUpgrade(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 4, workers: 1, kubernetes: "v1.35.4"})
	ctx := context.Background()

	// cp-4 is not in the cluster yet: no Node, no pods, nothing started.
	require.NoError(t, f.cs.CoreV1().Nodes().Delete(ctx, "cp-4", metav1.DeleteOptions{}))

	for _, c := range discovery.StaticPodComponents() {
		require.NoError(t, f.cs.CoreV1().Pods("kube-system").Delete(ctx, fmt.Sprintf("%s-cp-4", c), metav1.DeleteOptions{}))
	}

	require.NoError(t, f.cs.CoreV1().Pods("kube-system").Delete(ctx, "kube-proxy-cp-4", metav1.DeleteOptions{}))

	f.events = slices.DeleteFunc(f.events, func(e event) bool { return e.node == "cp-4" })
	before := render.Images(f.machine("cp-4").active)

	var (
		once     sync.Once
		joinedAt int // applies before the join
		podsUp   = make(chan struct{})
	)

	join := func() {
		m := f.machine("cp-4")

		_, err := f.cs.CoreV1().Nodes().Create(ctx, f.nodeObject(m, "v1.35.4"), metav1.CreateOptions{})
		require.NoError(t, err)
		f.record("cp-4", string(discovery.Kubelet), "v1.35.4")

		// The static pods come up a moment after the Node registers.
		go func() {
			defer close(podsUp)

			time.Sleep(300 * time.Millisecond)

			for _, c := range discovery.StaticPodComponents() {
				_, err := f.cs.CoreV1().Pods("kube-system").Create(ctx, mirrorPod("cp-4", c, "v1.35.4"), metav1.CreateOptions{})
				assert.NoError(t, err)
				f.record("cp-4", string(c), "v1.35.4")
			}

			_, err := f.cs.CoreV1().Pods("kube-system").Create(ctx, kubeProxyPod("cp-4", "v1.35.4"), metav1.CreateOptions{})
			assert.NoError(t, err)
			f.record("cp-4", string(discovery.KubeProxy), "v1.35.4")
		}()
	}

	// cp-4 joins while the ControlPlaneComponents stage applies on cp-1 (its second
	// apply, recorded before the hook runs).
	f.beforeApply = func(_ context.Context, m *fakeMachine) {
		if m.name == "cp-1" && appliesOn(f, "cp-1") == 2 {
			once.Do(func() {
				joinedAt = len(f.realApplies()) - 1
				join()
			})
		}
	}

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	require.NoError(t, e.Run(ctx))
	<-podsUp

	assert.NotEmpty(t, rec.with("ControlPlaneComponents [joined] control plane cp-4 joined during the stage: reading the cluster again, it goes first"))
	assert.NotEmpty(t, rec.with("ControlPlaneComponents cp-4", "behind the cluster: takes stage APIServers first"))

	applies := f.realApplies()
	// applies[joinedAt] is cp-1's ControlPlaneComponents apply, during which cp-4 joined.
	require.Greater(t, len(applies), joinedAt+2)
	assert.Equal(t, "cp-1", applies[joinedAt].node)

	var cp4 []applyCall

	for _, a := range applies {
		if a.node == "cp-4" {
			cp4 = append(cp4, a)
		}
	}

	require.Len(t, cp4, 4, "APIServers, ControlPlaneComponents, KubeProxy, Kubelets: one apply each")
	assert.Equal(t, "cp-4", applies[joinedAt+1].node, "cp-4 goes first once it joined")
	assert.Equal(t, []discovery.Component{discovery.APIServer}, changed(before, cp4[0].images))
	assert.Equal(t, []discovery.Component{discovery.ControllerManager, discovery.Scheduler}, changed(cp4[0].images, cp4[1].images))
	assert.Equal(t, []discovery.Component{discovery.Kubelet}, changed(cp4[2].images, cp4[3].images))

	// The only skew is what the join brought (cp-1's controller-manager, moved
	// before cp-4 came, newer than cp-4's apiserver), until cp-4's first apply.
	for _, broken := range f.invariantHistory() {
		assert.Contains(t, broken, "v1.35.4 on cp-4", broken)
	}

	for _, m := range f.machines {
		for c, image := range render.Images(m.active) {
			assert.Equal(t, "v1.36.3", render.TagOf(image), "%s %s", m.name, c)
		}
	}

	nodes, err := f.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, nodes.Items, 5)

	for _, n := range nodes.Items {
		assert.False(t, n.Spec.Unschedulable, "%s is schedulable", n.Name)
		assert.Equal(t, "v1.36.3", n.Status.NodeInfo.KubeletVersion, n.Name)
	}
}

// TestEngineNodeJoinedAfterTheLastCheckPauses: a worker registers while the Kubelets
// stage applies its last node, after every stage has read the cluster. The run does not
// say it succeeded: it pauses naming the worker, and the next run upgrades it.
func TestEngineNodeJoinedAfterTheLastCheckPauses(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
	ctx := context.Background()

	// worker-2 has no Node yet (the fake's kube-proxy rollout still counts its pod).
	require.NoError(t, f.cs.CoreV1().Nodes().Delete(ctx, "worker-2", metav1.DeleteOptions{}))
	f.events = slices.DeleteFunc(f.events, func(e event) bool { return e.node == "worker-2" })

	var once sync.Once

	f.beforeApply = func(_ context.Context, m *fakeMachine) {
		if m.name != "worker-1" {
			return
		}

		once.Do(func() {
			_, err := f.cs.CoreV1().Nodes().Create(ctx, f.nodeObject(f.machine("worker-2"), "v1.35.4"), metav1.CreateOptions{})
			assert.NoError(t, err)
		})
	}

	err := f.engine("v1.36.3").Run(ctx)

	var pause *PauseError
	require.ErrorAs(t, err, &pause)
	assert.Equal(t, "Kubelets", pause.Stage)
	assert.Equal(t, "worker-2", pause.Node)
	assert.Contains(t, pause.Reason, "worker-2 (kubelet v1.35.4) joined after the stages had read the cluster")
	assert.Contains(t, pause.Action, "the next run takes it through every stage from APIServers")
	assert.Zero(t, appliesOn(f, "worker-2"), "the joined node is not touched by the run that missed it")

	require.NoError(t, f.engine("v1.36.3").Run(ctx), "the next run takes it")
	assert.Equal(t, 1, appliesOn(f, "worker-2"))

	node, err := f.cs.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "v1.36.3", node.Status.NodeInfo.KubeletVersion)
}

// TestEngineJoinRestartsAreCapped: a control plane whose Node is gone while its mirror
// pods run (a node flapping in and out of the cluster) looks joined at every read of
// the stage. The stage starts again a bounded number of times, then pauses naming it
// rather than loop.
func TestEngineJoinRestartsAreCapped(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})
	require.NoError(t, f.cs.CoreV1().Nodes().Delete(context.Background(), "cp-3", metav1.DeleteOptions{}))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	rec := &recorder{}
	e := f.engine("v1.36.3", func(o *Options) { o.VerifyTimeout = 50 * time.Millisecond })
	e.Progress = rec

	pause := pauseOf(t, e.Run(ctx), "APIServers", "cp-3",
		fmt.Sprintf("control planes joined the cluster %d times during the stage (cp-3 %d time(s)), more than the %d restarts a stage takes",
			maxJoinRestarts+1, maxJoinRestarts+1, maxJoinRestarts))
	assert.Contains(t, pause.Action, "kubectl annotate node cp-3 ichor.dev/hold=flapping")
	assert.Len(t, rec.with("APIServers [joined] control plane cp-3 joined during the stage"), maxJoinRestarts)
	assert.Empty(t, f.realApplies(), "nothing applied while the stage could not settle")
}
